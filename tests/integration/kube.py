"""Small helpers for tests that talk to a real API server."""

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

T = TypeVar("T")

GiB = 1 << 30


def wait_for(probe: Callable[[], T | None], timeout: float, interval: float = 0.2, what: str = "") -> T:
    """Call `probe` until it returns something truthy; return it, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or probe}")
        time.sleep(interval)


def exists(read: Callable[[], object]) -> bool:
    """True when `read()` succeeds, False on 404."""
    try:
        read()
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def resource(dyn: DynamicClient, api_version: str, kind: str) -> Any:
    """The dynamic resource for `kind` in `api_version`."""
    return dyn.resources.get(api_version=api_version, kind=kind)


def unique(prefix: str) -> str:
    """A DNS-label-safe unique name."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_fake_node(api_client: client.ApiClient, name: str) -> dict[str, Any]:
    """A Node object with capacity and a Ready condition, and no kubelet behind it."""
    core = client.CoreV1Api(api_client)
    node = core.create_node(
        {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "fracgpu.dev/test": "fake"}}}
    )
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "FakeNode", "message": "test node"}],
            }
        },
    )
    return dict(api_client.sanitize_for_serialization(node))


def gpu_slice(
    driver: str,
    node: dict[str, Any],
    devices: list[dict[str, Any]],
    *,
    generation: int = 1,
) -> dict[str, Any]:
    """A ResourceSlice for `node` published by `driver`, owned by the Node."""
    name = node["metadata"]["name"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{name}-{driver}".replace(".", "-")[:63].rstrip("-"),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"], "controller": True}
            ],
        },
        "spec": {
            "driver": driver,
            "nodeName": name,
            "pool": {"name": name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def shared_gpu(name: str, memory: str, uuid_: str, step: str = "256Mi") -> dict[str, Any]:
    """A device entry that can be shared by memory, as the architecture's resource model describes."""
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {"uuid": {"string": uuid_}, "productName": {"string": "NVIDIA H100 80GB HBM3"}},
        "capacity": {
            "memory": {
                "value": memory,
                "requestPolicy": {"default": memory, "validRange": {"min": step, "step": step}},
            }
        },
    }


def ensure_device_class(dyn: DynamicClient, name: str, driver: str) -> None:
    """Create the DeviceClass selecting `driver` unless it exists (tests in one session share it)."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }
    try:
        resource(dyn, "resource.k8s.io/v1", "DeviceClass").create(body=body)
    except ApiException as err:
        if err.status != 409:
            raise


def claim_template(name: str, device_class: str, memory: str | None, config: object | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate with one request `gpu`, optionally for `memory`, with an opaque config."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if config is not None:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": device_class, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": spec},
    }


def pod_with_claim(name: str, template: str, node: str) -> dict[str, Any]:
    """A pod pinned to `node` whose one container uses a claim made from `template`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "app", "image": "fracgpu.invalid/never-pulled:0", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def allocate_claims(
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
    node: str,
    *,
    device_class: str,
    memories: list[str | None],
    config: object | None = None,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """One pod per entry of `memories`, each with its own claim; wait until the real scheduler has
    allocated every claim; return the claims (in pod order)."""
    core = client.CoreV1Api(api_client)
    templates = resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
    pods = []
    for memory in memories:
        pod = unique("pod")
        templates.create(namespace=namespace, body=claim_template(pod, device_class, memory, config))
        core.create_namespaced_pod(namespace, pod_with_claim(pod, pod, node))
        pods.append(pod)
    claims_api = resource(dyn, "resource.k8s.io/v1", "ResourceClaim")

    def allocated() -> list[dict[str, Any]] | None:
        by_pod: dict[str, dict[str, Any]] = {}
        for claim in claims_api.get(namespace=namespace).to_dict()["items"]:
            owner = (claim["metadata"].get("ownerReferences") or [{}])[0].get("name")
            if owner in pods and (claim.get("status") or {}).get("allocation"):
                by_pod[owner] = claim
        return [by_pod[p] for p in pods] if len(by_pod) == len(pods) else None

    return wait_for(allocated, timeout, what=f"allocation of {len(pods)} claims in {namespace}")
