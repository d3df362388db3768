"""Unit tests of the MPS trust-domain manager through the controller's entry (controller/mps/manager.py and
controller/mps/taint_rules.py with controller/loops.py and the status writers), driven step by step over an
in-memory API server and its watch (`Api`): each MPS GPU's DeviceTaintRule records the domain it serves, a waiting
share is decided only once the rule (as the index shows it) records a domain, a restarted controller decides the
same from the API alone, a rule deleted or edited by someone else is written back with an Event, and admin access
is no tenant."""

import asyncio
import copy
import datetime
from collections.abc import Callable, Coroutine
from typing import Any

from api.kube_errors import api_error
from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION, NAMESPACE_TAINT_KEY, TrustDomain
from api.names import DRIVER_NAME
from controller.core.context import first
from controller.core.settings import Settings
from controller.core.slices import slice_view, taint_rule_view
from controller.ledger.plan import ExistingGpu
from controller.loops import Controller
from controller.mps.plan import taint_rule
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller_factories import NODE, FakeWriter, World, claim, gpu, memory_request, result

RULE = f"{DRIVER_NAME}-mps-{NODE}-gpu-0"
RULE_1 = f"{DRIVER_NAME}-mps-{NODE}-gpu-1"
GPU_0 = (NODE, "gpu-0")


def mps_world(mps: tuple[str, ...] = ("gpu-0",)) -> World:
    world = World()
    world.slices.clear()
    bodies = build_slices(
        NODE, "uid-" + NODE, DRIVER_NAME, [gpu(0), gpu(1)], step=256 << 20, reserve=0, generation=1,
        enforcement=dict.fromkeys(mps, "mps"), mps_binding=True,
    )  # fmt: skip
    for body in bodies:
        view = slice_view(body, DRIVER_NAME)
        assert view is not None
        world.slices[view.name] = [view]
    return world


def waiting(name: str, namespace: str, at: str, device: str = "gpu-0", *, admin: bool = False) -> dict[str, Any]:
    share = result("gpu", device, "0" if admin else "10Gi", f"s-{name}")
    share["bindingConditions"] = [ADMITTED_CONDITION]
    share["bindingFailureConditions"] = [CONFLICT_CONDITION]
    if admin:
        share["adminAccess"] = True
    body = claim(name, results=[share], namespace=namespace)
    body["status"]["allocation"]["allocationTimestamp"] = at
    return body


class Api:
    """The API server and its watch for one controller: claims as the scheduler writes them, what the controller
    writes (its `FakeWriter`), and `echo`, which brings what changed into the controller's indexes, each change
    followed by its event, as kopf does."""

    def __init__(self, controller: Controller, world: World, writer: FakeWriter) -> None:
        self.controller, self.world, self.writer = controller, world, writer
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self._status_seen = 0

    def put(self, body: dict[str, Any]) -> tuple[str, str]:
        key = self.world.put(body)
        self.bodies[key] = body
        self.controller.claim_changed(key)
        return key

    def delete(self, key: tuple[str, str]) -> None:
        body = self.bodies.pop(key)
        del self.world.claims[key]
        self.controller.claim_event(key, body["metadata"]["uid"], deleted=True, indexed=False)

    def echo(self) -> None:
        for namespace, name, applied in self.writer.claims[self._status_seen :]:
            body = self.bodies.get((namespace, name))
            if body is not None:
                body["status"]["devices"] = copy.deepcopy(applied["status"]["devices"])
                self.world.put(body)
                self.controller.claim_changed((namespace, name))
        self._status_seen = len(self.writer.claims)
        for name in sorted(set(self.world.rules) | set(self.writer.taint_rules)):
            stored = self.writer.taint_rules.get(name)
            now = taint_rule_view(stored, DRIVER_NAME) if stored is not None else None
            before = first(self.world.rules, name)
            if now == before:
                continue
            if now is None:
                self.world.rules.pop(name, None)
            else:
                self.world.rules[name] = [now]
            gone = stored is None and before is not None
            self.controller.taint_rule_changed(name, deleted=gone, recorded=before.mps_domain if gone else None)

    async def settle(self, rounds: int = 4) -> None:
        """Let the controller and the API go back and forth until nothing changes: the rule loop's pass, the watch,
        each claim's status writer."""
        for _ in range(rounds):
            await self.controller.mps.rules.run_pass()
            self.echo()
            for key in list(self.bodies):
                await self.controller.status.reconcile(key)
            self.echo()


