"""A claim's GpuConfig sent as a Python or Go client writes JSON (spaces, keys unsorted) still gets its status written,
against the real API server, kube-scheduler and kube-controller-manager.

kube-apiserver stores opaque parameters byte for byte, the scheduler copies them into the allocation, and every later
status write is refused (422 on `status.allocation`) unless those bytes are the API server's own encoding. The
controller's mutating webhook rewrites them so at admission (controller/admission/canonical.py): shown for a claim
created through the API with such bytes, and for a claim kube-controller-manager makes from a template written so.
A claim whose other driver's parameters are sent so (not ours to rewrite) is told why its status stays unwritten
(`ClaimStatusUnwritable`), on the claim and its pod. The controller runs under exactly `controller.core.rbac`'s rules.
"""

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import GPU_CRD_NAME
from api.kube_config import from_kubeconfig
from api.kube_rest import KubeConnection, KubeRest, claim_path
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.settings import COMPONENT
from controller.status.events import REASON_STATUS_UNWRITABLE
from harness import kube
from harness.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration
PARAMETERS = {"kind": "GpuConfig", "apiVersion": "fracgpu.dev/v1alpha1", "env": {"Z_NOTE": "<a> & b", "A_NAME": "é"}}


def spaced(body: Any) -> str:
    """`body` as the kubernetes Python client sends it (`json.dumps`): spaces, keys in insertion order."""
    return json.dumps(body)


@pytest.fixture(scope="module")
def controller(
    api_client: client.ApiClient,
    dyn: DynamicClient,
    chart_controller: Callable[[str], AbstractContextManager[kube.ControllerProcess]],
) -> Iterator[kube.ControllerProcess]:
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    classes = kube.resource(dyn, "resource.k8s.io/v1", "DeviceClass")
    made_class = not kube.exists(lambda: classes.get(name=DEVICE_CLASS_NAME))
    kube.ensure_device_class(dyn, DEVICE_CLASS_NAME, DRIVER_NAME)
    admission = client.AdmissionregistrationV1Api(api_client)

    def registered() -> bool:
        hooks = admission.read_mutating_webhook_configuration(DRIVER_NAME).webhooks or []
        return any(h.name.startswith("canonical-resourceclaims.") for h in hooks)

    with chart_controller("canonical") as proc:
        proc.wait_for(registered, 60, "the canonical webhook registered")
        yield proc
    if made_class:  # a later module's `helm install` would meet a DeviceClass it does not own
        classes.delete(name=DEVICE_CLASS_NAME)


@pytest.fixture(scope="module")
def rest(control_plane: ControlPlane) -> KubeRest:
    return KubeRest(KubeConnection(from_kubeconfig([control_plane.kubeconfig])))


@pytest.fixture(scope="module")
def node(api_client: client.ApiClient, dyn: DynamicClient) -> Iterator[str]:
    made = kube.create_fake_node(api_client, kube.unique("canon"))
    name = str(made["metadata"]["name"])
    kube.publish_gpus(dyn, made, DRIVER_NAME, kube.simulated_gpus(name, 2, 80))
    yield name
    slices = kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice")
    for s in slices.get().to_dict()["items"]:
        if s["spec"].get("nodeName") == name:
            slices.delete(name=s["metadata"]["name"])
    client.CoreV1Api(api_client).delete_node(name)


def claim_spec(*configs: tuple[str, Any]) -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": "1Gi"}}},
    }
    opaque = [{"requests": ["gpu"], "opaque": {"driver": d, "parameters": p}} for d, p in configs]
    return {"devices": {"requests": [request], "config": opaque}}


def entries(rest: KubeRest, namespace: str, name: str) -> list[dict[str, Any]]:
    """The controller's status.devices entries on the claim (its `data`: the GPU's facts)."""
    status = rest.get(claim_path(namespace, name)).get("status") or {}
    return [e for e in status.get("devices") or [] if e.get("driver") == DRIVER_NAME and e.get("data")]


