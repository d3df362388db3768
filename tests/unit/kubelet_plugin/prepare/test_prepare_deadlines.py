"""A prepare's deadlines (kubelet_plugin/prepare/preparer.py, Deadlines): its claim reads wait out a throttling API
server (429 with Retry-After) past the API budget, within the kubelet's 45 s, and the time they took is taken off
the node lock's wait; a hung server still costs a read the API budget only. On virtual time where a wait is long
(the reader's API client's clock and sleep), against the fake API server (tests/unit/fake_apiserver.py)."""

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from api.kube_config import KubeConfig
from api.kube_rest import KubeConnection, KubeRest, claim_path
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import ClaimRef
from kubelet_plugin.core.settings import MAX_WAIT_S, READ_LOCK_SHARE_S
from kubelet_plugin.prepare.preparer import CallWindow
from kubelet_plugin.prepare.reader import ClaimReader
from tests.unit.api.test_kube_rest import VirtualTime
from tests.unit.fake_apiserver import FakeApiServer, serve, throttled
from tests.unit.kubelet_plugin.prepare.test_preparer_api import add, node, node_settings
from tests.unit.plugin_host import NS, SHARE_B, UID_A, UID_B, make_claim


@pytest.fixture
def api_server() -> Iterator[tuple[FakeApiServer, str]]:
    with serve() as running:
        yield running


def virtual_reader(host: str, budget: float = 10.0) -> tuple[ClaimReader, VirtualTime]:
    clock = VirtualTime()
    rest = KubeRest(
        KubeConnection(KubeConfig(server=host)), timeout=budget / 2, budget=budget, clock=clock.now, sleep=clock.sleep
    )
    return ClaimReader(rest, budget), clock


def test_the_window_keeps_the_lock_and_the_mps_switch_their_share(tmp_path: Path) -> None:
    plain = CallWindow.of(node_settings(tmp_path), 100.0)
    assert (plain.end, plain.lock_end, plain.reads_end) == (140.0, 140.0, 135.0)
    assert READ_LOCK_SHARE_S == 5.0 and MAX_WAIT_S == 40.0
    mps = CallWindow.of(node_settings(tmp_path, mps_gpus="all"), 100.0)
    assert (mps.end, mps.lock_end, mps.reads_end) == (140.0, 125.0, 120.0), "15 s for the MPS domain switch"
    short_lock = CallWindow.of(node_settings(tmp_path, node_lock_timeout_seconds=2), 100.0)
    assert short_lock.reads_end == 138.0
    assert CallWindow.lock_timeout(10.0, 140.0, 110.0) == 10.0, "reads within the API budget: the whole timeout"
    assert CallWindow.lock_timeout(10.0, 140.0, 135.5) == 4.5, "after throttled reads: what is left"
    assert CallWindow.lock_timeout(10.0, 140.0, 141.0) == 0.0


def test_every_setting_the_validator_allows_leaves_reads_within_the_api_budget_their_whole_lock_wait(
    tmp_path: Path,
) -> None:
    for api_s, lock_s, switch_s in ((10, 10, 15), (20, 10, 10), (5, 30, 5), (30, 1, 9)):
        settings = node_settings(
            tmp_path,
            api_timeout_seconds=api_s,
            node_lock_timeout_seconds=lock_s,
            mps_domain_switch_timeout_seconds=switch_s,
            mps_gpus="all",
        )
        window = CallWindow.of(settings, 0.0)
        assert window.reads_end >= api_s, "a read is never cut below the API budget"
        assert CallWindow.lock_timeout(lock_s, window.lock_end, api_s) == lock_s


def test_a_throttled_read_waits_as_asked_up_to_its_deadline(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    claim = add(api, make_claim(UID_A, "a"))
    reader, clock = virtual_reader(host)
    api.script[claim_path(NS, "a")] = [throttled("8")] * 4
    fetched = reader.read_all([claim], deadline=clock.now() + 35.0)
    assert not isinstance(fetched[UID_A], PrepareError), fetched[UID_A]
    assert clock.slept == [8.0] * 4, "32 s of waits asked, within the 35 s a prepare's reads may wait"

    api.script[claim_path(NS, "a")] = [throttled("8")] * 4
    failed = reader.read_all([claim])[UID_A]  # no deadline: the API budget only (recovery, at start)
    assert isinstance(failed, PrepareError) and failed.kind == ErrorKind.API_THROTTLED
    assert re.fullmatch(
        r"cannot read ResourceClaim team-a/a: throttled by the API server \(429 Too Many Requests; it asked to wait "
        r"8 s\); tried 2 times in 8\.\d s; the wait did not fit in the call's 10\.0 s; the kubelet retries",
        str(failed),
    ), failed


def test_a_hung_server_costs_each_read_its_api_budget_whatever_the_deadline(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    refs = [add(api, make_claim(UID_A, "a")), add(api, make_claim(UID_B, "b", device="gpu-1", share=SHARE_B))]
    api.hang.update(api.objects)
    reader = ClaimReader(KubeRest.bounded(KubeConnection(KubeConfig(server=host)), 1.0), 1.0)
    fetched = reader.read_all(refs, deadline=time.monotonic() + 35.0)
    for ref in refs:
        err = fetched[ref.uid]
        assert isinstance(err, PrepareError) and err.kind == ErrorKind.API_TIMEOUT
        assert "did not answer within 0.5 s; tried 2 times in " in str(err), "its own two attempts, not 35 s"
        assert "throttled" not in str(err)


class SteppedClock:
    """``time.monotonic`` plus `skip` seconds once `step` was called: a prepare whose reads took that long."""

    def __init__(self) -> None:
        self.skip = 0.0
        self.read: list[float] = []

    def now(self) -> float:
        value = time.monotonic() + self.skip
        self.read.append(value)
        return value


def wrap_reads(preparer: Any, after: Callable[[float | None], None]) -> None:
    real = preparer._reader.read_all

    def read_all(claims: list[ClaimRef], deadline: float | None = None) -> Any:
        fetched = real(claims, deadline)
        after(deadline)
        return fetched

    preparer._reader.read_all = read_all


def test_the_reads_get_the_calls_deadline_and_their_time_is_taken_off_the_lock_wait(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    clock = SteppedClock()
    plugin = node(tmp_path, host)
    plugin.preparer._clock = clock.now
    deadlines: list[float | None] = []

    def reads_took_39_9_s(deadline: float | None) -> None:
        deadlines.append(deadline)
        clock.skip = 39.9

    wrap_reads(plugin.preparer, reads_took_39_9_s)
    claim = add(api, make_claim(UID_A, "a"))
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with plugin.preparer.node_lock.hold():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        held.wait(10)
        results = plugin.preparer.prepare([claim])
    finally:
        release.set()
        holder.join(30)
    assert deadlines == [clock.read[0] + 35.0], "the reads may wait until 35 s after the call began"
    assert re.fullmatch(  # 40 s less the 39.9 s the reads took, not its 10 s
        r"another call of this fracgpu plugin held the node lock for 0\.\d+ s; the kubelet retries",
        results[UID_A].error,
    ), results[UID_A].error

    clock.skip = 0.0
    deadlines.clear()
    results = plugin.preparer.prepare([claim])
    assert results[UID_A].error == "", "the lock is free: taken at once even with only 0.1 s left"
