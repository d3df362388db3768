"""Unit tests of the controller's managers through its entry (controller/loops.py) with an in-memory writer."""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from api.gpu import NODE_LABEL
from api.kube_errors import api_error
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME, MPS_DEVICE_CLASS_NAME
from api.quantity import GiB
from controller.core.claims import DeviceClassView
from controller.core.kube import describe
from controller.core.settings import FIELD_MANAGER, Settings
from controller.core.slices import DeviceRecord, slice_view
from controller.devices.catalogue import DeviceCatalogue
from controller.devices.facts import AdmissionFacts
from controller.ledger import manager as ledger_manager
from controller.ledger.plan import MANAGED_BY_LABEL, ExistingGpu, GpuObject, desired_gpu
from controller.loops import Controller
from controller.status.events import REASON_DEVICE_GONE, REASON_STATUS_UNWRITABLE, REASON_UNSATISFIABLE
from tests.unit.controller_factories import NODE, FakeWriter, World, claim, eventually, memory_request, result, slices


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


def test_status_is_written_once_and_not_again_when_unchanged() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        key = world.put(claim(results=[result("a", "gpu-1", "10Gi", "s-1")]))
        await controller.status.reconcile(key)
        assert len(writer.claims) == 1
        namespace, name, body = writer.claims[0]
        assert (namespace, name) == key
        # the watch brings back what was written (plus the node plugin's condition): nothing to do
        entries = [{**e, "conditions": [{"type": "Ready", "status": "True"}]} for e in body["status"]["devices"]]
        world.put(claim(results=[result("a", "gpu-1", "10Gi", "s-1")], devices_status=entries))
        await controller.status.reconcile(key)
        await controller.status.reconcile(("ns", "gone"))
        assert len(writer.claims) == 1

    run(test)


def test_failed_writes_are_retried_and_gone_claims_are_not() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        writer.fail = [api_error(500, "boom")]
        key = world.put(claim(results=[result("a", "gpu-0", "1Gi", "s-1")]))
        controller.claim_changed(key)
        await eventually(lambda: len(writer.claims) == 1)
        writer.fail = [api_error(404, "gone")]
        other = world.put(claim("other", results=[result("a", "gpu-0", "1Gi", "s-2")]))
        controller.claim_changed(other)
        await asyncio.sleep(1.0)  # longer than the first retry delay
        assert [name for _, name, _ in writer.claims] == ["c1"]

    run(test)


ALLOCATION_IMMUTABLE = (
    b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"ResourceClaim.resource.k8s.io \\"c1\\" is '
    b'invalid: status.allocation: Invalid value: null: field cannot be modified once set","reason":"Invalid",'
    b'"details":{"name":"c1","group":"resource.k8s.io","kind":"ResourceClaim","causes":[{"reason":'
    b'"FieldValueInvalid","message":"Invalid value: null: field cannot be modified once set",'
    b'"field":"status.allocation"}]},"code":422}'
)
"""kube-apiserver v1.37's answer to any status write of a claim whose stored opaque parameters it encodes otherwise."""


def test_a_status_the_api_server_refuses_every_write_to_is_told_once_and_not_retried() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        controller.status.queue.base_delay = controller.status.queue.max_delay = 0.01
        refused = api_error(422, "Unprocessable Entity", ALLOCATION_IMMUTABLE.decode())
        tries: list[str] = []
        record = writer.apply_claim_status

        def apply(namespace: str, name: str, body: dict[str, Any]) -> None:
            tries.append(name)
            if refusing:
                raise refused
            record(namespace, name, body)

        refusing = True
        writer.apply_claim_status = apply  # type: ignore[method-assign]
        key = world.put(claim(results=[result("a", "gpu-0", "1Gi", "s-1")]))
        controller.claim_changed(key)
        await eventually(lambda: len(writer.events) == 1)
        await asyncio.sleep(0.3)  # many retry delays
        assert tries == ["c1"], "tried once: no retry can succeed"
        ((name, reason, message),) = writer.events
        assert (name, reason) == ("c1", REASON_STATUS_UNWRITABLE)
        assert message.startswith(f"{DRIVER_NAME}: the API server refuses every status write to this claim (422")
        assert "compact JSON with sorted keys" in message and "\n" not in message and len(message) < 900
        controller.claim_changed(key)  # a later change: tried again, told no more
        await eventually(lambda: len(tries) == 2)
        await asyncio.sleep(0.1)
        assert len(writer.events) == 1 and not writer.claims
        refusing = False
        controller.claim_changed(key)  # a claim the API server takes a write to again: written
        await eventually(lambda: len(writer.claims) == 1)

    run(test)


