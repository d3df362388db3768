"""Which pods hear a claim's Event (`plan_pod_events`), what they read, and the per-pod rate limit (pure)."""

from typing import Any

import pytest

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.claims import ClaimView, PodRef, claim_view
from controller.status.pod_events import PodRateLimit, PodView, claim_pods, plan_pod_events, pod_view

KEY = ("UnsatisfiableGpuRequest", "gpu", "msg")
MESSAGE = "no GPU of gpu.fracgpu.dev can ever satisfy this claim: request 'gpu' asks for 200Gi"


def pod_body(
    name: str,
    *,
    named: dict[str, str] | None = None,
    made: dict[str, str] | None = None,
    extended: str | None = None,
    node: str = "",
    **meta: Any,
) -> dict[str, Any]:
    """A Pod using existing claims (`named`: pod claim name -> claim), claims made from its templates (`made`: pod
    claim name -> the claim made, in its status) and the scheduler's claim for its extended resources."""
    status: dict[str, Any] = {"phase": meta.pop("phase", "Pending")}
    if made:
        status["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v} for k, v in made.items()]
    if extended:
        status["extendedResourceClaimStatus"] = {"resourceClaimName": extended, "requestMappings": []}
    claims = [{"name": k, "resourceClaimName": v} for k, v in (named or {}).items()]
    claims += [{"name": k, "resourceClaimTemplateName": "tpl"} for k in made or {}]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", **meta},
        "spec": {"resourceClaims": claims, **({"nodeName": node} if node else {})},
        "status": status,
    }


def view(body: dict[str, Any]) -> PodView:
    found = pod_view(body)
    assert found is not None
    return found


PENDING = ClaimView(namespace="ns", name="shared", uid="uid-shared", allocated=False)
OWNED = ClaimView(namespace="ns", name="p-gpu-x7k2", uid="uid-c", allocated=False, pod="p", pod_uid="uid-p")


def told(claim: ClaimView, *bodies: dict[str, Any]) -> dict[str, str]:
    return {e.pod.name: e.message for e in plan_pod_events(claim, KEY, KEY[0], MESSAGE, map(view, bodies))}


def test_a_pod_view_knows_every_way_a_pod_names_a_claim() -> None:
    pod = view(pod_body("p", named={"data": "shared"}, made={"gpu": "p-gpu-x7k2"}, extended="p-extended-gpu-ab12"))
    assert dict(pod.claims) == {"shared": "data", "p-gpu-x7k2": "gpu", "p-extended-gpu-ab12": ""}
    assert pod.ref == PodRef(name="p", uid="uid-p") and not pod.node and not pod.finished
    assert view(pod_body("q", deletionTimestamp="2026-01-01T00:00:00Z")).finished
    assert view(pod_body("q", phase="Failed")).finished
    assert pod_view({"metadata": {"name": "no-uid"}}) is None
    assert pod_view({"metadata": "odd"}) is None


def test_a_pending_claim_is_told_to_the_unbound_pods_that_use_it_under_their_own_name_for_it() -> None:
    found = told(
        PENDING,
        pod_body("waits", named={"data": "shared"}),
        pod_body("bound", named={"data": "shared"}, node="n1"),
        pod_body("other", named={"data": "another"}),
        pod_body("gone", named={"data": "shared"}, deletionTimestamp="2026-01-01T00:00:00Z"),
    )
    assert found == {"waits": f"claim 'data' (ResourceClaim shared): {MESSAGE}"}


def test_an_owned_claim_is_told_to_its_owner_only_if_it_is_the_same_pod() -> None:
    assert told(OWNED, pod_body("p", made={"gpu": "p-gpu-x7k2"})) == {
        "p": f"claim 'gpu' (ResourceClaim p-gpu-x7k2): {MESSAGE}"
    }
    extended = OWNED.model_copy(update={"name": "p-extended-gpu-ab12"})
    assert told(extended, pod_body("p", extended="p-extended-gpu-ab12")) == {
        "p": f"ResourceClaim p-extended-gpu-ab12: {MESSAGE}"
    }
    again = pod_body("p")
    again["metadata"]["uid"] = "uid-p-2"  # a new pod of the same name does not own the claim
    assert told(OWNED, again) == {}
    assert told(OWNED.model_copy(update={"namespace": "elsewhere"}), pod_body("p")) == {}


def test_a_template_claim_is_told_under_the_pods_name_for_it_before_the_pods_status_lists_it() -> None:
    body = {**OWNED.model_dump(), "pod_claim_name": "gpu"}
    annotated = ClaimView(**body)
    assert told(annotated, pod_body("p")) == {"p": f"claim 'gpu' (ResourceClaim p-gpu-x7k2): {MESSAGE}"}
    assert told(OWNED, pod_body("p")) == {"p": f"ResourceClaim p-gpu-x7k2: {MESSAGE}"}, "no annotation: the claim only"
    claim = claim_view_of({"resource.kubernetes.io/pod-claim-name": "gpu"})
    assert (claim.pod, claim.pod_claim_name) == ("p", "gpu")
    assert claim_view_of({}).pod_claim_name == ""


def claim_view_of(annotations: dict[str, str]) -> ClaimView:
    """A template's claim as kube-controller-manager makes it (owned by pod `p`), with `annotations`."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "p-gpu-x7k2", "namespace": "ns", "uid": "uid-c", "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}],
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_NAME}}]}},
    }  # fmt: skip
    found = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert found is not None
    return found


def test_an_allocated_claim_is_told_to_the_pods_that_hold_it_bound_or_not() -> None:
    held = PENDING.model_copy(
        update={"allocated": True, "reserved": (PodRef(name="a", uid="uid-a"), PodRef(name="b", uid="uid-b"))}
    )
    found = told(
        held,
        pod_body("a", named={"data": "shared"}, node="n1", phase="Running"),
        pod_body("b", named={"data": "shared"}),
        pod_body("c", named={"data": "shared"}),  # uses it, not among those holding it (waits for room)
    )
    assert set(found) == {"a", "b"}
    assert claim_pods(held) == held.reserved
    owned = OWNED.model_copy(update={"allocated": True, "reserved": (PodRef(name="p", uid="uid-p"),)})
    assert claim_pods(owned) == (PodRef(name="p", uid="uid-p"),), "the owner once"


def test_only_a_pending_claim_pods_name_needs_a_list() -> None:
    assert claim_pods(PENDING) is None
    assert claim_pods(OWNED) == (PodRef(name="p", uid="uid-p"),)


def test_the_rate_limit_allows_a_burst_then_says_when_the_oldest_leaves_the_window() -> None:
    limit = PodRateLimit(limit=3, window=60.0)
    assert [limit.take("p", t) for t in (0.0, 1.0, 2.0)] == [0.0, 0.0, 0.0]
    assert limit.take("p", 10.0) == pytest.approx(50.0)
    assert limit.take("q", 10.0) == 0.0, "per pod"
    assert limit.take("p", 60.0) == 0.0, "the first left the window"
    assert limit.take("p", 60.5) == pytest.approx(0.5)
    assert limit.take("p", 200.0) == 0.0
