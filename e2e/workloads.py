"""Pods and claims for the end-to-end tests and the demo (all hostNetwork: the node has no pod network)."""

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from harness.image.small import BUSYBOX_IMAGE


class Cluster(Protocol):
    """What these helpers need of a cluster (SingleNodeCluster, MultiNodeCluster): kubectl against it."""

    def kubectl(
        self, *args: str, check: bool = True, input_: str | None = None
    ) -> subprocess.CompletedProcess[str]: ...


DEVICE_CLASS = "gpu.fracgpu.dev"
EXTENDED_RESOURCE = "gpu.fracgpu.dev/gpu"  # the chart's default deviceClass.extendedResource name
# Prints what the container got, then stays up: the lines `report` parses and the demo shows. `OPEN` tries
# open(O_RDWR) on each GPU node: simulated nodes have no driver behind them, so the kernel answers "No such
# device or address" once the file mode and the device cgroup have let the open through.
REPORT = r"""
env | grep -E '^(FRACGPU_|NVIDIA_VISIBLE_DEVICES=|NVIDIA_GPU_MEMORY_|CUDA_)' | sort | sed 's/^/ENV /'
for f in /run/fracgpu/*.json; do [ -f "$f" ] && echo "FILE ${f##*/} $(cat "$f")"; done
for d in /dev/nvidia*; do [ -e "$d" ] && echo "NODE ${d#/dev/} $(stat -c %a "$d")"; done
for d in /dev/nvidia[0-9]*; do
  [ -e "$d" ] || continue
  if err=$( (exec 3<>"$d") 2>&1 ); then echo "OPEN ${d#/dev/} ok"; else echo "OPEN ${d#/dev/} ${err##*: }"; fi
done
echo "UID $(id -u)"
echo END
sleep 100000
"""
OPENED = ("ok", "No such device or address")  # past the permission and device-cgroup checks
# What a glibc container gets of the driver (driverEdits: toolkit): tagged lines `cuda_report` parses.
CUDA_REPORT = r"""
ldconfig -p | sed -n 's/^[[:space:]]*\(libcuda\.so\.1\|libnvidia-ml\.so\.1\) .*=> /LDCONFIG \1 /p'
nvidia-smi -L 2>&1 | sed 's/^/SMI /'
echo "PROBE $(cuda-probe 2>&1 | tr '\n' ' ')"
echo "ENV NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-}"
echo END
sleep 100000
"""


@dataclass(frozen=True)
class Seen:
    """What one container reported about itself."""

    env: dict[str, str]
    files: dict[str, dict[str, Any]]  # /run/fracgpu/<name> -> its JSON
    nodes: dict[str, str]  # /dev/nvidia* name -> octal mode
    opened: dict[str, str]  # /dev/nvidia<minor> name -> "ok" or the error
    uid: int

    def device_vars(self) -> dict[str, dict[str, str]]:
        """FRACGPU_DEV_<KEY>_* variables grouped by the envPrefix the files name."""
        prefixes = [d["envPrefix"] for f in self.files.values() for d in f["devices"]]
        return {p: {k.removeprefix(p): v for k, v in self.env.items() if k.startswith(p)} for p in prefixes}

    def uuids(self) -> set[str]:
        """The UUIDs of the FRACGPU_DEV_<KEY>_UUID variables of the files' devices."""
        return {v["UUID"] for v in self.device_vars().values()}

    def grants(self) -> str:
        """`<uuid>=<MiB>` per GPU share, from the files."""
        return " ".join(f"{d['uuid'][:12]}…={d['memoryMiB']}MiB" for f in self.files.values() for d in f["devices"])


def parse_report(out: str) -> Seen | None:
    """The report in a container's log; None until it is complete."""
    env: dict[str, str] = {}
    files: dict[str, dict[str, Any]] = {}
    nodes: dict[str, str] = {}
    opened: dict[str, str] = {}
    uid = -1
    for line in out.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "ENV":
            key, _, value = rest.partition("=")
            env[key] = value
        elif tag == "FILE":
            name, _, content = rest.partition(" ")
            files[name] = json.loads(content)
        elif tag == "NODE":
            name, _, mode = rest.partition(" ")
            nodes[name] = mode
        elif tag == "OPEN":
            name, _, result = rest.partition(" ")
            opened[name] = result
        elif tag == "UID":
            uid = int(rest)
        elif tag == "END":
            return Seen(env, files, nodes, opened, uid)
    return None


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


