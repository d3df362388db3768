"""Planning of node lifecycle (controller/nodes/plan.py): claims on a deleted node, silent node plugins."""

import asyncio
import datetime
from typing import Any

from api.gpu import DEVICE_GONE_CONDITION, PLUGIN_REPORTING_CONDITION
from api.heartbeat import HEARTBEAT_LABEL, lease_body, lease_name
from api.kube_errors import api_error
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.claims import ClaimView, claim_view
from controller.core.settings import Settings
from controller.core.slices import current_devices, slice_view
from controller.ledger.plan import ExistingGpu
from controller.loops import Controller
from controller.nodes.plan import (
    REASON_HEARTBEAT,
    REASON_HEARTBEAT_EXPIRED,
    REASON_NO_HEARTBEAT,
    REASON_NOT_CHECKED,
    Heartbeat,
    observe,
    plan_node_gone,
    plan_plugin_reporting,
)
from controller.status.events import REASON_DEVICE_GONE
from controller.status.plan import plan_status
from tests.unit.controller_factories import NODE, FakeWriter, World, claim, result, slices

T0 = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)
NS = "fracgpu-system"


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def view(body: dict[str, object]) -> ClaimView:
    found = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert found is not None
    return found


def entries_of(c: ClaimView) -> tuple[dict[str, object], ...]:
    devices = current_devices(v for b in slices("node-a") + slices("node-b") if (v := slice_view(b, DRIVER_NAME)))
    return plan_status(c, devices.get, DRIVER_NAME).entries


def two_shares_on(node: str) -> ClaimView:
    return view(
        claim(
            f"on-{node}",
            node=node,
            results=[
                result("a", "gpu-0", "10Gi", "s-0", pool=node),
                result("b", "gpu-1", None, None, pool=node),
            ],
        )
    )


def test_a_claim_on_a_deleted_node_gets_the_condition_on_every_entry_and_others_nothing() -> None:
    gone, kept = two_shares_on("node-a"), two_shares_on("node-b")
    plan = plan_node_gone(gone, {"node-b"}, entries_of(gone), DRIVER_NAME, T0)
    assert (plan.node, plan.changed, plan.shares) == ("node-a", True, gone.shares)
    by_device = {e["device"]: e for e in plan.entries}
    assert set(by_device) == {"gpu-0", "gpu-1"}
    for device, entry in by_device.items():
        (condition,) = entry["conditions"]
        assert condition["type"] == DEVICE_GONE_CONDITION and condition["status"] == "True"
        assert condition["reason"] == "NodeDeleted" and condition["lastTransitionTime"] == "2026-12-01T12:00:00Z"
        assert f"node node-a was deleted, and device {device} of pool node-a" in condition["message"]
        assert entry["data"]["device"] == device  # the recorded data stays
    assert by_device["gpu-0"]["shareID"] == "s-0" and "shareID" not in by_device["gpu-1"]

    untouched = plan_node_gone(kept, {"node-b"}, entries_of(kept), DRIVER_NAME, T0)
    assert untouched.entries == entries_of(kept) and not untouched.changed and untouched.node is None


def test_nothing_is_concluded_before_the_nodes_are_known_or_for_unallocated_claims() -> None:
    gone = two_shares_on("node-a")
    assert not plan_node_gone(gone, None, entries_of(gone), DRIVER_NAME, T0).changed
    pending = view(claim("pending"))
    assert plan_node_gone(pending, set(), (), DRIVER_NAME, T0).entries == ()


def test_the_condition_once_written_is_kept_as_it_is_and_no_write_is_needed() -> None:
    gone = two_shares_on("node-a")
    first = plan_node_gone(gone, set(), entries_of(gone), DRIVER_NAME, T0)
    body = claim(
        "on-node-a",
        node="node-a",
        results=[result("a", "gpu-0", "10Gi", "s-0", pool="node-a"), result("b", "gpu-1", None, None, pool="node-a")],
        devices_status=list(first.entries),
    )
    again = plan_node_gone(view(body), set(), entries_of(view(body)), DRIVER_NAME, at(300))
    assert not again.changed
    assert again.entries == first.entries  # the same time: an unchanged apply