def run(
    test: Callable[[Controller, Api], Coroutine[Any, Any, None]],
    mps_gpus: tuple[str, ...] = ("gpu-0",),
    **settings: Any,
) -> None:
    async def main() -> None:
        writer, world = FakeWriter(), mps_world(mps_gpus)
        controller = Controller(Settings(**{"ledger_delay_seconds": 0.0, "mps": True, **settings}), writer)
        controller.bind(world.slices, world.claims, world.gpus, taint_rules=world.rules)
        controller.slices_changed()
        try:
            await test(controller, Api(controller, world, writer))
        finally:
            await controller.stop()

    asyncio.run(main())


def entry_of(writer: FakeWriter, name: str) -> dict[str, Any]:
    bodies = [body for _, n, body in writer.claims if n == name]
    (entry,) = bodies[-1]["status"]["devices"]
    return dict(entry)


def condition_of(writer: FakeWriter, name: str) -> tuple[str, str, str] | None:
    conditions = entry_of(writer, name).get("conditions") or []
    return (conditions[0]["type"], conditions[0]["reason"], conditions[0]["message"]) if conditions else None


def kind_of(writer: FakeWriter, name: str) -> str | None:
    """The type of the condition last written on the claim's entry (None: none)."""
    found = condition_of(writer, name)
    return found[0] if found is not None else None


def test_a_free_gpu_decides_nothing_until_its_rule_records_the_first_allocated_domain() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        late = api.put(waiting("late", "team-b", "2026-12-05T10:00:02Z"))
        early = api.put(waiting("early", "team-a", "2026-12-05T10:00:01Z"))
        for key in (late, early):
            await controller.status.reconcile(key)
        assert condition_of(writer, "late") is None and condition_of(writer, "early") is None, "no rule yet"
        assert entry_of(writer, "early")["data"]["mpsTrustDomain"] == "namespace/team-a"
        await controller.mps.rules.run_pass()
        assert writer.rule_writes == [("create", RULE)]
        rule = writer.taint_rules[RULE]
        assert rule["metadata"]["annotations"] == {"gpu.fracgpu.dev/mps-trust-domain": "namespace/team-a"}
        assert rule["spec"]["taint"] == {"key": NAMESPACE_TAINT_KEY, "value": "team-a", "effect": "NoSchedule"}
        await controller.status.reconcile(early)
        assert condition_of(writer, "early") is None, "admitted before the index showed the rule"
        api.echo()  # the rule reaches the index; its event queues the GPU's claims
        assert controller.status.queue.queued() >= {late, early}
        await api.settle()
        assert condition_of(writer, "early") == (
            ADMITTED_CONDITION,
            "Admitted",
            "MPS GPU gpu-0 of node node-a serves namespace team-a, this claim's trust domain",
        )
        refused = condition_of(writer, "late")
        assert refused is not None and refused[:2] == (CONFLICT_CONDITION, "OtherTrustDomain")
        assert "serves namespace team-a, and this claim belongs to namespace team-b" in refused[2]
        assert entry_of(writer, "late")["data"]["mpsTrustDomain"] == "namespace/team-b"
        assert {(n, r) for n, r, _ in writer.events} == {("late", "MpsTrustDomainConflict")}
        assert writer.rule_writes == [("create", RULE)] and writer.rule_events == [], "one write, no Event"
        assert controller.mps.serving_id(GPU_0) == "namespace/team-a"

    run(test)


