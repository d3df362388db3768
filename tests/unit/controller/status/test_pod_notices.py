"""A claim's Events reach the pods that use it (`controller.status.pod_notices`) through the controller's status
writers, against the in-memory writer: once per pod, rate-limited per pod, pods gone or bound skipped."""

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from api.kube_errors import api_error
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.claims import claim_view
from controller.loops import Controller
from controller.status.events import REASON_DEVICE_GONE, REASON_SKIPPED_PARTS, REASON_UNSATISFIABLE
from controller.status.pod_events import PodRateLimit
from tests.unit.controller.status.test_pod_events import pod_body
from tests.unit.controller.test_loops import run
from tests.unit.controller_factories import FakeWriter, World, claim, eventually, memory_request, result

TOO_BIG = [memory_request("gpu", "200Gi")]


def owned(name: str, pod: str, **kwargs: Any) -> dict[str, Any]:
    """A claim made for `pod` (from its template): the pod is its controlling owner."""
    body = claim(name, **kwargs)
    ref = {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": f"uid-{pod}", "controller": True}
    body["metadata"]["ownerReferences"] = [ref]
    return body


def put_pod(writer: FakeWriter, body: dict[str, Any]) -> None:
    writer.pods[("ns", body["metadata"]["name"])] = body


def on_pods(writer: FakeWriter) -> list[tuple[str, str]]:
    return sorted((pod, reason) for pod, _, reason, _ in writer.pod_events.values())


def deferred(reason: str) -> float:
    return REGISTRY.get_sample_value("fracgpu_controller_pod_events_deferred_total", {"reason": reason}) or 0.0


def test_the_owner_pod_hears_its_claims_reason_once_even_after_a_restart() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        put_pod(writer, pod_body("p", made={"gpu": "p-gpu"}))
        key = world.put(owned("p-gpu", "p", requests=TOO_BIG))
        for _ in range(3):
            assert await controller.status.reconcile(key)
        ((pod, uid, reason, message),) = writer.pod_events.values()
        assert (pod, uid, reason) == ("p", "uid-p", REASON_UNSATISFIABLE)
        (claim_message,) = [m for _, r, m in writer.events if r == REASON_UNSATISFIABLE]
        assert message == f"claim 'gpu' (ResourceClaim p-gpu): {claim_message}"
        assert writer.pod_reads == [("get", "p")], "read once: told, nothing more to read"

        # a new process knows nothing it told: it posts again under the same name, which the API server refuses
        restarted = Controller(controller.settings, writer)
        restarted.bind(world.slices, world.claims, world.gpus)
        assert await restarted.status.reconcile(key)
        assert len(writer.pod_events) == 1 and len(writer.pod_reads) == 2

    run(test)


def test_a_pod_gone_or_bound_is_skipped_quietly_and_not_read_again() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        gone = world.put(owned("gone-gpu", "gone", requests=TOO_BIG))
        put_pod(writer, pod_body("bound", made={"gpu": "bound-gpu"}, node="n1"))
        bound = world.put(owned("bound-gpu", "bound", requests=TOO_BIG))
        for key in (gone, bound, gone, bound):
            assert await controller.status.reconcile(key)
        assert not writer.pod_events
        assert writer.pod_reads == [("get", "gone"), ("get", "bound")]

    run(test)


def test_the_pods_that_name_a_pending_claim_hear_it_and_one_made_later_within_a_relist() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.status.events.pods.relist = (0.3, 0.6)
        for body in (
            pod_body("a", named={"data": "shared"}),
            pod_body("b", named={"data": "shared"}),
            pod_body("bound", named={"data": "shared"}, node="n1"),
            pod_body("other", named={"data": "another"}),
        ):
            put_pod(writer, body)
        await controller.start()
        controller.claim_changed(world.put(claim("shared", requests=TOO_BIG)))
        await eventually(lambda: bool(writer.pod_events))
        assert on_pods(writer) == [("a", REASON_UNSATISFIABLE), ("b", REASON_UNSATISFIABLE)]
        assert writer.pod_reads == [("list", "ns")]
        put_pod(writer, pod_body("late", named={"data": "shared"}))  # nothing on the claim changes
        await asyncio.sleep(0.1)
        assert len(writer.pod_reads) == 1, "not listed again before the relist"
        await eventually(lambda: len(writer.pod_events) == 3)
        assert on_pods(writer) == [(p, REASON_UNSATISFIABLE) for p in ("a", "b", "late")]
        assert len(writer.pod_reads) == 2
        await asyncio.sleep(0.3)
        assert len(writer.pod_reads) == 2, "then less often"
        await eventually(lambda: len(writer.pod_reads) == 3)
        assert len(writer.pod_events) == 3, "listed again, nobody told twice"

    run(test)


def test_a_device_gone_is_told_to_the_pods_that_hold_the_claim() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        body = claim("held", results=[result("gpu", "gpu-1", "1Gi", "s-1")])
        body["status"]["reservedFor"] = [{"resource": "pods", "name": n, "uid": f"uid-{n}"} for n in ("r", "gone")]
        put_pod(writer, pod_body("r", named={"data": "held"}, node="n1", phase="Running"))
        put_pod(writer, pod_body("waits", named={"data": "held"}))  # uses it, does not hold it
        world.put(body)
        world.publish(1, generation=2)
        await controller.start()
        controller.slices_changed()
        await eventually(lambda: bool(writer.pod_events))
        assert on_pods(writer) == [("r", REASON_DEVICE_GONE)]
        assert sorted(writer.pod_reads) == [("get", "gone"), ("get", "r")], "by name, no list"

    run(test, device_gone_grace_seconds=0.0)


def test_a_pod_over_its_rate_limit_is_told_later_what_still_holds_and_nothing_is_lost() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        controller.status.events.pods.limit = PodRateLimit(limit=2, window=0.4)
        names = [f"c{i}" for i in range(4)]
        put_pod(writer, pod_body("p", named={n: n for n in names}))
        before = deferred(REASON_UNSATISFIABLE)
        await controller.start()
        for n in names:
            controller.claim_changed(world.put(claim(n, requests=TOO_BIG)))
        await eventually(lambda: len(writer.pod_events) == 2)
        await asyncio.sleep(0.1)
        assert len(writer.pod_events) == 2, "at most 2 within the window"
        assert deferred(REASON_UNSATISFIABLE) - before >= 2
        await eventually(lambda: len(writer.pod_events) == 4, timeout=3.0)
        told = sorted(m.split(" ")[1] for _, _, _, m in writer.pod_events.values())
        assert told == [f"'{n}'" for n in names]

    run(test)


def test_a_failed_pod_read_or_post_is_retried() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        put_pod(writer, pod_body("p", made={"gpu": "p-gpu"}))
        key = world.put(owned("p-gpu", "p", requests=TOO_BIG))
        writer.pod_fail = [api_error(500, "InternalError")]
        assert not await controller.status.reconcile(key), "to be retried"
        writer.pod_event_results = [False]
        assert not await controller.status.reconcile(key), "to be retried"
        assert not writer.pod_events
        assert await controller.status.reconcile(key)
        assert on_pods(writer) == [("p", REASON_UNSATISFIABLE)]
        assert [r for _, r, _ in writer.events] == [REASON_UNSATISFIABLE], "the claim's Event posted once"

    run(test)


def test_unreadable_parts_are_told_on_the_claim_only() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        put_pod(writer, pod_body("p", made={"gpu": "p-gpu"}))
        view = claim_view(owned("p-gpu", "p", requests=TOO_BIG), DRIVER_NAME, DEVICE_CLASS_NAME)
        assert view is not None
        assert await controller.status.events.skipped_parts(view.model_copy(update={"skipped": ("spec.x: deep",)}))
        assert [r for _, r, _ in writer.events] == [REASON_SKIPPED_PARTS]
        assert not writer.pod_reads and not writer.pod_events

    run(test)
