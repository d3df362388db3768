"""A pending share request that no GPU it may use has the memory and compute free for now is told so
(`GpuRoomWaiting`), naming what is short and where the most is free; a claim another reason explains, a GPU with room
(whatever holds it back), or a ledger without figures gets nothing. Through the controller: the ledger's GPU objects
are what it reads, told once per request, on the pod too, and a claim left undecided is looked at again as the
ledger catches up."""

import asyncio
from typing import Any

import pytest

from api.names import COMPUTE_CAPACITY, DEVICE_CLASS_NAME, DRIVER_NAME, MIG_DEVICE_CLASS_NAME
from api.quantity import GiB
from controller.core.claims import ClaimView, DeviceClassView, claim_view
from controller.core.slices import DeviceRecord
from controller.loops import Controller
from controller.status import events
from controller.status.events import REASON_GPU_ROOM
from controller.status.feasibility import selected_by
from controller.status.gpu_room import RoomPlan, plan_room_waiting
from tests.unit.controller.status.test_pod_events import pod_body
from tests.unit.controller.status.test_pod_notices import owned, put_pod
from tests.unit.controller.status.test_whole_gpu import published
from tests.unit.controller.test_loops import run
from tests.unit.controller_factories import NODE, FakeWriter, World, claim, eventually, result

GPU_CLASS = DeviceClassView(name=DEVICE_CLASS_NAME, selectors=(f'device.driver == "{DRIVER_NAME}"',))
CLASSES = (DEVICE_CLASS_NAME, MIG_DEVICE_CLASS_NAME)


def ask(memory: str | None = "4Gi", compute: str | None = "50", **exactly: Any) -> dict[str, Any]:
    capacity = {k: v for k, v in (("memory", memory), (COMPUTE_CAPACITY, compute)) if v is not None}
    return {"deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": capacity}, **exactly}


def pending(*requests: dict[str, Any], name: str = "c") -> ClaimView:
    body = claim(name, requests=list(requests) or [{"name": "gpu", "exactly": ask()}])
    found = claim_view(body, DRIVER_NAME, CLASSES)
    assert found is not None
    return found


def plan(
    claim_: ClaimView,
    free: dict[str, tuple[int, int]],
    devices: list[DeviceRecord] | None = None,
    **kwargs: Any,
) -> RoomPlan:
    """`free`: device -> (free memory in GiB, free compute), as the ledger has it (absent: no figures)."""
    selected = selected_by({DEVICE_CLASS_NAME: GPU_CLASS}, DRIVER_NAME)
    rooms = {d: (m * GiB, c) for d, (m, c) in free.items()}
    found = published() if devices is None else devices
    return plan_room_waiting(claim_, found, lambda d: rooms.get(d.device), selected, **kwargs)


def messages(found: RoomPlan) -> list[str]:
    return [w.message for w in found.waiting]


def test_compute_short_on_every_gpu_is_told_with_the_most_free_of_each() -> None:
    found = plan(pending(), {"gpu-0": (72, 0), "gpu-1": (40, 30)})
    ((request, message),) = [(w.request, w.message) for w in found.waiting]
    assert request == "gpu"
    assert message == (
        "request 'gpu' asks for 4Gi of memory and compute 50 (percent of a GPU), and none of the 2 GPUs its "
        "selectors allow has both free now (as the GPU ledger counts them, kubectl get gpus): the most free memory is "
        f"72Gi, on gpu-0 of node {NODE}, the most free compute 30, on gpu-1 of node {NODE}; compute is short. It is "
        "placed once a share on one of them goes and leaves that room (the scheduler tries again when a claim is "
        "deallocated), if that GPU's taints and MPS trust domain admit it too"
    )
    assert not found.undecided


def test_memory_short_both_short_and_neither_alone_are_each_named() -> None:
    (memory,) = messages(plan(pending(), {"gpu-0": (2, 100), "gpu-1": (3, 60)}))
    assert f"the most free memory is 3Gi, on gpu-1 of node {NODE}, the most free compute 100, on gpu-0" in memory
    assert "; memory is short." in memory
    (both,) = messages(plan(pending(), {"gpu-0": (2, 10), "gpu-1": (3, 0)}))
    assert "; both are short." in both
    (split,) = messages(plan(pending(), {"gpu-0": (70, 0), "gpu-1": (1, 100)}))
    assert "; no one GPU has both: those with the memory free lack the compute." in split
    (plain,) = messages(plan(pending({"name": "gpu", "exactly": ask("10Gi", None)}), {"gpu-0": (8, 100)}, published(1)))
    assert plain.startswith(
        "request 'gpu' asks for 10Gi of memory, and none of the 1 GPU its selectors allow has that much free now (as "
        f"the GPU ledger counts it, kubectl get gpus): the most free is 8Gi, on gpu-0 of node {NODE}. It is placed"
    )