def test_a_claim_sent_with_spaced_unsorted_parameters_is_rewritten_and_its_status_written(
    controller: kube.ControllerProcess, rest: KubeRest, api_client: client.ApiClient, namespace: str, node: str
) -> None:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "spaced"},
            "spec": claim_spec((DRIVER_NAME, PARAMETERS))}  # fmt: skip
    made = rest.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", body=spaced(body))
    stored = made["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert stored == PARAMETERS and list(stored) == sorted(PARAMETERS), "the same value, its keys sorted"
    assert list(stored["env"]) == ["A_NAME", "Z_NOTE"]
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, kube.pod_with_claim("spaced", None, node, {"gpu": "spaced"}))
    written = controller.wait_for(lambda: entries(rest, namespace, "spaced"), 60, "the claim's status entries")
    # the node plugin's write (any writer's) is taken too: a merge patch of a condition on the entry
    entry = {k: written[0][k] for k in ("driver", "pool", "device", "shareID")}
    ready = {**entry, "conditions": [{"type": "Probe", "status": "True", "reason": "Probe", "message": "",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]}  # fmt: skip
    patch = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "spaced", "namespace": namespace}, "status": {"devices": [ready]}}  # fmt: skip
    rest.apply(claim_path(namespace, "spaced") + "/status", patch, "probe")


def test_a_claim_made_from_a_template_with_spaced_parameters_gets_its_status_written(
    controller: kube.ControllerProcess, rest: KubeRest, api_client: client.ApiClient, namespace: str, node: str
) -> None:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "spaced"},
                "spec": {"spec": claim_spec((DRIVER_NAME, PARAMETERS))}}  # fmt: skip
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
    made = rest.request("POST", path, body=spaced(template))
    kept = made["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert list(kept) == list(PARAMETERS), "a template is stored as sent: its claims are rewritten"
    core = client.CoreV1Api(api_client)
    pod = core.create_namespaced_pod(namespace, kube.pod_with_claim("templated", "spaced", node))

    def claim_name() -> str | None:
        statuses = core.read_namespaced_pod(pod.metadata.name, namespace).status.resource_claim_statuses or []
        return next((s.resource_claim_name for s in statuses if s.resource_claim_name), None)

    name = controller.wait_for(claim_name, 60, "kube-controller-manager to make the pod's claim")
    controller.wait_for(lambda: entries(rest, namespace, name), 60, "the template's claim's status entries")


def test_a_claim_whose_status_cannot_be_written_is_told_so_on_the_claim_and_its_pod(
    controller: kube.ControllerProcess, rest: KubeRest, api_client: client.ApiClient, namespace: str, node: str
) -> None:
    # ours rewritten, another driver's (not ours to touch) kept as sent: its status can never be written
    other = {"z": 1, "a": 2}
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "unwritable"},
            "spec": claim_spec((DRIVER_NAME, PARAMETERS), ("nic.example.com", other))}  # fmt: skip
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    rest.request("POST", path, body=spaced(body))
    core = client.CoreV1Api(api_client)
    pod = core.create_namespaced_pod(namespace, kube.pod_with_claim("unwritable", None, node, {"gpu": "unwritable"}))

    def told(kind: str, name: str) -> list[Any]:
        selector = f"involvedObject.kind={kind},involvedObject.name={name},reason={REASON_STATUS_UNWRITABLE}"
        found = core.list_namespaced_event(namespace, field_selector=selector).items
        return [e for e in found if e.reporting_component == COMPONENT]

    (event,) = controller.wait_for(
        lambda: told("ResourceClaim", "unwritable"), 60, "ClaimStatusUnwritable on the claim"
    )
    assert event.type == "Warning"
    assert event.message.startswith(f"{DRIVER_NAME}: the API server refuses every status write to this claim (422")
    assert "compact JSON with sorted keys" in event.message
    (on_pod,) = controller.wait_for(lambda: told("Pod", pod.metadata.name), 60, "ClaimStatusUnwritable on the pod")
    assert event.message in on_pod.message
    assert not entries(rest, namespace, "unwritable")
    assert "giving up on claim status" not in controller.log_tail(400), "not retried: no retry can succeed"
