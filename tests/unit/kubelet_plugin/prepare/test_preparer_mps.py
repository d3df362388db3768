"""Unit tests of the MPS GPUs' ceilings in the Preparer (kubelet_plugin/prepare/preparer.py with
kubelet_plugin/prepare/mps_ceiling.py): raised to the largest grant and percentage before a new share's files are
written, refused when the daemon does not take it, lowered after an unprepare, set again on demand. The daemon
is a recording fake of MpsControl; the integration tier runs the real call against the mock driver's daemon."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from api.names import DRIVER_NAME
from kubelet_plugin.enforcement import mps
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.prepare import cdi
from kubelet_plugin.prepare.mps_ceiling import MpsControl, MpsControlError, ceiling
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


class Daemon(MpsControl):
    """Records the ceilings it was given (uuid -> (MiB, %)); `down` makes it refuse like an absent daemon."""

    def __init__(self) -> None:
        self.ceilings: dict[str, tuple[int, int]] = {}
        self.calls = 0
        self.down = False

    def apply(self, uuid: str, memory_mib: int, percentage: int) -> None:
        self.calls += 1
        if self.down:
            raise MpsControlError(
                "nvidia-cuda-mps-control answered 'set_default_device_pinned_mem_limit' with status 1"
            )
        self.ceilings[uuid] = (memory_mib, percentage)


def mps_claim(uid: str, name: str, share: str, memory: str, percent: int | None) -> dict[str, object]:
    claim = make_claim(uid, name, share=share, memory=memory)
    if percent is not None:
        parameters = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": percent}
        claim["status"]["allocation"]["devices"]["config"] = [
            {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
        ]
    return claim


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Env, Daemon]:
    e = make_env(tmp_path, monkeypatch, mps_gpus="0", mps_root=tmp_path / "mps")
    path = mps.status_path(e.settings.mps_root, UUID0)
    path.parent.mkdir(parents=True)
    path.write_bytes(
        mps.DaemonStatus(uuid=UUID0, state="running", updated=time.time() + 3600, refresh_seconds=5).to_json()
    )
    daemon = Daemon()
    detector = EnforcementDetector.without_nvml(e.settings, GPUS, "no nvml")
    e.preparer = make_preparer(
        connection(refused_url()), e.settings, e.store, e.metrics, nodes=e.nodes, enforcement=detector,
        mps_control=daemon,
    )  # fmt: skip
    return e, daemon


def test_the_ceiling_follows_the_largest_grant_and_percentage_on_the_gpu(env: tuple[Env, Daemon]) -> None:
    e, daemon = env
    small = e.api.add(mps_claim(UID_A, "small", SHARE_A, "10Gi", 30))
    big = e.api.add(mps_claim(UID_B, "big", SHARE_B, "20Gi", 50))
    assert e.preparer.prepare([ref(small)])[UID_A].error == ""
    assert daemon.ceilings == {UUID0: (10240, 30)}
    assert e.preparer.prepare([ref(big)])[UID_B].error == ""
    assert daemon.ceilings == {UUID0: (20480, 50)}
    assert e.preparer.unprepare([ref(big)]) == {UID_B: ""}
    assert daemon.ceilings == {UUID0: (10240, 30)}, "lowered to the remaining share's"
    daemon.ceilings.clear()
    e.preparer.refresh_mps_ceiling(UUID0)  # the daemon came back without one
    assert daemon.ceilings == {UUID0: (10240, 30)}


def test_a_share_without_a_percentage_lifts_the_thread_ceiling(env: tuple[Env, Daemon]) -> None:
    e, daemon = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_B, "b", SHARE_B, "4Gi", None)))])
    assert daemon.ceilings == {UUID0: (10240, 100)}
    assert ceiling([]) is None


def test_a_daemon_that_refuses_the_ceiling_refuses_the_share_before_any_file(env: tuple[Env, Daemon]) -> None:
    e, daemon = env
    daemon.down = True
    result = e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])[UID_A]
    assert "did not take the ceiling 10240 MiB / 30 %" in result.error and "status 1" in result.error
    assert not cdi.spec_path(e.settings.cdi_dir, DRIVER_NAME, UID_A).exists()
    assert UID_A not in e.checkpoint().claims


def test_a_ceiling_the_same_daemon_already_has_is_not_sent_again(env: tuple[Env, Daemon]) -> None:
    e, daemon = env

    def daemon_pid(pid: int) -> None:
        status = mps.DaemonStatus(uuid=UUID0, state="running", pid=pid, updated=time.time() + 3600, refresh_seconds=5)
        mps.status_path(e.settings.mps_root, UUID0).write_bytes(status.to_json())

    daemon_pid(4242)
    claim = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    e.preparer.prepare([ref(claim)])
    e.preparer.unprepare([ref(claim)])
    e.preparer.prepare([ref(claim)])
    assert daemon.calls == 1, "prepare, unprepare (no share left) and the same prepare again: one command"
    daemon_pid(4343)  # the supervisor restarted the daemon: it has no ceiling
    e.preparer.unprepare([ref(claim)])
    e.preparer.prepare([ref(claim)])
    assert daemon.calls == 2 and daemon.ceilings == {UUID0: (10240, 30)}


def test_the_claims_status_says_the_tier_the_grant_and_the_thread_percentage(env: tuple[Env, Daemon]) -> None:
    e, _ = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    assert e.preparer.wait_ready_writes(10)
    (patch,) = [p for p in e.api.status_patches if p["name"] == "a"]
    (entry,) = patch["body"]["status"]["devices"]
    (condition,) = [c for c in entry["conditions"] if c["type"] == "MemoryEnforcement"]
    assert (condition["status"], condition["reason"]) == ("True", "Mps")
    assert condition["message"].startswith("MPS limits: memory 10Gi, active threads 30 %; GPU memory and compute")
