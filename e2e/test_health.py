"""End to end (issue #14): GPU health from NVML (the mock's event API, fed by its control file) as DRA device taints.

A fatal XID on gpu-1 taints it in the node's ResourceSlice: the scheduler puts no new share there, the device
taint eviction controller evicts the pod using it (NoExecute) while a pod whose claim tolerates the taint stays and
its status shows the device Unhealthy (kubelet health stream); Events on the Node and the claims; the metrics.
The mock's reset clears it. Ignored XIDs change nothing; a flood of 10,000 XIDs is a handful of slice writes.
"""

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e import workloads as w
from e2e.install import HEALTH_IGNORED_XIDS, Installation

pytestmark = pytest.mark.e2e
T = TypeVar("T")
DEADLINE = 60.0  # probe interval 1 s, coalescing 1 s, the scheduler, eviction, the kubelet's 10 s health stream
XID_TAINT = "gpu.fracgpu.dev/xid"


def _metric(installation: Installation, name: str, **labels: str) -> float | None:
    url = f"http://{installation.cluster.netns.address}:8082/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def _wait(probe: Callable[[], T | None], what: str, timeout: float = DEADLINE) -> T:
    """Until `probe` returns something truthy: that."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"{what} not within {timeout:g} s"
        time.sleep(0.5)
    return value


def _devices(installation: Installation) -> dict[str, dict[str, Any]]:
    """The node's published devices by name."""
    slices = w.get(installation.cluster, "resourceslices")["items"]
    return {d["name"]: d for s in slices if s["spec"]["driver"] == w.DEVICE_CLASS for d in s["spec"]["devices"]}


def _taints(installation: Installation, device: str) -> list[dict[str, Any]]:
    return list(_devices(installation)[device].get("taints") or [])


def _uuid(installation: Installation, device: str) -> str:
    return str(_devices(installation)[device]["attributes"]["uuid"]["string"])


def _inject(installation: Installation, *lines: str) -> None:
    with installation.health_control.open("a") as f:
        f.write("".join(f"{line}\n" for line in lines))


def _slice_writes(installation: Installation) -> float:
    value = _metric(installation, "fracgpu_plugin_slice_writes_total")
    assert value is not None, "the plugin exports fracgpu_plugin_slice_writes_total"
    return value


def _on_gpu(name: str, index: int, memory: str, tolerate: bool = False) -> dict[str, Any]:
    """A claim template for a share of the GPU of `index` (a CEL selector), tolerating every NoExecute taint if
    asked (the eviction controller honours only tolerations that name the effect NoExecute)."""
    template = w.claim_template(name, memory)
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{w.DEVICE_CLASS}"].index == {index}'}}]
    if tolerate:
        exactly["tolerations"] = [{"operator": "Exists", "effect": "NoExecute"}]
    return template


@pytest.fixture
def healthy(installation: Installation) -> Iterator[Installation]:
    """Both GPUs healthy and untainted before and after the test (a reset line for each)."""
    gpus = ("gpu-0", "gpu-1")
    uuids = [_uuid(installation, g) for g in gpus]
    assert not any(_taints(installation, g) for g in gpus), "the GPUs start untainted"
    yield installation
    _inject(installation, *(f"{u} reset" for u in uuids))
    _wait(lambda: not any(_taints(installation, g) for g in gpus), "the GPUs untainted after the test")


