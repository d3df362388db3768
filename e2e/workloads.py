"""Pods and claims for the end-to-end tests and the demo (all hostNetwork: the node has no pod network)."""

import json
import time
from typing import Any

from e2e.cluster.node import SingleNodeCluster
from e2e.image.small import BUSYBOX_IMAGE

DEVICE_CLASS = "gpu.fracgpu.dev"
# Prints what the container got, then stays up: the same lines tests parse and the demo shows.
REPORT = (
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; echo "FRACGPU_MEMORY_LIMIT_MIB=$FRACGPU_MEMORY_LIMIT_MIB"; '
    'echo "FRACGPU_SHARE_ID=$FRACGPU_SHARE_ID"; echo "DEV=$(ls /dev | grep nvidia | tr "\\n" " ")"; sleep 100000'
)


def claim_template(name: str, memory: str | None, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate for one GPU share of `memory` (None: the whole GPU)."""
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": DEVICE_CLASS, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def gpu_pod(name: str, template: str, containers: int = 1) -> dict[str, Any]:
    """A pod whose `containers` busybox containers all use one claim made from `template`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "fracgpu-e2e"}},
        "spec": {
            "hostNetwork": True,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": f"app{i}" if containers > 1 else "app",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", REPORT],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
                for i in range(containers)
            ],
        },
    }


def apply(cluster: SingleNodeCluster, namespace: str, *objects: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input_=json.dumps({"kind": "List", "apiVersion": "v1", "items": list(objects)}),
    )


def get(cluster: SingleNodeCluster, *args: str) -> Any:
    """`kubectl get ... -o json`, decoded."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def wait_running(cluster: SingleNodeCluster, namespace: str, pods: list[str], timeout: float = 240) -> None:
    """Until every pod is Running. Generous: the kubelet backs off when the node authorizer has not yet
    linked a new pod to its claim ("no relationship found"), an upstream race that costs a retry."""
    deadline = time.monotonic() + timeout
    phases: dict[str, str] = {}
    while time.monotonic() < deadline:
        phases = {p: get(cluster, "pod", "-n", namespace, p)["status"].get("phase", "") for p in pods}
        if all(phase == "Running" for phase in phases.values()):
            return
        time.sleep(1)
    events = cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout
    raise TimeoutError(f"pods not Running after {timeout}s: {phases}\n{events[-3000:]}")


def report(
    cluster: SingleNodeCluster, namespace: str, pod: str, container: str = "app", timeout: float = 30
) -> dict[str, str]:
    """The KEY=value lines the container printed at start."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout
        lines = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        if "DEV" in lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)


def claim_of(cluster: SingleNodeCluster, namespace: str, pod: str) -> dict[str, Any]:
    """The ResourceClaim generated for the pod's claim `gpu`."""
    status = get(cluster, "pod", "-n", namespace, pod)["status"]
    (entry,) = [s for s in status.get("resourceClaimStatuses", []) if s["name"] == "gpu"]
    claim: dict[str, Any] = get(cluster, "resourceclaim", "-n", namespace, entry["resourceClaimName"])
    return claim


def recorded_gpu(claim: dict[str, Any]) -> dict[str, Any]:
    """The controller's `data` of the claim's status entry for our driver."""
    (entry,) = [d for d in claim["status"].get("devices", []) if d["driver"] == DEVICE_CLASS and d.get("data")]
    data: dict[str, Any] = entry["data"]
    return data