def test_throttled_status_writes_are_delayed_never_dropped() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        controller.status.queue.max_attempts = 2
        controller.status.queue.base_delay = controller.status.queue.max_delay = 0.01
        throttled = api_error(429, "Too Many Requests", "", retry_after="0")
        writer.fail = [throttled] * 6  # three times the limit of other failures
        key = world.put(claim(results=[result("a", "gpu-0", "1Gi", "s-1")]))
        controller.claim_changed(key)
        await eventually(lambda: len(writer.claims) == 1)
        assert writer.fail == [], "every throttled write was tried again"

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
            await controller.status.reconcile(key)
        assert [(n, r) for n, r, _ in writer.events] == [("big", REASON_UNSATISFIABLE)]
        assert "largest GPU has 80Gi" in writer.events[0][2] and "100Gi" in writer.events[0][2]
        controller.claim_event(big, "uid-big", deleted=True, indexed=False)
        await controller.status.reconcile(big)
        assert len(writer.events) == 2, "a new claim of the same name is told again"

    run(test)


def test_no_unsatisfiable_event_without_published_gpus() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.slices.clear()
        controller.slices_changed()
        await controller.status.reconcile(world.put(claim("big", requests=[memory_request("gpu", "100Gi")])))
        assert controller.admission.largest is None and not writer.events

    run(test)


def test_ledger_creates_updates_and_deletes_objects() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        assert await controller.ledger.reconcile()
        names = [f"{NODE}-gpu-0", f"{NODE}-gpu-1"]
        assert sorted(writer.gpus) == sorted([(n, False) for n in names] + [(n, True) for n in names])
        assert writer.gpus.index((names[0], False)) < writer.gpus.index((names[0], True)), "create before status"
        # an object of a device that vanished
        stale = ExistingGpu(name=f"{NODE}-gpu-9", labels={}, spec={"driver": DRIVER_NAME}, status={})
        world.gpus[stale.name] = [stale]
        writer.gpus.clear()
        assert await controller.ledger.reconcile()
        assert writer.deleted == [stale.name]

    run(test)


def test_ledger_reports_failed_writes() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        writer.fail = [api_error(403, "forbidden")]
        assert not await controller.ledger.reconcile()
        assert await controller.ledger.reconcile()

    run(test)


def test_ledger_loop_follows_changes() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        key = world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        controller.claim_changed(key)
        await eventually(lambda: (f"{NODE}-gpu-0", True) in writer.gpus)
        assert controller.context.ready.is_set()

    run(test)


