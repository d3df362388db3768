"""The controller's kopf indexes under kopf's own event processing (tests/unit/kopf_world.py).

No fake index here: kopf decides what stays indexed, as in the running controller.
"""

import asyncio
import copy
from collections.abc import Callable, Coroutine
from typing import Any

from api.names import DRIVER_NAME
from controller.core.settings import Settings
from controller.loops import Controller
from tests.unit.controller_factories import NODE, FakeWriter, claim, eventually, result, slices
from tests.unit.kopf_world import KopfWorld

OTHER_CLASS = "other-class.fracgpu.dev"


def run(test: Callable[[Controller, KopfWorld, FakeWriter], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        writer = FakeWriter()
        controller = Controller(Settings(ledger_delay_seconds=0.0), writer)
        world = KopfWorld(controller)
        try:
            await test(controller, world, writer)
        finally:
            await controller.stop()

    asyncio.run(main())


def _claim(**kwargs: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim(**kwargs)}


def _slices(**kwargs: Any) -> list[dict[str, Any]]:
    return [{**s, "kind": "ResourceSlice"} for s in slices(**kwargs)]


def _allocated(gpu: str) -> Callable[[FakeWriter], str | None]:
    return lambda writer: writer.gpu_status.get(f"{NODE}-{gpu}", {}).get("allocatedMemory")


def test_a_deallocated_claim_of_another_class_leaves_the_index_and_the_ledger() -> None:
    # a claim of another DeviceClass of our driver concerns us only while it has our results
    requests = [{"name": "gpu", "exactly": {"deviceClassName": OTHER_CLASS}}]

    async def test(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
        for body in _slices():
            await world.event(None, body)
        await controller.start()
        allocated = _claim(requests=requests, results=[result("gpu", "gpu-0", "10Gi", "s-1")])
        await world.event("ADDED", allocated)
        assert ("ns", "c1") in world.index("fracgpu_claims")
        await eventually(lambda: _allocated("gpu-0")(writer) == "10Gi")
        deallocated = copy.deepcopy(allocated)
        deallocated["status"] = {}
        await world.event("MODIFIED", deallocated)
        assert ("ns", "c1") not in world.index("fracgpu_claims"), "kopf kept the claim's old index entry"
        await eventually(lambda: _allocated("gpu-0")(writer) == "0")
        # claims that were never ours (or are no longer) do not wake the ledger
        await controller.stop()  # no loop takes the marks from here on
        await controller.ledger.run_pass()
        await world.event("ADDED", _claim(name="foreign", requests=requests))
        await world.event("MODIFIED", deallocated)
        assert not controller.ledger.marks.pending()

    run(test)


def test_a_deallocated_claim_of_our_class_stays_indexed_without_shares() -> None:
    async def test(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
        for body in _slices():
            await world.event(None, body)
        await controller.start()
        allocated = _claim(results=[result("gpu", "gpu-1", "20Gi", "s-1")])
        await world.event("ADDED", allocated)
        await eventually(lambda: _allocated("gpu-1")(writer) == "20Gi")
        await world.event("MODIFIED", {**allocated, "status": {}})
        (view,) = world.index("fracgpu_claims")[("ns", "c1")]
        assert not view.shares and not view.allocated
        await eventually(lambda: _allocated("gpu-1")(writer) == "0")

    run(test)


def test_a_claim_changed_to_something_unreadable_leaves_the_index() -> None:
    async def test(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
        body = _claim(results=[result("gpu", "gpu-0", "10Gi", "s-1")])
        await world.event("ADDED", body)
        assert ("ns", "c1") in world.index("fracgpu_claims")
        broken = copy.deepcopy(body)
        broken["status"]["allocation"]["devices"]["results"][0].pop("pool")  # unreadable result of our driver
        await world.event("MODIFIED", broken)
        assert ("ns", "c1") not in world.index("fracgpu_claims"), "a stale view outlived the claim's change"

    run(test)


def test_a_slice_that_stops_being_ours_leaves_the_index_and_its_gpus_the_ledger() -> None:
    async def test(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
        (body,) = _slices(count=2)
        await world.event("ADDED", body)
        name = body["metadata"]["name"]
        assert name in world.index("fracgpu_slices")
        assert await controller.ledger.reconcile()
        assert set(writer.gpu_status) == {f"{NODE}-gpu-0", f"{NODE}-gpu-1"}
        foreign = copy.deepcopy(body)
        foreign["spec"]["driver"] = "nic.other.example.com"  # the same name, now another driver's
        await world.event("MODIFIED", foreign)
        assert name not in world.index("fracgpu_slices"), "kopf kept the slice's old index entry"
        assert controller.catalogue.devices() == {}
        for gpu in ("gpu-0", "gpu-1"):
            await world.event(
                None,
                {
                    "kind": "GPU",
                    "metadata": {"name": f"{NODE}-{gpu}", "labels": {}},
                    "spec": {"driver": DRIVER_NAME},
                    "status": writer.gpu_status[f"{NODE}-{gpu}"],
                },
            )
        assert await controller.ledger.reconcile()
        assert sorted(writer.deleted) == [f"{NODE}-gpu-0", f"{NODE}-gpu-1"]

    run(test)


def test_a_device_taint_rule_taints_the_gpus_it_selects_until_it_is_changed_or_deleted() -> None:
    def taints(writer: FakeWriter) -> dict[str, str | None]:
        return {n: s.get("taintSummary") for n, s in sorted(writer.gpu_status.items())}

    async def test(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
        for body in _slices():
            await world.event(None, body)
        await controller.start()
        await eventually(lambda: taints(writer) == {f"{NODE}-gpu-0": None, f"{NODE}-gpu-1": None})
        rule: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "maint"},
            "spec": {
                "deviceSelector": {"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0"},
                "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
            },
        }
        await world.event("ADDED", rule)
        assert "maint" in world.index("fracgpu_taint_rules")
        await eventually(lambda: taints(writer) == {f"{NODE}-gpu-0": "NoSchedule=1", f"{NODE}-gpu-1": None})
        assert writer.gpu_status[f"{NODE}-gpu-0"]["taintedBy"] == "example.com/maintenance:NoSchedule"
        moved = copy.deepcopy(rule)
        moved["spec"]["deviceSelector"]["device"] = "gpu-1"  # the GPU it selected before is marked too
        await world.event("MODIFIED", moved)
        await eventually(lambda: taints(writer) == {f"{NODE}-gpu-0": None, f"{NODE}-gpu-1": "NoSchedule=1"})
        foreign = copy.deepcopy(moved)
        foreign["spec"]["deviceSelector"]["driver"] = "nic.other.example.com"
        await world.event("MODIFIED", foreign)
        assert "maint" not in world.index("fracgpu_taint_rules"), "kopf kept the rule's old index entry"
        await eventually(lambda: taints(writer) == {f"{NODE}-gpu-0": None, f"{NODE}-gpu-1": None})
        await world.event("MODIFIED", moved)
        await eventually(lambda: taints(writer)[f"{NODE}-gpu-1"] == "NoSchedule=1")
        await world.event("DELETED", moved)
        await eventually(lambda: taints(writer) == {f"{NODE}-gpu-0": None, f"{NODE}-gpu-1": None})

    run(test)
