"""GPU memory use per claim (issue #11): the real plugin process samples the mock NVML through the real pynvml.

Real parts: kube-apiserver, scheduler (allocates the claims and reserves them for their pods), the controller
(keeps the GPU ledger), the node plugin process. The "containers" are real processes in cgroups named like the
kubelet's (cgroup v1 `pids` hierarchy, `kubepods/besteffort/pod<uid>/<container id>` below a test prefix), so the
plugin reads their pods from the host's /proc; the mock NVML reports them from the control file this test writes.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient
from prometheus_client.parser import text_string_to_metric_families

from api.crds import CRD_DIR
from api.gpu import GPU_CRD_NAME
from harness import kube, mocknvml
from harness.cluster import binaries
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KubeletClient
from harness.nodeplugin import DRIVER, NodePluginProcess

pytestmark = pytest.mark.integration
PROFILE = mocknvml.PROFILES / "gpu80x2.profile"
INTERVAL = 2.0  # the plugin's --usage-interval
DEADLINE = 2 * INTERVAL + 2  # two sample intervals, plus a scrape and an API round trip
GiB = 1 << 30
CGROUP_ROOT = Path("/sys/fs/cgroup/pids")
GPUS = "/apis/fracgpu.dev/v1alpha1/gpus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Node:
    name: str
    process: NodePluginProcess
    kubelet: KubeletClient
    control: Path
    metrics_port: int
    cgroup_prefix: Path
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The plugin's samples; empty while its metrics server is not listening yet (it starts a moment after
        the plugin registers with the kubelet, which is when the test gets the node)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except urllib.error.URLError as err:
            if isinstance(err.reason, ConnectionRefusedError):
                return {}
            raise
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float | None:
        return self.scrape().get((name, tuple(sorted(labels.items()))))

    def pod_process(self, pod_uid: str) -> int:
        """A process in a container cgroup of pod `pod_uid`, as the kubelet (cgroupfs driver) makes them."""
        directory = self.cgroup_prefix / "kubepods" / "besteffort" / f"pod{pod_uid}" / uuid.uuid4().hex
        directory.mkdir(parents=True)
        child = subprocess.Popen(["sleep", "600"])
        (directory / "cgroup.procs").write_text(str(child.pid))
        self.children.append(child)
        return child.pid

    def report(self, lines: list[tuple[str, int | str, int]]) -> None:
        """What the mock NVML reports from now on: (GPU UUID, pid or "error", bytes or NVML code)."""
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text("".join(f"{g} {p} {b}\n" for g, p, b in lines))
        tmp.rename(self.control)


def _cleanup_cgroups(prefix: Path) -> None:
    for directory in sorted((p for p in prefix.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        directory.rmdir()
    prefix.rmdir()


@pytest.fixture(scope="module")
def controller(control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient) -> Iterator[None]:
    """The GPU CRD and the controller keeping the ledger (admission is tested elsewhere)."""
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgusc-", dir="/tmp"))
    proc = kube.ControllerProcess(workdir, control_plane.kubeconfig, "--no-admission", "--ledger-delay=0.2")
    proc.start()
    try:
        yield
    finally:
        proc.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


def _start_node(control_plane: ControlPlane, api_client: client.ApiClient, nvml: Path, workdir: Path) -> Node:
    name = kube.unique("usagenode")
    kube.create_fake_node(api_client, name)
    control = workdir / "processes"
    control.write_text("")
    port = free_port()
    process = NodePluginProcess(
        workdir,
        name,
        control_plane.kubeconfig,
        PROFILE,
        nvml,
        f"--usage-interval={INTERVAL}",
        f"--usage-ledger-interval={INTERVAL}",
        f"--metrics-port={port}",
        env={"FRACGPU_MOCK_NVML_PROCESSES": str(control)},
    )
    prefix = CGROUP_ROOT / f"fracgpu-usage-test-{uuid.uuid4().hex[:8]}"
    prefix.mkdir()
    return Node(name, process, process.start(), control, port, prefix)


def _stop_node(node: Node) -> None:
    for child in node.children:
        child.kill()
        child.wait()
    node.kubelet.close()
    node.process.stop()
    _cleanup_cgroups(node.cgroup_prefix)


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, api_client: client.ApiClient, controller: None) -> Iterator[Node]:
    if os.geteuid() != 0 or not os.access(CGROUP_ROOT, os.W_OK):
        pytest.skip(f"needs root and a writable cgroup v1 pids hierarchy at {CGROUP_ROOT}")
    workdir = Path(tempfile.mkdtemp(prefix="fgus-", dir="/tmp"))  # short: unix socket paths ≤ 107 bytes
    started = _start_node(control_plane, api_client, mocknvml.build(workdir / "nvml"), workdir)
    try:
        yield started
    finally:
        print(f"plugin log:\n{started.process.log()}")
        _stop_node(started)
        shutil.rmtree(workdir, ignore_errors=True)


def _reserved(api_client: client.ApiClient, claim: dict[str, Any]) -> tuple[str, str]:
    """(pod UID, pod name) the scheduler reserved the claim for."""
    api = client.ResourceV1Api(api_client)

    def reserved() -> tuple[str, str] | None:
        body = api.read_namespaced_resource_claim(claim["metadata"]["name"], claim["metadata"]["namespace"])
        entries = body.status.reserved_for or []
        return (entries[0].uid, entries[0].name) if entries else None

    return kube.wait_for(reserved, 30, what="the claim reserved for its pod")


def _gpu_of(claim: dict[str, Any]) -> tuple[str, str]:
    """(device name, UUID) of a one-device claim."""
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    index = int(result["device"].removeprefix("gpu-"))
    return result["device"], mocknvml.read_profile(PROFILE)[f"gpu.{index}.uuid"]


def _events(api_client: client.ApiClient, namespace: str, kind: str, name: str) -> list[Any]:
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    return [
        e
        for e in events
        if e.reason == "OverMemoryGrant" and e.involved_object.kind == kind and e.involved_object.name == name
    ]


def _refs(claims: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]


def test_usage_reaches_metrics_ledger_and_events(
    node: Node, control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    claims = kube.allocate_claims(api_client, dyn, namespace, node.name, device_class=DRIVER, memories=["10Gi"] * 2)
    prepared = node.kubelet.prepare(_refs(claims))
    assert all(not r.error for r in prepared.claims.values()), prepared
    (uid_a, pod_a), (uid_b, pod_b) = (_reserved(api_client, c) for c in claims)
    (dev_a, gpu_a), (_, gpu_b) = (_gpu_of(c) for c in claims)
    name_a, name_b = (c["metadata"]["name"] for c in claims)
    pid_a, pid_b = node.pod_process(uid_a), node.pod_process(uid_b)
    gone_pid = 4194000  # above the default pid_max: no such process, its cgroup cannot be read
    node.report([(gpu_a, pid_a, 4 * GiB), (gpu_b, pid_b, 12 * GiB), (gpu_a, gone_pid, GiB)])
    used = "fracgpu_plugin_claim_memory_used_bytes"
    labels_a = {"namespace": namespace, "claim": name_a, "pod": pod_a, "gpu_uuid": gpu_a}
    labels_b = {"namespace": namespace, "claim": name_b, "pod": pod_b, "gpu_uuid": gpu_b}

    kube.wait_for(lambda: node.metric(used, **labels_a) == 4 * GiB or None, DEADLINE, what="claim A's used memory")
    assert node.metric(used, **labels_b) == 12 * GiB
    assert node.metric("fracgpu_plugin_claim_memory_granted_bytes", **labels_a) == 10 * GiB
    per_gpu = {gpu_a: 0, gpu_b: 0}
    for gpu, amount in ((gpu_a, 4 * GiB), (gpu_b, 12 * GiB), (gpu_a, GiB)):
        per_gpu[gpu] += amount
    for gpu, amount in per_gpu.items():
        assert node.metric("fracgpu_plugin_gpu_memory_used_bytes", gpu_uuid=gpu) == amount
    assert (node.metric("fracgpu_plugin_usage_unreadable_cgroups_total") or 0) >= 1
    assert node.metric("fracgpu_plugin_usage_unattributed_processes") == 1, "the unreadable one, never a claim's"

    # the ledger: USED per GPU next to the controller's allocation, which the plugin's writes leave alone
    custom = client.CustomObjectsApi(api_client)

    def ledger_used(device: str) -> str | None:
        try:
            gpu = custom.get_cluster_custom_object("fracgpu.dev", "v1alpha1", "gpus", f"{node.name}-{device}")
        except client.ApiException:
            return None
        status = gpu.get("status") or {}
        return str(status["usage"]["usedMemory"]) if "usage" in status and status.get("shares") else None

    expected_a = f"{per_gpu[gpu_a] // GiB}Gi"
    kube.wait_for(lambda: ledger_used(dev_a) == expected_a or None, DEADLINE + 10, what="USED in the GPU ledger")
    gpu_obj = custom.get_cluster_custom_object("fracgpu.dev", "v1alpha1", "gpus", f"{node.name}-{dev_a}")
    assert gpu_obj["status"]["allocatedMemory"] in ("10Gi", "20Gi")
    managers = {f["manager"] for f in gpu_obj["metadata"]["managedFields"] if f.get("subresource") == "status"}
    assert managers == {"fracgpu-controller", "fracgpu-kubelet-plugin"}
    kubectl = binaries.ensure_built("kubectl")["kubectl"]
    table = subprocess.run(
        [kubectl, f"--kubeconfig={control_plane.kubeconfig}", "get", "gpu", f"{node.name}-{dev_a}", "-o", "wide"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    header, row = table[0], table[1]
    start = header.index("USED")  # in -o wide; columns are aligned: the value starts under its header
    assert row[start:].split()[0] == expected_a, table

    # claim B is over its unenforced grant: one Event on the claim and one on its pod, however long it stays over
    kube.wait_for(lambda: _events(api_client, namespace, "ResourceClaim", name_b) or None, DEADLINE, what="Event")
    kube.wait_for(lambda: _events(api_client, namespace, "Pod", pod_b) or None, DEADLINE, what="Event on the pod")
    time.sleep(2 * INTERVAL)
    (event,) = _events(api_client, namespace, "ResourceClaim", name_b)
    assert len(_events(api_client, namespace, "Pod", pod_b)) == 1
    assert f"uses 12Gi of GPU {gpu_b}, more than its grant of 10Gi (pods {pod_b})" in event.message
    assert event.type == "Warning" and event.involved_object.uid == claims[1]["metadata"]["uid"]
    assert not _events(api_client, namespace, "ResourceClaim", name_a)
    # back under the grant re-arms it: the next crossing is reported again
    node.report([(gpu_a, pid_a, 4 * GiB), (gpu_b, pid_b, 5 * GiB)])
    kube.wait_for(lambda: node.metric(used, **labels_b) == 5 * GiB or None, DEADLINE, what="B under its grant")
    node.report([(gpu_a, pid_a, 4 * GiB), (gpu_b, pid_b, 11 * GiB)])
    kube.wait_for(
        lambda: len(_events(api_client, namespace, "ResourceClaim", name_b)) == 2 or None, DEADLINE, what="2nd Event"
    )

    # claim A unprepared (its pod ended): its series go
    done = node.kubelet.unprepare(_refs(claims[:1]))
    assert not done.claims[claims[0]["metadata"]["uid"]].error
    kube.wait_for(lambda: node.metric(used, **labels_a) is None or None, DEADLINE, what="claim A's series gone")
    assert node.metric("fracgpu_plugin_claim_memory_granted_bytes", **labels_a) is None
    assert node.metric(used, **labels_b) == 11 * GiB
    node.kubelet.unprepare(_refs(claims[1:]))


def test_a_failing_sample_is_counted_and_the_plugin_goes_on(
    node: Node, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    (claim,) = kube.allocate_claims(api_client, dyn, namespace, node.name, device_class=DRIVER, memories=["1Gi"])
    assert not node.kubelet.prepare(_refs([claim])).claims[claim["metadata"]["uid"]].error
    uid, pod = _reserved(api_client, claim)
    _, gpu = _gpu_of(claim)
    pid = node.pod_process(uid)
    labels = {"namespace": namespace, "claim": claim["metadata"]["name"], "pod": pod, "gpu_uuid": gpu}
    used = "fracgpu_plugin_claim_memory_used_bytes"
    failures = {"reason": "nvml_query"}
    before = node.metric("fracgpu_plugin_usage_sample_failures_total", **failures) or 0
    node.report([(gpu, "error", 999)])  # NVML_ERROR_UNKNOWN for that GPU
    kube.wait_for(
        lambda: (node.metric("fracgpu_plugin_usage_sample_failures_total", **failures) or 0) > before or None,
        DEADLINE,
        what="the failure counted",
    )
    assert node.metric(used, **labels) is None, "no value for a GPU that could not be sampled"
    assert node.kubelet.prepare(_refs([claim])).claims[claim["metadata"]["uid"]].error == "", "still serving"
    node.report([(gpu, pid, 2 * GiB)])
    kube.wait_for(lambda: node.metric(used, **labels) == 2 * GiB or None, DEADLINE, what="sampling again")
    node.kubelet.unprepare(_refs([claim]))


def test_nvml_without_the_call(
    control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient, controller: None, namespace: str
) -> None:
    if os.geteuid() != 0 or not os.access(CGROUP_ROOT, os.W_OK):
        pytest.skip(f"needs root and a writable cgroup v1 pids hierarchy at {CGROUP_ROOT}")
    workdir = Path(tempfile.mkdtemp(prefix="fgun-", dir="/tmp"))
    nvml = mocknvml.build_nvml_variant(workdir / "nvml", "-DMOCK_NO_RUNNING_PROCESSES")
    started = _start_node(control_plane, api_client, nvml, workdir)
    try:
        reason = {"reason": "function_not_found"}
        kube.wait_for(
            lambda: (started.metric("fracgpu_plugin_usage_sample_failures_total", **reason) or 0) >= 2 or None,
            2 * DEADLINE,
            what="samples failing for want of the call",
        )
        (claim,) = kube.allocate_claims(api_client, dyn, namespace, started.name, device_class=DRIVER, memories=["1Gi"])
        assert not started.kubelet.prepare(_refs([claim])).claims[claim["metadata"]["uid"]].error
        log = started.process.log()
        assert log.count("has no nvmlDeviceGetComputeRunningProcesses") == 1, "logged once, not every interval"
        started.kubelet.unprepare(_refs([claim]))
    finally:
        _stop_node(started)
        shutil.rmtree(workdir, ignore_errors=True)
