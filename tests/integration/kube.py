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
