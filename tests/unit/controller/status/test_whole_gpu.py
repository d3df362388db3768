"""A pending request that names no memory takes a whole GPU: where shares hold every GPU it may use while some
have memory free, it is told why and what to write (`WholeGpuRequested`); a claim that works, or waits for
another reason, is told nothing."""

import asyncio
from typing import Any

import pytest

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME, MIG_DEVICE_CLASS_NAME
from controller.core.claims import EXTENDED_RESOURCE_CLAIM_ANNOTATION, ClaimView, DeviceClassView, claim_view
from controller.core.slices import DeviceRecord, current_devices, slice_view
from controller.loops import Controller
from controller.status.events import REASON_WHOLE_GPU
from controller.status.feasibility import selected_by
from controller.status.whole_gpu import plan_whole_gpu
from tests.unit.controller.test_loops import run
from tests.unit.controller_factories import NODE, FakeWriter, World, claim, eventually, result, slices

GPU_CLASS = DeviceClassView(name=DEVICE_CLASS_NAME, selectors=(f'device.driver == "{DRIVER_NAME}"',))
SHARED = {DEVICE_CLASS_NAME, "mps.gpu.fracgpu.dev"}
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "web-1", "uid": "u", "controller": True}


def published(count: int = 2, *nodes: str) -> list[DeviceRecord]:
    views = [slice_view(body, DRIVER_NAME) for node in (nodes or (NODE,)) for body in slices(node, count=count)]
    return list(current_devices([v for v in views if v is not None]).values())


def view(body: dict[str, Any]) -> ClaimView:
    found = claim_view(body, DRIVER_NAME, (DEVICE_CLASS_NAME, MIG_DEVICE_CLASS_NAME, *sorted(SHARED)))
    assert found is not None
    return found


def pending(name: str = "whole", *, pod: bool = True, **exactly: Any) -> ClaimView:
    request = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_NAME, **exactly}}
    body = claim(name, requests=[request])
    if pod:
        body["metadata"]["ownerReferences"] = [OWNER]
    return view(body)


def share(name: str, device: str, memory: str | None, node: str = NODE, **extra: Any) -> ClaimView:
    return view(claim(name, results=[{**result("gpu", device, memory, f"s-{name}", pool=node), **extra}]))


def plan(claim_: ClaimView, held: list[ClaimView], devices: list[DeviceRecord] | None = None) -> list[str]:
    found = published() if devices is None else devices
    selected = selected_by({DEVICE_CLASS_NAME: GPU_CLASS}, DRIVER_NAME)
    return [w.message for w in plan_whole_gpu(claim_, found, [claim_, *held], selected, SHARED)]


def test_a_template_without_memory_where_every_gpu_has_a_share_is_told_what_to_write() -> None:
    (message,) = plan(pending(), [share("a", "gpu-0", "10Gi"), share("b", "gpu-1", "50Gi")])
    assert message == (
        "request 'gpu' asks for no capacity.requests.memory, so it takes a whole GPU (the memory capacity's default "
        "is all of a GPU's memory) and waits until one has nothing allocated, but every GPU its selectors allow has "
        f"memory allocated (2 GPUs; the most free on one is 70Gi, on gpu-0 of node {NODE}); to take a share of a GPU "
        "instead, ask for capacity.requests.memory (e.g. 10Gi) in its ResourceClaimTemplate (the pod's claim is made "
        "from it)"
    )
    (standalone,) = plan(pending(pod=False), [share("a", "gpu-0", "10Gi"), share("b", "gpu-1", "50Gi")])
    assert standalone.endswith("in a new ResourceClaim (a claim's spec cannot change)")


