"""Unit tests of MPS shares in the Preparer (kubelet_plugin/prepare/preparer.py with kubelet_plugin/kinds/mps/shares.py
and kubelet_plugin/kinds/mps/): the ceiling (raised to the largest grant and percentage before a new share's files are
written, refused when the daemon refuses it, lowered after an unprepare, set again on demand, read back and
repaired), and the trust domains (a claim of another domain on the GPU is refused naming both; a GPU whose claims
are gone serves the next domain after the supervisor's switch).

The daemon is `FakeDaemon`, the control client's commands interpreted as the mock driver's daemon answers them
(tests/integration/test_mps_supervisor.py runs the same control client against that daemon)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.names import DRIVER_NAME
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.kinds.mps.control import Limits, MpsControl, MpsControlError
from kubelet_plugin.kinds.mps.limits import MpsLimits, ceiling
from kubelet_plugin.kinds.mps.shares import MpsShares
from kubelet_plugin.state import cdi
from kubelet_plugin.state import mps_files as mps
from tests.unit.fake_apiserver import connection, refused_url
from tests.unit.plugin_host import (
    GPUS,
    SHARE_A,
    SHARE_B,
    UID_A,
    UID_B,
    UUID0,
    Env,
    make_claim,
    make_env,
    make_preparer,
    ref,
)


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
) -> dict[str, object]:
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
                 trust_domains: bool = True) -> None:  # fmt: skip
    status = mps.DaemonStatus(uuid=UUID0, state=state, pid=pid, updated=time.time() + 3600, refresh_seconds=5,
                              trust_domains=trust_domains, trust_domain=domain)  # fmt: skip
    path = mps.status_path(root, UUID0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(status.to_json())


def domain_of(claim: dict[str, object]) -> str:
    return f"namespace/{claim['metadata']['namespace']}"  # type: ignore[index]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Env, FakeDaemon]]:
    e = make_env(tmp_path, monkeypatch, mps_gpus="0", mps_root=tmp_path / "mps", mps_domain_switch_timeout_seconds=2)
    write_status(e.settings.mps_root, domain=domain_of(make_claim(UID_A, "a")))
    daemon = FakeDaemon(e.settings.mps_root)
    detector = EnforcementDetector.without_nvml(e.settings, GPUS, "no nvml")
    e.preparer = make_preparer(
        connection(refused_url()), e.settings, e.store, e.metrics, nodes=e.nodes, enforcement=detector,
        mps=MpsShares(e.settings, MpsLimits(daemon)),
    )  # fmt: skip
    yield e, daemon


def test_the_ceiling_follows_the_largest_grant_and_percentage_on_the_gpu(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    small = e.api.add(mps_claim(UID_A, "small", SHARE_A, "10Gi", 30))
    big = e.api.add(mps_claim(UID_B, "big", SHARE_B, "20Gi", 50))
    assert e.preparer.prepare([ref(small)])[UID_A].error == ""
    assert daemon.ceiling == ("10240M", "30.0")
    daemon.start_server(7001)
    assert e.preparer.prepare([ref(big)])[UID_B].error == ""
    assert daemon.ceiling == ("20480M", "50.0") and daemon.servers_[7001] == ["20480M", "50.0"], "running servers too"
    assert e.preparer.unprepare([ref(big)]) == {UID_B: ""}
    assert daemon.ceiling == ("10240M", "30.0"), "lowered to the remaining share's"
    daemon.defaults = ["0", "100.0"]  # the daemon came back without one
    e.preparer.refresh_mps_ceiling(UUID0)
    assert daemon.ceiling == ("10240M", "30.0")


def test_a_share_without_a_percentage_lifts_the_thread_ceiling(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_B, "b", SHARE_B, "4Gi", None)))])
    assert daemon.ceiling == ("10240M", "100.0")
    assert ceiling([]) is None
    assert ceiling([(4096, 20), (1024, 70)]) == Limits(memory_mib=4096, percentage=70)


def test_a_daemon_that_refuses_the_ceiling_refuses_the_share_before_any_file(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    daemon.refuse = True
    result = e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])[UID_A]
    assert "did not take the ceiling 10240 MiB / 30 %" in result.error, result.error
    assert "Error: the daemon refused set_default_device_pinned_mem_limit" in result.error, "the daemon's words"
    assert not cdi.spec_path(e.settings.cdi_dir, DRIVER_NAME, UID_A).exists()
    assert UID_A not in e.checkpoint().claims


def test_a_ceiling_the_same_daemon_already_has_is_not_sent_again(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    domain = domain_of(make_claim(UID_A, "a"))
    write_status(e.settings.mps_root, pid=4242, domain=domain)
    claim = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    e.preparer.prepare([ref(claim)])
    e.preparer.unprepare([ref(claim)])
    e.preparer.prepare([ref(claim)])
    sets = [c for c in daemon.commands if c.startswith("set_default_device")]
    assert len(sets) == 1, "prepare, unprepare (no share left) and the same prepare again: one ceiling"
    write_status(e.settings.mps_root, pid=4343, domain=domain)  # the supervisor restarted the daemon
    e.preparer.unprepare([ref(claim)])
    e.preparer.prepare([ref(claim)])
    assert len([c for c in daemon.commands if c.startswith("set_default_device")]) == 2
    assert daemon.ceiling == ("10240M", "30.0")


def test_limits_a_client_changed_are_read_back_and_set_again(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    assert e.preparer.repair_mps_limits(UUID0) == []
    daemon.defaults = ["81920M", "100.0"]  # `set_default_*` sent by a client of the domain
    daemon.start_server(7002)  # a server started meanwhile, with the raised defaults
    changed = e.preparer.repair_mps_limits(UUID0)
    assert changed == [
        "the daemon's defaults are pinned memory 81920M, active threads 100.0 %, not pinned memory 10240M, "
        "active threads 30.0 %",
        "server 7002 has pinned memory 81920M, active threads 100.0 %, not pinned memory 10240M, active threads 30.0 %",
    ]
    assert daemon.ceiling == ("10240M", "30.0") and daemon.servers_[7002] == ["10240M", "30.0"]
    assert e.preparer.repair_mps_limits(UUID0) == [], "repaired once, quiet after"


def test_a_claim_of_another_namespace_on_the_gpu_is_refused_naming_both(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    first = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    assert e.preparer.prepare([ref(first)])[UID_A].error == ""
    assert e.checkpoint().claims[UID_A].mps_trust_domain == domain_of(first)
    other = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    error = e.preparer.prepare([ref(other)])[UID_B].error
    assert "whose daemon serves namespace team-a" in error, error
    assert "this claim belongs to namespace team-b" in error and "never share an MPS daemon" in error
    assert UID_B not in e.checkpoint().claims
    assert not cdi.spec_path(e.settings.cdi_dir, DRIVER_NAME, UID_B).exists()


def test_a_gpu_without_claims_serves_the_next_domain_once_the_supervisor_switched(
    env: tuple[Env, FakeDaemon],
) -> None:
    e, daemon = env
    root = e.settings.mps_root
    other = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))

    def supervisor() -> None:  # sees the tenant request, switches, says so
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            tenant = mps.read_tenant(root, UUID0)
            if tenant is not None:
                write_status(root, pid=5151, domain=tenant.domain)
                return
            time.sleep(0.02)

    switching = threading.Thread(target=supervisor)
    switching.start()
    assert e.preparer.prepare([ref(other)])[UID_B].error == ""
    switching.join()
    assert mps.read_tenant(root, UUID0) == mps.TenantRequest(domain="namespace/team-b")
    assert daemon.ceiling == ("10240M", "30.0")


def test_a_switch_the_supervisor_does_not_make_refuses_the_share(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    other = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    error = e.preparer.prepare([ref(other)])[UID_B].error
    assert "did not start a daemon for namespace team-b within 2 s" in error, error
    assert "its daemon serves namespace" in error


def test_a_supervisor_from_before_trust_domains_refuses_mps_shares(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    write_status(e.settings.mps_root, trust_domains=False)
    error = e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])[UID_A].error
    assert "predates trust domains" in error and "delete that pod" in error, error


def test_with_cluster_scope_every_namespace_shares_the_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = make_env(tmp_path, monkeypatch, mps_gpus="0", mps_root=tmp_path / "mps", mps_trust_scope="cluster")
    write_status(e.settings.mps_root, domain="cluster")
    daemon = FakeDaemon(e.settings.mps_root)
    e.preparer = make_preparer(
        connection(refused_url()), e.settings, e.store, e.metrics, nodes=e.nodes,
        enforcement=EnforcementDetector.without_nvml(e.settings, GPUS, "no nvml"),
        mps=MpsShares(e.settings, MpsLimits(daemon)),
    )  # fmt: skip
    a = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    b = e.api.add(mps_claim(UID_B, "b", SHARE_B, "20Gi", 50, namespace="team-b"))
    results = e.preparer.prepare([ref(a), ref(b)])
    assert (results[UID_A].error, results[UID_B].error) == ("", "")
    assert {c.mps_trust_domain for c in e.checkpoint().claims.values()} == {"cluster"}
    assert daemon.ceiling == ("20480M", "50.0")


def test_the_claims_status_says_the_tier_the_grant_and_the_thread_percentage(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    assert e.preparer.wait_ready_writes(10)
    (patch,) = [p for p in e.api.status_patches if p["name"] == "a"]
    (entry,) = patch["body"]["status"]["devices"]
    (condition,) = [c for c in entry["conditions"] if c["type"] == "MemoryEnforcement"]
    assert (condition["status"], condition["reason"]) == ("True", "Mps")
    assert condition["message"].startswith("MPS limits: memory 10Gi, active threads 30 %; GPU memory and compute")
