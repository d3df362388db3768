"""Unit tests of the controller's work loops with an in-memory writer (controller/reconciler.py)."""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from api.kube_rest import ApiError
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import GiB
from controller.ledger import ExistingGpu
from controller.model import ClaimView, SliceView, claim_view, slice_view
from controller.reconciler import REASON_DEVICE_GONE, REASON_UNSATISFIABLE, Controller, EventPostError, describe
from controller.settings import Settings
from tests.unit.test_controller_model import NODE, claim, memory_request, result, slices


class FakeWriter:
    """Records writes; `fail` makes the next calls raise the given errors in turn.

    `event_results` makes the next Event posts answer these results in turn (True: posted).
    """

    def __init__(self) -> None:
        self.claims: list[tuple[str, str, dict[str, Any]]] = []
        self.gpus: list[tuple[str, bool]] = []
        self.gpu_status: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        self.event_attempts: list[tuple[str, ...]] = []
        self.event_results: list[bool] = []
        self.fail: list[Exception] = []

    def _maybe_fail(self) -> None:
        if self.fail:
            raise self.fail.pop(0)

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._maybe_fail()
        self.claims.append((namespace, name, body))

    def apply_gpu(self, body: dict[str, Any], *, status: bool) -> None:
        self._maybe_fail()
        self.gpus.append((body["metadata"]["name"], status))
        if status:
            self.gpu_status[body["metadata"]["name"]] = body["status"]

    def delete_gpu(self, name: str) -> None:
        self._maybe_fail()
        self.deleted.append(name)

    def post_claim_event(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        self.event_attempts.append((claim.uid, *key))
        if self.event_results and not self.event_results.pop(0):
            return False
        self.events.append((claim.name, reason, message))
        return True


class World:
    """kopf-shaped indexes (key -> list of values) the tests edit directly."""

    def __init__(self, gpu_count: int = 2) -> None:
        self.slices: dict[str, list[SliceView]] = {}
        self.claims: dict[tuple[str, str], list[ClaimView]] = {}
        self.gpus: dict[str, list[ExistingGpu]] = {}
        self.publish(gpu_count)

    def publish(self, count: int, generation: int = 1) -> None:
        self.slices.clear()
        for body in slices(count=count, generation=generation):
            view = slice_view(body, DRIVER_NAME)
            assert view is not None
            self.slices[view.name] = [view]

    def put(self, body: dict[str, Any]) -> tuple[str, str]:
        view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
        assert view is not None
        self.claims[view.key] = [view]
        return view.key


def run(test: Callable[[Controller, World, FakeWriter], Coroutine[Any, Any, None]], **settings: Any) -> None:
    async def main() -> None:
        writer = FakeWriter()
        world = World()
        controller = Controller(Settings(**{"ledger_delay_seconds": 0.0, **settings}), writer)
        controller.bind(world.slices, world.claims, world.gpus)
        try:
            await test(controller, world, writer)
        finally:
            await controller.stop()

    asyncio.run(main())


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_status_is_written_once_and_not_again_when_unchanged() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        key = world.put(claim(results=[result("a", "gpu-1", "10Gi", "s-1")]))
        await controller.reconcile_claim(key)
        assert len(writer.claims) == 1
        namespace, name, body = writer.claims[0]
        assert (namespace, name) == key
        # the watch brings back what was written (plus the node plugin's condition): nothing to do
        entries = [{**e, "conditions": [{"type": "Ready", "status": "True"}]} for e in body["status"]["devices"]]
        world.put(claim(results=[result("a", "gpu-1", "10Gi", "s-1")], devices_status=entries))
        await controller.reconcile_claim(key)
        await controller.reconcile_claim(("ns", "gone"))
        assert len(writer.claims) == 1

    run(test)


def test_failed_writes_are_retried_and_gone_claims_are_not() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        writer.fail = [ApiError(status=500, reason="boom")]
        key = world.put(claim(results=[result("a", "gpu-0", "1Gi", "s-1")]))
        controller.claim_changed(key)
        await eventually(lambda: len(writer.claims) == 1)
        writer.fail = [ApiError(status=404, reason="gone")]
        other = world.put(claim("other", results=[result("a", "gpu-0", "1Gi", "s-2")]))
        controller.claim_changed(other)
        await asyncio.sleep(1.0)  # longer than the first retry delay
        assert [name for _, name, _ in writer.claims] == ["c1"]

    run(test)


def test_slice_changes_recheck_every_claim_with_fresh_devices() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        key = world.put(claim(results=[result("a", "gpu-3", "1Gi", "s-1")]))
        controller.claim_changed(key)
        await asyncio.sleep(0.1)
        assert not writer.claims, "gpu-3 is not published yet"
        world.publish(4, generation=2)
        controller.slices_changed()
        await eventually(lambda: len(writer.claims) == 1)
        assert writer.claims[0][2]["status"]["devices"][0]["data"]["index"] == 3

    run(test)


def test_vanished_device_is_reported_once_after_the_grace_period() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        key = world.put(claim(results=[result("a", "gpu-1", "1Gi", "s-1")]))
        world.publish(1, generation=2)
        controller.slices_changed()
        await asyncio.sleep(0.1)
        assert not writer.events, "still within the grace period"
        await eventually(lambda: len(writer.events) == 1)
        name, reason, message = writer.events[0]
        assert (name, reason) == ("c1", REASON_DEVICE_GONE)
        assert "gpu-1" in message and NODE in message and "no longer exists" in message
        controller.claim_changed(key)
        await asyncio.sleep(0.4)
        assert len(writer.events) == 1, "posted once per claim and device"

    run(test, device_gone_grace_seconds=0.3)


def test_a_device_back_within_the_grace_period_is_not_reported() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        world.put(claim(results=[result("a", "gpu-1", "1Gi", "s-1")]))
        world.publish(1, generation=2)
        controller.slices_changed()
        await asyncio.sleep(0.05)
        world.publish(2, generation=3)
        controller.slices_changed()
        await asyncio.sleep(0.5)
        assert not writer.events

    run(test, device_gone_grace_seconds=0.3)


def test_a_pending_claim_no_gpu_can_satisfy_gets_one_event() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        big = world.put(claim("big", requests=[memory_request("gpu", "100Gi")]))
        fits = world.put(claim("fits", requests=[memory_request("gpu", "80Gi")]))
        for key in (big, fits, big):
            await controller.reconcile_claim(key)
        assert [(n, r) for n, r, _ in writer.events] == [("big", REASON_UNSATISFIABLE)]
        assert "largest GPU has 80Gi" in writer.events[0][2] and "100Gi" in writer.events[0][2]
        controller.claim_deleted("uid-big")
        await controller.reconcile_claim(big)
        assert len(writer.events) == 2, "a new claim of the same name is told again"

    run(test)


def test_no_unsatisfiable_event_without_published_gpus() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.slices.clear()
        controller.slices_changed()
        await controller.reconcile_claim(world.put(claim("big", requests=[memory_request("gpu", "100Gi")])))
        assert controller.largest_request() is None and not writer.events

    run(test)


def test_ledger_creates_updates_and_deletes_objects() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        assert await controller.reconcile_ledger()
        names = [f"{NODE}-gpu-0", f"{NODE}-gpu-1"]
        assert sorted(writer.gpus) == sorted([(n, False) for n in names] + [(n, True) for n in names])
        assert writer.gpus.index((names[0], False)) < writer.gpus.index((names[0], True)), "create before status"
        # an object of a device that vanished
        stale = ExistingGpu(name=f"{NODE}-gpu-9", labels={}, spec={"driver": DRIVER_NAME}, status={})
        world.gpus[stale.name] = [stale]
        writer.gpus.clear()
        assert await controller.reconcile_ledger()
        assert writer.deleted == [stale.name]

    run(test)


def test_ledger_reports_failed_writes() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        writer.fail = [ApiError(status=403, reason="forbidden")]
        assert not await controller.reconcile_ledger()
        assert await controller.reconcile_ledger()

    run(test)


def test_ledger_loop_follows_changes() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        key = world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        controller.claim_changed(key)
        await eventually(lambda: (f"{NODE}-gpu-0", True) in writer.gpus)
        assert controller.ready.is_set()

    run(test)


def test_admin_access_is_not_counted_in_the_ledger() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.put(claim("mon", results=[{**result("mon", "gpu-0", None, None), "adminAccess": True}]))
        world.put(claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1")]))
        assert await controller.reconcile_ledger()
        status = writer.gpu_status[f"{NODE}-gpu-0"]
        assert (status["allocatedMemory"], status["freeMemory"], status["shares"]) == ("10Gi", "70Gi", 2)

    run(test)


def test_a_failed_event_post_is_retried_and_remembered_only_once_posted() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        big = world.put(claim("big", requests=[memory_request("gpu", "100Gi")]))
        writer.event_results = [False]
        with pytest.raises(EventPostError):
            await controller.reconcile_claim(big)
        assert not writer.events
        await controller.reconcile_claim(big)
        await controller.reconcile_claim(big)
        assert [r for _, r, _ in writer.events] == [REASON_UNSATISFIABLE]
        assert len(writer.event_attempts) == 2 and writer.event_attempts[0] == writer.event_attempts[1]
        assert writer.event_attempts[0][:2] == ("uid-big", REASON_UNSATISFIABLE), "keyed by claim uid and reason"

    run(test)


def test_failed_event_posts_are_retried_by_the_workers() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        writer.event_results = [False]
        controller.claim_changed(world.put(claim("big", requests=[memory_request("gpu", "100Gi")])))
        await eventually(lambda: len(writer.events) == 1)
        assert len(writer.event_attempts) == 2

    run(test)


def test_unchanged_slices_do_not_recheck_claims_or_the_ledger() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.put(claim(results=[result("a", "gpu-0", "1Gi", "s-1")]))
        controller.slices_changed()
        assert controller._queue.qsize() == 1 and controller._ledger_dirty.is_set()
        controller._queue.get_nowait()
        controller._queued.clear()
        controller._ledger_dirty.clear()
        for _ in range(3):  # a re-list delivers every slice again
            controller.slices_changed()
        assert controller._queue.qsize() == 0 and not controller._ledger_dirty.is_set()
        world.publish(4, generation=2)
        controller.slices_changed()
        assert controller._queue.qsize() == 1 and controller._ledger_dirty.is_set()

    run(test)


def test_the_largest_request_is_cached_with_the_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.slices_changed()
        assert controller.largest_request() == 80 * GiB

        def no_scan(self: Controller) -> dict[Any, Any]:
            raise AssertionError("largest_request must not scan the devices")

        monkeypatch.setattr(Controller, "devices", no_scan)
        assert controller.largest_request() == 80 * GiB
        monkeypatch.undo()
        world.slices.clear()
        for body in slices(count=1, generation=2, memory_gib=40):
            view = slice_view(body, DRIVER_NAME)
            assert view is not None
            world.slices[view.name] = [view]
        controller.slices_changed()
        assert controller.largest_request() == 40 * GiB

    run(test)


def test_failures_are_described_by_the_api_servers_message() -> None:
    err = ApiError(status=422, reason="Unprocessable Entity")
    err.body = '{"kind":"Status","message":"changing status.devices requires resource=resourceclaims/driver"}'
    assert describe(err) == "422 changing status.devices requires resource=resourceclaims/driver"
    assert describe(ApiError(status=500, reason="boom")) == "500 boom"
    assert describe(TimeoutError("slow")) == "TimeoutError: slow"
