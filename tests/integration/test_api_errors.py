"""The real kube-apiserver's failures arrive as the typed errors the components decide by (api/kube_errors.py,
parsed by api/kube_rest.py): not found, already exists, a stale write, a status apply for a claim that was deleted
or replaced, forbidden, and a create in a namespace being deleted. Each decision of the controller and the plugin
is a type test, so these types must be what the API server's answers become."""

import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from api.events import event_body, involved_object
from api.kube_config import from_kubeconfig
from api.kube_errors import (
    ApiAlreadyExists,
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiNamespaceTerminating,
    ApiNotFound,
    ApiUidMismatch,
)
from api.kube_rest import KubeConnection, KubeRest, claim_path
from controller.core.kube import describe
from harness import kube
from harness.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration


@pytest.fixture
def rest(api_client: client.ApiClient) -> KubeRest:
    return KubeRest(KubeConnection.of(api_client), timeout=10, budget=10)


def claim(name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "absent.fracgpu.dev"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def status_apply(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The controller's status apply (controller/status/plan.py apply_body): its uid is a precondition."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"devices": []},
    }


def raised(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def test_not_found_already_exists_and_a_stale_write(rest: KubeRest, namespace: str) -> None:
    missing = raised(lambda: rest.get(claim_path(namespace, "absent")))
    assert type(missing) is ApiNotFound and missing.status_reason == "NotFound"
    assert describe(missing) == 'not found (404): resourceclaims.resource.k8s.io "absent" not found'

    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    created = rest.create(claims, claim("c1"))
    assert type(raised(lambda: rest.create(claims, claim("c1")))) is ApiAlreadyExists

    stale = {**created, "metadata": {**created["metadata"], "labels": {"a": "b"}}}
    rest.replace(claim_path(namespace, "c1"), {**created, "metadata": {**created["metadata"], "labels": {"a": "c"}}})
    conflict = raised(lambda: rest.replace(claim_path(namespace, "c1"), stale))
    assert type(conflict) is ApiConflict, "a stale resourceVersion: plain conflict, not a uid mismatch"


def test_a_status_apply_for_a_deleted_or_replaced_claim_is_a_uid_mismatch(rest: KubeRest, namespace: str) -> None:
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    first = rest.create(claims, claim("c2"))
    old_uid = first["metadata"]["uid"]
    rest.apply_unread(claim_path(namespace, "c2") + "/status", status_apply(namespace, "c2", old_uid), "t")
    rest.delete(claim_path(namespace, "c2"))

    def gone() -> bool:
        try:
            rest.get(claim_path(namespace, "c2"))
        except ApiNotFound:
            return True
        return False

    kube.wait_for(gone, 30, what="the claim to be deleted")

    deleted = raised(
        lambda: rest.apply_unread(claim_path(namespace, "c2") + "/status", status_apply(namespace, "c2", old_uid), "t")
    )
    assert type(deleted) is ApiNotFound, "the status subresource of a deleted claim is not found"

    rest.create(claims, claim("c2"))  # the same name, a new claim
    replaced = raised(
        lambda: rest.apply_unread(claim_path(namespace, "c2") + "/status", status_apply(namespace, "c2", old_uid), "t")
    )
    assert type(replaced) is ApiUidMismatch, "a uid is immutable: the API server refuses the old one (422)"
    assert replaced.status == 422 and ("FieldValueInvalid", "metadata.uid") in replaced.causes


def test_forbidden_and_a_terminating_namespace(
    control_plane: ControlPlane, api_client: client.ApiClient, rest: KubeRest, tmp_path: Path
) -> None:
    name = kube.unique("nobody")
    kubeconfig = kube.service_account_kubeconfig(
        api_client,
        server=control_plane.server,
        ca_cert=control_plane.ca_cert,
        namespace=name,
        name=name,
        rules=[],
        path=tmp_path / "nobody.kubeconfig",
    )
    nobody = KubeRest(KubeConnection(from_kubeconfig([kubeconfig])), timeout=10, budget=10)
    forbidden = raised(lambda: nobody.get("/api/v1/namespaces/default/configmaps"))
    assert type(forbidden) is ApiForbidden and forbidden.status_reason == "Forbidden"

    # a namespace held in Terminating by an object with a finalizer
    doomed = f"t-{uuid.uuid4().hex[:8]}"
    rest.create("/api/v1/namespaces", {"metadata": {"name": doomed}})
    held = {"metadata": {"name": "held", "finalizers": ["fracgpu.dev/test-hold"]}}
    rest.create(f"/api/v1/namespaces/{doomed}/configmaps", held)
    rest.delete(f"/api/v1/namespaces/{doomed}")
    try:
        involved = involved_object("v1", "ConfigMap", "held", namespace=doomed)
        body = event_body(involved, "Test", "in a terminating namespace", component="t", instance="t")

        def refused() -> ApiError | None:
            try:
                rest.create(f"/api/v1/namespaces/{doomed}/events", body)
            except ApiError as err:
                return err
            return None

        terminating = kube.wait_for(refused, 30, what="the namespace to be terminating")
        assert type(terminating) is ApiNamespaceTerminating
    finally:
        rest.request(
            "PATCH",
            f"/api/v1/namespaces/{doomed}/configmaps/held",
            body={"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
        )