def test_a_restarted_controller_decides_the_same_from_the_api_alone() -> None:
    async def test(controller: Controller, api: Api) -> None:
        api.put(waiting("a", "team-a", "2026-12-05T10:00:05Z"))
        await api.settle()
        assert kind_of(api.writer, "a") == ADMITTED_CONDITION
        # b of team-b was allocated earlier than a, d of team-a later: the rule, not the order, decides
        b = api.put(waiting("b", "team-b", "2026-12-05T10:00:01Z"))
        d = api.put(waiting("d", "team-a", "2026-12-05T10:00:09Z"))
        fresh_writer = FakeWriter()
        fresh_writer.taint_rules = copy.deepcopy(api.writer.taint_rules)
        fresh = Controller(Settings(ledger_delay_seconds=0.0, mps=True), fresh_writer)
        fresh.bind(api.world.slices, api.world.claims, api.world.gpus, taint_rules=api.world.rules)
        fresh.slices_changed()
        await fresh.start()
        await fresh.stop()  # the start queued every claim and resynced the rules: nothing is running now
        await fresh.mps.rules.run_pass()
        assert fresh_writer.rule_writes == [], "the rule records the domain already"
        now = datetime.datetime.now(datetime.UTC)
        for key, kind in ((b, CONFLICT_CONDITION), (d, ADMITTED_CONDITION)):
            (entry,) = fresh.mps.entries(api.world.claims[key][0], now).values()
            assert entry.condition is not None and entry.condition["type"] == kind, key
            (again,) = controller.mps.entries(api.world.claims[key][0], now).values()
            assert again.condition is not None and again.condition["type"] == kind, "the first controller agrees"

    run(test)


def test_a_rule_deleted_by_someone_else_is_created_again_with_an_event_and_a_stale_one_is_deleted_quietly() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        a = api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        await api.settle()
        del writer.taint_rules[RULE]  # someone deletes it
        api.echo()
        await controller.mps.rules.run_pass()  # on the watch event, no resync
        assert writer.rule_writes == [("create", RULE), ("create", RULE)]
        assert writer.taint_rules[RULE]["metadata"]["annotations"]["gpu.fracgpu.dev/mps-trust-domain"] == (
            "namespace/team-a"
        )
        ((name, uid, reason, message),) = writer.rule_events
        assert (name, uid, reason) == (RULE, writer.taint_rules[RULE]["metadata"]["uid"], "MpsTaintRuleRestored")
        assert message.startswith(
            f"DeviceTaintRule {RULE} of MPS GPU gpu-0 of node node-a was deleted while it recorded namespace team-a."
        )
        api.echo()
        api.delete(a)  # the GPU holds no claim: its rule is stale
        await controller.mps.rules.run_pass()
        assert RULE not in writer.taint_rules and writer.rule_writes[-1] == ("delete", RULE)
        # before the watch shows the deletion, a claim of team-a lands (the index still shows the rule) ...
        z = api.put(waiting("z", "team-a", "2026-12-05T10:00:07Z"))
        await controller.status.reconcile(z)
        assert kind_of(writer, "z") == ADMITTED_CONDITION
        await api.settle()  # ... so the rule is created again, and its deletion was the controller's own: no Event
        assert writer.rule_writes[-2:] == [("delete", RULE), ("create", RULE)] and len(writer.rule_events) == 1
        api.delete(z)
        await api.settle()
        assert RULE not in writer.taint_rules and len(writer.rule_events) == 1
        assert controller.mps.serving_id(GPU_0) is None

    run(test)


def test_a_claim_of_another_domain_waits_out_a_stale_rule_and_is_admitted_under_its_own() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        a = api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        await api.settle()
        api.delete(a)
        b = api.put(waiting("b", "team-b", "2026-12-05T10:00:05Z"))  # the index still shows team-a's rule
        await controller.status.reconcile(b)
        assert kind_of(writer, "b") is None, "refused by a rule no claim of team-a keeps"
        await controller.mps.rules.run_pass()
        assert writer.rule_writes == [("create", RULE), ("delete", RULE)]
        await api.settle()
        assert writer.rule_writes[-1] == ("create", RULE) and kind_of(writer, "b") == ADMITTED_CONDITION
        assert writer.taint_rules[RULE]["spec"]["taint"]["value"] == "team-b"
        assert writer.events == [] and writer.rule_events == []

    run(test)


