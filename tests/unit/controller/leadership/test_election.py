"""Unit tests of leader election on a Lease (controller/leadership/election.py) and of the write gate
(controller/leadership/gate.py), on a fake clock and an in-memory API with the API server's write semantics."""

import asyncio
import datetime
import threading
from typing import Any

import pytest

from api.kube_errors import api_error
from controller.core.settings import Settings
from controller.leadership.election import LEASES, LeaderElector, LeaseTimings
from controller.leadership.gate import GatedWriter, Leadership, NotLeaderError
from controller.loops import Controller
from tests.unit.controller_factories import FakeWriter, World, claim, eventually, result
from tests.unit.fake_objects import FakeObjects

TIMINGS = LeaseTimings(duration=15.0, renew_deadline=10.0, retry_period=2.0)
PATH = f"{LEASES.format(namespace='ns')}/lead"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Candidate:
    """An elector with recorded leadership changes."""

    def __init__(self, api: FakeObjects, identity: str, clock: Clock) -> None:
        self.changes: list[str] = []

        async def started(lease: dict[str, Any]) -> None:
            self.changes.append("started")

        async def stopped() -> None:
            self.changes.append("stopped")

        self.elector = LeaderElector(
            api,
            "ns",
            "lead",
            identity,
            TIMINGS,
            on_started=started,
            on_stopped=stopped,
            clock=clock,
            wall=lambda: datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        )


def test_timings_must_leave_room_for_a_renew_before_the_lease_runs_out() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaseTimings(duration=10.0, renew_deadline=10.0, retry_period=2.0)


def test_one_candidate_leads_and_the_other_takes_over_only_after_a_lease_duration_of_silence() -> None:
    async def main() -> None:
        api, clock = FakeObjects(), Clock()
        a, b = Candidate(api, "pod-a", clock), Candidate(api, "pod-b", clock)
        await a.elector.step()  # no Lease yet: created, held by a
        await b.elector.step()
        assert a.elector.is_leader() and not b.elector.is_leader()
        assert api.objects[PATH]["spec"]["holderIdentity"] == "pod-a"
        assert (a.changes, b.changes) == (["started"], [])
        for _ in range(3):  # a renews, b keeps seeing fresh records
            clock.now += TIMINGS.retry_period
            await a.elector.step()
            await b.elector.step()
        assert a.elector.is_leader() and not b.elector.is_leader()
        last_renew = clock.now  # a's last renew started here, and b saw its record here
        api.fail = [api_error(503, "Unavailable")] * 100  # a can no longer renew
        clock.now = last_renew + TIMINGS.renew_deadline - 0.1
        assert a.elector.is_leader()
        clock.now += 0.2
        assert not a.elector.is_leader(), "leads past the renew deadline without renewing"
        await a.elector.step()
        assert a.changes == ["started", "stopped"]
        api.fail = []
        clock.now = last_renew + TIMINGS.duration - 0.1
        await b.elector.step()
        assert not b.elector.is_leader(), "took the Lease before it could have run out"
        clock.now += 0.2
        await b.elector.step()
        assert b.elector.is_leader() and b.changes == ["started"]
        spec = api.objects[PATH]["spec"]
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("pod-b", 1)
        await a.elector.step()  # a comes back: b holds a valid Lease
        assert not a.elector.is_leader() and a.changes == ["started", "stopped"]

    asyncio.run(main())


def test_of_two_candidates_taking_an_expired_lease_at_once_exactly_one_wins() -> None:
    async def main() -> None:
        api, clock = FakeObjects(), Clock()
        old = Candidate(api, "pod-old", clock)
        await old.elector.step()
        a, b = Candidate(api, "pod-a", clock), Candidate(api, "pod-b", clock)
        await a.elector.step()
        await b.elector.step()
        clock.now += TIMINGS.duration + 1  # pod-old is gone
        both_read = threading.Barrier(2, timeout=5)

        def meet() -> None:  # each reads the expired Lease before either writes
            both_read.wait()

        api.before_get = meet
        await asyncio.gather(a.elector.step(), b.elector.step())
        api.before_get = None
        leaders = [c for c in (a, b) if c.elector.is_leader()]
        assert len(leaders) == 1
        assert api.objects[PATH]["spec"]["holderIdentity"] == leaders[0].elector.identity

    asyncio.run(main())


