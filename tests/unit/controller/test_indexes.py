"""The controller's kopf indexes under kopf's own event processing (tests/unit/kopf_world.py).

No fake index here: kopf decides what stays indexed, as in the running controller.
"""

import asyncio
import copy
from collections.abc import Callable, Coroutine
from typing import Any

from api.mps_trust import ADMITTED_CONDITION
from api.names import DRIVER_NAME
from controller.core.settings import Settings
from controller.loops import Controller
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller_factories import NODE, FakeWriter, claim, eventually, memory_request, result, slices
from tests.unit.controller_factories import gpu as gpu_info
from tests.unit.kopf_world import KopfWorld

OTHER_CLASS = "other-class.fracgpu.dev"


def run(test: Callable[[Controller, KopfWorld, FakeWriter], Coroutine[Any, Any, None]], **settings: Any) -> None:
    async def main() -> None:
        writer = FakeWriter()
        controller = Controller(Settings(**{"ledger_delay_seconds": 0.0, **settings}), writer)
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


MPS_CLASS = "mps.gpu.fracgpu.dev"
MPS_RULE = f"{DRIVER_NAME}-mps-{NODE}-gpu-0"


async def one_mps_gpu_held_by_team_a(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
    """MPS GPU gpu-0, admitted to a claim of team-a, and gpu-1, no MPS GPU, free; the rule and GPU objects and the
    MPS DeviceClass (as the chart makes it) in kopf's indexes."""
    bodies = build_slices(
        NODE, "uid-" + NODE, DRIVER_NAME, [gpu_info(0), gpu_info(1)], step=256 << 20, reserve=0, generation=1,
        enforcement={"gpu-0": "mps"}, mps_binding=True,
    )  # fmt: skip
    mps_only = f'"mps" in device.attributes["{DRIVER_NAME}"] && device.attributes["{DRIVER_NAME}"].mps'
    selectors = [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}, {"cel": {"expression": mps_only}}]
    await world.event(None, {"kind": "DeviceClass", "metadata": {"name": MPS_CLASS}, "spec": {"selectors": selectors}})
    for body in bodies:
        await world.event(None, {**body, "kind": "ResourceSlice"})
    share = result("gpu", "gpu-0", "10Gi", "s-a")
    share["bindingConditions"] = [ADMITTED_CONDITION]
    holder = _claim(name="a", namespace="team-a", results=[share])
    await world.event("ADDED", holder)
    await controller.mps.rules.run_pass()
    await world.event("ADDED", {**writer.taint_rules[MPS_RULE], "kind": "DeviceTaintRule"})
    assert await controller.status.reconcile(("team-a", "a"))
    (_, _, applied) = writer.claims[-1]
    assert applied["status"]["devices"][0]["conditions"][0]["type"] == ADMITTED_CONDITION
    holder["status"]["devices"] = applied["status"]["devices"]
    await world.event("MODIFIED", holder)
    assert await controller.ledger.reconcile()
    for name, status in writer.gpu_status.items():
        await world.event(None, {"kind": "GPU", "metadata": {"name": name, "labels": {}}, "spec": {}, "status": status})


def test_a_pending_claim_of_the_mps_class_is_seen_and_told_which_domain_holds_the_gpu() -> None:
    async def test(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
        await one_mps_gpu_held_by_team_a(controller, world, writer)
        pending = _claim(name="c", namespace="team-c", requests=[memory_request("gpu", "10Gi", MPS_CLASS)])
        await world.event("ADDED", pending)
        assert ("team-c", "c") in world.index("fracgpu_claims"), "a pending claim of the MPS class is not indexed"
        assert await controller.status.reconcile(("team-c", "c"))
        ((name, reason, message),) = [e for e in writer.events if e[1] == "MpsTrustDomainWaiting"]
        assert (name, reason) == ("c", "MpsTrustDomainWaiting")
        assert "this claim of namespace team-c waits" in message
        assert "(gpu-0 of node node-a (namespace team-a))" in message, "gpu-1 has room but is no MPS GPU"
        anywhere = _claim(name="d", namespace="team-c", requests=[memory_request("gpu", "10Gi")])
        await world.event("ADDED", anywhere)
        assert await controller.status.reconcile(("team-c", "d"))
        assert [e[0] for e in writer.events if e[1] == "MpsTrustDomainWaiting"] == ["c"], "d may use gpu-1"

    run(test, mps=True, extra_device_classes=MPS_CLASS)


def test_an_mps_gpus_rule_deleted_through_the_watch_is_created_again_with_an_event() -> None:
    async def test(controller: Controller, world: KopfWorld, writer: FakeWriter) -> None:
        await one_mps_gpu_held_by_team_a(controller, world, writer)
        rule = {**writer.taint_rules.pop(MPS_RULE), "kind": "DeviceTaintRule"}  # someone deletes it
        await world.event("DELETED", rule)
        assert MPS_RULE not in world.index("fracgpu_taint_rules")
        await controller.mps.rules.run_pass()
        assert writer.rule_writes == [("create", MPS_RULE), ("create", MPS_RULE)]
        ((name, _, reason, message),) = writer.rule_events
        assert (name, reason) == (MPS_RULE, "MpsTaintRuleRestored")
        assert f"{MPS_RULE} of MPS GPU gpu-0 of node node-a was deleted while it recorded namespace team-a" in message

    run(test, mps=True)
