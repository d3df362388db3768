"""`nvidia.com/gpu: 1` unchanged on fracgpu (docs/migrating.md, "NVIDIA's device plugin"): the chart's DeviceClass
as `helm template` renders it with `deviceClass.extendedResource.name=nvidia.com/gpu`, and the real kube-scheduler.

On a node that advertises no `nvidia.com/gpu` (no NVIDIA device plugin there), the scheduler makes the pod's claim
for the extended resource and allocates one of fracgpu's GPUs whole. On a node whose device plugin advertises it,
the scheduler counts the device plugin's GPUs instead and makes no claim: fracgpu is not asked at all.
"""

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api.quantity import GiB, to_bytes
from harness import kube
from harness.cluster import binaries

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "fracgpu"
NVIDIA_GPU = "nvidia.com/gpu"
CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def _device_class(driver: str) -> dict[str, Any]:
    """The chart's DeviceClass of whole GPUs for `driver`, rendered with the extended resource `nvidia.com/gpu`."""
    argv = [str(binaries.binary("helm")), "template", "fg", str(CHART), "--namespace", "fracgpu"]
    argv += ["--kube-version", binaries.version_of("kubectl").removeprefix("v")]
    argv += ["--set", f"driverName={driver}", "--set", f"deviceClass.extendedResource.name={NVIDIA_GPU}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    (found,) = [
        d
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "DeviceClass" and d["metadata"]["name"] == driver
    ]
    assert found["spec"]["extendedResourceName"] == NVIDIA_GPU
    return dict(found)


def _pod(name: str, node: str) -> dict[str, Any]:
    """A pod as written for NVIDIA's device plugin: `nvidia.com/gpu: 1`, no claim; pinned to `node`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],  # fake nodes have no kubelet and turn NotReady
            "containers": [
                {
                    "name": "app",
                    "image": "fracgpu.invalid/never-pulled:0",
                    "resources": {"limits": {NVIDIA_GPU: "1"}},
                }
            ],
        },
    }


def _gpu_node(api_client: client.ApiClient, dyn: DynamicClient, driver: str, *, device_plugin: bool) -> str:
    """A fake node with one 80Gi GPU published by `driver`; with `device_plugin`, also advertising one
    `nvidia.com/gpu` as NVIDIA's device plugin would (node capacity and allocatable)."""
    body = kube.create_fake_node(api_client, kube.unique("er-node"))
    name: str = body["metadata"]["name"]
    if device_plugin:
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110", NVIDIA_GPU: "1"}
        client.CoreV1Api(api_client).patch_node_status(
            name, {"status": {"capacity": resources, "allocatable": resources}}
        )
    kube.publish_gpus(dyn, body, driver, kube.simulated_gpus(name, 1))
    return name


def test_nvidia_gpu_pods_get_a_whole_fracgpu_gpu_where_no_device_plugin_serves_it(
    api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    driver = f"gpu-{uuid.uuid4().hex[:6]}.example.test"  # its own DeviceClass: one class per extended resource
    classes = kube.resource(dyn, "resource.k8s.io/v1", "DeviceClass")
    classes.create(body=_device_class(driver))
    core = client.CoreV1Api(api_client)
    nodes = []
    try:
        nodes = [_gpu_node(api_client, dyn, driver, device_plugin=plugin) for plugin in (False, True)]
        dra_node, plugin_node = nodes
        core.create_namespaced_pod(namespace, _pod("on-dra", dra_node))
        core.create_namespaced_pod(namespace, _pod("on-plugin", plugin_node))

        def bound(pod: str) -> Any:
            found = core.read_namespaced_pod(pod, namespace)
            return found if found.spec.node_name else None

        pod = kube.wait_for(lambda: bound("on-dra"), 60, what="the scheduler to bind on-dra")
        assert pod.spec.node_name == dra_node
        claim_name = pod.status.extended_resource_claim_status.resource_claim_name
        claim = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim").get(namespace=namespace, name=claim_name)
        claim = claim.to_dict()
        assert claim["metadata"]["annotations"][CLAIM_ANNOTATION] == "true", "the scheduler's own claim"
        (request,) = claim["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == driver and request["exactly"]["count"] == 1
        assert "capacity" not in request["exactly"], "the pod asked for a GPU, not an amount"
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (driver, dra_node)
        assert to_bytes(result["consumedCapacity"]["memory"]) == 80 * GiB, "the requestPolicy default: all of it"

        # where NVIDIA's device plugin advertises nvidia.com/gpu, the scheduler counts its GPUs: no claim at all
        other = kube.wait_for(lambda: bound("on-plugin"), 60, what="the scheduler to bind on-plugin")
        assert other.spec.node_name == plugin_node
        assert other.status.extended_resource_claim_status is None, "the device plugin's GPU, not fracgpu's"
        claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim").get(namespace=namespace).to_dict()
        assert [c["metadata"]["name"] for c in claims["items"]] == [claim_name]
    finally:  # the namespace goes with its pods and claims; the nodes and the class are cluster-wide
        for node in nodes:
            core.delete_node(node)
        classes.delete(name=driver)