def test_an_edited_rule_is_written_back_and_shares_wait_meanwhile() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        await api.settle()
        writer.taint_rules[RULE]["spec"]["taint"]["value"] = "team-z"  # someone edits the taint
        api.echo()
        await controller.mps.rules.run_pass()
        assert writer.rule_writes[-1] == ("apply", RULE)
        assert writer.taint_rules[RULE]["spec"]["taint"]["value"] == "team-a"
        (_, uid, _, message) = writer.rule_events[-1]
        assert uid == writer.taint_rules[RULE]["metadata"]["uid"]
        assert (
            message.startswith(
                f"DeviceTaintRule {RULE} of MPS GPU gpu-0 of node node-a was edited: its taint is "
                "gpu.fracgpu.dev/mps-namespace=team-z:NoSchedule."
            )
            and "rewrote it for namespace team-a" in message
        )
        api.echo()
        annotations = writer.taint_rules[RULE]["metadata"]["annotations"]
        annotations["gpu.fracgpu.dev/mps-trust-domain"] = "namespace/team-z"  # now the recorded domain
        api.echo()
        z = api.put(waiting("z", "team-z", "2026-12-05T10:00:03Z"))
        await controller.status.reconcile(z)
        assert condition_of(writer, "z") is None, "admitted by a rule that a holder's domain contradicts"
        await api.settle()
        assert annotations is not writer.taint_rules[RULE]["metadata"]["annotations"]
        assert writer.taint_rules[RULE]["metadata"]["annotations"]["gpu.fracgpu.dev/mps-trust-domain"] == (
            "namespace/team-a"
        )
        assert "its annotation gpu.fracgpu.dev/mps-trust-domain is 'namespace/team-z'" in writer.rule_events[-1][3]
        assert kind_of(writer, "z") == CONFLICT_CONDITION

    run(test)


def test_a_rule_moved_off_our_driver_leaves_the_index_and_is_read_back_and_restored() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        await api.settle()
        writer.taint_rules[RULE]["spec"]["deviceSelector"] = {"driver": "nic.example.com"}
        api.echo()
        assert RULE not in api.world.rules
        await controller.mps.rules.run_pass()  # create: 409, read back, written again
        assert writer.rule_writes[-1] == ("apply", RULE)
        assert writer.taint_rules[RULE]["spec"]["deviceSelector"] == {
            "driver": DRIVER_NAME,
            "pool": NODE,
            "device": "gpu-0",
        }
        assert (
            "was edited: its deviceSelector selects driver=nic.example.com, pool=<any>, device=<any>"
            in (writer.rule_events[-1][3])
        )

    run(test)


def test_a_rule_that_exists_unseen_is_read_back_and_never_replaced_by_another_domain() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        theirs = rule_of("team-b")
        writer.taint_rules[RULE] = theirs  # created by another replica; its watch event has not come yet
        a = api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        b = api.put(waiting("b", "team-b", "2026-12-05T10:00:02Z"))
        await controller.mps.rules.run_pass()  # wants team-a (the earliest): 409, reads team-b's, keeps it
        assert writer.rule_writes == [] and writer.taint_rules[RULE] == theirs
        await api.settle()
        assert writer.rule_writes == [] and writer.rule_events == []
        assert kind_of(writer, "b") == ADMITTED_CONDITION
        assert kind_of(writer, "a") == CONFLICT_CONDITION
        assert {a, b} <= set(api.bodies)

    run(test)


def rule_of(namespace: str) -> dict[str, Any]:
    """gpu-0's rule as a controller writes it for `namespace`."""
    body = taint_rule(DRIVER_NAME, NODE, "gpu-0", TrustDomain("namespace", namespace))
    assert body is not None
    body["metadata"]["uid"] = "uid-theirs"
    return body


