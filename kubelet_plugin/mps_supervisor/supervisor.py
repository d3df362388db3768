"""One CUDA MPS control daemon per MPS GPU, for one trust domain at a time, supervised.

A daemon per GPU keeps a fatal client fault (which puts every GPU of its server in a fault state), and each
client's pipe directory, to one GPU, and lets one daemon restart alone. Whoever reaches a daemon's pipe directory
commands it (NVIDIA documents no access check), so a GPU's daemon serves the claims of one trust domain
(``api/mps_trust.py``) at a time: the one the node plugin asks for in ``<gpu dir>/tenant.json``. Per GPU:

1. the GPU's compute mode becomes EXCLUSIVE_PROCESS through NVML, so no process can use it outside MPS; the mode
   it had is kept in ``<gpu dir>/compute-mode-before-mps`` and restored when its daemon stops for good;
2. ``<gpu dir>/shm`` is a tmpfs of its own (``--shm-size``, ``nosuid,nodev,noexec``: ``shm.py``), the daemon's
   and its clients' /dev/shm;
3. ``nvidia-cuda-mps-control -f`` (the driver's, under ``--driver-root``) runs in a mount namespace whose
   /dev/shm is that tmpfs, with ``CUDA_VISIBLE_DEVICES`` set to the GPU's UUID, its own pipe and log directories,
   and ``-multiuser-server`` (``--multi-user``, default), so that pods of any UID share its one server;
4. once it answers ``get_server_list`` it counts as running; the node plugin sets its ceilings
   (``kubelet_plugin/mps/limits.py``);
5. every ``--refresh`` seconds its status file says whether it runs, which domain it serves and which MPS servers
   it has (a server that dies takes its clients with it); a daemon that exits is restarted with a backoff (1 s
   doubling to 30 s), its status saying why it stopped meanwhile;
6. every ``--poll`` seconds: a new domain in ``tenant.json`` (the GPU's claims of the domain before are all gone,
   the plugin checked) gets a fresh daemon, an emptied pipe directory and a fresh tmpfs (a daemon that never had
   a domain takes it as it is); a control socket that is gone or no longer the daemon's (another inode or owner)
   restarts the daemon at once, counted in the status.

SIGTERM quits every daemon (``quit``), restores the compute modes and detaches the tmpfs mounts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pynvml
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from api.options import OptionSettings, build_parser, parse
from kubelet_plugin.core.filelock import atomic_write
from kubelet_plugin.core.settings import Quantity, is_mps_gpu, mps_selection
from kubelet_plugin.mps import layout as mps
from kubelet_plugin.mps.control import CONTROL_IN_DRIVER_ROOT, run_control
from kubelet_plugin.mps_supervisor import shm

log = logging.getLogger(__name__)

COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
}
MODE_BEFORE_FILE = "compute-mode-before-mps"
MAX_BACKOFF_S = 30.0
GiB = 1 << 30


class MpsSettings(OptionSettings):
    """The supervisor's options (flags and FRACGPU_* variables, api/options.py)."""

    model_config = SettingsConfigDict(env_prefix="FRACGPU_")

    mps_gpus: str = Field(min_length=1, description="the MPS GPUs: all, or NVML indices and UUIDs (as the plugin's)")
    mps_root: Path = Field(Path("/run/fracgpu/mps"), description="host directory of the daemons' files")
    driver_root: Path = Field(Path("/"), description="the driver root as mounted here, holding the MPS binaries")
    mps_control: Path | None = Field(
        None, description="nvidia-cuda-mps-control (default: <driver root>/usr/bin/nvidia-cuda-mps-control)"
    )
    daemon_library_path: str = Field(
        "", description="LD_LIBRARY_PATH of the daemons (the driver's libcuda.so.1 for their servers); empty: inherited"
    )
    multi_user: bool = Field(True, description="start daemons with -multiuser-server: one server for every UID")
    refresh_seconds: float = Field(5.0, gt=0, description="seconds between two status writes per GPU")
    poll_seconds: float = Field(
        0.2, gt=0, description="seconds between two looks at each GPU's tenant request and control socket"
    )
    shm_size_bytes: Quantity = Field(
        8 * GiB, gt=0, description="the size limit of each MPS GPU's /dev/shm tmpfs (a quantity, e.g. 8Gi)"
    )
    start_timeout_seconds: float = Field(10.0, gt=0, description="seconds a new daemon has to answer")
    metrics_address: str = Field("0.0.0.0", description="where the metrics server listens")
    metrics_port: int = Field(8081, ge=0, le=65535, description="port of the Prometheus /metrics server; 0: off")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["json", "text"] = Field("json", description="log format")

    @field_validator("mps_gpus")
    @classmethod
    def _selection(cls, value: str) -> str:
        return ",".join(mps_selection(value))

    @property
    def control(self) -> Path:
        return self.mps_control or self.driver_root / CONTROL_IN_DRIVER_ROOT


