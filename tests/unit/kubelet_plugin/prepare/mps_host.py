"""Fakes of the MPS side of a node for the preparer's unit tests: a GPU's control daemon as the control client
sees it (`FakeDaemon`), the supervisor's status file (`write_status`) and a supervisor that switches a GPU's
daemon to the trust domain the plugin asks for once the test lets it (`FakeSupervisor`), MPS claims, and a
Preparer on an MPS GPU (`mps_env`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from api.names import DRIVER_NAME
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.kinds.mps.control import MpsControl, MpsControlError
from kubelet_plugin.kinds.mps.limits import MpsLimits
from kubelet_plugin.kinds.mps.shares import DomainSwitchPendingError, MpsShares
from kubelet_plugin.state import mps_files as mps
from tests.unit.fake_apiserver import connection, refused_url
from tests.unit.plugin_host import GPUS, NS, UUID0, Env, make_claim, make_env, make_preparer


class FakeDaemon(MpsControl):
    """One GPU daemon's defaults and servers, set and read through the control client's commands as the mock
    driver's daemon answers them: a set prints nothing, or ``Error: ...``; `down` answers like no daemon."""

    def __init__(self, mps_root: Path) -> None:
        super().__init__(Path("/nonexistent/nvidia-cuda-mps-control"), mps_root)
        self.defaults = ["0", "100.0"]
        self.servers_: dict[int, list[str]] = {}
        self.commands: list[str] = []
        self.down = False
        self.refuse = False

    @property
    def ceiling(self) -> tuple[str, str]:
        return self.defaults[0], self.defaults[1]

    def run(self, uuid: str, commands: list[str]) -> list[str]:
        if self.down:
            raise MpsControlError(
                f"{self.binary} answered {commands[0]!r} with status 1: Cannot find MPS control daemon"
            )
        self.commands += commands
        out = []
        for command in commands:
            words = command.split()
            if self.refuse and words[0].startswith("set"):
                out.append(f"Error: the daemon refused {words[0]}")
            elif words[0] == "get_server_list":
                out += [str(pid) for pid in self.servers_]
            elif words[0] == "set_default_device_pinned_mem_limit":
                self.defaults[0] = words[2]
            elif words[0] == "set_default_active_thread_percentage":
                self.defaults[1] = f"{float(words[1]):.1f}"
            elif words[0] == "set_device_pinned_mem_limit":
                self.servers_[int(words[1])][0] = words[3]
            elif words[0] == "set_active_thread_percentage":
                self.servers_[int(words[1])][1] = f"{float(words[2]):.1f}"
            elif words[0] == "get_default_device_pinned_mem_limit":
                out.append(self.defaults[0])
            elif words[0] == "get_default_active_thread_percentage":
                out.append(self.defaults[1])
            elif words[0] == "get_device_pinned_mem_limit":
                out.append(self.servers_[int(words[1])][0])
            elif words[0] == "get_active_thread_percentage":
                out.append(self.servers_[int(words[1])][1])
        if any(line.startswith("Error") for line in out):
            raise MpsControlError(f"the MPS control daemon of GPU {uuid} refused {commands!r}: {out}")
        return out

    def start_server(self, pid: int) -> None:
        """A server starts with the defaults of now (as NVIDIA documents)."""
        self.servers_[pid] = list(self.defaults)


def mps_claim(
    uid: str, name: str, share: str, memory: str, percent: int | None, *, namespace: str | None = None
) -> dict[str, Any]:
    claim = make_claim(uid, name, share=share, memory=memory)
    if namespace is not None:
        claim["metadata"]["namespace"] = namespace
    if percent is not None:
        parameters = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": percent}
        claim["status"]["allocation"]["devices"]["config"] = [
            {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
        ]
    return claim


def write_status(root: Path, *, pid: int | None = None, domain: str | None = None, state: mps.DaemonState = "running",
                 trust_domains: bool = True, uuid: str = UUID0) -> None:  # fmt: skip
    status = mps.DaemonStatus(uuid=uuid, state=state, pid=pid, updated=time.time() + 3600, refresh_seconds=5,
                              trust_domains=trust_domains, trust_domain=domain)  # fmt: skip
    path = mps.status_path(root, uuid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(status.to_json())


def domain_of(claim: dict[str, Any]) -> str:
    return f"namespace/{claim['metadata']['namespace']}"


def mps_env(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shares: Callable[[Settings, MpsLimits], MpsShares] = MpsShares,
    **settings: Any,
) -> tuple[Env, FakeDaemon]:
    """A Preparer whose gpu-0 is an MPS GPU (its daemon serving namespace team-a) and gpu-1 is not; `shares` makes
    its MpsShares, `settings` override the defaults."""
    e = make_env(tmp_path, monkeypatch, **{"mps_gpus": "0", "mps_root": tmp_path / "mps",
                                           "mps_domain_switch_timeout_seconds": 2, **settings})  # fmt: skip
    write_status(e.settings.mps_root, domain=f"namespace/{NS}")
    daemon = FakeDaemon(e.settings.mps_root)
    detector = EnforcementDetector.without_nvml(e.settings, GPUS, "no nvml")
    e.preparer = make_preparer(
        connection(refused_url()), e.settings, e.store, e.metrics, nodes=e.nodes, enforcement=detector,
        mps=shares(e.settings, MpsLimits(daemon)),
    )  # fmt: skip
    return e, daemon


class FakeSupervisor:
    """The MPS supervisor of GPU `uuid` as the node plugin sees it, on a thread of its own: when the tenant request
    names a domain its daemon does not serve, it sets `asked` and says ``switching``; once `release` is set it
    serves that domain (a fresh daemon, pid `pid`). Stops after `limit_s` (a bound, so a failing test ends)."""

    def __init__(self, root: Path, release: threading.Event, *, uuid: str = UUID0, pid: int = 5151,
                 limit_s: float = 20.0) -> None:  # fmt: skip
        self.root, self.uuid, self.release, self.pid = root, uuid, release, pid
        self.asked = threading.Event()
        self.switches: list[str] = []
        self._serving = mps.read_status(root, uuid)[0]
        self._limit = limit_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self._limit
        while time.monotonic() < deadline and not self._stop.is_set():
            tenant = mps.read_tenant(self.root, self.uuid)
            serving = self._serving.trust_domain if self._serving is not None else None
            if tenant is not None and tenant.domain != serving:
                if not self.asked.is_set():
                    write_status(self.root, domain=serving, state="switching", uuid=self.uuid)
                    self.asked.set()
                if self.release.wait(0.02):
                    write_status(self.root, pid=self.pid, domain=tenant.domain, uuid=self.uuid)
                    self._serving = mps.read_status(self.root, self.uuid)[0]
                    self.switches.append(tenant.domain)
                    self.asked.clear()
                    self.release.clear()
                continue
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class WatchedShares(MpsShares):
    """MpsShares that count the calls waiting in `wait_served` (each waits without the node lock)."""

    def __init__(self, settings: Settings, limits: MpsLimits | None = None) -> None:
        super().__init__(settings, limits)
        self.waits = 0
        self._changed = threading.Condition()

    def wait_served(self, switches: Iterable[DomainSwitchPendingError]) -> dict[tuple[str, str], str | None]:
        with self._changed:
            self.waits += 1
            self._changed.notify_all()
        return super().wait_served(switches)

    def wait_for(self, waits: int, timeout: float = 10.0) -> bool:
        """Whether `waits` calls have started waiting within `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self.waits >= waits, timeout)
