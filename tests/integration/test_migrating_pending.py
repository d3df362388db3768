"""Every pod of docs/migrating.md's fracgpu examples that stays Pending says why in `kubectl describe pod` (issue 38).

On a cluster of its own (kube-apiserver, kube-controller-manager, kube-scheduler), with the DeviceClasses a default
install creates (`helm template` of the chart with its defaults), the controller, and one fake node publishing two
simulated 80Gi GPUs as `make demo` has them, the examples are applied in page order, each block in a namespace of its
own, as a user following the page on one cluster would. A block's objects are applied as they stand, but for a
toleration of every taint added to each pod (template): the fake node has no kubelet and turns NotReady. A
ResourceClaimTemplate no pod of its block names gets the pod a user writes beside it (one container using the claim).
Deployments become pods through kube-controller-manager, claims from templates through its resourceclaim controller.

Every pod the scheduler leaves unscheduled must carry an Event of fracgpu's controller (reporting component, the pod
as involvedObject) within `TOLD_WITHIN` seconds, and `kubectl describe pod` must show it. A pod that uses no claim
of ours (`nvidia.com/gpu: 1`, which only the chart value `deviceClass.extendedResource.name` gives to fracgpu) is out
of the controller's sight: it must say why through the scheduler's Event naming the resource, and the page must say
what a default install answers. The figures (examples, pods, which pend, with which reasons) are printed.
"""

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import GPU_CRD_NAME
from api.names import DRIVER_NAME
from controller.core.settings import COMPONENT
from harness import kube
from harness.cluster import binaries
from harness.cluster.controlplane import ControlPlane
from tests.integration import own_plane
from tests.integration.test_readme_examples import MIGRATING, yaml_blocks

pytestmark = pytest.mark.integration
control_plane, api_client, dyn = own_plane.control_plane, own_plane.api_client, own_plane.dyn

CHART = Path(__file__).resolve().parents[2] / "charts" / "fracgpu"
TOLD_WITHIN = 40.0
"""Seconds a pending pod may wait for the controller's Event (the pod notices list a namespace again 5 s after
the first list)."""
SETTLED_WITHIN = 30.0
"""Seconds for a block's pods to exist and be bound or found unschedulable by the scheduler."""
TOLERATE_ALL = [{"operator": "Exists"}]


def _default_device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses `helm template` renders with the chart's default values."""
    argv = [str(binaries.binary("helm")), "template", "fg", str(CHART), "--namespace", "fracgpu"]
    argv += ["--kube-version", binaries.version_of("kubectl").removeprefix("v")]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "DeviceClass"]


def _blocks() -> list[tuple[str, list[dict[str, Any]]]]:
    """(where, objects) of each fracgpu block of the page that makes pods, with the pod a user writes beside a
    template no pod of its block names; tolerations added to every pod (template)."""
    found = []
    for b, block in enumerate(yaml_blocks(MIGRATING.read_text()), start=1):
        docs = [d for d in yaml.safe_load_all(block) if d]
        named = set()
        for doc in docs:
            spec = doc["spec"]["template"]["spec"] if doc["kind"] in ("Deployment", "Job") else doc.get("spec")
            if doc["kind"] in ("Pod", "Deployment", "Job"):
                spec["tolerations"] = TOLERATE_ALL
                named |= {c.get("resourceClaimTemplateName") for c in spec.get("resourceClaims") or []}
        for doc in [d for d in docs if d["kind"] == "ResourceClaimTemplate" and d["metadata"]["name"] not in named]:
            docs.append(_pod_of(doc["metadata"]["name"]))
        if any(d["kind"] in ("Pod", "Deployment", "Job") for d in docs):
            found.append((f"docs/migrating.md#{b}", docs))
    return found