def test_a_fatal_xid_taints_evicts_reports_and_clears_on_reset(healthy: Installation, ns: str) -> None:
    installation, cluster = healthy, healthy.cluster
    gpu1 = _uuid(installation, "gpu-1")
    gpu0 = _uuid(installation, "gpu-0")
    w.apply(
        cluster, ns,
        _on_gpu("on-gpu1", 1, "10Gi"), _on_gpu("on-gpu1-tolerant", 1, "10Gi", tolerate=True),
        w.claim_template("share", "30Gi"),
        w.gpu_pod("victim", "on-gpu1"), w.gpu_pod("tolerant", "on-gpu1-tolerant"),
    )  # fmt: skip
    w.wait_running(cluster, ns, ["victim", "tolerant"])
    tolerant_claim = w.claim_of(cluster, ns, "tolerant")["metadata"]["name"]

    # ignored XIDs: 13 (an application's fault) and the installation's allow-list: heard, counted, nothing changes
    writes = _slice_writes(installation)
    _inject(installation, f"{gpu1} xid 13", *(f"{gpu1} xid {x}" for x in HEALTH_IGNORED_XIDS))
    ignored = f"{HEALTH_IGNORED_XIDS[0]}"
    _wait(lambda: _metric(installation, "fracgpu_plugin_xid_events_total", gpu="gpu-1", xid=ignored) == 1, "XIDs")
    assert _metric(installation, "fracgpu_plugin_xid_events_total", gpu="gpu-1", xid="13") == 1
    time.sleep(2.5)  # longer than the coalescing window: a slice write would have happened by now
    assert _taints(installation, "gpu-1") == [] and _slice_writes(installation) == writes
    assert _metric(installation, "fracgpu_plugin_gpu_health", gpu="gpu-1", state="healthy") == 1

    _inject(installation, f"{gpu1} xid 48 gpu_reset")  # double-bit ECC error; the driver asks for a GPU reset
    _wait(lambda: _taints(installation, "gpu-1"), "gpu-1 tainted")
    taints = {t["key"]: t for t in _taints(installation, "gpu-1")}
    assert taints[XID_TAINT]["value"] == "48-double-bit-ecc-error" and taints[XID_TAINT]["effect"] == "NoExecute"
    assert taints["gpu.fracgpu.dev/recovery-action"]["value"] == "gpu-reset"
    assert _taints(installation, "gpu-0") == []

    # NoExecute: the pod without a toleration is evicted, the tolerant one stays and sees the device Unhealthy
    def victim_gone() -> bool:
        got = cluster.kubectl("get", "pod", "-n", ns, "victim", "-o", "json", check=False)
        return got.returncode != 0 or bool(json.loads(got.stdout)["metadata"].get("deletionTimestamp"))

    _wait(victim_gone, "the pod on gpu-1 evicted")

    def unhealthy_in_pod_status() -> list[tuple[str, str]] | None:
        status = w.get(cluster, "pod", "-n", ns, "tolerant")["status"]
        resources = [r for c in status.get("containerStatuses", []) for r in c.get("allocatedResourcesStatus") or []]
        health = [(h.get("health"), h.get("message", "")) for r in resources for h in r.get("resources") or []]
        return health if [h for h, _ in health] == ["Unhealthy"] else None

    # the kubelet shows the plugin's message with it (ResourceHealthStatusMessage, on since 1.36)
    ((_, why),) = _wait(unhealthy_in_pod_status, "the tolerant pod's status showing its device Unhealthy")
    assert why == "XID 48 (double-bit-ecc-error, fatal); driver asks for recovery action gpu-reset", why
    assert w.get(cluster, "pod", "-n", ns, "tolerant")["status"]["phase"] == "Running"

    # new shares land on gpu-0 only; one pinned to gpu-1 stays Pending. One share after the other: once in
    # a CI run, of two created together the second stayed Pending ("cannot allocate all claims") for the whole
    # wait although the test's own claims left gpu-0 room for both: the upstream scheduler can count an in-flight
    # share twice (docs/operations.md "Packing"); wait_running prints every allocated claim and the ledger when it gives up
    w.apply(cluster, ns, w.gpu_pod("pinned", "on-gpu1"))
    for name in ("new-a", "new-b"):
        w.apply(cluster, ns, w.gpu_pod(name, "share"))
        w.wait_running(cluster, ns, [name])
    for name in ("new-a", "new-b"):
        assert w.recorded_gpu(w.claim_of(cluster, ns, name))["uuid"] == gpu0, f"{name} on gpu-0"
    assert w.get(cluster, "pod", "-n", ns, "pinned")["status"].get("phase") == "Pending"

    # Events on the Node and on the claim on gpu-1; the metrics
    def events(namespace: str, reason: str) -> list[dict[str, Any]]:
        items = w.get(cluster, "events", "-n", namespace)["items"]
        return [e for e in items if e.get("reason") == reason]

    node_events = [e for e in events("default", "GpuUnhealthy") if "gpu-1" in e["message"]]
    assert node_events and "XID 48 (double-bit-ecc-error, fatal)" in node_events[-1]["message"]
    claim_events = [e for e in events(ns, "GpuUnhealthy") if e["involvedObject"]["name"] == tolerant_claim]
    assert claim_events and claim_events[0]["involvedObject"]["kind"] == "ResourceClaim"
    assert _metric(installation, "fracgpu_plugin_gpu_health", gpu="gpu-1", state="fatal") == 1
    assert _metric(installation, "fracgpu_plugin_gpu_health", gpu="gpu-0", state="healthy") == 1
    assert _metric(installation, "fracgpu_plugin_xid_events_total", gpu="gpu-1", xid="48") == 1

    # the driver resets the GPU: untainted, the pinned pod schedules onto gpu-1, healthy again in the pod status
    _inject(installation, f"{gpu1} reset")
    _wait(lambda: _taints(installation, "gpu-1") == [], "gpu-1 untainted after the reset")
    w.wait_running(cluster, ns, ["pinned"], timeout=DEADLINE)
    assert w.recorded_gpu(w.claim_of(cluster, ns, "pinned"))["uuid"] == gpu1
    assert _metric(installation, "fracgpu_plugin_gpu_health", gpu="gpu-1", state="healthy") == 1
    _wait(lambda: [e for e in events("default", "GpuHealthy") if "gpu-1" in e["message"]], "GpuHealthy Event")


def test_a_flood_of_xids_is_a_handful_of_slice_writes(healthy: Installation) -> None:
    installation = healthy
    gpus = [_uuid(installation, "gpu-0"), _uuid(installation, "gpu-1")]
    writes = _slice_writes(installation)
    before = _metric(installation, "fracgpu_plugin_xid_events_total", gpu="gpu-1", xid="63") or 0
    # 10,000 XIDs in one write: degraded (63) and fatal (48, asking for a reset), alternating over both GPUs
    _inject(installation, *(f"{gpus[i % 2]} xid {63 if i % 4 < 2 else 48} gpu_reset" for i in range(10_000)))
    _wait(
        lambda: _metric(installation, "fracgpu_plugin_xid_events_total", gpu="gpu-1", xid="63") == before + 2500,
        "all 10,000 events handled",
    )
    _wait(lambda: all(_taints(installation, g) for g in ("gpu-0", "gpu-1")), "both GPUs tainted")
    time.sleep(2.5)  # the last coalesced write
    flood_writes = _slice_writes(installation) - writes
    print(f"slice writes for 10,000 XID events: {flood_writes:g}")
    assert 1 <= flood_writes <= 4, f"{flood_writes:g} slice writes for one flood"
    plugin = w.get(installation.cluster, "pods", "-n", "fracgpu-system", "-l",
                   "app.kubernetes.io/component=kubelet-plugin")["items"]  # fmt: skip
    assert [c["restartCount"] for p in plugin for c in p["status"]["containerStatuses"]] == [0], "plugin alive"