def requests_template(name: str, memories: dict[str, str]) -> dict[str, Any]:
    """A ResourceClaimTemplate with one request per entry (request name -> memory)."""
    requests = [
        {"name": r, "exactly": {"deviceClassName": DEVICE_CLASS, "capacity": {"requests": {"memory": m}}}}
        for r, m in memories.items()
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def on_node(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """`pod` pinned to the Node `node` (a nodeSelector on its hostname label)."""
    return {**pod, "spec": {**pod["spec"], "nodeSelector": {"kubernetes.io/hostname": node}}}


def gpu_pod(name: str, template: str, containers: int = 1, run_as_user: int | None = None) -> dict[str, Any]:
    """A pod whose `containers` busybox containers all use one claim `gpu` made from `template`."""
    names = [f"app{i}" for i in range(containers)] if containers > 1 else ["app"]
    return pod(name, {"gpu": template}, {c: ["gpu"] for c in names}, run_as_user=run_as_user)


def cuda_pod(name: str, template: str, image: str) -> dict[str, Any]:
    """A pod whose one container, of the glibc `image`, prints CUDA_REPORT about its claim `gpu`."""
    return pod(name, {"gpu": template}, {"app": ["gpu"]}, image=image, script=CUDA_REPORT)


def cuda_report(
    cluster: Cluster, namespace: str, pod: str, timeout: float = 30, container: str = "app"
) -> dict[str, list[str]]:
    """The lines a container printed up to `END` by tag (CUDA_REPORT: LDCONFIG, SMI, PROBE, ENV)."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout
        if "\nEND" in f"\n{out}":
            tagged: dict[str, list[str]] = {}
            for line in out.splitlines():
                tag, _, rest = line.partition(" ")
                tagged.setdefault(tag, []).append(rest)
            return tagged
        if time.monotonic() > deadline:
            raise TimeoutError(f"{namespace}/{pod}/{container} printed no complete report in {timeout}s:\n{out}")
        time.sleep(0.5)


def pod(
    name: str,
    claims: dict[str, str],
    containers: dict[str, list[str]],
    run_as_user: int | None = None,
    *,
    image: str = BUSYBOX_IMAGE,
    script: str = REPORT,
) -> dict[str, Any]:
    """A pod with claims (pod claim name -> template) and containers of `image` running `script` (name -> the
    claims it uses, each `claim` or `claim/request`)."""
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "resourceClaims": [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()],
        "containers": [
            {
                "name": container,
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"claims": [_claim_ref(c) for c in used]},
            }
            for container, used in containers.items()
        ],
    }
    if run_as_user is not None:
        spec["securityContext"] = {"runAsUser": run_as_user, "runAsGroup": run_as_user, "runAsNonRoot": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "fracgpu-e2e"}},
        "spec": spec,
    }


def extended_pod(name: str, gpus: int = 1, *, image: str = BUSYBOX_IMAGE, script: str = REPORT) -> dict[str, Any]:
    """A pod with no claim whose one container `app` asks `resources.limits: {EXTENDED_RESOURCE: gpus}`, as a
    device-plugin pod asks `nvidia.com/gpu` (the scheduler writes the claim)."""
    body = pod(name, {}, {"app": []}, image=image, script=script)
    del body["spec"]["resourceClaims"]
    body["spec"]["containers"][0]["resources"] = {"limits": {EXTENDED_RESOURCE: str(gpus)}}
    return body


def extended_claim_of(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    """The ResourceClaim the scheduler made for the pod's extended resources (pod.status.extendedResourceClaimStatus)."""
    status = get(cluster, "pod", "-n", namespace, pod)["status"]
    found: dict[str, Any] = get(
        cluster, "resourceclaim", "-n", namespace, status["extendedResourceClaimStatus"]["resourceClaimName"]
    )
    return found


def unschedulable(cluster: Cluster, namespace: str, pod: str, timeout: float = 60) -> str:
    """The scheduler's message once the pod's PodScheduled condition says Unschedulable (TimeoutError before)."""
    deadline = time.monotonic() + timeout
    condition: dict[str, str] = {}
    while time.monotonic() < deadline:
        conditions = get(cluster, "pod", "-n", namespace, pod)["status"].get("conditions", [])
        condition = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        if condition.get("reason") == "Unschedulable":
            return condition.get("message", "")
        time.sleep(1)
    raise TimeoutError(f"{namespace}/{pod} not reported Unschedulable in {timeout}s: {condition}")


def claim_event(
    cluster: Cluster, namespace: str, pod: str, reason: str, *, timeout: float = 60, claim: str = "gpu"
) -> str:
    """The message of the first Event `reason` on the ResourceClaim of the pod's claim `claim` (the controller's
    `UnsatisfiableGpuRequest`, say); TimeoutError when none came within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = get(cluster, "pod", "-n", namespace, pod)["status"].get("resourceClaimStatuses", [])
        names = [s["resourceClaimName"] for s in statuses if s["name"] == claim and s.get("resourceClaimName")]
        if names:
            selector = f"--field-selector=involvedObject.name={names[0]},reason={reason}"
            events = get(cluster, "events", "-n", namespace, selector)["items"]
            if events:
                return str(events[0].get("message", ""))
        time.sleep(1)
    raise TimeoutError(f"no {reason} Event on the claim {claim} of {namespace}/{pod} in {timeout}s")


def _claim_ref(used: str) -> dict[str, str]:
    """`claim` or `claim/request` as a container's resources.claims entry."""
    claim, _, request = used.partition("/")
    return {"name": claim, "request": request} if request else {"name": claim}


def apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input_=json.dumps({"kind": "List", "apiVersion": "v1", "items": list(objects)}),
    )


def get(cluster: Cluster, *args: str) -> Any:
    """`kubectl get ... -o json`, decoded."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def gpu_table(cluster: Cluster, *args: str) -> dict[str, dict[str, str]]:
    """`kubectl get gpus [args]` (e.g. `-o wide`), each row by column name (kubectl aligns columns; MODEL has
    spaces, and an empty cell is an empty string)."""
    lines = cluster.kubectl("get", "gpus", *args).stdout.splitlines()
    if not lines:
        return {}  # "No resources found" (on stderr)
    header, *rows = lines
    starts = [header.index(name) for name in header.split()]
    ends = [*starts[1:], None]
    return {row.split()[0]: {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}
            for row in rows}  # fmt: skip


def wait_running(cluster: Cluster, namespace: str, pods: list[str], timeout: float = 240) -> None:
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
    # what holds the GPUs (every namespace's allocated claims, the ledger): a pod Pending for want of memory
    claims = cluster.kubectl(
        "get", "resourceclaims", "-A", "-o",
        "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,DELETING:.metadata.deletionTimestamp,"
        "DEVICES:.status.allocation.devices.results[*].device,CAPACITY:.status.allocation.devices.results[*].consumedCapacity",
        check=False,
    ).stdout  # fmt: skip
    gpus = cluster.kubectl("get", "gpus", "-o", "wide", check=False).stdout
    # what the scheduler weighs besides room: the namespace's claims' tolerations, the taint rules on the devices
    tolerations = cluster.kubectl(
        "get", "resourceclaims", "-n", namespace, "-o",
        "custom-columns=NAME:.metadata.name,TOLERATIONS:.spec.devices.requests[*].exactly.tolerations", check=False,
    ).stdout  # fmt: skip
    rules = cluster.kubectl(
        "get", "devicetaintrules", "-o",
        "custom-columns=NAME:.metadata.name,DEVICE:.spec.deviceSelector.device,TAINT:.spec.taint", check=False,
    ).stdout  # fmt: skip
    raise TimeoutError(
        f"pods not Running after {timeout}s: {phases}\n{events[-3000:]}\nclaims:\n{claims[-3000:]}\nGPUs:\n{gpus}"
        f"\ntolerations:\n{tolerations[-2000:]}\ntaint rules:\n{rules[-2000:]}"
    )


def report(cluster: Cluster, namespace: str, pod: str, container: str = "app", timeout: float = 30) -> Seen:
    """What the container printed at start."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout
        seen = parse_report(out)
        if seen is not None:
            return seen
        if time.monotonic() > deadline:
            raise TimeoutError(f"{namespace}/{pod}/{container} printed no complete report in {timeout}s:\n{out}")
        time.sleep(0.5)


def claim_of(cluster: Cluster, namespace: str, pod: str, claim: str = "gpu") -> dict[str, Any]:
    """The ResourceClaim generated for the pod's claim `claim`."""
    status = get(cluster, "pod", "-n", namespace, pod)["status"]
    (entry,) = [s for s in status.get("resourceClaimStatuses", []) if s["name"] == claim]
    found: dict[str, Any] = get(cluster, "resourceclaim", "-n", namespace, entry["resourceClaimName"])
    return found


def recorded_gpu(claim: dict[str, Any]) -> dict[str, Any]:
    """The controller's `data` of the claim's status entry for our driver."""
    (entry,) = [d for d in claim["status"].get("devices", []) if d["driver"] == DEVICE_CLASS and d.get("data")]
    data: dict[str, Any] = entry["data"]
    return data


def on_runtime(pod: dict[str, Any], runtime_class: str) -> dict[str, Any]:
    """`pod` with `runtimeClassName: runtime_class` (a containerd handler of the node, e.g. node.RUNC)."""
    return {**pod, "spec": {**pod["spec"], "runtimeClassName": runtime_class}}


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster) -> Iterator[str]:
    """A new namespace (with its default ServiceAccount), deleted with everything in it afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        assert time.monotonic() < deadline, "default ServiceAccount never appeared"
        time.sleep(0.5)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False)