def test_a_share_without_recorded_data_gets_an_entry_with_the_condition_only() -> None:
    unrecorded = view(claim("c", node="node-x", results=[result("a", "gpu-0", "1Gi", "s-1", pool="node-x")]))
    plan = plan_node_gone(unrecorded, {"node-a"}, (), DRIVER_NAME, T0)
    (entry,) = plan.entries
    assert {k: v for k, v in entry.items() if k != "conditions"} == {
        "driver": DRIVER_NAME,
        "pool": "node-x",
        "device": "gpu-0",
        "shareID": "s-1",
    }
    assert [c["type"] for c in entry["conditions"]] == [DEVICE_GONE_CONDITION]


def lease(node: str, renewed: datetime.datetime, name: str | None = None) -> dict[str, object]:
    body = lease_body(node, DRIVER_NAME, renewed=renewed, acquired=T0, duration_seconds=30)
    if name is not None:
        body["metadata"]["name"] = name
    assert body["metadata"]["labels"] == {HEARTBEAT_LABEL: DRIVER_NAME}
    return body


def test_a_renewal_is_timed_when_seen_and_the_first_one_by_its_own_time_when_older() -> None:
    first = observe({}, [lease("node-a", at(-100)), lease("node-b", at(5))], T0)
    assert first["node-a"].seen_at == at(-100)  # silent before the controller started
    assert first["node-b"].seen_at == T0  # a plugin clock ahead of ours counts from now
    later = observe(first, [lease("node-a", at(-100)), lease("node-b", at(7))], at(20))
    assert later["node-a"] == first["node-a"]  # not renewed: unchanged
    assert later["node-b"].seen_at == at(20)
    assert observe(later, [], at(30)) == {}  # Leases gone: no heartbeat


def test_the_first_listing_of_a_fresh_lease_plans_reporting_true_at_once() -> None:
    beats = observe({}, [lease("node-a", at(-3)), lease("node-b", at(-30))], T0)  # the first listing only
    planned = plan_plugin_reporting(["node-a", "node-b"], beats, {}, now=T0, timeout_s=10, namespace=NS)
    assert (planned["node-a"]["status"], planned["node-a"]["reason"]) == ("True", REASON_HEARTBEAT)
    assert planned["node-a"]["lastTransitionTime"] == "2026-12-01T12:00:00Z"
    assert planned["node-b"]["status"] == "False", "a Lease older than the timeout at the first listing: silent"


def test_a_lease_naming_another_node_than_its_name_is_no_heartbeat() -> None:
    assert observe({}, [lease("node-a", T0, name=lease_name("node-b"))], T0) == {}


def test_a_plugin_silent_past_the_timeout_is_not_reporting_and_back_when_renewed() -> None:
    nodes = ["node-a", "node-b", "node-c"]
    beats = {"node-a": Heartbeat(renew_time="r1", seen_at=T0), "node-b": Heartbeat(renew_time="r1", seen_at=T0)}
    now = plan_plugin_reporting(nodes, beats, {}, now=at(10), timeout_s=10, namespace=NS)
    assert {n: (c["type"], c["status"], c["reason"]) for n, c in now.items()} == {
        "node-a": (PLUGIN_REPORTING_CONDITION, "True", REASON_HEARTBEAT),
        "node-b": (PLUGIN_REPORTING_CONDITION, "True", REASON_HEARTBEAT),
        "node-c": (PLUGIN_REPORTING_CONDITION, "Unknown", REASON_NO_HEARTBEAT),
    }
    assert "lastTransitionTime" not in now["node-c"]
    beats["node-a"] = Heartbeat(renew_time="r2", seen_at=at(9))
    silent = plan_plugin_reporting(nodes, beats, now, now=at(11), timeout_s=10, namespace=NS)
    assert silent["node-a"] == now["node-a"]  # renewed: unchanged, nothing to write
    assert (silent["node-b"]["status"], silent["node-b"]["reason"]) == ("False", REASON_HEARTBEAT_EXPIRED)
    assert silent["node-b"]["lastTransitionTime"] == "2026-12-01T12:00:10Z"  # when the timeout passed
    assert f"{NS}/{lease_name('node-b')}" in silent["node-b"]["message"]
    assert "for more than 10 s (last r1)" in silent["node-b"]["message"]
    assert (
        plan_plugin_reporting(nodes, beats, silent, now=at(60), timeout_s=10, namespace=NS)["node-b"]
        == silent["node-b"]
    )

    beats["node-b"] = Heartbeat(renew_time="r3", seen_at=at(61))
    back = plan_plugin_reporting(nodes, beats, silent, now=at(61), timeout_s=10, namespace=NS)
    assert (back["node-b"]["status"], back["node-b"]["lastTransitionTime"]) == ("True", "2026-12-01T12:01:01Z")