def test_claims_that_work_or_wait_for_another_reason_are_told_nothing() -> None:
    assert plan(pending(), [share("a", "gpu-0", "10Gi")]) == [], "gpu-1 is free: the scheduler places it whole"
    assert plan(pending(), []) == []
    full = [share("a", "gpu-0", None), share("b", "gpu-1", "80Gi")]
    assert plan(pending(), full) == [], "no GPU has memory free: a memory request would wait too"
    asks_memory = pending(capacity={"requests": {"memory": "10Gi"}})
    assert plan(asks_memory, [share("a", "gpu-0", "10Gi"), share("b", "gpu-1", "10Gi")]) == []
    held = [share("a", "gpu-0", "10Gi"), share("b", "gpu-1", "10Gi")]
    allocated = share("whole", "gpu-0", None)
    assert plan(allocated, held) == [], "allocated: nothing to tell"
    mig = view(claim("m", requests=[{"name": "gpu", "exactly": {"deviceClassName": MIG_DEVICE_CLASS_NAME}}]))
    assert plan(mig, held) == [], "a MIG partition is allocated whole by design"
    body = claim("ext", requests=[{"name": "container-0-request-0", "exactly": {"deviceClassName": DEVICE_CLASS_NAME}}])
    body["metadata"]["annotations"] = {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    assert plan(view(body), held) == [], "kube-scheduler's claim for resources.limits asks for whole GPUs"
    everything = pending(allocationMode="All")
    assert plan(everything, held) == []


def test_admin_access_and_admin_shares_are_counted_as_the_scheduler_counts_them() -> None:
    monitor = share("mon", "gpu-1", None, adminAccess=True)
    assert plan(pending(), [share("a", "gpu-0", "10Gi"), monitor]) == [], "admin access holds no memory"
    (message,) = plan(pending(adminAccess=True), [share("a", "gpu-0", "10Gi"), share("b", "gpu-1", "10Gi")])
    assert message.startswith(
        "request 'gpu' asks for no capacity.requests.memory and has adminAccess: to place it the scheduler charges "
        "it the memory capacity's default, all of a GPU's memory, so it waits for a whole GPU with nothing "
        "allocated, and every GPU its selectors allow has memory allocated (2 GPUs; the most free on one is 70Gi"
    )
    assert message.endswith(
        "ask for capacity.requests.memory: 0 to reach a GPU in use (admin access takes no share of it)"
    )


def test_selectors_decide_which_gpus_count() -> None:
    only_gpu_1 = [{"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].index == 1'}}]
    (message,) = plan(pending(selectors=only_gpu_1), [share("a", "gpu-1", "30Gi")])
    assert f"(1 GPU; the most free on one is 50Gi, on gpu-1 of node {NODE})" in message, "gpu-0, free, is not allowed"


@pytest.mark.parametrize("held", [["gpu-0"], ["gpu-0", "gpu-1"]])
def test_a_count_needs_that_many_on_one_node(held: list[str]) -> None:
    devices = published(2, "n1", "n2")
    shares = [share(f"s{i}", d, "20Gi", node="n1") for i, d in enumerate(held)] + [
        share("t", "gpu-1", "10Gi", node="n2")
    ]
    (message,) = plan(pending(count=2), shares, devices)
    assert message.startswith(
        "request 'gpu' asks for 2 GPUs and no capacity.requests.memory, so it takes 2 whole GPUs of one node (the "
        "memory capacity's default is all of a GPU's memory) and waits until they have nothing allocated, but no node "
        "has 2 GPUs its selectors allow with no memory allocated (4 GPUs; node "
    )
    assert message.endswith(
        "n2 has 2 of them with memory free, the least of those 70Gi; the most with nothing allocated on one node is "
        "1); to take a share of a GPU instead, ask for capacity.requests.memory (e.g. 10Gi) in its "
        "ResourceClaimTemplate (the pod's claim is made from it)"
    ), message
    assert plan(pending(count=2), shares[-1:], devices) == [], "n1 has 2 GPUs with nothing allocated"


def test_the_controller_tells_it_once_and_looks_again_when_a_share_lands() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        waiting = pending()
        world.claims[waiting.key] = [waiting]
        world.claims["ns", "a"] = [share("a", "gpu-0", "10Gi")]
        await controller.status.reconcile(waiting.key)
        assert writer.events == [], "gpu-1 is free"
        await controller.start()
        await asyncio.sleep(0.2)  # the start's full pass is done
        assert writer.events == []
        world.claims["ns", "b"] = [share("b", "gpu-1", "10Gi")]
        controller.claim_changed(("ns", "b"))  # the last free GPU gets a share: the waiting claim is looked at again
        await eventually(lambda: len(writer.events) == 1)
        assert writer.events[0][:2] == ("whole", REASON_WHOLE_GPU)
        world.claims["ns", "c"] = [share("c", "gpu-1", "20Gi")]
        controller.claim_changed(("ns", "c"))
        await asyncio.sleep(0.2)
        assert len(writer.events) == 1, "told once per request, though the amounts changed"

    run(test)