def parse_mps_settings(argv: list[str] | None = None) -> MpsSettings:
    parser = build_parser(
        MpsSettings,
        "python -m kubelet_plugin.mps_supervisor",
        "fracgpu MPS supervisor: one CUDA MPS control daemon per MPS GPU, kept alive apart from the node plugin.",
    )
    return parse(MpsSettings, argv, parser)


@dataclass
class _Daemon:
    uuid: str
    process: subprocess.Popen[bytes] | None = None
    state: mps.DaemonState = "starting"
    reason: str = "not started yet"
    compute_mode: str = ""
    restarts: int = 0
    next_start: float = 0.0
    servers: list[int] = field(default_factory=list)
    server_exits: int = 0
    domain: str | None = None
    socket: tuple[int, int] | None = None  # (inode, owner) of the control socket the daemon made
    socket_replacements: int = 0


class Supervisor:
    """The daemons of one node's MPS GPUs. `run` until the event is set, then `shutdown`."""

    def __init__(self, settings: MpsSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self._up = Gauge(
            "fracgpu_mps_daemon_up", "1 while the GPU's MPS control daemon runs", ["uuid"], registry=self.registry
        )
        self._restarts = Counter(
            "fracgpu_mps_daemon_restarts", "MPS control daemon restarts", ["uuid"], registry=self.registry
        )
        self._daemons: list[_Daemon] = []
        self._nvml = False

    # ----- lifecycle ------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Find the MPS GPUs, then keep each one's daemon running and its status written until `stop`."""
        while not stop.is_set() and not self._daemons:
            try:
                self._daemons = self._select()
            except pynvml.NVMLError as err:
                log.error("NVML cannot list the GPUs; retrying", extra={"error": str(err)})
            if not self._daemons:
                stop.wait(self.settings.refresh_seconds)
        next_tick = 0.0
        while not stop.is_set():
            now = time.monotonic()
            for daemon in self._daemons:
                self._watch(daemon)
            if now >= next_tick:
                self.tick()
                next_tick = now + self.settings.refresh_seconds
            stop.wait(min(self.settings.poll_seconds, self.settings.refresh_seconds))

    def tick(self, now: float | None = None) -> None:
        """One round: restart what stopped (when its backoff is over), write every status."""
        for daemon in self._daemons:
            self._check(daemon, time.monotonic() if now is None else now)
            self._write_status(daemon)

    def shutdown(self) -> None:
        """Quit every daemon, restore the compute modes, detach the tmpfs mounts, say so in the status files."""
        for daemon in self._daemons:
            self._stop(daemon)
            self._restore_mode(daemon.uuid)
            self._unmount(daemon.uuid)
            daemon.state, daemon.reason, daemon.process = "down", "the MPS supervisor stopped", None
            self._up.labels(daemon.uuid).set(0)
            self._write_status(daemon)
        if self._nvml:
            pynvml.nvmlShutdown()
            self._nvml = False

    # ----- steps --------------------------------------------------------------------------------------

    def _select(self) -> list[_Daemon]:
        if not self._nvml:
            pynvml.nvmlInit()
            self._nvml = True
        selected = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            uuid = _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
            if is_mps_gpu(self.settings.mps_gpus, index, uuid):
                selected.append(_Daemon(uuid))
            elif (mps.gpu_dir(self.settings.mps_root, uuid) / MODE_BEFORE_FILE).exists():
                self._restore_mode(uuid)  # MPS was turned off for this GPU since the last run
                self._unmount(uuid)
        if selected:
            log.info("MPS GPUs", extra={"gpus": [d.uuid for d in selected], "selection": self.settings.mps_gpus})
        else:
            log.error(
                "no GPU of this node is named by --mps-gpus (chart value mps.gpus); waiting",
                extra={"selection": self.settings.mps_gpus, "gpus": pynvml.nvmlDeviceGetCount()},
            )
        return selected

    def _watch(self, daemon: _Daemon) -> None:
        """Between refreshes: serve a new trust domain, and restart a daemon whose control socket is not its own."""
        tenant = mps.read_tenant(self.settings.mps_root, daemon.uuid)
        if tenant is not None and tenant.domain != daemon.domain:
            if daemon.domain is None:  # never had a client: it may serve anyone
                daemon.domain = tenant.domain
                log.info("MPS daemon serves a trust domain", extra={"uuid": daemon.uuid, "domain": tenant.domain})
            else:
                self._switch(daemon, tenant.domain)
            self._write_status(daemon)
            return
        process = daemon.process
        if process is None or process.poll() is not None or daemon.socket is None:
            return
        try:
            found = os.lstat(mps.control_socket(self.settings.mps_root, daemon.uuid))
            now = (found.st_ino, found.st_uid)
        except FileNotFoundError:
            now = None
        if now != daemon.socket:
            daemon.socket_replacements += 1
            daemon.reason = (
                f"its control socket was {'removed' if now is None else 'replaced (another inode or owner)'} while "
                "it ran; restarted"
            )
            log.warning("MPS control socket not the daemon's own", extra={"uuid": daemon.uuid, "why": daemon.reason})
            self._stop(daemon)
            mps.control_socket(self.settings.mps_root, daemon.uuid).unlink(missing_ok=True)  # whoever made it
            self._start(daemon, time.monotonic())
            self._write_status(daemon)

    def _switch(self, daemon: _Daemon, domain: str) -> None:
        """A fresh daemon, pipe directory and /dev/shm for trust domain `domain`."""
        log.info("MPS daemon replaced for another trust domain", extra={"uuid": daemon.uuid, "from": daemon.domain,
                 "to": domain})  # fmt: skip
        daemon.state, daemon.reason = "switching", f"from {daemon.domain or 'none'} to {domain}"
        self._write_status(daemon)
        self._stop(daemon)
        pipe = mps.pipe_dir(self.settings.mps_root, daemon.uuid)
        for leftover in pipe.iterdir() if pipe.is_dir() else []:
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        daemon.domain = domain
        try:
            shm.mount_fresh(mps.shm_dir(self.settings.mps_root, daemon.uuid), self.settings.shm_size_bytes)
        except shm.ShmError as err:
            self._failed(daemon, time.monotonic(), f"cannot mount a fresh /dev/shm for trust domain {domain}: {err}")
            return
        daemon.next_start = 0.0
        self._start(daemon, time.monotonic())

    def _stop(self, daemon: _Daemon) -> None:
        """Quit the daemon (kill it when it does not quit) and forget it."""
        process = daemon.process
        if process is not None and process.poll() is None:
            self._control(daemon, ["quit"])
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        daemon.process, daemon.servers, daemon.socket = None, [], None

    def _unmount(self, uuid: str) -> None:
        try:
            shm.unmount(mps.shm_dir(self.settings.mps_root, uuid))
        except shm.ShmError as err:
            log.error("cannot detach an MPS /dev/shm", extra={"uuid": uuid, "error": str(err)})

    def _check(self, daemon: _Daemon, now: float) -> None:
        process = daemon.process
        if process is not None and process.poll() is None:
            self._look_at_servers(daemon)
            return
        if process is not None:  # it exited
            daemon.process, daemon.servers, daemon.socket = None, [], None
            daemon.state = "down"
            daemon.reason = f"nvidia-cuda-mps-control exited with status {process.returncode}{self._tail(daemon)}"
            daemon.next_start = now + min(MAX_BACKOFF_S, 2.0**daemon.restarts)
            daemon.restarts += 1
            self._restarts.labels(daemon.uuid).inc()
            self._up.labels(daemon.uuid).set(0)
            log.warning("MPS control daemon stopped", extra={"uuid": daemon.uuid, "reason": daemon.reason})
            return
        if now >= daemon.next_start:
            self._start(daemon, now)

    def _start(self, daemon: _Daemon, now: float) -> None:
        settings = self.settings
        try:
            daemon.compute_mode = self._exclusive(daemon.uuid)
        except pynvml.NVMLError as err:
            self._failed(daemon, now, f"NVML cannot set GPU {daemon.uuid} to EXCLUSIVE_PROCESS: {err}")
            return
        for directory in (mps.pipe_dir(settings.mps_root, daemon.uuid), mps.log_dir(settings.mps_root, daemon.uuid)):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755)
        shm_dir = mps.shm_dir(settings.mps_root, daemon.uuid)
        try:
            if not shm.mounted(shm_dir):
                shm.mount_fresh(shm_dir, settings.shm_size_bytes)
        except shm.ShmError as err:
            self._failed(daemon, now, f"cannot mount the daemon's /dev/shm: {err}")
            return
        control = [str(settings.control), "-f", *(["-multiuser-server"] if settings.multi_user else [])]
        argv = shm.in_namespace(shm_dir, control)
        stderr = (mps.log_dir(settings.mps_root, daemon.uuid) / "supervisor.stderr").open("wb")
        try:
            daemon.process = subprocess.Popen(argv, env=self._env(daemon), stdin=subprocess.DEVNULL, stderr=stderr)
        except OSError as err:
            self._failed(daemon, now, f"cannot run {argv[0]}: {err}")
            return
        finally:
            stderr.close()
        deadline = time.monotonic() + settings.start_timeout_seconds
        while time.monotonic() < deadline and daemon.process.poll() is None:
            if self._control(daemon, ["get_server_list"])[0] == 0:
                break
            time.sleep(0.05)
        else:
            if daemon.process.poll() is None:
                daemon.process.kill()
                daemon.process.wait()
            return  # the next _check reports the exit and schedules a restart
        daemon.state, daemon.reason = "running", ""
        try:
            made = os.lstat(mps.control_socket(settings.mps_root, daemon.uuid))
            daemon.socket = (made.st_ino, made.st_uid)
        except FileNotFoundError:
            daemon.socket = None  # it answered, so it listens somewhere: the next refresh looks again
        self._up.labels(daemon.uuid).set(1)
        log.info("MPS control daemon running", extra={"uuid": daemon.uuid, "pid": daemon.process.pid})

    def _look_at_servers(self, daemon: _Daemon) -> None:
        """Note the daemon's servers; one gone since the last look counts as a server exit."""
        if daemon.socket is None:
            with contextlib.suppress(FileNotFoundError):
                made = os.lstat(mps.control_socket(self.settings.mps_root, daemon.uuid))
                daemon.socket = (made.st_ino, made.st_uid)
        code, output = self._control(daemon, ["get_server_list"])
        if code != 0:
            return
        servers = [int(word) for word in output.split() if word.isdigit()]
        gone = set(daemon.servers) - set(servers)
        if gone:
            daemon.server_exits += len(gone)
            log.warning("MPS server gone", extra={"uuid": daemon.uuid, "servers": sorted(gone)})
        daemon.servers = servers

    def _failed(self, daemon: _Daemon, now: float, reason: str) -> None:
        daemon.state, daemon.reason = "down", reason
        daemon.next_start = now + min(MAX_BACKOFF_S, 2.0**daemon.restarts)
        daemon.restarts += 1
        self._up.labels(daemon.uuid).set(0)
        log.error("MPS control daemon cannot start", extra={"uuid": daemon.uuid, "reason": reason})

    def _env(self, daemon: _Daemon) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
        if self.settings.daemon_library_path:
            env["LD_LIBRARY_PATH"] = self.settings.daemon_library_path
        env["CUDA_VISIBLE_DEVICES"] = daemon.uuid
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps.pipe_dir(self.settings.mps_root, daemon.uuid))
        env["CUDA_MPS_LOG_DIRECTORY"] = str(mps.log_dir(self.settings.mps_root, daemon.uuid))
        return env

    def _control(self, daemon: _Daemon, commands: list[str]) -> tuple[int, str]:
        """Send `commands` to the GPU's daemon through the control client; (status, output)."""
        return run_control(self.settings.control, commands, self._env(daemon))

    def _exclusive(self, uuid: str) -> str:
        """Set the GPU to EXCLUSIVE_PROCESS (keeping the mode it had, once); its mode's name."""
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        mode = pynvml.nvmlDeviceGetComputeMode(handle)
        before = mps.gpu_dir(self.settings.mps_root, uuid) / MODE_BEFORE_FILE
        if not before.exists():
            before.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(before, f"{mode}\n".encode(), 0o644)
        if mode != pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
            pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        return COMPUTE_MODES[pynvml.nvmlDeviceGetComputeMode(handle)]

    def _restore_mode(self, uuid: str) -> None:
        before = mps.gpu_dir(self.settings.mps_root, uuid) / MODE_BEFORE_FILE
        try:
            mode = int(before.read_text().strip())
            pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid), mode)
        except FileNotFoundError:
            return
        except (ValueError, pynvml.NVMLError) as err:
            log.error("cannot restore the compute mode", extra={"uuid": uuid, "error": str(err)})
            return
        before.unlink()
        log.info("compute mode restored", extra={"uuid": uuid, "mode": COMPUTE_MODES.get(mode, str(mode))})

    def _tail(self, daemon: _Daemon) -> str:
        path = mps.log_dir(self.settings.mps_root, daemon.uuid) / "supervisor.stderr"
        try:
            text = path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f": {text[-300:]}" if text else ""

    def _write_status(self, daemon: _Daemon) -> None:
        status = mps.DaemonStatus(
            uuid=daemon.uuid,
            state=daemon.state,
            reason=daemon.reason,
            pid=daemon.process.pid if daemon.process is not None else None,
            multi_user=self.settings.multi_user,
            compute_mode=daemon.compute_mode,
            trust_domains=True,
            trust_domain=daemon.domain,
            restarts=daemon.restarts,
            servers=daemon.servers,
            server_exits=daemon.server_exits,
            socket_replacements=daemon.socket_replacements,
            updated=time.time(),
            refresh_seconds=self.settings.refresh_seconds,
        )
        path = mps.status_path(self.settings.mps_root, daemon.uuid)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, status.to_json(), 0o644, durable=False)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
