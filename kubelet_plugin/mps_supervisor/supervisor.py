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
   (``kubelet_plugin/kinds/mps/limits.py``);
5. every ``--refresh`` seconds its status file says whether it runs, which domain it serves and which MPS servers
   it has (a server that dies takes its clients with it); a daemon that exits is restarted with a backoff (1 s
   doubling to 30 s), its status saying why it stopped meanwhile;
6. every ``--poll`` seconds: a new domain in ``tenant.json`` (the GPU's claims of the domain before are all gone,
   the plugin checked) gets a fresh daemon, an emptied pipe directory and a fresh tmpfs (a daemon that never had
   a domain takes it as it is); a control socket that is gone or no longer the daemon's (another inode or owner)
   restarts the daemon at once, counted in the status.

SIGTERM quits every daemon (``quit``), restores the compute modes and detaches the tmpfs mounts.

This module is the loop over the MPS GPUs (steps 6 and SIGTERM); one daemon's process and status file are
``daemon.py``'s (steps 3 to 5), the compute modes ``compute_mode.py``'s (step 1), the options ``settings.py``'s.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time

import pynvml
from prometheus_client import CollectorRegistry

from kubelet_plugin.core.settings import is_mps_gpu
from kubelet_plugin.mps_supervisor import compute_mode, shm
from kubelet_plugin.mps_supervisor.daemon import DaemonRunner, GpuDaemon
from kubelet_plugin.mps_supervisor.settings import MpsSettings, parse_mps_settings
from kubelet_plugin.state import mps_files as mps

__all__ = ["MpsSettings", "Supervisor", "parse_mps_settings"]

log = logging.getLogger(__name__)


class Supervisor:
    """The daemons of one node's MPS GPUs. `run` until the event is set, then `shutdown`.

    It keeps a `GpuDaemon` per MPS GPU and serves their trust domains; `DaemonRunner` (``daemon``) runs each one's
    process and writes its status."""

    def __init__(self, settings: MpsSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self._runner = DaemonRunner(settings, self.registry)
        self._daemons: list[GpuDaemon] = []
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
            self._runner.check(daemon, time.monotonic() if now is None else now)
            self._runner.write_status(daemon)

    def shutdown(self) -> None:
        """Quit every daemon, restore the compute modes, detach the tmpfs mounts, say so in the status files."""
        for daemon in self._daemons:
            self._runner.stop(daemon)
            compute_mode.restore_mode(self.settings.mps_root, daemon.uuid)
            self._unmount(daemon.uuid)
            daemon.state, daemon.reason, daemon.process = "down", "the MPS supervisor stopped", None
            self._runner.up.labels(daemon.uuid).set(0)
            self._runner.write_status(daemon)
        if self._nvml:
            pynvml.nvmlShutdown()
            self._nvml = False

    # ----- steps --------------------------------------------------------------------------------------

    def _select(self) -> list[GpuDaemon]:
        if not self._nvml:
            pynvml.nvmlInit()
            self._nvml = True
        selected = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            uuid = _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
            if is_mps_gpu(self.settings.mps_gpus, index, uuid):
                selected.append(GpuDaemon(uuid))
            elif compute_mode.mode_before_path(self.settings.mps_root, uuid).exists():
                compute_mode.restore_mode(
                    self.settings.mps_root, uuid
                )  # MPS was turned off for this GPU since the last run
                self._unmount(uuid)
        if selected:
            log.info("MPS GPUs", extra={"gpus": [d.uuid for d in selected], "selection": self.settings.mps_gpus})
        else:
            log.error(
                "no GPU of this node is named by --mps-gpus (chart value mps.gpus); waiting",
                extra={"selection": self.settings.mps_gpus, "gpus": pynvml.nvmlDeviceGetCount()},
            )
        return selected

    def _watch(self, daemon: GpuDaemon) -> None:
        """Between refreshes: serve a new trust domain, and restart a daemon whose control socket is not its own."""
        tenant = mps.read_tenant(self.settings.mps_root, daemon.uuid)
        if tenant is not None and tenant.domain != daemon.domain:
            if daemon.domain is None:  # never had a client: it may serve anyone
                daemon.domain = tenant.domain
                log.info("MPS daemon serves a trust domain", extra={"uuid": daemon.uuid, "domain": tenant.domain})
            else:
                self._switch(daemon, tenant.domain)
            self._runner.write_status(daemon)
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
            self._runner.stop(daemon)
            mps.control_socket(self.settings.mps_root, daemon.uuid).unlink(missing_ok=True)  # whoever made it
            self._runner.start(daemon, time.monotonic())
            self._runner.write_status(daemon)

    def _switch(self, daemon: GpuDaemon, domain: str) -> None:
        """A fresh daemon, pipe directory and /dev/shm for trust domain `domain`."""
        log.info("MPS daemon replaced for another trust domain", extra={"uuid": daemon.uuid, "from": daemon.domain,
                 "to": domain})  # fmt: skip
        daemon.state, daemon.reason = "switching", f"from {daemon.domain or 'none'} to {domain}"
        self._runner.write_status(daemon)
        self._runner.stop(daemon)
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
            self._runner.failed(
                daemon, time.monotonic(), f"cannot mount a fresh /dev/shm for trust domain {domain}: {err}"
            )
            return
        daemon.next_start = 0.0
        self._runner.start(daemon, time.monotonic())

    def _unmount(self, uuid: str) -> None:
        try:
            shm.unmount(mps.shm_dir(self.settings.mps_root, uuid))
        except shm.ShmError as err:
            log.error("cannot detach an MPS /dev/shm", extra={"uuid": uuid, "error": str(err)})


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