def test_the_controller_reports_claims_of_a_deleted_node_once_and_touches_no_other_claim() -> None:
    async def main() -> None:
        writer, world = FakeWriter(), World()
        nodes: dict[str, list[str]] = {NODE: [f"uid-{NODE}"], "node-b": ["uid-node-b"]}
        controller = Controller(Settings(ledger_delay_seconds=0.0), writer)
        controller.bind(world.slices, world.claims, world.gpus, None, nodes)
        controller.context.ready.set()  # kopf delivered the first event: every index is populated
        on_a = world.put(claim("on-a", results=[result("a", "gpu-0", "10Gi", "s-1")]))
        on_b = world.put(claim("on-b", node="node-b", results=[result("a", "gpu-0", "10Gi", "s-1", pool="node-b")]))
        for key in (on_a, on_b):
            await controller.status.reconcile(key)
        written = len(writer.claims)
        assert all("conditions" not in e for _, _, b in writer.claims for e in b["status"]["devices"])

        del nodes[NODE]
        controller.node_deleted(NODE)
        assert controller.status.queue.queued() == {on_a}  # only the claim on the deleted node
        for key in (on_a, on_b):
            await controller.status.reconcile(key)
        (namespace, name, body), *_ = writer.claims[written:]
        assert (namespace, name, len(writer.claims)) == ("ns", "on-a", written + 1)
        (entry,) = body["status"]["devices"]
        assert [c["type"] for c in entry["conditions"]] == [DEVICE_GONE_CONDITION] and "data" in entry
        assert [(n, r) for n, r, _ in writer.events] == [("on-a", REASON_DEVICE_GONE)]
        assert f"node {NODE} was deleted" in writer.events[0][2]

        world.put(claim("on-a", results=[result("a", "gpu-0", "10Gi", "s-1")], devices_status=[entry]))
        await controller.status.reconcile(on_a)  # the echo: nothing more to write or tell
        assert len(writer.claims) == written + 1 and len(writer.events) == 1
        await controller.stop()

    asyncio.run(main())


def test_the_controller_marks_a_silent_nodes_gpus_not_reporting_and_reporting_again() -> None:
    async def main() -> None:
        writer, world = FakeWriter(), World()
        controller = Controller(Settings(ledger_delay_seconds=0.0, plugin_heartbeat_timeout_seconds=10), writer)
        controller.bind(world.slices, world.claims, world.gpus)

        async def reporting() -> set[str]:
            assert await controller.ledger.run_pass()
            return {c["status"] for s in writer.gpu_status.values() for c in s["conditions"]}

        controller.nodes.listed(NS, [lease(NODE, T0)], T0)
        assert await reporting() == {"True"}
        controller.nodes.listed(NS, [lease(NODE, T0)], at(11))
        assert controller.ledger.marks.pending()  # the node's GPUs are marked
        assert await reporting() == {"False"}
        assert len(writer.gpu_status) == 2
        writer.gpu_status.clear()
        controller.nodes.listed(NS, [lease(NODE, at(12))], at(12))
        assert await reporting() == {"True"}
        await controller.stop()

    asyncio.run(main())


def _reporting_controller(writer: FakeWriter, world: World) -> Controller:
    """A controller with heartbeats (a namespace) whose indexes are populated, not started: passes are run by hand."""
    settings = Settings(ledger_delay_seconds=0.0, plugin_heartbeat_timeout_seconds=10, namespace=NS)
    controller = Controller(settings, writer)
    controller.bind(world.slices, world.claims, world.gpus)
    controller.context.ready.set()  # kopf delivered the first event: every index is populated
    return controller