def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    async def main() -> None:
        api, clock = FakeObjects(), Clock()
        a = Candidate(api, "pod-a", clock)
        await a.elector.step()
        api.edit(PATH, lambda lease: lease["spec"].update(holderIdentity="pod-x"))
        clock.now += TIMINGS.retry_period
        await a.elector.step()
        assert not a.elector.is_leader() and a.changes == ["started", "stopped"]

    asyncio.run(main())


def test_shutdown_stops_leading_before_it_releases_the_lease_and_a_follower_takes_it_at_once() -> None:
    async def main() -> None:
        api, clock = FakeObjects(), Clock()
        a, b = Candidate(api, "pod-a", clock), Candidate(api, "pod-b", clock)
        holders_at_stop: list[Any] = []

        async def stopped() -> None:
            holders_at_stop.append(api.objects[PATH]["spec"]["holderIdentity"])

        a.elector._on_stopped = stopped
        task = asyncio.create_task(a.elector.run())
        await eventually(a.elector.is_leader)
        await b.elector.step()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert holders_at_stop == ["pod-a"], "released the Lease before stopping its work"
        assert api.objects[PATH]["spec"]["holderIdentity"] is None
        clock.now += TIMINGS.retry_period  # far less than a lease duration
        await b.elector.step()
        assert b.elector.is_leader()

    asyncio.run(main())


def test_the_gate_refuses_writes_once_the_renew_deadline_passed_even_before_the_loop_notices() -> None:
    async def main() -> None:
        api, clock = FakeObjects(), Clock()
        a = Candidate(api, "pod-a", clock)
        inner = FakeWriter()
        gated = GatedWriter(inner, a.elector)
        with pytest.raises(NotLeaderError):
            gated.apply_claim_status("ns", "c", {})
        await a.elector.step()
        gated.apply_claim_status("ns", "c", {})
        gated.apply_gpu({"metadata": {"name": "g"}}, status=False)
        clock.now += TIMINGS.renew_deadline
        with pytest.raises(NotLeaderError):
            gated.apply_claim_status("ns", "c2", {})
        with pytest.raises(NotLeaderError):
            gated.delete_gpu("g")
        assert [n for _, n, _ in inner.claims] == ["c"] and inner.deleted == []

    asyncio.run(main())


def test_a_new_leader_resyncs_every_claim_and_a_deposed_one_writes_nothing_more() -> None:
    async def main() -> None:
        api, clock = FakeObjects(), Clock()
        world, inner = World(), FakeWriter()
        keys = [world.put(claim(f"c{i}", results=[result("a", "gpu-0", "1Gi", f"s-{i}")])) for i in range(3)]
        elector = Candidate(api, "pod-a", clock).elector
        controller = Controller(Settings(ledger_delay_seconds=0.0), GatedWriter(inner, elector))
        controller.bind(world.slices, world.claims, world.gpus)
        for key in keys:  # a follower sees the claims (its caches are warm) but writes nothing
            controller.claim_changed(key)
        leadership = Leadership(controller, elector)
        elector._on_started, elector._on_stopped = leadership.started, leadership.stopped
        await asyncio.sleep(0.2)
        assert inner.claims == [] and inner.gpus == []
        await elector.step()
        await eventually(lambda: len(inner.claims) == 3 and len(inner.gpu_status) == 2)
        api.edit(PATH, lambda lease: lease["spec"].update(holderIdentity="pod-b"))
        await elector.step()
        assert not leadership.leading
        written = len(inner.claims)
        key = world.put(claim("c-late", results=[result("a", "gpu-1", "1Gi", "s-9")]))
        controller.claim_changed(key)
        await asyncio.sleep(0.3)
        assert len(inner.claims) == written, "wrote claim status after losing leadership"
        # leading again: a full resync, the new claim included, from the indexes alone
        api.edit(PATH, lambda lease: lease["spec"].update(holderIdentity=None))
        clock.now += TIMINGS.retry_period
        inner.claims.clear()
        await elector.step()
        await eventually(lambda: {n for _, n, _ in inner.claims} == {"c0", "c1", "c2", "c-late"})
        await controller.stop()

    asyncio.run(main())
