"""No claim can take the controller down (issue #9): claims nested as deep as the real API server stores.

The API server keeps `opaque.parameters` up to 10 KiB (OpaqueParametersMaxLength) and decodes up to 10000
levels, so 10 KiB of `[[[...]]]` (5000 levels) is stored. Such a claim, of our driver or of another one, is
listed and watched by the controller as a process under its own RBAC, created before it starts, while it
runs and while it is down; the controller stays up, keeps writing status for good claims, reads the deep
claim of ours as far as it can (status written, Event posted), counts what it skipped, and its webhook
refuses a deep GpuConfig with a message instead of an error.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api import bounded_json
from api.crds import CRD_DIR
from api.gpu import GPU_CRD_NAME
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.rbac import cluster_role_rules
from harness import kube
from harness.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration

OTHER_DRIVER = "nic.other.example.com"
DEPTH = 5000
"""Levels of `[...]` in 10 KiB of parameters: the deepest the API server stores in a claim."""
SKIPPED = "fracgpu_controller_objects_skipped_total"


def deep_parameters(depth: int = DEPTH) -> str:
    """JSON text of parameters nested `depth` arrays deep (built as text: json.dumps itself recurses)."""
    return '{"apiVersion":"fracgpu.dev/v1alpha1","kind":"GpuConfig","env":{"A":' + "[" * depth + "]" * depth + "}}"


def deep_object_parameters(depth: int = 1680) -> str:
    """JSON text of parameters nested `depth` objects deep (10 KiB)."""
    return '{"apiVersion":"fracgpu.dev/v1alpha1","kind":"GpuConfig","x":' + '{"a":' * depth + "1" + "}" * depth + "}"


def claim_text(name: str, device_class: str, driver: str, parameters: str | None) -> str:
    """A ResourceClaim for one device of `device_class` (10Gi for ours), optionally with an opaque config."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if device_class == DEVICE_CLASS_NAME:
        exactly["capacity"] = {"requests": {"memory": "10Gi"}}
    devices: dict[str, Any] = {"requests": [{"name": "dev", "exactly": exactly}]}
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}}
    text = json.dumps({**body, "spec": {"devices": devices}})
    if parameters is None:
        return text
    config = '[{"opaque":{"driver":"%s","parameters":%s}}]' % (driver, parameters)  # noqa: UP031 - JSON text
    return text[: -len("}}}")] + ',"config":' + config + "}}}"


