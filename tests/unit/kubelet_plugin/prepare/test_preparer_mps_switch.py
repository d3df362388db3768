"""Unit tests of an MPS GPU's trust-domain switch in the Preparer (kubelet_plugin/prepare/preparer.py with
kubelet_plugin/kinds/mps/shares.py): the switch is asked for under the node lock, waited for without it, and the
claim completed under the lock again. Other prepares go on meanwhile; the waiting claim's checkpoint entry holds
its GPU for its domain, so another domain is refused; an unprepare, a restarted plugin's recovery and a second call
for the same claim during the wait leave nothing inconsistent.

The supervisor is `FakeSupervisor` (``mps_host``): it switches only when the test lets it, so each test decides
what happens during the wait without timing anything."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from api.names import DRIVER_NAME
from kubelet_plugin.core.model import PrepareResult
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.kinds.mps.limits import MpsLimits
from kubelet_plugin.prepare.journal import NodeLock, NodeLockTimeoutError
from kubelet_plugin.state import cdi
from kubelet_plugin.state import mps_files as mps
from kubelet_plugin.state.checkpoint import Checkpoint
from tests.unit.kubelet_plugin.prepare.mps_host import (
    FakeSupervisor,
    WatchedShares,
    mps_claim,
    mps_env,
    write_status,
)
from tests.unit.plugin_host import SHARE_A, SHARE_B, UID_A, UID_B, UID_C, UUID0, make_claim, ref

TEAM_B = "namespace/team-b"


def in_thread(call: Callable[[], dict[str, PrepareResult]]) -> tuple[threading.Thread, dict[str, PrepareResult]]:
    results: dict[str, PrepareResult] = {}
    thread = threading.Thread(target=lambda: results.update(call()))
    thread.start()
    return thread, results


class Switching:
    """A Preparer whose GPU 0 serves team-a, with a supervisor that switches it when `release` is set, and a claim
    of team-b (`claim`, UID_B) whose prepare runs on a thread of its own (`start`)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: float) -> None:
        made: list[WatchedShares] = []

        def shares(s: Settings, limits: MpsLimits) -> WatchedShares:
            made.append(WatchedShares(s, limits))
            return made[-1]

        self.env, self.daemon = mps_env(
            tmp_path, monkeypatch, shares=shares, **{"mps_domain_switch_timeout_seconds": 20, **settings}
        )
        self.shares = made[0]
        self.release = threading.Event()
        self.supervisor = FakeSupervisor(self.env.settings.mps_root, self.release)
        self.claim = self.env.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
        self.threads: list[threading.Thread] = []

    def start(self) -> dict[str, PrepareResult]:
        """Prepare the team-b claim on a thread; its answer lands in the dict returned once the thread ends."""
        thread, results = in_thread(lambda: self.env.preparer.prepare([ref(self.claim)]))
        self.threads.append(thread)
        return results

    def finish(self) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(30)
        self.supervisor.stop()

    def checkpoint(self) -> Checkpoint:
        return self.env.checkpoint()


@pytest.fixture
def switching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Switching]:
    s = Switching(tmp_path, monkeypatch, node_lock_timeout_seconds=2)
    yield s
    s.finish()


