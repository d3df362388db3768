"""Unit tests of the controller's Event posting and DeviceTaintRule writes (controller/core/kube.py) against a fake
REST client."""

import json
from typing import Any

from api.kube_errors import api_error
from api.kube_rest import KubeRest
from controller.core.claims import ClaimView, PodRef
from controller.core.kube import (
    KubeWriter,
    event_name,
    pod_event_name,
    post_claim_event,
    post_pod_event,
    post_taint_rule_event,
)

#: kube-apiserver's answer to a create in a namespace being deleted (its NamespaceLifecycle admission plugin)
TERMINATING = {
    "kind": "Status",
    "status": "Failure",
    "reason": "Forbidden",
    "code": 403,
    "message": 'events "c1.x" is forbidden: unable to create new content in namespace ns because it is being terminated',
    "details": {
        "name": "c1.x",
        "kind": "events",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": "namespace ns is being terminated",
                "field": "metadata.namespace",
            }
        ],
    },
}
CLAIM = ClaimView(namespace="ns", name="c1", uid="uid-1", allocated=False)
KEY = ("UnsatisfiableGpuRequest", "gpu", "85899345920")


class FakeRest:
    """Records created bodies; `errors` makes the next creates raise these in turn."""

    def __init__(self, *errors: Exception) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.errors = list(errors)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.errors:
            raise self.errors.pop(0)
        self.created.append((path, body))
        return {**body, "metadata": {**body["metadata"], "uid": "uid-made"}}

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        self.created.append((path, query))
        return {"items": [{"metadata": {"name": "r"}}] if query.get("fieldSelector") == "metadata.name=r" else []}


def post(rest: FakeRest, claim: ClaimView = CLAIM, key: tuple[str, ...] = KEY) -> bool:
    fake: KubeRest = rest  # type: ignore[assignment]  # duck-typed: only create() is used
    return post_claim_event(fake, claim, key, reason=key[0], message="too big")


def test_event_names_are_deterministic_per_claim_uid_and_key() -> None:
    name = event_name(CLAIM, KEY)
    assert name == event_name(CLAIM, KEY) and name.startswith("c1.") and len(name) == len("c1.") + 16
    assert event_name(CLAIM, (*KEY[:2], "1")) != name
    assert event_name(CLAIM.model_copy(update={"uid": "uid-2"}), KEY) != name, "a new claim of the same name"
    long = CLAIM.model_copy(update={"name": "a" * 235 + "-" + "b" * 17})
    assert len(event_name(long, KEY)) <= 253 and not event_name(long, KEY).split(".")[0].endswith("-")


def test_posted_events_carry_the_deterministic_name() -> None:
    rest = FakeRest()
    assert post(rest)
    ((path, body),) = rest.created
    assert path == "/api/v1/namespaces/ns/events"
    assert body["metadata"] == {"name": event_name(CLAIM, KEY), "namespace": "ns"}
    assert body["involvedObject"]["uid"] == "uid-1" and body["reason"] == KEY[0]


def test_already_existing_events_count_as_posted_and_failures_do_not() -> None:
    assert post(FakeRest(api_error(409, "AlreadyExists")))
    assert not post(FakeRest(api_error(500, "boom")))
    assert not post(FakeRest(ConnectionResetError("reset")))
    terminating = api_error(403, "Forbidden", json.dumps(TERMINATING))
    assert post(FakeRest(terminating)), "never postable: not worth retrying"


def test_a_taint_rule_is_created_by_a_create_and_read_back_by_name() -> None:
    rest = FakeRest()
    writer = KubeWriter.__new__(KubeWriter)
    writer.rest = rest  # type: ignore[assignment]  # duck-typed: create() and get()
    rule = {"metadata": {"name": "r"}, "spec": {}}
    assert writer.create_taint_rule(rule) == "uid-made"
    assert writer.read_taint_rule("r") == {"metadata": {"name": "r"}} and writer.read_taint_rule("s") is None
    assert rest.created == [
        ("/apis/resource.k8s.io/v1/devicetaintrules", rule),
        ("/apis/resource.k8s.io/v1/devicetaintrules", {"fieldSelector": "metadata.name=r"}),
        ("/apis/resource.k8s.io/v1/devicetaintrules", {"fieldSelector": "metadata.name=s"}),
    ]


def test_an_event_about_a_taint_rule_names_it_in_namespace_default() -> None:
    rest = FakeRest()
    fake: KubeRest = rest  # type: ignore[assignment]
    assert post_taint_rule_event(fake, "r", "uid-r", reason="MpsTaintRuleRestored", message="was deleted")
    ((path, body),) = rest.created
    assert path == "/api/v1/namespaces/default/events"
    assert body["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "name": "r",
        "uid": "uid-r",
    }
    assert (body["type"], body["reason"], body["message"]) == ("Warning", "MpsTaintRuleRestored", "was deleted")


def test_pod_events_are_named_after_the_pod_uid_and_the_claims_event_and_are_one_line() -> None:
    rest = FakeRest()
    pod = PodRef(name="p", uid="uid-p")
    about = ("uid-1", *KEY)
    fake: KubeRest = rest  # type: ignore[assignment]  # duck-typed: only create() is used
    assert post_pod_event(fake, "ns", pod, about, reason=KEY[0], message="selector a ==\n  1 matches none")
    ((path, body),) = rest.created
    assert path == "/api/v1/namespaces/ns/events"
    assert body["metadata"] == {"name": pod_event_name(pod, about), "namespace": "ns"}
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": "uid-p"}
    assert body["message"] == "selector a == 1 matches none"
    assert pod_event_name(pod, about).startswith("p.")
    assert pod_event_name(PodRef(name="p", uid="uid-p2"), about) != pod_event_name(pod, about), "a new pod"
    assert pod_event_name(pod, ("uid-2", *KEY)) != pod_event_name(pod, about), "another claim"
    exists: KubeRest = FakeRest(api_error(409, "AlreadyExists"))  # type: ignore[assignment]
    assert post_pod_event(exists, "ns", pod, about, reason="R", message="m"), "posted before: counts as posted"


class PagedPods:
    """Answers pod reads as the API server does: a GET of a missing pod is NotFound, a list comes in pages."""

    def __init__(self, pages: list[list[str]]) -> None:
        self.pages = pages
        self.queries: list[tuple[str, dict[str, Any]]] = []

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        self.queries.append((path, query))
        if not path.endswith("/pods"):
            raise api_error(404, "NotFound")
        page = int(query.get("continue") or 0)
        more = {"continue": str(page + 1)} if page + 1 < len(self.pages) else {}
        return {"metadata": more, "items": [{"metadata": {"name": n}} for n in self.pages[page]]}


def test_unbound_pods_are_listed_page_by_page_and_a_missing_pod_reads_as_none() -> None:
    rest = PagedPods([["a", "b"], ["c"]])
    writer = KubeWriter.__new__(KubeWriter)
    writer.rest = rest  # type: ignore[assignment]  # duck-typed: get()
    assert [p["metadata"]["name"] for p in writer.list_unbound_pods("ns")] == ["a", "b", "c"]
    assert [q.get("continue") for _, q in rest.queries] == [None, "1"]
    assert all(q["fieldSelector"] == "spec.nodeName=" for _, q in rest.queries)
    assert writer.read_pod("ns", "gone") is None
    assert rest.queries[-1][0] == "/api/v1/namespaces/ns/pods/gone"