def post_raw(api_client: client.ApiClient, namespace: str, text: str | bytes) -> tuple[int, dict[str, Any]]:
    """POST a claim as JSON text or bytes, exactly as given (the client would re-encode it); (status, answer)."""
    host = api_client.configuration.host
    answer = api_client.rest_client.pool_manager.request(
        "POST",
        f"{host}/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        body=text.encode() if isinstance(text, str) else text,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        decoded: dict[str, Any] = json.loads(answer.data)
    except (RecursionError, UnicodeDecodeError):  # the created claim comes back as it went in
        decoded = {}
    return answer.status, decoded


def raw_claim(api_client: client.ApiClient, namespace: str, name: str) -> str:
    answer = api_client.rest_client.pool_manager.request(
        "GET", f"{api_client.configuration.host}/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    )
    assert answer.status == 200, answer.data[:300]
    return str(answer.data.decode())


def status_data(api_client: client.ApiClient, namespace: str, name: str) -> list[Any] | None:
    """Our driver's status.devices data of a claim (decoded with its deep parts skipped: json.loads fails)."""
    status = bounded_json.loads(raw_claim(api_client, namespace, name)).get("status") or {}
    data = [d.get("data") for d in status.get("devices") or [] if d["driver"] == DRIVER_NAME]
    return data if data and all(data) else None


def events(api_client: client.ApiClient, namespace: str, claim: str, reason: str) -> list[Any]:
    return list(
        client.CoreV1Api(api_client)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={claim},reason={reason}")
        .items
    )


@pytest.fixture(scope="module")
def setup(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[kube.ControllerProcess, str]]:
    """The CRD, both DeviceClasses, a node with two GPUs, and a controller process (not started)."""
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kube.ensure_device_class(dyn, DEVICE_CLASS_NAME, DRIVER_NAME)
    kube.ensure_device_class(dyn, OTHER_DRIVER, OTHER_DRIVER)
    node_body = kube.create_fake_node(api_client, kube.unique("gpunode"))
    node = node_body["metadata"]["name"]
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, kube.simulated_gpus(node, 2))
    nics = [{"name": f"nic-{i}", "attributes": {"port": {"int": i}}} for i in range(4)]
    kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice").create(body=kube.gpu_slice(OTHER_DRIVER, node_body, nics))
    workdir = tmp_path_factory.mktemp("robust-controller")
    kubeconfig = kube.service_account_kubeconfig(
        api_client,
        server=control_plane.server,
        ca_cert=control_plane.ca_cert,
        namespace="fracgpu-system",
        name="fracgpu-controller-robust",  # not the chart's ClusterRole name: the chart tests install the chart
        rules=cluster_role_rules(),
        path=workdir / "controller.kubeconfig",
    )
    with kube.chart_made_webhook_configuration(api_client, DRIVER_NAME):
        proc = kube.ControllerProcess(workdir, kubeconfig, "--ledger-delay=0.2")
        yield proc, node
        if proc.proc is not None:
            proc.terminate()
        print(f"controller log:\n{proc.log_tail(60)}")


def test_deep_claims_of_any_driver_neither_stop_the_controller_nor_other_claims(
    setup: tuple[kube.ControllerProcess, str], api_client: client.ApiClient, namespace: str
) -> None:
    controller, node = setup
    core = client.CoreV1Api(api_client)

    def create(name: str, device_class: str, driver: str, parameters: str | None, not_utf8: bool = False) -> None:
        text = claim_text(name, device_class, driver, parameters)
        # bytes that are not UTF-8: the API server stores and serves them as sent
        body = text.encode().replace(b"NOT-UTF8", b"\xff") if not_utf8 else text
        status, answer = post_raw(api_client, namespace, body)
        assert status == 201, answer.get("message", answer)
        core.create_namespaced_pod(namespace, kube.pod_with_claim(f"p-{name}", None, node, {"c": name}))

    def wait_written(name: str) -> list[Any]:
        try:
            return kube.wait_for(lambda: status_data(api_client, namespace, name), 60, what=f"status of {name}")
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- controller log:\n{controller.log_tail()}") from None

    def wait_event(name: str) -> list[Any]:
        return kube.wait_for(
            lambda: events(api_client, namespace, name, "UnreadableClaimParts"), 30, what=f"Event on {name}"
        )

    # before the controller starts: deep claims of another driver and of ours, and a good claim
    create("deep-other", OTHER_DRIVER, OTHER_DRIVER, deep_parameters())
    create("deep-ours", DEVICE_CLASS_NAME, DRIVER_NAME, deep_parameters())
    create("deep-objects", DEVICE_CLASS_NAME, DRIVER_NAME, deep_object_parameters())
    create("good-1", DEVICE_CLASS_NAME, DRIVER_NAME, None)
    create("bytes-other", OTHER_DRIVER, OTHER_DRIVER, '{"a":"NOT-UTF8"}', not_utf8=True)
    assert raw_claim(api_client, namespace, "deep-other").count("[") >= DEPTH, "the API server stored it whole"

    controller.start()
    assert wait_written("good-1")[0]["memory"] == "10Gi"
    # our deep claims are read as far as they can be: status written, and an Event naming what was skipped
    # (the API server itself refuses to server-side apply the status of the claim nested 5000 arrays deep:
    # "status.allocation: Invalid value: null"; the controller retries it with backoff, as any failed write)
    assert wait_written("deep-objects")[0]["memory"] == "10Gi"
    for name in ("deep-ours", "deep-objects"):
        posted = wait_event(name)
        assert "spec.devices.config[0].opaque.parameters" in posted[0].message, posted[0].message
        assert "nested deeper than 100 levels" in posted[0].message, posted[0].message
    assert not events(api_client, namespace, "deep-other", "UnreadableClaimParts"), "not ours: no Event"
    assert not events(api_client, namespace, "good-1", "UnreadableClaimParts")
    assert controller.metric(SKIPPED, resource="ResourceClaim", reason="deep") >= 3
    assert controller.metric(SKIPPED, resource="ResourceClaim", reason="not-utf8") >= 1  # listed
    assert "deep-other" in controller.log_tail(400), "the skipped claim of another driver is logged"

    # while it runs: another driver's deep claim (not ours to judge) and a good claim
    create("deep-other-2", OTHER_DRIVER, OTHER_DRIVER, deep_parameters())
    create("bytes-other-2", OTHER_DRIVER, OTHER_DRIVER, '{"a":"NOT-UTF8"}', not_utf8=True)
    create("good-2", DEVICE_CLASS_NAME, DRIVER_NAME, None)
    assert wait_written("good-2")[0]["memory"] == "10Gi"
    assert controller.metric(SKIPPED, resource="ResourceClaim", reason="not-utf8") >= 2  # and watched
    # our webhook refuses a deep GpuConfig with a message (it answered 500 before, which failurePolicy
    # Ignore turned into an admission)
    status, answer = post_raw(
        api_client, namespace, claim_text("deep-refused", DEVICE_CLASS_NAME, DRIVER_NAME, deep_parameters())
    )
    assert status == 422, answer
    assert 'admission webhook "resourceclaims.gpu.fracgpu.dev" denied the request' in answer["message"]
    assert (
        "spec.devices.config[0].opaque.parameters: nested deeper than 16 levels (at env.A[0][0][0][0]..."
        in answer["message"]
    ), answer["message"]

    # a crash and a restart with all of them listed again, plus a deep claim of ours admitted while the
    # webhook was down (failurePolicy Ignore): no crash loop, good claims keep being written
    controller.kill()
    create("deep-while-down", DEVICE_CLASS_NAME, DRIVER_NAME, deep_object_parameters())
    controller.start()
    create("good-3", DEVICE_CLASS_NAME, DRIVER_NAME, None)
    assert wait_written("good-3")[0]["memory"] == "10Gi"
    assert wait_written("deep-while-down")[0]["memory"] == "10Gi"
    wait_event("deep-while-down")
    assert len(events(api_client, namespace, "deep-ours", "UnreadableClaimParts")) == 1, "posted once, not per start"
    assert controller.proc is not None and controller.proc.poll() is None, controller.log_tail()
    log = controller.log_tail(2000)
    assert "RecursionError" not in log and "Traceback" not in log, log