def test_a_slow_domain_switch_on_one_gpu_does_not_fail_a_prepare_on_another_on_the_node_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU 0's daemon is switched to team-b for a claim, and the supervisor takes its time (here: until the test
    lets it, after the other prepare answered). A prepare on GPU 1 meanwhile gets the node lock (whose timeout,
    2 s, the switch outlasts) and succeeds; the switching claim is prepared once its domain is served. (Before the
    wait left the lock, the prepare on GPU 1 failed: "another call of this fracgpu plugin held the node lock".)"""
    e, _ = mps_env(tmp_path, monkeypatch, node_lock_timeout_seconds=2, mps_domain_switch_timeout_seconds=20)
    release = threading.Event()
    supervisor = FakeSupervisor(e.settings.mps_root, release)
    switching = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    elsewhere = e.api.add(make_claim(UID_C, "c", device="gpu-1"))
    thread, results = in_thread(lambda: e.preparer.prepare([ref(switching)]))
    try:
        assert supervisor.asked.wait(10), "the switch was asked for"
        other = e.preparer.prepare([ref(elsewhere)])[UID_C]
    finally:
        release.set()
        thread.join(30)
        supervisor.stop()
    assert other.error == "", other.error
    assert results[UID_B].error == "", results[UID_B].error
    assert supervisor.switches == [TEAM_B]
    assert e.spec_file(UID_B).is_file() and e.spec_file(UID_C).is_file()


def test_while_the_switch_is_pending_the_waiting_entry_holds_the_gpu_and_another_domain_is_refused(
    switching: Switching,
) -> None:
    e = switching.env
    results = switching.start()
    assert switching.shares.wait_for(1), "the claim waits"
    entry = switching.checkpoint().claims[UID_B]
    assert (entry.state, entry.mps_trust_domain, [d.uuid for d in entry.devices]) == (
        "PrepareStarted", TEAM_B, [UUID0]
    )  # fmt: skip
    assert entry.mps_switch_until is not None and entry.mps_switch_until > time.time()
    assert not e.spec_file(UID_B).exists(), "no files before the daemon serves the domain"
    intruder = e.api.add(mps_claim(UID_C, "c", SHARE_A, "10Gi", 30, namespace="team-c"))
    error = e.preparer.prepare([ref(intruder)])[UID_C].error
    assert "whose daemon is being switched to namespace team-b (claim team-b/b)" in error, error
    assert "this claim belongs to namespace team-c" in error
    assert mps.read_tenant(e.settings.mps_root, UUID0) == mps.TenantRequest(domain=TEAM_B), "not asked for team-c"
    assert UID_C not in switching.checkpoint().claims
    switching.finish()
    assert results[UID_B].error == "", results[UID_B].error
    done = switching.checkpoint().claims[UID_B]
    assert (done.state, done.mps_trust_domain, done.mps_switch_until) == ("PrepareCompleted", TEAM_B, None)
    assert e.spec_file(UID_B).is_file() and switching.daemon.ceiling == ("10240M", "30.0")
    assert switching.supervisor.switches == [TEAM_B]


def test_an_unprepare_during_the_wait_makes_the_prepare_fail_and_leave_nothing(switching: Switching) -> None:
    e = switching.env
    results = switching.start()
    assert switching.shares.wait_for(1)
    assert e.preparer.unprepare([ref(switching.claim)]) == {UID_B: ""}
    switching.finish()
    error = results[UID_B].error
    assert "claim team-b/b lost its checkpoint entry (it was unprepared" in error, error
    assert UID_B not in switching.checkpoint().claims
    assert not e.spec_file(UID_B).exists()


def test_a_plugin_restarted_during_the_wait_drops_the_waiting_entry_and_the_first_prepare_fails(
    switching: Switching,
) -> None:
    """What a crash during the wait leaves, a waiting entry without files, is what recovery drops; here a new
    instance recovers while the first still waits, which then finds its entry gone and answers an error (the
    kubelet retries)."""
    e = switching.env
    results = switching.start()
    assert switching.shares.wait_for(1)
    e.new_preparer().recover()
    assert UID_B not in switching.checkpoint().claims
    switching.finish()
    assert "lost its checkpoint entry" in results[UID_B].error, results[UID_B].error
    assert UID_B not in switching.checkpoint().claims and not e.spec_file(UID_B).exists()


def test_a_second_call_for_the_waiting_claim_waits_too_and_the_switch_is_asked_for_once(switching: Switching) -> None:
    """The kubelet's retry of the claim while the first call waits: it asks for nothing again (the tenant request is
    the same file), neither call answers before the daemon serves team-b, both answer the claim prepared, once in
    the checkpoint."""
    e = switching.env
    first = switching.start()
    assert switching.shares.wait_for(1)
    tenant = mps.tenant_path(e.settings.mps_root, UUID0)
    asked = tenant.stat().st_ino
    second = switching.start()
    assert switching.shares.wait_for(2), "the second call waits too"
    assert tenant.stat().st_ino == asked, "the tenant request was not written again"
    assert all(t.is_alive() for t in switching.threads), "no answer before the daemon serves the domain"
    switching.finish()
    assert (first[UID_B].error, second[UID_B].error) == ("", "")
    assert first[UID_B].devices == second[UID_B].devices
    assert switching.supervisor.switches == [TEAM_B]
    assert switching.checkpoint().claims[UID_B].state == "PrepareCompleted"
    assert e.spec_file(UID_B).is_file()


def test_a_failure_after_the_wait_undoes_the_claim_and_gives_its_entry_back(switching: Switching) -> None:
    """The daemon of the new domain refuses the ceiling: the claim's files are not kept and its waiting entry goes,
    so the GPU is held by no one."""
    e = switching.env
    results = switching.start()
    assert switching.shares.wait_for(1)
    switching.daemon.refuse = True
    switching.finish()
    assert "did not take the ceiling 10240 MiB / 30 %" in results[UID_B].error, results[UID_B].error
    assert UID_B not in switching.checkpoint().claims
    assert not cdi.spec_path(e.settings.cdi_dir, DRIVER_NAME, UID_B).exists()


def test_a_switch_that_is_not_made_in_time_gives_the_entry_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e, _ = mps_env(tmp_path, monkeypatch, mps_domain_switch_timeout_seconds=0.3)
    claim = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    error = e.preparer.prepare([ref(claim)])[UID_B].error
    assert "did not start a daemon for namespace team-b within 0.3 s" in error, error
    assert UID_B not in e.checkpoint().claims


def test_a_prepared_claim_whose_daemon_lost_its_domain_keeps_its_entry_while_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prepared claim (its containers may run) whose GPU's daemon came back without a domain: its repeat prepare
    asks for the domain and waits with its own entry, which stays (and its files) whatever the wait comes to."""
    e, _ = mps_env(tmp_path, monkeypatch, mps_domain_switch_timeout_seconds=0.3)
    claim = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    assert e.preparer.prepare([ref(claim)])[UID_A].error == ""
    entry = e.checkpoint().claims[UID_A]
    write_status(e.settings.mps_root, domain=None)  # the supervisor restarted the daemon, no domain yet
    error = e.preparer.prepare([ref(claim)])[UID_A].error
    assert "did not start a daemon for namespace team-a" in error, error
    assert e.checkpoint().claims[UID_A] == entry and e.spec_file(UID_A).is_file()


