"""A pending pod says why where its user looks (issue 38): the controller's reason for its claim is also an Event on
the pod (`kubectl describe pod`), once per pod and reason, against the real API server and kube-scheduler.

The controller runs under a ServiceAccount bound to exactly `controller.core.rbac`'s rules (so the pod reads it
needs must be granted there). Also measured, not asserted: Events per pending pod per minute, over a window in
which the published GPUs change twice (each change tells the pods the claim's new reason).
"""

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import GPU_CRD_NAME
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.settings import COMPONENT
from harness import kube
from harness.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration
REASON = "UnsatisfiableGpuRequest"
WINDOW = 45.0
"""Seconds over which Events per pending pod are counted (the figure is printed, not asserted)."""


@pytest.fixture(scope="module")
def controller(
    api_client: client.ApiClient,
    dyn: DynamicClient,
    chart_controller: Callable[[str], AbstractContextManager[kube.ControllerProcess]],
) -> Iterator[kube.ControllerProcess]:
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kube.ensure_device_class(dyn, DEVICE_CLASS_NAME, DRIVER_NAME)
    with chart_controller("pod-events") as proc:
        yield proc


def _pod_events(core: client.CoreV1Api, namespace: str, pod: Any, *, ours: bool = True) -> list[Any]:
    """The Events `kubectl describe pod` shows for `pod` (involvedObject the pod, by uid); `ours`: the
    controller's only."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={pod.metadata.name},involvedObject.uid={pod.metadata.uid}"
    events = core.list_namespaced_event(namespace, field_selector=selector).items
    return [e for e in events if not ours or e.reporting_component == COMPONENT]


def _times(event: Any) -> int:
    """How many times the Event was recorded (an aggregated Event counts each time; its series too)."""
    return max(event.count or 1, (event.series.count if event.series else 0) or 1)


def _publish(api_client: client.ApiClient, dyn: DynamicClient, memory_gib: int) -> str:
    node = kube.create_fake_node(api_client, kube.unique("gpunode"))
    kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], 2, memory_gib))
    return str(node["metadata"]["name"])


def _unpublish(api_client: client.ApiClient, dyn: DynamicClient, nodes: list[str]) -> None:
    """Delete the nodes' slices and the nodes (GPUs larger than 80Gi would change other tests' figures)."""
    slices = kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice")
    for s in slices.get().to_dict()["items"]:
        if s["spec"].get("nodeName") in nodes:
            slices.delete(name=s["metadata"]["name"])
    for name in nodes:
        client.CoreV1Api(api_client).delete_node(name)


def test_a_pending_pod_hears_its_claims_reason_once_and_the_new_one_when_it_changes(
    controller: kube.ControllerProcess,
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    core = client.CoreV1Api(api_client)
    nodes = [_publish(api_client, dyn, 80)]
    try:
        # a pod with a claim from its template (the pod owns the claim) and two pods naming one claim, all asking
        # 200Gi where the GPUs have 80Gi; pods may run anywhere: the scheduler finds no node for any of them
        kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate").create(
            namespace=namespace, body=kube.claim_template("huge", DEVICE_CLASS_NAME, "200Gi")
        )
        shared = kube.claim_template("shared", DEVICE_CLASS_NAME, "200Gi")
        kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim").create(
            namespace=namespace,
            body={"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "shared"}, **shared["spec"]},
        )  # fmt: skip
        bodies = [
            kube.pod_with_claim("owner", "huge", ""),
            kube.pod_with_claim("named-1", None, "", {"data": "shared"}),
            kube.pod_with_claim("named-2", None, "", {"data": "shared"}),
        ]
        started = time.monotonic()
        for body in bodies:
            del body["spec"]["nodeSelector"]
            core.create_namespaced_pod(namespace, body)
        pods = {b["metadata"]["name"]: core.read_namespaced_pod(b["metadata"]["name"], namespace) for b in bodies}

        def told_all() -> bool:
            return all(_pod_events(core, namespace, p) for p in pods.values())

        try:
            controller.wait_for(told_all, 60, f"a {REASON} Event on every pending pod")
        except AssertionError:
            for e in core.list_namespaced_event(namespace).items:
                print(
                    "EVENT", e.involved_object.kind, e.involved_object.name, e.reason, e.reporting_component, e.source
                )
            print("METRIC", controller.metric("fracgpu_controller_pod_events_total", reason=REASON))
            raise
        first_told = time.monotonic() - started
        owned = core.read_namespaced_pod("owner", namespace).status.resource_claim_statuses[0].resource_claim_name
        for name, pod in pods.items():
            (event,) = _pod_events(core, namespace, pod)
            claim = f"claim 'gpu' (ResourceClaim {owned})" if name == "owner" else "claim 'data' (ResourceClaim shared)"
            assert event.reason == REASON and event.type == "Warning", event
            assert event.message.startswith(f"{claim}: no GPU of {DRIVER_NAME} can ever satisfy this claim: "), event
            assert "200Gi" in event.message and "80Gi" in event.message and "\n" not in event.message, event
            assert _times(event) == 1, "posted once"
        described = subprocess.run(
            [str(control_plane.bin["kubectl"]), f"--kubeconfig={control_plane.kubeconfig}", "describe", "pod", "owner",
             "-n", namespace],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        assert REASON in described and f"ResourceClaim {owned}" in described, described

        # the published GPUs change twice: the claim's reason changes (the largest GPU), each pod hears the new one
        for memory in ("96Gi", "120Gi"):
            time.sleep(5)
            nodes.append(_publish(api_client, dyn, int(memory[:-2])))

            def heard(m: str = memory) -> bool:
                return all(any(m in e.message for e in _pod_events(core, namespace, p)) for p in pods.values())

            controller.wait_for(heard, 60, f"the reason with {memory} on every pod")
        remaining = WINDOW - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
        window = time.monotonic() - started
        ours = {n: sum(_times(e) for e in _pod_events(core, namespace, p)) for n, p in pods.items()}
        every = {n: sum(_times(e) for e in _pod_events(core, namespace, p, ours=False)) for n, p in pods.items()}
        for name, pod in pods.items():
            messages = [e.message for e in _pod_events(core, namespace, pod)]
            assert len(messages) == len(set(messages)) == 3, f"each reason once on {name}: {messages}"
            assert all(_times(e) == 1 for e in _pod_events(core, namespace, pod))
        per_minute = {n: round(c * 60 / window, 1) for n, c in ours.items()}
        print(
            f"\nEvents per pending pod over {window:.0f} s (GPUs published at 0 s, 80Gi; +96Gi, +120Gi later): "
            f"first controller Event on every pod after {first_told:.1f} s; controller's {ours} "
            f"= {per_minute} per minute; all sources (scheduler included) {every} "
            f"= { {n: round(c * 60 / window, 1) for n, c in every.items()} } per minute; "
            f"deferred by the per-pod limit: {controller.metric('fracgpu_controller_pod_events_deferred_total', reason=REASON)}"
        )
    finally:
        _unpublish(api_client, dyn, nodes)