def test_admin_access_is_not_counted_in_the_ledger() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.put(claim("mon", results=[{**result("mon", "gpu-0", None, None), "adminAccess": True}]))
        world.put(claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1")]))
        assert await controller.ledger.reconcile()
        status = writer.gpu_status[f"{NODE}-gpu-0"]
        assert (status["allocatedMemory"], status["freeMemory"], status["shares"]) == ("10Gi", "70Gi", 2)

    run(test)


def test_a_failed_event_post_is_retried_and_remembered_only_once_posted() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        big = world.put(claim("big", requests=[memory_request("gpu", "100Gi")]))
        writer.event_results = [False]
        assert not await controller.status.reconcile(big), "to be retried"
        assert not writer.events
        await controller.status.reconcile(big)
        await controller.status.reconcile(big)
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
        key = world.put(claim(results=[result("a", "gpu-0", "1Gi", "s-1")]))
        controller.slices_changed()
        assert controller.status.queue.queued() == {key} and controller.ledger.marks.pending()
        controller.status.queue.done(await controller.status.queue.get())
        assert await controller.ledger.run_pass()
        assert not controller.ledger.marks.pending()
        for _ in range(3):  # a re-list delivers every slice again
            controller.slices_changed()
        assert not controller.status.queue.queued() and not controller.ledger.marks.pending()
        world.publish(4, generation=2)
        controller.slices_changed()
        assert controller.status.queue.queued() == {key} and controller.ledger.marks.pending()

    run(test)


def _count_recomputes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the GPU objects each ledger pass recomputes one by one, in order."""
    computed: list[str] = []
    real = desired_gpu

    def counting(device: DeviceRecord, *args: Any, **kwargs: Any) -> GpuObject:
        out = real(device, *args, **kwargs)
        computed.append(out.name)
        return out

    monkeypatch.setattr(ledger_manager, "desired_gpu", counting)
    return computed


def _index_written(world: World, writer: FakeWriter) -> None:
    """What the watch brings back after the GPU writes: the written objects in the GPU index."""
    for name, status in writer.gpu_status.items():
        spec = {"driver": DRIVER_NAME, "pool": NODE, "device": name.removeprefix(f"{NODE}-"), "node": NODE}
        labels = {NODE_LABEL: NODE, MANAGED_BY_LABEL: FIELD_MANAGER}
        owners = (f"uid-{NODE}",)  # the owner the identity apply set: the slices' Node
        world.gpus[name] = [ExistingGpu(name=name, labels=labels, spec=spec, status=status, owners=owners)]


def test_a_claim_change_recomputes_only_the_gpus_its_shares_were_and_are_on(monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        world.publish(4)
        controller.slices_changed()
        key = world.put(claim(results=[result("a", "gpu-1", "10Gi", "s-1")]))
        controller.claim_changed(key)
        assert await controller.ledger.run_pass()  # the first pass after a slice change: every GPU
        _index_written(world, writer)
        computed = _count_recomputes(monkeypatch)
        writer.gpus.clear()
        world.put(claim(results=[result("a", "gpu-2", "10Gi", "s-1")]))  # reallocated elsewhere
        controller.claim_changed(key)
        assert await controller.ledger.run_pass()
        assert sorted(computed) == [f"{NODE}-gpu-1", f"{NODE}-gpu-2"]
        assert sorted(writer.gpus) == [(f"{NODE}-gpu-1", True), (f"{NODE}-gpu-2", True)]
        assert writer.gpu_status[f"{NODE}-gpu-1"]["shares"] == 0 and writer.gpu_status[f"{NODE}-gpu-2"]["shares"] == 1

    run(test)


def test_the_echo_of_our_own_gpu_write_is_recomputed_alone_and_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.slices_changed()
        key = world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        controller.claim_changed(key)
        assert await controller.ledger.run_pass()
        _index_written(world, writer)
        computed = _count_recomputes(monkeypatch)
        writer.gpus.clear()
        controller.gpus_changed(f"{NODE}-gpu-0")  # the watch event of our status write
        assert await controller.ledger.run_pass()
        assert computed == [f"{NODE}-gpu-0"] and not writer.gpus
        # someone else edits the ledger: its event brings it back
        edited = world.gpus[f"{NODE}-gpu-0"][0]
        world.gpus[edited.name] = [edited.model_copy(update={"status": {**(edited.status or {}), "shares": 7}})]
        controller.gpus_changed(edited.name)
        assert await controller.ledger.run_pass()
        assert writer.gpus == [(edited.name, True)] and writer.gpu_status[edited.name]["shares"] == 1

    run(test)


def test_the_heap_is_compacted_once_the_ledger_is_quiet_after_a_full_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    compactions: list[None] = []

    def compact() -> int:
        compactions.append(None)
        return 7

    monkeypatch.setattr("controller.core.runtime.compact", compact)

    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.slices_changed()
        key = world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        controller.claim_changed(key)
        assert await controller.ledger.run_pass()  # full, with writes: not quiet yet
        assert writer.gpus and not compactions
        _index_written(world, writer)
        controller.gpus_changed(f"{NODE}-gpu-0")  # the echo: nothing to write
        assert await controller.ledger.run_pass()
        assert len(compactions) == 1
        controller.gpus_changed(f"{NODE}-gpu-0")
        assert await controller.ledger.run_pass()
        assert len(compactions) == 1, "once per full pass, not at every quiet pass"

    run(test)


def test_a_deleted_claim_leaves_its_gpu_and_a_stray_object_of_our_driver_is_deleted() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.slices_changed()
        key = world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        controller.claim_changed(key)
        assert await controller.ledger.run_pass()
        del world.claims[key]
        controller.claim_event(key, "uid-c1", deleted=True, indexed=False)
        stray = ExistingGpu(name="stray", labels={}, spec={"driver": DRIVER_NAME}, status=None)
        world.gpus[stray.name] = [stray]
        controller.gpus_changed(stray.name)
        assert await controller.ledger.run_pass()
        assert writer.gpu_status[f"{NODE}-gpu-0"]["shares"] == 0 and writer.deleted == ["stray"]

    run(test)


def test_a_failed_ledger_write_keeps_its_gpu_marked_for_the_next_pass() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.slices_changed()
        assert await controller.ledger.run_pass()
        _index_written(world, writer)
        key = world.put(claim(results=[result("a", "gpu-0", "10Gi", "s-1")]))
        controller.claim_changed(key)
        writer.fail = [api_error(500, "boom")]
        assert not await controller.ledger.run_pass()
        assert controller.ledger.marks.pending()
        assert await controller.ledger.run_pass()
        assert writer.gpu_status[f"{NODE}-gpu-0"]["shares"] == 1 and not controller.ledger.marks.pending()

    run(test)


def test_the_largest_request_is_cached_with_the_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.slices_changed()
        assert controller.admission.largest == 80 * GiB

        def no_scan(self: DeviceCatalogue) -> dict[Any, Any]:
            raise AssertionError("the largest request must not scan the devices")

        monkeypatch.setattr(DeviceCatalogue, "devices", no_scan)
        assert controller.admission.largest == 80 * GiB
        monkeypatch.undo()
        world.slices.clear()
        for body in slices(count=1, generation=2, memory_gib=40):
            view = slice_view(body, DRIVER_NAME)
            assert view is not None
            world.slices[view.name] = [view]
        controller.slices_changed()
        assert controller.admission.largest == 40 * GiB

    run(test)


def test_failures_are_described_by_the_api_servers_message() -> None:
    body = '{"kind":"Status","message":"changing status.devices requires resource=resourceclaims/driver"}'
    err = api_error(422, "Unprocessable Entity", body)
    assert describe(err) == (
        "the API server answered 422 Unprocessable Entity: changing status.devices requires resource=resourceclaims/driver"
    )
    assert describe(api_error(500, "boom")) == "API server error (500 boom)"
    assert describe(api_error(429, "Too Many Requests", "", retry_after="2")) == (
        "throttled by the API server (429 Too Many Requests; it asked to wait 2 s)"
    )
    assert describe(TimeoutError("slow")) == "TimeoutError: slow"


def test_admission_facts_are_published_when_devices_or_the_class_change() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        assert controller.admission == AdmissionFacts(), "nothing known before the first slice event"
        controller.slices_changed()
        facts = controller.admission
        assert (facts.largest, facts.hami_core, facts.device_class) == (80 * GiB, False, None)
        classes: dict[str, list[DeviceClassView]] = {DEVICE_CLASS_NAME: [DeviceClassView(name=DEVICE_CLASS_NAME)]}
        controller.bind(world.slices, world.claims, world.gpus, classes)
        controller.slices_changed()
        controller.classes_changed()
        assert controller.admission.device_class == classes[DEVICE_CLASS_NAME][0]
        assert controller.admission.mps_class is False, "the indexes are populated: the MPS class is not there"
        classes[MPS_DEVICE_CLASS_NAME] = [DeviceClassView(name=MPS_DEVICE_CLASS_NAME)]
        controller.classes_changed()
        assert controller.admission.mps_class is True
        assert MPS_DEVICE_CLASS_NAME in controller.context.claim_classes(), "claims may name it: its selectors apply"
        world.slices.clear()
        controller.slices_changed()
        assert controller.admission.largest is None and controller.admission.nvml is None

    run(test)