@pytest.mark.parametrize(("until", "refused"), [(3600.0, True), (-1.0, False)])
def test_a_waiting_entry_holds_its_gpu_only_until_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, until: float, refused: bool
) -> None:
    """A waiting entry whose prepare is gone (its time passed) holds no GPU: the next domain is asked for."""
    e, _ = mps_env(tmp_path, monkeypatch, mps_domain_switch_timeout_seconds=0.3)
    write_status(e.settings.mps_root, domain=TEAM_B)
    waiting = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    assert e.preparer.prepare([ref(waiting)])[UID_B].error == ""
    entry = e.checkpoint().claims[UID_B].waiting_until(time.time() + until)
    e.store.save(e.checkpoint().with_claim(UID_B, entry))
    other = e.api.add(mps_claim(UID_C, "c", SHARE_A, "10Gi", 30, namespace="team-c"))
    error = e.preparer.prepare([ref(other)])[UID_C].error
    assert ("whose daemon is being switched to namespace team-b" in error) is refused, error
    assert ("did not start a daemon for namespace team-c" in error) is not refused, error


def test_a_lock_not_had_again_after_the_switch_fails_the_call_and_the_kubelets_retry_prepares_the_claim(
    switching: Switching,
) -> None:
    """The switch is made, but another call holds the node lock longer than this one may wait for it (2 s here):
    the claim fails and its waiting entry stays (it could not be given back), so the GPU stays held for team-b;
    the retry finds the daemon serving team-b and prepares the claim at once."""
    e = switching.env
    results = switching.start()
    assert switching.shares.wait_for(1)
    with e.preparer.node_lock.hold():
        switching.release.set()
        switching.threads[0].join(30)
    error = results[UID_B].error
    assert error == "another call of this fracgpu plugin held the node lock for 2 s; the kubelet retries", error
    assert switching.checkpoint().claims[UID_B].state == "PrepareStarted"
    assert e.preparer.prepare([ref(switching.claim)])[UID_B].error == ""
    assert switching.checkpoint().claims[UID_B].state == "PrepareCompleted"
    assert switching.shares.waits == 1, "the retry did not wait"


def test_a_lock_wait_with_no_time_left_says_so(tmp_path: Path) -> None:
    lock = NodeLock(tmp_path / "serialize.lock", 10.0)
    with lock.hold(), pytest.raises(NodeLockTimeoutError) as err, lock.hold(timeout=0):
        pass
    assert str(err.value) == (
        "another call of this fracgpu plugin held the node lock when this call had no time left to wait for it; the "
        "kubelet retries"
    )
