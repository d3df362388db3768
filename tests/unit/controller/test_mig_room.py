"""A pending MIG request that the free slices of a MIG GPU hold by count, but no free aligned placement does, is
told why (`MigPlacementsFragmented`); with a free placement, or too few free slices, nothing is."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api import mig
from api.names import DRIVER_NAME, MIG_DEVICE_CLASS_NAME
from controller.core.claims import ClaimView, claim_view
from controller.core.slices import slice_view
from controller.loops import Controller
from controller.status.events import REASON_MIG_FRAGMENTED
from controller.status.feasibility import plan_unsatisfiable, selected_by
from controller.status.mig_room import plan_mig_fragmented, spans
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller.test_loops import run
from tests.unit.controller.test_mig import GPU_CLASS, MIG_CLASS, claim, devices
from tests.unit.controller_factories import FakeWriter, World, eventually
from tests.unit.fake_mig import H100_MIG
from tests.unit.kubelet_plugin.publishing.test_slices import NODE, NODE_UID, STEP, gpu

CLASSES = {MIG_DEVICE_CLASS_NAME: MIG_CLASS, DRIVER_NAME: GPU_CLASS}


def held(name: str, profile: str, start: int) -> ClaimView:
    view: ClaimView = claim(name, mig.partition_device_name(1, profile, start))["view"]
    return view


def plan(pending: ClaimView, claims: list[ClaimView], found: Any = None) -> tuple[Any, ...]:
    found = devices() if found is None else found
    selected = selected_by(CLASSES, DRIVER_NAME)
    return plan_mig_fragmented(pending, found.values(), [pending, *claims], selected, MIG_DEVICE_CLASS_NAME)


def test_spans() -> None:
    assert spans([0, 1, 3, 4, 5, 7]) == "0-1, 3-5, 7"
    assert spans([]) == ""


def test_the_issue_case_names_the_free_slices_the_partitions_in_the_way_and_what_would_help() -> None:
    """H100 80GB: 1g.10gb partitions at 2 and 6 leave 6 memory slices free, but every placement of a 4-slice
    profile (3g.40gb at 0 or 4, 4g.40gb at 0) overlaps one of them."""
    pending = claim("wants", memory="25Gi")["view"]
    way = [held("x", "1g.10gb", 2), held("y", "1g.10gb", 6)]
    (found,) = plan(pending, way)
    assert found.request == "gpu"
    assert found.message == (
        "request 'gpu' asks for 25Gi of GPU memory, which a 3g.40gb or 4g.40gb partition would hold in the free "
        "slices of a MIG GPU, but none has a free aligned placement of one: a partition takes the memory slices "
        "of its placement, and the scheduler reports only that it cannot allocate the claim; "
        f"on GPU 1 (gpu-1) of node {NODE} memory slices 0-1, 3-5, 7 are free (6 of 8) and 5 of 7 compute slices, "
        "but every placement of 3g.40gb, 4g.40gb (3g.40gb at 0, 4; 4g.40gb at 0) overlaps an allocated "
        "partition: 1g.10gb at 2 (claim ns/x), 1g.10gb at 6 (claim ns/y); releasing claim ns/x would free "
        "3g.40gb at 0; the largest partition free there now is 1g.20gb at 0 (20096Mi): a request of at most that "
        "much fits there now"
    )
    assert plan_unsatisfiable(pending, devices().values(), CLASSES, DRIVER_NAME) == (), "a waiting reason"


def test_a_free_aligned_placement_says_nothing() -> None:
    """1g.10gb at 5 and 6 leave 3g.40gb and 4g.40gb at 0 free: the scheduler places it."""
    assert plan(claim("wants", memory="25Gi")["view"], [held("x", "1g.10gb", 5), held("y", "1g.10gb", 6)]) == ()
    assert plan(claim("wants", memory="25Gi")["view"], []) == ()


def test_too_few_free_slices_say_nothing_here() -> None:
    """A 3g.40gb at 4 and 1g.10gb at 0 and 2 leave 2 memory slices: no 4-slice profile fits by count."""
    way = [held("x", "3g.40gb", 4), held("y", "1g.10gb", 0), held("z", "1g.10gb", 2)]
    assert plan(claim("wants", memory="25Gi")["view"], way) == ()
    big = claim("big", memory="80Gi")["view"]
    assert plan(big, []) == (), "no partition holds it: UnsatisfiableGpuRequest's case"
    assert plan_unsatisfiable(big, devices().values(), CLASSES, DRIVER_NAME) != ()


def test_too_few_compute_slices_say_nothing() -> None:
    """Four 1g.10gb partitions (slices 1, 2, 5, 6) leave 3 compute slices, too few for 4g.40gb; 3g.40gb fits by
    count, and its placements are in the way."""
    way = [held(n, "1g.10gb", s) for n, s in (("a", 1), ("b", 2), ("c", 5), ("d", 6))]
    (found,) = plan(claim("wants", memory="25Gi")["view"], way)
    assert "which a 3g.40gb partition would hold" in found.message
    assert "4g.40gb" not in found.message
    assert "3 of 7 compute slices" in found.message
    assert "releasing claims ns/a, ns/b would free 3g.40gb at 0" in found.message


@pytest.mark.parametrize("memory", ["9Gi", "25Gi"])
def test_an_allocated_or_gpu_class_claim_is_not_told(memory: str) -> None:
    way = [held("x", "1g.10gb", 2), held("y", "1g.10gb", 6)]
    assert plan(held("self", "1g.10gb", 0), way) == ()
    assert plan(claim("gpu", memory=memory, cls=DRIVER_NAME)["view"], way) == ()
    assert plan(claim("small", memory="9Gi")["view"], way) == (), "a 1g.10gb is free"
    assert plan(claim("other", memory=memory)["view"], way, devices("disabled")) == ()


def test_a_selector_that_leaves_no_free_placement_counts() -> None:
    """The request's selectors choose the partitions: one that asks for 4g.40gb waits even with 3g.40gb at 4 free."""
    way = [held("x", "1g.10gb", 2)]
    assert plan(claim("wants", memory="25Gi")["view"], way) == ()
    body: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "four", "uid": "uid-four"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": MIG_DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": "25Gi"}},
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].profile == "4g.40gb"'}}]}}]}},
    }  # fmt: skip
    four = claim_view(body, DRIVER_NAME, (DRIVER_NAME, MIG_DEVICE_CLASS_NAME))
    assert four is not None
    (found,) = plan(four, way)
    assert "which a 4g.40gb partition would hold" in found.message
    assert (
        "1g.10gb at 2 (claim ns/x)" in found.message and "releasing claim ns/x would free 4g.40gb at 0" in found.message
    )