def _pod_of(template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{template}-pod"},
        "spec": {
            "tolerations": TOLERATE_ALL,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "app",
                    "image": "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04",
                    "command": ["nvidia-smi"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _expected_pods(docs: list[dict[str, Any]]) -> int:
    return sum(
        1 if d["kind"] == "Pod" else int(d["spec"].get("replicas", 1)) if d["kind"] == "Deployment" else 1
        for d in docs
        if d["kind"] in ("Pod", "Deployment", "Job")
    )


@pytest.fixture(scope="module")
def controller(
    api_client: client.ApiClient,
    dyn: DynamicClient,
    chart_controller: Callable[[str], AbstractContextManager[kube.ControllerProcess]],
) -> Iterator[kube.ControllerProcess]:
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    for body in _default_device_classes():
        kube.resource(dyn, "resource.k8s.io/v1", "DeviceClass").create(body=body)
    with chart_controller("migrating") as proc:
        yield proc


def _ours(core: client.CoreV1Api, pod: Any) -> list[Any]:
    """The controller's Events on `pod` (involvedObject the pod, by uid)."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={pod.metadata.name},involvedObject.uid={pod.metadata.uid}"
    events = core.list_namespaced_event(pod.metadata.namespace, field_selector=selector).items
    return [e for e in events if e.reporting_component == COMPONENT or (e.source and e.source.component == COMPONENT)]


def _has_default_account(core: client.CoreV1Api, namespace: str) -> bool:
    return kube.exists(lambda: core.read_namespaced_service_account("default", namespace))


def _unschedulable(pod: Any) -> bool:
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or []
    )


def _uses_our_claim(pod: Any) -> bool:
    return bool(pod.spec.resource_claims)


def test_every_pending_pod_of_the_migration_page_says_why(
    controller: kube.ControllerProcess, control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient
) -> None:
    started = time.monotonic()
    core = client.CoreV1Api(api_client)
    node = kube.create_fake_node(api_client, kube.unique("demo"))
    kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], 2, 80))
    blocks = _blocks()
    pending: list[tuple[str, Any]] = []
    bound: list[str] = []
    for b, (where, docs) in enumerate(blocks):
        namespace = f"migrating-{b}"
        core.create_namespace({"metadata": {"name": namespace}})
        kube.wait_for(partial(_has_default_account, core, namespace), 30)
        for doc in docs:
            try:
                kube.resource(dyn, doc["apiVersion"], doc["kind"]).create(namespace=namespace, body=doc)
            except ApiException as err:
                pytest.fail(f"{where}: {doc['kind']} {doc['metadata']['name']} refused: {err.status} {err.body}")
        want = _expected_pods(docs)

        def settled(n: str = namespace, want: int = want) -> list[Any] | None:
            pods = core.list_namespaced_pod(n).items
            done = len(pods) == want and all(p.spec.node_name or _unschedulable(p) for p in pods)
            return pods if done else None

        for pod in kube.wait_for(settled, SETTLED_WITHIN, what=f"{where}: {want} pods bound or unschedulable"):
            if pod.spec.node_name:
                bound.append(f"{where} {pod.metadata.name}")
            else:
                pending.append((where, pod))

    def told() -> bool:
        return all(_ours(core, p) for _, p in pending if _uses_our_claim(p))

    try:
        kube.wait_for(told, TOLD_WITHIN, interval=1.0, what="a controller Event on every pending pod of ours")
    except AssertionError:
        silent = [
            f"{w} {p.metadata.namespace}/{p.metadata.name}"
            for w, p in pending
            if _uses_our_claim(p) and not _ours(core, p)
        ]
        raise AssertionError(f"pending with no reason from the controller: {silent}\n{controller.log_tail()}") from None
    reasons: dict[str, list[str]] = {}
    for where, pod in pending:
        if _uses_our_claim(pod):
            events = _ours(core, pod)
            assert all("\n" not in e.message for e in events), events
            reasons[f"{where} {pod.metadata.name}"] = sorted({e.reason for e in events})
            print(f"{where} {pod.metadata.name}:", *(f"{e.reason}: {e.message}" for e in events), sep="\n  ")
            described = subprocess.run(
                [str(control_plane.bin["kubectl"]), f"--kubeconfig={control_plane.kubeconfig}", "describe", "pod",
                 pod.metadata.name, "-n", pod.metadata.namespace],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout  # fmt: skip
            assert all(e.reason in described and e.message[:60] in described for e in events), described
        else:  # no claim of ours: only the scheduler sees it
            requested = set((pod.spec.containers[0].resources.limits or {}).keys())
            events = core.list_namespaced_event(
                pod.metadata.namespace, field_selector=f"involvedObject.uid={pod.metadata.uid}"
            ).items
            assert any(e.reason == "FailedScheduling" and requested & set(e.message.split()) for e in events) or any(
                e.reason == "FailedScheduling" and any(f"Insufficient {r}" in e.message for r in requested)
                for e in events
            ), (pod.metadata.name, [e.message for e in events])
            assert requested == {"nvidia.com/gpu"} and "Insufficient nvidia.com/gpu" in MIGRATING.read_text(), (
                "docs/migrating.md says what a default install answers a pod asking nvidia.com/gpu"
            )
            reasons[f"{where} {pod.metadata.name}"] = ["FailedScheduling (scheduler; no claim of ours)"]
    print(
        f"\n{len(blocks)} example blocks of docs/migrating.md applied ({len(bound) + len(pending)} pods): "
        f"{len(bound)} bound, {len(pending)} pending; reasons: {reasons}; {time.monotonic() - started:.1f} s"
    )
    assert reasons, "some example pends on a default install (the MPS and MIG classes' pods)"