def test_admin_access_is_admitted_and_never_decides_keeps_or_changes_a_domain() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        alone = api.put(waiting("monitor", "ops", "2026-12-05T10:00:01Z", admin=True))
        await api.settle()
        assert writer.rule_writes == [], "admin access decided the GPU's domain"
        admitted = condition_of(writer, "monitor")
        assert admitted is not None and admitted[:2] == (ADMITTED_CONDITION, "AdminAccess")
        assert "admin access to MPS GPU gpu-0 of node node-a (monitoring): it is not a tenant" in admitted[2]
        assert "mpsTrustDomain" not in entry_of(writer, "monitor")["data"]
        a = api.put(waiting("a", "team-a", "2026-12-05T10:00:02Z"))
        other = api.put(waiting("monitor-b", "team-b", "2026-12-05T10:00:03Z", admin=True))
        await api.settle()
        assert writer.taint_rules[RULE]["spec"]["taint"]["value"] == "team-a"
        assert kind_of(writer, "a") == ADMITTED_CONDITION
        admitted_b = condition_of(writer, "monitor-b")
        assert admitted_b is not None and admitted_b[:2] == (ADMITTED_CONDITION, "AdminAccess"), "refused as a tenant"
        assert writer.events == []
        api.delete(a)
        await api.settle()
        assert RULE not in writer.taint_rules, "admin access kept the domain's rule alive"
        assert {alone, other} <= set(api.bodies)

    run(test)


def test_a_claim_without_binding_conditions_holds_the_gpu_and_a_non_mps_gpu_gets_nothing() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        api.put(claim("old", results=[result("gpu", "gpu-0", "10Gi", "s-old")], namespace="team-a"))
        api.put(waiting("new", "team-b", "2026-12-05T10:00:01Z"))
        api.put(claim("plain", results=[result("gpu", "gpu-1", "10Gi", "s-p")], namespace="team-b"))
        await api.settle()
        assert "conditions" not in entry_of(writer, "old") and entry_of(writer, "old")["data"]["mpsTrustDomain"]
        assert writer.taint_rules[RULE]["spec"]["taint"]["value"] == "team-a"
        assert kind_of(writer, "new") == CONFLICT_CONDITION
        plain = entry_of(writer, "plain")
        assert "mpsTrustDomain" not in plain["data"] and "conditions" not in plain
        assert list(writer.taint_rules) == [RULE]

    run(test)


def test_scope_cluster_admits_every_tenant_without_a_rule_and_deletes_rules_left_from_another_scope() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        writer.taint_rules[RULE] = rule_of("team-b")  # left by a controller of scope namespace
        api.echo()
        api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        api.put(waiting("b", "team-b", "2026-12-05T10:00:02Z"))
        await api.settle()
        for name in ("a", "b"):
            assert kind_of(writer, name) == ADMITTED_CONDITION, name
            assert entry_of(writer, name)["data"]["mpsTrustDomain"] == "cluster"
        assert writer.rule_writes == [("delete", RULE)] and writer.rule_events == []
        assert controller.mps.serving_id(GPU_0) == "cluster"

    run(test, mps_trust_scope="cluster")


def test_a_pending_claim_is_told_which_domains_hold_the_gpus_with_room_as_their_rules_record() -> None:
    async def test(controller: Controller, api: Api) -> None:
        api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z", "gpu-0"))
        api.put(waiting("b", "team-b", "2026-12-05T10:00:02Z", "gpu-1"))
        await api.settle()
        assert await controller.ledger.reconcile()
        for name, status in api.writer.gpu_status.items():
            api.world.gpus[name] = [ExistingGpu(name=name, labels={}, spec={}, status=status)]
        pending = claim("c", requests=[memory_request("gpu", "10Gi")], namespace="team-c")
        del pending["status"]
        key = api.put({**pending, "status": {}})
        ((request, message),) = controller.mps.waiting(api.world.claims[key][0])
        assert request == "gpu" and "this claim of namespace team-c waits" in message
        assert "gpu-0 of node node-a (namespace team-a), gpu-1 of node node-a (namespace team-b)" in message
        await controller.status.reconcile(key)
        assert [(n, r) for n, r, _ in api.writer.events] == [("c", "MpsTrustDomainWaiting")]
        del api.writer.taint_rules[RULE]  # gpu-0's rule gone (not yet restored): the fact is gone with it
        api.echo()
        assert controller.mps.serving_id(GPU_0) is None
        assert controller.mps.waiting(api.world.claims[key][0]) == []

    run(test, mps_gpus=("gpu-0", "gpu-1"))