def test_a_gpu_with_room_or_without_figures_leaves_it_unsaid_and_undecided() -> None:
    roomy = plan(pending(), {"gpu-0": (72, 0), "gpu-1": (4, 50)})
    assert roomy == RoomPlan(undecided=True), "gpu-1 has exactly the room (a taint or a domain may hold it back)"
    assert plan(pending(), {"gpu-0": (72, 0)}) == RoomPlan(undecided=True), "gpu-1 not yet in the ledger"


def test_selectors_decide_which_gpus_count() -> None:
    only_gpu_1 = [{"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].index == 1'}}]
    claim_ = pending({"name": "gpu", "exactly": ask(selectors=only_gpu_1)})
    (message,) = messages(plan(claim_, {"gpu-0": (80, 100), "gpu-1": (40, 0)}))
    assert "none of the 1 GPU its selectors allow" in message and "gpu-0" not in message
    nothing = [{"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].index == 7'}}]
    no_gpu = pending({"name": "gpu", "exactly": ask(selectors=nothing)})
    assert plan(no_gpu, {"gpu-0": (0, 0), "gpu-1": (0, 0)}) == RoomPlan(), "no GPU at all: UnsatisfiableGpuRequest"


def test_every_alternative_must_lack_room_and_a_count_is_said() -> None:
    small, large = {"name": "small", **ask("4Gi", "10")}, {"name": "large", **ask("40Gi", "50")}
    alternatives = {"name": "gpu", "firstAvailable": [large, small]}
    (message,) = messages(plan(pending(alternatives), {"gpu-0": (3, 100), "gpu-1": (30, 0)}))
    assert message.startswith("request 'gpu/large' asks for 40Gi of memory and compute 50")
    assert "; or request 'gpu/small' asks for 4Gi of memory and compute 10" in message
    assert plan(pending(alternatives), {"gpu-0": (4, 10), "gpu-1": (30, 0)}).waiting == (), "gpu/small fits gpu-0"
    (two,) = messages(plan(pending({"name": "gpu", "exactly": ask(count=2)}), {"gpu-0": (3, 100), "gpu-1": (3, 0)}))
    assert two.startswith("request 'gpu' asks for 2 GPUs of one node, each with 4Gi of memory and compute 50")


@pytest.mark.parametrize(
    ("claim_", "told"),
    [
        (pending(), ("gpu",)),
        (pending(), ("gpu,other",)),
        (pending({"name": "gpu", "firstAvailable": [{"name": "a", **ask()}]}), ("gpu/a",)),
        (pending({"name": "gpu", "exactly": ask(None)}), ()),
        (pending({"name": "gpu", "exactly": ask(adminAccess=True)}), ()),
        (pending({"name": "gpu", "exactly": ask(allocationMode="All")}), ()),
        (pending({"name": "gpu", "exactly": {**ask(), "deviceClassName": MIG_DEVICE_CLASS_NAME}}), ()),
    ],
    ids=["told", "told-together", "told-subrequest", "no-memory", "admin", "all", "mig"],
)
def test_requests_another_reason_explains_or_not_shares_are_left_out(claim_: ClaimView, told: tuple[str, ...]) -> None:
    found = plan(claim_, {"gpu-0": (0, 0), "gpu-1": (0, 0)}, told=told, skip_classes=(MIG_DEVICE_CLASS_NAME,))
    assert found == RoomPlan()


def test_allocated_claims_and_devices_not_counted_here_leave_it_unsaid() -> None:
    allocated = claim_view(claim("a", results=[result("gpu", "gpu-0", "4Gi", "s")]), DRIVER_NAME, CLASSES)
    assert allocated is not None
    assert plan(allocated, {"gpu-0": (0, 0), "gpu-1": (0, 0)}) == RoomPlan()
    whole = [d.model_copy(update={"allow_multiple": False}) for d in published()]
    assert plan(pending(), {"gpu-0": (0, 0), "gpu-1": (0, 0)}, whole) == RoomPlan(), "no share of them to count"
    assert messages(plan(pending(), {"gpu-0": (0, 0), "gpu-1": (0, 0)})), "the same with shared GPUs"


def compute_share(name: str, device: str, compute: str) -> dict[str, Any]:
    share = result("gpu", device, "4Gi", f"s-{name}")
    share["consumedCapacity"][COMPUTE_CAPACITY] = compute
    return claim(name, results=[share])


async def write_ledger(controller: Controller, world: World, writer: FakeWriter) -> None:
    """The ledger written and brought back by the watch (as kopf indexes it)."""
    from controller.ledger.plan import ExistingGpu

    assert await controller.ledger.reconcile()
    for name, status in writer.gpu_status.items():
        world.gpus[name] = [ExistingGpu(name=name, labels={}, spec={}, status=status)]
        controller.gpus_changed(name)


def test_the_controller_tells_the_third_share_of_compute_50_once_on_its_pod_from_the_ledger() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        for name, device, compute in (("a", "gpu-0", "50"), ("b", "gpu-0", "50"), ("c", "gpu-1", "100")):
            world.put(compute_share(name, device, compute))
        await write_ledger(controller, world, writer)
        put_pod(writer, pod_body("p", made={"gpu": "p-gpu"}))
        key = world.put(owned("p-gpu", "p", requests=[{"name": "gpu", "exactly": ask()}]))
        for _ in range(2):
            assert await controller.status.reconcile(key)
        ((name, reason, message),) = writer.events
        assert (name, reason) == ("p-gpu", REASON_GPU_ROOM)
        assert "the most free compute 0, on gpu-0 of node node-a; compute is short" in message, message
        assert f"the most free memory is {80 - 4}Gi, on gpu-1" in message, "one 4Gi share there, two on gpu-0"
        ((pod, _, pod_reason, pod_message),) = writer.pod_events.values()
        assert (pod, pod_reason, pod_message) == ("p", REASON_GPU_ROOM, f"claim 'gpu' (ResourceClaim p-gpu): {message}")

    run(test)


def test_a_claim_seen_before_the_ledger_caught_up_is_looked_at_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "ROOM_RECHECK_SECONDS", (0.05, 0.1))

    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        key = world.put(claim("late", requests=[{"name": "gpu", "exactly": ask()}]))
        controller.claim_changed(key)
        roomy = world.put(claim("roomy", requests=[{"name": "gpu", "exactly": ask(compute="0")}]))
        controller.claim_changed(roomy)
        await asyncio.sleep(0.2)
        assert writer.events == [], "no ledger yet: nothing is said"
        for name, device, compute in (("a", "gpu-0", "100"), ("b", "gpu-1", "60")):
            world.put(compute_share(name, device, compute))  # the index only: the claims' own events are not sent
        await write_ledger(controller, world, writer)
        await eventually(lambda: [n for n, r, _ in writer.events if r == REASON_GPU_ROOM] == ["late"], 2.0)
        await asyncio.sleep(0.3)
        assert [n for n, r, _ in writer.events if r == REASON_GPU_ROOM] == ["late"], "told once; roomy has room"

    run(test)


def test_a_changed_ledger_brings_the_next_look_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "ROOM_RECHECK_SECONDS", (60.0, 60.0))  # the timers alone would not look again here
    monkeypatch.setattr(events, "ROOM_SETTLE_SECONDS", 0.05)
    monkeypatch.setattr(events, "ROOM_SETTLE_AGE_SECONDS", 0.05)

    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        key = world.put(claim("late", requests=[{"name": "gpu", "exactly": ask()}]))
        controller.claim_changed(key)
        await asyncio.sleep(0.1)
        assert writer.events == [], "no ledger yet: nothing is said"
        for name, device, compute in (("a", "gpu-0", "100"), ("b", "gpu-1", "60")):
            world.put(compute_share(name, device, compute))  # the index only: the claims' own events are not sent
        await write_ledger(controller, world, writer)  # the GPU objects' watch events
        await eventually(lambda: [n for n, r, _ in writer.events if r == REASON_GPU_ROOM] == ["late"], 1.0)

    run(test)
