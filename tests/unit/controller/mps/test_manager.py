"""Unit tests of the MPS trust-domain manager through the controller's entry (controller/mps/manager.py with
controller/loops.py and the status writers): the binding conditions decided on an MPS GPU, remembered until written,
the claim's domain in its status data, the Event of a refusal, and each MPS GPU's DeviceTaintRule."""

import asyncio
import datetime
from collections.abc import Callable, Coroutine
from typing import Any

from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION, NAMESPACE_TAINT_KEY
from api.names import DRIVER_NAME
from controller.core.settings import Settings
from controller.core.slices import slice_view
from controller.loops import Controller
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller_factories import NODE, FakeWriter, World, claim, eventually, gpu, result

RULE = f"{DRIVER_NAME}-mps-{NODE}-gpu-0"


def mps_world() -> World:
    world = World()
    world.slices.clear()
    bodies = build_slices(
        NODE, "uid-" + NODE, DRIVER_NAME, [gpu(0), gpu(1)], step=256 << 20, reserve=0, generation=1,
        enforcement={"gpu-0": "mps"}, mps_binding=True,
    )  # fmt: skip
    for body in bodies:
        view = slice_view(body, DRIVER_NAME)
        assert view is not None
        world.slices[view.name] = [view]
    return world


def waiting(name: str, namespace: str, at: str, device: str = "gpu-0", **status: Any) -> dict[str, Any]:
    share = result("gpu", device, "10Gi", f"s-{name}")
    share["bindingConditions"] = [ADMITTED_CONDITION]
    share["bindingFailureConditions"] = [CONFLICT_CONDITION]
    body = claim(name, results=[share], namespace=namespace, **status)
    body["status"]["allocation"]["allocationTimestamp"] = at
    return body


def run(test: Callable[[Controller, World, FakeWriter], Coroutine[Any, Any, None]], **settings: Any) -> None:
    async def main() -> None:
        writer, world = FakeWriter(), mps_world()
        controller = Controller(Settings(**{"ledger_delay_seconds": 0.0, "mps": True, **settings}), writer)
        controller.bind(world.slices, world.claims, world.gpus)
        controller.slices_changed()
        try:
            await test(controller, world, writer)
        finally:
            await controller.stop()

    asyncio.run(main())


def entry_of(writer: FakeWriter, name: str) -> dict[str, Any]:
    bodies = [body for _, n, body in writer.claims if n == name]
    (entry,) = bodies[-1]["status"]["devices"]
    return dict(entry)


def test_two_domains_on_a_free_gpu_the_first_allocated_is_admitted_the_other_refused_with_an_event() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        late = world.put(waiting("late", "team-b", "2026-12-05T10:00:02Z"))
        early = world.put(waiting("early", "team-a", "2026-12-05T10:00:01Z"))
        for key in (late, early):
            controller.claim_changed(key)
        await controller.status.reconcile(late)  # the later one first: still the earlier allocation wins
        await controller.status.reconcile(early)
        refused, admitted = entry_of(writer, "late"), entry_of(writer, "early")
        assert admitted["data"]["mpsTrustDomain"] == "namespace/team-a"
        ((condition,),) = [admitted["conditions"]]
        assert (condition["type"], condition["status"]) == (ADMITTED_CONDITION, "True")
        (conflict,) = refused["conditions"]
        assert (conflict["type"], conflict["status"], conflict["reason"]) == (
            CONFLICT_CONDITION,
            "True",
            "OtherTrustDomain",
        )
        assert "serves namespace team-a, and this claim belongs to namespace team-b" in conflict["message"]
        assert refused["data"]["mpsTrustDomain"] == "namespace/team-b"
        assert [(n, r) for n, r, _ in writer.events] == [("late", "MpsTrustDomainConflict")]

    run(test)


def test_a_decision_holds_until_written_and_is_read_back_after_a_restart() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        a = world.put(waiting("a", "team-a", "2026-12-05T10:00:05Z"))
        controller.claim_changed(a)
        await controller.status.reconcile(a)  # admitted: team-a holds gpu-0 from now on ...
        b = world.put(waiting("b", "team-b", "2026-12-05T10:00:01Z"))  # ... though b was allocated earlier
        controller.claim_changed(b)
        await controller.status.reconcile(b)
        assert entry_of(writer, "b")["conditions"][0]["type"] == CONFLICT_CONDITION
        # a new controller (no memory) reads a's admission from its status, as the watch brings it back
        written = entry_of(writer, "a")
        world.put(waiting("a", "team-a", "2026-12-05T10:00:05Z", devices_status=[written]))
        fresh = Controller(Settings(ledger_delay_seconds=0.0, mps=True), FakeWriter())
        fresh.bind(world.slices, world.claims, world.gpus)
        fresh.slices_changed()
        entries = fresh.mps.entries(world.claims[b][0], datetime.datetime.now(datetime.UTC))
        ((_, entry),) = entries.items()
        assert entry.condition is not None and entry.condition["type"] == CONFLICT_CONDITION
        await fresh.stop()

    run(test)


def test_an_mps_gpu_with_claims_has_a_taint_rule_of_its_domain_gone_with_them() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        await controller.start()
        key = world.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        controller.claim_changed(key)
        await eventually(lambda: RULE in writer.taint_rules)
        assert writer.taint_rules[RULE]["spec"] == {
            "deviceSelector": {"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0"},
            "taint": {"key": NAMESPACE_TAINT_KEY, "value": "team-a", "effect": "NoSchedule"},
        }
        del world.claims[key]
        controller.claim_event(key, "uid-a", deleted=True, indexed=False)
        await eventually(lambda: RULE not in writer.taint_rules)

    run(test)


def test_a_claim_without_binding_conditions_holds_the_gpu_and_a_non_mps_gpu_gets_nothing() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        old = claim("old", results=[result("gpu", "gpu-0", "10Gi", "s-old")], namespace="team-a")
        other = world.put(waiting("new", "team-b", "2026-12-05T10:00:01Z"))
        plain = world.put(claim("plain", results=[result("gpu", "gpu-1", "10Gi", "s-p")], namespace="team-b"))
        for key in (world.put(old), other, plain):
            controller.claim_changed(key)
            await controller.status.reconcile(key)
        assert "conditions" not in entry_of(writer, "old") and entry_of(writer, "old")["data"]["mpsTrustDomain"]
        assert entry_of(writer, "new")["conditions"][0]["type"] == CONFLICT_CONDITION
        assert "mpsTrustDomain" not in entry_of(writer, "plain")["data"] and "conditions" not in entry_of(
            writer, "plain"
        )

    run(test)


def test_without_mps_nothing_is_decided() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        key = world.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        controller.claim_changed(key)
        await controller.status.reconcile(key)
        entry = entry_of(writer, "a")
        assert "conditions" not in entry and "mpsTrustDomain" not in entry["data"]

    run(test, mps=False)