def test_other_domains_mps_gpus_without_the_compute_it_asks_are_no_room_for_a_pending_claim() -> None:
    async def test(controller: Controller, api: Api) -> None:
        for name, namespace, device, compute in (("a", "team-a", "gpu-0", "100"), ("b", "team-b", "gpu-1", "60")):
            body = waiting(name, namespace, "2026-12-05T10:00:01Z", device)
            body["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["compute"] = compute
            api.put(body)
        await api.settle()
        assert await controller.ledger.reconcile()
        for name, status in api.writer.gpu_status.items():
            api.world.gpus[name] = [ExistingGpu(name=name, labels={}, spec={}, status=status)]

        def pending(name: str, compute: str) -> tuple[str, str]:
            request = memory_request("gpu", "10Gi")
            request["exactly"]["capacity"]["requests"]["compute"] = compute
            body = claim(name, requests=[request], namespace="team-c")
            return api.put({**body, "status": {}})

        key = pending("c", "50")  # both GPUs have 60Gi free, neither 50 of compute
        assert controller.mps.waiting(api.world.claims[key][0]) == [], "no GPU has room: not a matter of domains"
        await controller.status.reconcile(key)
        assert [(n, r) for n, r, _ in api.writer.events] == [("c", "GpuRoomWaiting")]
        small = pending("d", "40")  # gpu-1 has 40 left: only team-b's GPU has room for it
        ((request, message),) = controller.mps.waiting(api.world.claims[small][0])
        assert request == "gpu" and "(gpu-1 of node node-a (namespace team-b))" in message, message
        await controller.status.reconcile(small)
        assert [(n, r) for n, r, _ in api.writer.events][1:] == [("d", "MpsTrustDomainWaiting")]

    run(test, mps_gpus=("gpu-0", "gpu-1"))


def test_a_failed_write_keeps_its_gpu_for_the_next_pass_and_a_full_pass_deletes_rules_of_no_mps_gpu() -> None:
    async def test(controller: Controller, api: Api) -> None:
        writer = api.writer
        left = taint_rule(DRIVER_NAME, NODE, "gpu-9", TrustDomain("namespace", "gone"))  # a GPU no longer published
        assert left is not None
        writer.taint_rules[left["metadata"]["name"]] = left
        api.echo()
        api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z", "gpu-0"))
        api.put(waiting("b", "team-b", "2026-12-05T10:00:02Z", "gpu-1"))
        writer.fail = [api_error(500, "boom")]  # gpu-0's create
        controller.mps.resync()
        assert not await controller.mps.rules.run_pass()
        assert writer.rule_writes == [("create", RULE_1), ("delete", left["metadata"]["name"])], "the others went on"
        assert await controller.mps.rules.run_pass()
        assert writer.rule_writes[-1] == ("create", RULE) and set(writer.taint_rules) == {RULE, RULE_1}

    run(test, mps_gpus=("gpu-0", "gpu-1"))


def test_without_mps_nothing_is_decided() -> None:
    async def test(controller: Controller, api: Api) -> None:
        api.put(waiting("a", "team-a", "2026-12-05T10:00:01Z"))
        await api.settle()
        entry = entry_of(api.writer, "a")
        assert "conditions" not in entry and "mpsTrustDomain" not in entry["data"] and api.writer.rule_writes == []

    run(test, mps=False)