def test_the_controller_posts_it_once_per_state_and_rechecks_when_a_partition_is_freed() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        # a cluster with the chart's MIG DeviceClass (without it the claim hears DeviceClassNotInstalled instead)
        classes = {c.name: [c] for c in (GPU_CLASS, MIG_CLASS)}
        controller.bind(world.slices, world.claims, world.gpus, classes)
        built = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(0), gpu(1)], step=STEP, reserve=0, generation=1,
                             mig={"gpu-1": H100_MIG})  # fmt: skip
        world.slices.clear()
        for body in built:
            view = slice_view(body, DRIVER_NAME)
            assert view is not None
            world.slices[view.name] = [view]
        controller.slices_changed()
        pending = claim("wants", memory="25Gi")["view"]
        for one in (held("x", "1g.10gb", 2), held("y", "1g.10gb", 6), pending):
            world.claims[one.key] = [one]
        await controller.status.reconcile(pending.key)
        await controller.status.reconcile(pending.key)
        assert [(n, r) for n, r, _ in writer.events] == [("wants", REASON_MIG_FRAGMENTED)]
        assert "releasing claim ns/x would free 3g.40gb at 0" in writer.events[0][2]
        await controller.start()
        del world.claims["ns", "x"]  # its partition is freed: the pending claim is decided again
        controller.claim_event(("ns", "x"), "uid-x", deleted=True, indexed=False)
        await asyncio.sleep(0.2)
        assert len(writer.events) == 1, "a free placement: nothing more to say"
        world.claims["ns", "x"] = [held("x", "1g.10gb", 1)]
        controller.claim_changed(("ns", "x"))
        await eventually(lambda: len(writer.events) == 2)
        assert writer.events[1][1] == REASON_MIG_FRAGMENTED and "1g.10gb at 1 (claim ns/x)" in writer.events[1][2]

    run(test)