def _listings(writer: FakeWriter) -> list[str]:
    """The namespaces of the heartbeat listings `writer` answers from now on, in order."""
    calls: list[str] = []
    answer = writer.list_heartbeats

    def counted(namespace: str) -> list[dict[str, Any]]:
        calls.append(namespace)
        return answer(namespace)

    writer.list_heartbeats = counted  # type: ignore[method-assign]
    return calls


def _conditions(writer: FakeWriter) -> set[tuple[str, str]]:
    return {(c["status"], c["reason"]) for s in writer.gpu_status.values() for c in s["conditions"]}


def test_a_gpu_object_says_reporting_true_from_its_first_write_when_the_plugins_lease_is_fresh() -> None:
    async def main() -> None:
        writer, world = FakeWriter(), World()
        writer.leases = [lease(NODE, datetime.datetime.now(datetime.UTC))]  # the plugin beats before it publishes
        controller = _reporting_controller(writer, world)
        listings = _listings(writer)
        assert await controller.ledger.run_pass()  # the first pass, no periodic listing yet
        assert len(writer.gpu_status) == 2
        assert _conditions(writer) == {("True", REASON_HEARTBEAT)}, "True in the objects' first status"
        assert listings == [NS], "the pass listed the heartbeats itself"
        assert await controller.ledger.reconcile([f"{NODE}-gpu-0"])
        assert listings == [NS], "a node already covered is not listed again"

        world.slices.update(_other_node_slices())  # a new node's GPUs published
        controller.slices_changed()
        writer.leases.append(lease("node-b", datetime.datetime.now(datetime.UTC)))
        writer.gpu_status.clear()
        assert await controller.ledger.run_pass()
        assert listings == [NS, NS], "a node new since the last listing is listed before its GPUs are written"
        assert {n for n in writer.gpu_status if n.startswith("node-b")} and _conditions(writer) == {
            ("True", REASON_HEARTBEAT)
        }
        await controller.stop()

    asyncio.run(main())


def _other_node_slices() -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for body in slices(count=1, node="node-b"):
        found = slice_view(body, DRIVER_NAME)
        assert found is not None
        out[found.name] = [found]
    return out


def test_gpus_say_unknown_without_a_lease_or_when_the_listing_fails_and_a_restart_keeps_what_was_written() -> None:
    async def main() -> None:
        writer, world = FakeWriter(), World()
        controller = _reporting_controller(writer, world)
        assert await controller.ledger.run_pass()
        assert _conditions(writer) == {("Unknown", REASON_NO_HEARTBEAT)}, "listed: no Lease from the plugin yet"
        await controller.stop()

        writer.gpu_status.clear()
        failing = _reporting_controller(writer, World())
        listings = _listings(writer)
        writer.fail = [api_error(503, "unavailable")]
        assert await failing.ledger.run_pass()
        assert _conditions(writer) == {("Unknown", REASON_NOT_CHECKED)}, "a value from the start, though unchecked"
        assert await failing.ledger.reconcile([f"{NODE}-gpu-0"])
        assert listings == [NS], "a failed listing is not tried again by every pass"
        await failing.stop()

        # A new controller (restart, takeover) whose GPU index holds True conditions: their times are kept.
        fresh = datetime.datetime.now(datetime.UTC)
        writer.leases = [lease(NODE, fresh)]
        written = {"lastTransitionTime": "2026-12-01T12:00:00Z", "status": "True", "reason": REASON_HEARTBEAT}
        for n in (f"{NODE}-gpu-0", f"{NODE}-gpu-1"):
            status = {"node": NODE, "conditions": [{"type": PLUGIN_REPORTING_CONDITION, "message": "m", **written}]}
            world.gpus[n] = [ExistingGpu(name=n, labels={}, spec={}, status=status)]
        writer.gpu_status.clear()
        restarted = _reporting_controller(writer, world)
        assert await restarted.ledger.run_pass()
        times = {c["lastTransitionTime"] for s in writer.gpu_status.values() for c in s["conditions"]}
        assert _conditions(writer) <= {("True", REASON_HEARTBEAT)} and times <= {written["lastTransitionTime"]}
        await restarted.stop()

    asyncio.run(main())
