"""One MPS GPU's control daemon: its record (`GpuDaemon`) and its process lifecycle (`DaemonRunner`).

The runner starts a GPU's ``nvidia-cuda-mps-control -f`` (its compute mode made EXCLUSIVE_PROCESS by
``compute_mode``, its /dev/shm a tmpfs of its own by ``shm``) and waits until it answers, notes its servers,
notices its exit and schedules a restart with a backoff (1 s doubling to 30 s), quits it, and writes its status
file (``kubelet_plugin/state/mps_files.py``). It holds no daemon: the supervisor (``supervisor``) keeps one record
per MPS GPU and decides when each starts, restarts or stops; the runner changes the record it is given, sets the
``fracgpu_mps_daemon_up`` gauge and ``fracgpu_mps_daemon_restarts`` counter, and logs under the supervisor's
logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field

import pynvml
from prometheus_client import CollectorRegistry, Counter, Gauge

from kubelet_plugin.core.filelock import atomic_write
from kubelet_plugin.kinds.mps.control import run_control
from kubelet_plugin.mps_supervisor import compute_mode, shm
from kubelet_plugin.mps_supervisor.settings import MpsSettings
from kubelet_plugin.state import mps_files as mps

#: The supervisor's logger: its records name one logger, whichever of its modules writes them.
log = logging.getLogger("kubelet_plugin.mps_supervisor.supervisor")

MAX_BACKOFF_S = 30.0


@dataclass
class GpuDaemon:
    """What the supervisor knows of one MPS GPU's daemon; its status file says it."""

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


class DaemonRunner:
    """Starts, checks and stops the control daemon of any MPS GPU, and writes its status file."""

    def __init__(self, settings: MpsSettings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.up = Gauge(
            "fracgpu_mps_daemon_up", "1 while the GPU's MPS control daemon runs", ["uuid"], registry=registry
        )
        self.restarts = Counter(
            "fracgpu_mps_daemon_restarts", "MPS control daemon restarts", ["uuid"], registry=registry
        )

    def stop(self, daemon: GpuDaemon) -> None:
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

    def check(self, daemon: GpuDaemon, now: float) -> None:
        """Note a running daemon's servers, an exited one's exit (and its restart time), or start it when due."""
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
            self.restarts.labels(daemon.uuid).inc()
            self.up.labels(daemon.uuid).set(0)
            log.warning("MPS control daemon stopped", extra={"uuid": daemon.uuid, "reason": daemon.reason})
            return
        if now >= daemon.next_start:
            self.start(daemon, now)

    def start(self, daemon: GpuDaemon, now: float) -> None:
        """Start the daemon and wait until it answers; one that cannot start is `failed`, one that does not answer
        is killed (the next `check` reports its exit)."""
        settings = self.settings
        try:
            daemon.compute_mode = compute_mode.exclusive(settings.mps_root, daemon.uuid)
        except pynvml.NVMLError as err:
            self.failed(daemon, now, f"NVML cannot set GPU {daemon.uuid} to EXCLUSIVE_PROCESS: {err}")
            return
        for directory in (mps.pipe_dir(settings.mps_root, daemon.uuid), mps.log_dir(settings.mps_root, daemon.uuid)):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755)
        shm_dir = mps.shm_dir(settings.mps_root, daemon.uuid)
        try:
            if not shm.mounted(shm_dir):
                shm.mount_fresh(shm_dir, settings.shm_size_bytes)
        except shm.ShmError as err:
            self.failed(daemon, now, f"cannot mount the daemon's /dev/shm: {err}")
            return
        control = [str(settings.control), "-f", *(["-multiuser-server"] if settings.multi_user else [])]
        argv = shm.in_namespace(shm_dir, control)
        stderr = (mps.log_dir(settings.mps_root, daemon.uuid) / "supervisor.stderr").open("wb")
        try:
            daemon.process = subprocess.Popen(argv, env=self._env(daemon), stdin=subprocess.DEVNULL, stderr=stderr)
        except OSError as err:
            self.failed(daemon, now, f"cannot run {argv[0]}: {err}")
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
            return  # the next check reports the exit and schedules a restart
        daemon.state, daemon.reason = "running", ""
        try:
            made = os.lstat(mps.control_socket(settings.mps_root, daemon.uuid))
            daemon.socket = (made.st_ino, made.st_uid)
        except FileNotFoundError:
            daemon.socket = None  # it answered, so it listens somewhere: the next refresh looks again
        self.up.labels(daemon.uuid).set(1)
        log.info("MPS control daemon running", extra={"uuid": daemon.uuid, "pid": daemon.process.pid})

    def failed(self, daemon: GpuDaemon, now: float, reason: str) -> None:
        """The daemon could not start, for `reason`: down until its backoff is over."""
        daemon.state, daemon.reason = "down", reason
        daemon.next_start = now + min(MAX_BACKOFF_S, 2.0**daemon.restarts)
        daemon.restarts += 1
        self.up.labels(daemon.uuid).set(0)
        log.error("MPS control daemon cannot start", extra={"uuid": daemon.uuid, "reason": reason})

    def write_status(self, daemon: GpuDaemon) -> None:
        """The daemon's status file, as the node plugin reads it."""
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

    def _look_at_servers(self, daemon: GpuDaemon) -> None:
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

    def _env(self, daemon: GpuDaemon) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
        if self.settings.daemon_library_path:
            env["LD_LIBRARY_PATH"] = self.settings.daemon_library_path
        env["CUDA_VISIBLE_DEVICES"] = daemon.uuid
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps.pipe_dir(self.settings.mps_root, daemon.uuid))
        env["CUDA_MPS_LOG_DIRECTORY"] = str(mps.log_dir(self.settings.mps_root, daemon.uuid))
        return env

    def _control(self, daemon: GpuDaemon, commands: list[str]) -> tuple[int, str]:
        """Send `commands` to the GPU's daemon through the control client; (status, output)."""
        return run_control(self.settings.control, commands, self._env(daemon))

    def _tail(self, daemon: GpuDaemon) -> str:
        path = mps.log_dir(self.settings.mps_root, daemon.uuid) / "supervisor.stderr"
        try:
            text = path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f": {text[-300:]}" if text else ""
