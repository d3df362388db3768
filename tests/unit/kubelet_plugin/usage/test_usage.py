"""Usage per claim: attribution, grant crossings, ledger rate limiting, metric series, and the sampler with fakes."""

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from api.kube_errors import api_error
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import container_info, device_metadata
from kubelet_plugin.state.container_info import ClaimName, DeviceInfo, RequestInfo
from kubelet_plugin.usage.attribution import (
    ClaimShare,
    CrossingTracker,
    GpuUsage,
    LedgerWriter,
    ProcessSample,
    Snapshot,
    attribute,
)
from kubelet_plugin.usage.metrics import UsageMetrics
from kubelet_plugin.usage.nvml import SampleError
from kubelet_plugin.usage.sampler import ClaimPods, UsageSampler, read_shares, reserved_pods

GiB = 1 << 30
MiB = 1 << 20
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
POD_A, POD_B, POD_C = (f"{c * 8}-{c * 4}-{c * 4}-{c * 4}-{c * 12}" for c in "abc")
CID = "0123456789ab" * 2


def share(uid: str, gpu: str = GPU0, granted: int = 10 * GiB, enforced: bool = False, name: str = "") -> ClaimShare:
    return ClaimShare(
        claim_uid=uid,
        namespace="ns",
        name=name or f"claim-{uid}",
        gpu_uuid=gpu,
        granted_bytes=granted,
        enforced=enforced,
    )


def used_of(snapshot: Snapshot) -> dict[tuple[str, str, str], int]:
    return {(u.share.name, u.pod, u.share.gpu_uuid): u.used_bytes for u in snapshot.claims}


# ----- attribution ------------------------------------------------------------------------------------


def test_processes_go_to_the_claim_of_their_pod_on_their_gpu() -> None:
    shares = [share("c1"), share("c2"), share("c3", gpu=GPU1)]
    pods = {"c1": {POD_A: "a"}, "c2": {POD_B: "b"}, "c3": {POD_A: "a"}}
    processes = [
        ProcessSample(gpu_uuid=GPU0, pid=10, used_bytes=3 * GiB),
        ProcessSample(gpu_uuid=GPU0, pid=11, used_bytes=1 * GiB),  # second process of pod a
        ProcessSample(gpu_uuid=GPU0, pid=20, used_bytes=5 * GiB),
        ProcessSample(gpu_uuid=GPU1, pid=10, used_bytes=2 * GiB),  # pod a's process also on GPU1: claim c3
        ProcessSample(gpu_uuid=GPU0, pid=30, used_bytes=7 * GiB),  # pod c holds no claim: GPU total only
        ProcessSample(gpu_uuid=GPU0, pid=40, used_bytes=1 * GiB),  # a host process
        ProcessSample(gpu_uuid=GPU0, pid=50, used_bytes=1 * GiB),  # cgroup unreadable: not in pod_of_pid
    ]
    snapshot = attribute(processes, {10: POD_A, 11: POD_A, 20: POD_B, 30: POD_C, 40: None}, shares, pods, [GPU0, GPU1])
    assert used_of(snapshot) == {
        ("claim-c1", "a", GPU0): 4 * GiB,
        ("claim-c2", "b", GPU0): 5 * GiB,
        ("claim-c3", "a", GPU1): 2 * GiB,
    }
    assert snapshot.gpus == (
        GpuUsage(uuid=GPU0, granted_bytes=20 * GiB, used_bytes=18 * GiB),
        GpuUsage(uuid=GPU1, granted_bytes=10 * GiB, used_bytes=2 * GiB),
    )
    assert (snapshot.unattributed, snapshot.ambiguous) == (3, 0)


def test_a_pod_with_two_claims_on_one_gpu_is_never_guessed() -> None:
    shares = [share("c1"), share("c2")]
    pods = {"c1": {POD_A: "a"}, "c2": {POD_A: "a"}}
    snapshot = attribute([ProcessSample(gpu_uuid=GPU0, pid=1, used_bytes=GiB)], {1: POD_A}, shares, pods, [GPU0])
    assert used_of(snapshot) == {("claim-c1", "a", GPU0): 0, ("claim-c2", "a", GPU0): 0}
    assert (snapshot.unattributed, snapshot.ambiguous) == (1, 1)
    assert snapshot.gpus[0].used_bytes == GiB


def test_a_shared_claim_has_a_series_per_pod_and_one_without_pods() -> None:
    shares = [share("c1"), share("c2", gpu=GPU1)]
    snapshot = attribute(
        [ProcessSample(gpu_uuid=GPU0, pid=2, used_bytes=GiB)], {2: POD_B}, shares, {"c1": {POD_A: "a", POD_B: "b"}}, []
    )
    assert used_of(snapshot) == {("claim-c1", "a", GPU0): 0, ("claim-c1", "b", GPU0): GiB, ("claim-c2", "", GPU1): 0}


# ----- crossings ---------------------------------------------------------------------------------------


def snap(used: int, enforced: bool = False, uid: str = "c1") -> Snapshot:
    s = share(uid, enforced=enforced)
    return attribute(
        [ProcessSample(gpu_uuid=GPU0, pid=1, used_bytes=used)], {1: POD_A}, [s], {uid: {POD_A: "a"}}, [GPU0]
    )


def test_one_crossing_per_excursion_over_the_grant() -> None:
    tracker = CrossingTracker()
    assert tracker.update(snap(10 * GiB)) == []  # at the grant is within it
    (crossing,) = tracker.update(snap(11 * GiB))
    assert (crossing.share.claim_uid, crossing.used_bytes, crossing.pods) == ("c1", 11 * GiB, ("a",))
    assert tracker.update(snap(12 * GiB)) == []  # still over: no second report
    assert tracker.update(snap(9 * GiB)) == []  # back under: re-armed
    assert len(tracker.update(snap(11 * GiB))) == 1
    assert tracker.update(Snapshot()) == []  # the claim went: forgotten
    assert len(tracker.update(snap(11 * GiB))) == 1


def test_an_enforced_share_never_crosses() -> None:
    tracker = CrossingTracker()
    assert tracker.update(snap(20 * GiB, enforced=True)) == []


# ----- ledger rate limiting ----------------------------------------------------------------------------


def gpu(used: int) -> GpuUsage:
    return GpuUsage(uuid=GPU0, granted_bytes=0, used_bytes=used)


def test_ledger_writes_only_meaningful_changes_at_most_once_per_interval() -> None:
    writer = LedgerWriter(threshold_bytes=256 * MiB, min_interval_s=30)
    assert writer.due([gpu(0)], now=0) == [gpu(0)]  # first value: written
    writer.written(gpu(0), now=0)
    assert writer.due([gpu(0)], now=100) == []  # unchanged
    assert writer.due([gpu(GiB)], now=10) == []  # changed, but within the interval
    assert writer.due([gpu(GiB)], now=30) == [gpu(GiB)]  # the held-back change, at the first sample after it
    writer.written(gpu(GiB), now=30)
    assert writer.due([gpu(GiB + 100 * MiB)], now=100) == []  # below the threshold
    assert writer.due([gpu(GiB + 256 * MiB)], now=100) == [gpu(GiB + 256 * MiB)]
    writer.written(gpu(GiB + 256 * MiB), now=100)
    writer.failed(gpu(0), now=200)
    assert writer.due([gpu(0)], now=229) == []  # a failed write is retried after the interval
    assert writer.due([gpu(0)], now=230) == [gpu(0)]


def test_a_small_change_to_or_from_zero_is_meaningful() -> None:
    writer = LedgerWriter(threshold_bytes=256 * MiB, min_interval_s=0)
    writer.written(gpu(MiB), now=0)
    assert writer.due([gpu(0)], now=1) == [gpu(0)]


# ----- metric series -----------------------------------------------------------------------------------


def test_series_of_a_claim_go_with_the_claim() -> None:
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry)
    labels = {"namespace": "ns", "claim": "claim-c1", "pod": "a", "gpu_uuid": GPU0}
    metrics.publish(snap(3 * GiB))
    assert registry.get_sample_value("fracgpu_plugin_claim_memory_used_bytes", labels) == 3 * GiB
    assert registry.get_sample_value("fracgpu_plugin_claim_memory_granted_bytes", labels) == 10 * GiB
    assert registry.get_sample_value("fracgpu_plugin_gpu_memory_used_bytes", {"gpu_uuid": GPU0}) == 3 * GiB
    metrics.publish(attribute([], {}, [], {}, [GPU0]))
    assert registry.get_sample_value("fracgpu_plugin_claim_memory_used_bytes", labels) is None
    assert registry.get_sample_value("fracgpu_plugin_gpu_memory_used_bytes", {"gpu_uuid": GPU0}) == 0


def test_series_stay_bounded_by_the_claims_present() -> None:
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry)
    for i in range(200):  # 200 claims come and go, at most two at a time
        shares = [share(f"c{i}"), share(f"c{i + 1}")]
        metrics.publish(attribute([], {}, shares, {}, [GPU0]))
    series = [
        s
        for family in registry.collect()
        if family.name == "fracgpu_plugin_claim_memory_granted_bytes"
        for s in family.samples
    ]
    assert sorted(s.labels["claim"] for s in series) == ["claim-c199", "claim-c200"]


# ----- the claims of this node ------------------------------------------------------------------------


def write_info(data_dir: Path, uid: str, request: str, devices: list[tuple[str, int]], enforcement: str) -> None:
    info = RequestInfo(
        claim=ClaimName(namespace="ns", name=f"claim-{uid}", uid=uid),
        request=request,
        enforcement=enforcement,
        devices=[
            DeviceInfo(
                uuid=u,
                memory_mib=mib,
                share_id=None,
                device="gpu-0",
                pci_bus_id="0000:18:00.0",
                minor=0,
                cdi_device=f"k8s.gpu.fracgpu.dev/claim={uid}-gpu-0",
                env_prefix="FRACGPU_DEV_X_",
                enforcement=enforcement,
            )
            for u, mib in devices
        ],
    )
    f = container_info.info_file(data_dir, info)
    store.write_claim_files(f.host_path.parent, [f, *_existing(f.host_path.parent, f)])


def _existing(directory: Path, new: container_info.InfoFile) -> list[container_info.InfoFile]:
    out = []
    for path in directory.glob("*.json") if directory.exists() else []:
        if path != new.host_path:
            info = RequestInfo.model_validate_json(path.read_bytes())
            out.append(container_info.info_file(directory.parents[1], info))
    return out


def test_a_share_is_enforced_by_its_own_tier_not_its_requests_weakest(tmp_path: Path) -> None:
    write_info(tmp_path, "c1", "a", [(GPU0, 1024), (GPU1, 1024)], "none")
    path = container_info.claim_info_dir(tmp_path, "c1") / "a.json"
    info = RequestInfo.model_validate_json(path.read_bytes())
    devices = [info.devices[0].model_copy(update={"enforcement": "nvml"}), info.devices[1]]
    f = container_info.info_file(tmp_path, info.model_copy(update={"devices": devices}))
    store.write_claim_files(f.host_path.parent, [f])
    assert {s.gpu_uuid: s.enforced for s in read_shares(tmp_path)} == {GPU0: True, GPU1: False}


def test_read_shares_sums_requests_per_gpu_and_skips_broken_claims(tmp_path: Path) -> None:
    write_info(tmp_path, "c1", "a", [(GPU0, 1024)], "none")
    write_info(tmp_path, "c1", "b", [(GPU0, 2048), (GPU1, 512)], "hami-core")
    write_info(tmp_path, "c2", "gpu", [(GPU1, 4096)], "none")
    c2 = container_info.claim_info_dir(tmp_path, "c2")  # and its device metadata, which is no info file
    info = container_info.info_file(tmp_path, RequestInfo.model_validate_json((c2 / "gpu.json").read_bytes()))
    claim = {"metadata": {"name": "claim-c2", "namespace": "ns", "uid": "c2"}}
    metadata = device_metadata.metadata_file(
        claim, "gpu.fracgpu.dev", "gpu", request_ref="gpu", devices=[], info_dir=c2
    )
    store.write_claim_files(c2, [info, metadata])
    assert sorted(p.name for p in c2.iterdir()) == ["gpu.json", "gpu.metadata"]
    broken = container_info.claim_info_dir(tmp_path, "c3")
    broken.mkdir(parents=True)
    (broken / "gpu.json").write_text("{half")
    assert read_shares(tmp_path) == [
        ClaimShare(
            claim_uid="c1", namespace="ns", name="claim-c1", gpu_uuid=GPU0, granted_bytes=3 * GiB, enforced=False
        ),
        ClaimShare(
            claim_uid="c1", namespace="ns", name="claim-c1", gpu_uuid=GPU1, granted_bytes=512 * MiB, enforced=True
        ),
        ClaimShare(
            claim_uid="c2", namespace="ns", name="claim-c2", gpu_uuid=GPU1, granted_bytes=4 * GiB, enforced=False
        ),
    ]
    assert read_shares(tmp_path / "nothing") == []


def test_reserved_pods_are_only_core_pods() -> None:
    claim = {
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": "a", "uid": POD_A},
                {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": POD_C},
                {"resource": "jobs", "name": "j", "uid": POD_B},
            ]
        }
    }
    assert reserved_pods(claim) == {POD_A: "a"}
    assert reserved_pods({}) == {}


class FakeRest:
    """The few KubeRest calls of the sampler, with an API server's answers: claims by path, 404 otherwise."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.gets: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.applied: list[tuple[str, dict[str, Any], str]] = []
        self.apply_error: int | None = None

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        self.gets.append(path)
        if path not in self.claims:
            raise api_error(404, "Not Found")
        return self.claims[path]

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.events.append({"path": path, **body})
        return body

    def apply(self, path: str, body: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        if self.apply_error:
            raise api_error(self.apply_error, "Unprocessable")
        self.applied.append((path, body, field_manager))
        return body


def claim_object(uid: str, pods: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid},
        "status": {"reservedFor": [{"resource": "pods", "name": n, "uid": u} for u, n in pods.items()]},
    }


def test_claim_pods_are_read_once_and_again_only_on_a_stale_miss() -> None:
    rest = FakeRest()
    rest.claims["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-c1"] = claim_object("c1", {POD_A: "a"})
    now = [0.0]
    pods = ClaimPods(rest, refresh_s=10, clock=lambda: now[0])  # type: ignore[arg-type]
    assert pods.get([share("c1")], refresh=set()) == {"c1": {POD_A: "a"}}
    assert pods.get([share("c1")], refresh=set()) == {"c1": {POD_A: "a"}}
    assert pods.get([share("c1")], refresh={"c1"}) == {"c1": {POD_A: "a"}}  # fresh: not read again
    assert len(rest.gets) == 1
    now[0] = 10
    rest.claims["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-c1"] = claim_object(
        "c1", {POD_A: "a", POD_B: "b"}
    )
    assert pods.get([share("c1")], refresh={"c1"}) == {"c1": {POD_A: "a", POD_B: "b"}}
    rest.claims["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-c1"] = claim_object("other", {POD_C: "c"})
    now[0] = 20
    assert pods.get([share("c1")], refresh={"c1"}) == {"c1": {}}  # replaced by a claim of the same name
    assert pods.get([], refresh=set()) == {}


# ----- the sampler --------------------------------------------------------------------------------------


def gpu_info(index: int, uuid: str) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid,
        product_name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=80 * GiB,
        minor=index,
        pci_bus_id=f"0000:1{index}:00.0",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        driver_version="580.65.06",
    )


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.data_dir = tmp_path / "plugin"
        self.proc = tmp_path / "proc"
        self.registry = CollectorRegistry()
        self.rest = FakeRest()
        self.now = 0.0
        self.nvml_result: tuple[list[ProcessSample], dict[str, str]] | Exception = ([], {})
        self.sampler = UsageSampler(
            node="node1",
            gpus=[gpu_info(0, GPU0), gpu_info(1, GPU1)],
            plugin_data_dir=self.data_dir,
            proc_root=self.proc,
            rest=self.rest,  # type: ignore[arg-type]
            metrics=UsageMetrics(self.registry),
            interval_s=5,
            ledger_min_interval_s=30,
            ledger_threshold_bytes=256 * MiB,
            nvml=self.nvml,
            clock=lambda: self.now,
        )

    def nvml(self) -> tuple[list[ProcessSample], dict[str, str]]:
        if isinstance(self.nvml_result, Exception):  # what NVML raised (SampleError), or a bug below it
            raise self.nvml_result
        return self.nvml_result

    def process(self, pid: int, pod_uid: str | None) -> None:
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        path = f"/kubepods/besteffort/pod{pod_uid}/{CID}" if pod_uid else "/system.slice/x.service"
        (self.proc / str(pid) / "cgroup").write_text(f"0::{path}\n")

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


def test_sampler_metrics_events_and_ledger(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    write_info(h.data_dir, "c1", "gpu", [(GPU0, 10240)], "none")
    h.rest.claims["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-c1"] = claim_object("c1", {POD_A: "a"})
    h.process(100, POD_A)
    h.nvml_result = ([ProcessSample(gpu_uuid=GPU0, pid=100, used_bytes=4 * GiB)], {})
    h.sampler.sample_once()
    labels = {"namespace": "ns", "claim": "claim-c1", "pod": "a", "gpu_uuid": GPU0}
    assert h.value("fracgpu_plugin_claim_memory_used_bytes", **labels) == 4 * GiB
    assert [(p, b["status"], m) for p, b, m in h.rest.applied] == [
        (
            "/apis/fracgpu.dev/v1alpha1/gpus/node1-gpu-0/status",
            {"usage": {"usedMemory": "4Gi"}},
            "fracgpu-kubelet-plugin",
        ),
        (
            "/apis/fracgpu.dev/v1alpha1/gpus/node1-gpu-1/status",
            {"usage": {"usedMemory": "0"}},
            "fracgpu-kubelet-plugin",
        ),
    ]
    assert h.rest.events == []

    h.now = 5
    h.nvml_result = ([ProcessSample(gpu_uuid=GPU0, pid=100, used_bytes=11 * GiB)], {})
    h.sampler.sample_once()
    h.now = 10
    h.sampler.sample_once()  # still over: no second Event
    kinds = sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"]) for e in h.rest.events)
    assert kinds == [("Pod", "a", "OverMemoryGrant"), ("ResourceClaim", "claim-c1", "OverMemoryGrant")]
    assert "uses 11Gi of GPU " + GPU0 + ", more than its grant of 10Gi (pods a)" in h.rest.events[0]["message"]
    assert {e["path"] for e in h.rest.events} == {"/api/v1/namespaces/ns/events"}
    assert len(h.rest.applied) == 2, "the 11Gi change waits for the ledger interval"
    h.now = 30
    h.sampler.sample_once()
    assert h.rest.applied[-1][1]["status"] == {"usage": {"usedMemory": "11Gi"}}

    store.remove_claim_files(h.data_dir, "c1")  # unprepared
    h.sampler.sample_once()
    assert h.value("fracgpu_plugin_claim_memory_used_bytes", **labels) is None
    assert h.value("fracgpu_plugin_usage_unattributed_processes") == 1


def test_sampler_counts_bad_input_and_never_raises(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    write_info(h.data_dir, "c1", "gpu", [(GPU0, 10240)], "none")
    h.rest.claims["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-c1"] = claim_object("c1", {POD_A: "a"})
    labels = {"namespace": "ns", "claim": "claim-c1", "pod": "a", "gpu_uuid": GPU0}
    # a process whose cgroup cannot be read (it ended between NVML's answer and the read)
    h.nvml_result = ([ProcessSample(gpu_uuid=GPU0, pid=999, used_bytes=20 * GiB)], {})
    assert h.sampler.sample_once() is not None
    assert h.value("fracgpu_plugin_usage_unreadable_cgroups_total") == 1
    assert h.value("fracgpu_plugin_claim_memory_used_bytes", **labels) == 0, "never a wrong claim"
    assert h.rest.events == []
    # NVML without the call
    h.nvml_result = SampleError("function_not_found", "no nvmlDeviceGetComputeRunningProcesses")
    assert h.sampler.sample_once() is None
    assert h.value("fracgpu_plugin_usage_sample_failures_total", reason="function_not_found") == 1
    assert h.value("fracgpu_plugin_claim_memory_used_bytes", **labels) is None, "no stale values"
    # one GPU's query fails: its claims have no series this sample, the other GPU's are fine
    h.nvml_result = ([], {GPU0: "Unknown Error"})
    assert h.sampler.sample_once() is not None
    assert h.value("fracgpu_plugin_usage_sample_failures_total", reason="nvml_query") == 1
    assert h.value("fracgpu_plugin_claim_memory_used_bytes", **labels) is None
    assert h.value("fracgpu_plugin_gpu_memory_used_bytes", gpu_uuid=GPU1) == 0
    assert h.value("fracgpu_plugin_gpu_memory_used_bytes", gpu_uuid=GPU0) is None
    # the ledger write failing is counted and retried later
    h2 = Harness(tmp_path / "two")
    h2.rest.apply_error = 422
    h2.sampler.sample_once()
    assert h2.value("fracgpu_plugin_usage_ledger_writes_total", result="error") == 2
    h2.sampler.sample_once()
    assert h2.value("fracgpu_plugin_usage_ledger_writes_total", result="error") == 2, "retried after the interval"


def test_sampler_thread_survives_an_unexpected_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(tmp_path)

    h.nvml_result = RuntimeError("boom")
    assert h.sampler.sample_once() is None
    assert h.sampler.sample_once() is None
    assert h.value("fracgpu_plugin_usage_sample_failures_total", reason="internal") == 2
    assert sum("GPU memory usage sample failed" in r.message for r in caplog.records) == 1, "logged once per problem"


def test_the_dashboard_queries_only_metrics_the_plugin_exports() -> None:
    import json
    import re

    dashboard = (Path(__file__).resolve().parents[4] / "charts" / "fracgpu" / "dashboards" / "fracgpu.json").read_text()
    queried = set(re.findall(r"fracgpu_[a-z_]+", dashboard))
    assert json.loads(dashboard)["panels"], "a dashboard with panels"
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry)
    metrics.publish(snap(GiB))
    metrics.sample_failures.labels("nvml_query").inc()
    metrics.ledger_writes.labels("ok").inc()
    exported = {s.name for family in registry.collect() for s in family.samples}
    assert queried and queried <= exported, queried - exported


def test_a_gpu_failing_every_sample_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(tmp_path)
    h.nvml_result = ([], {GPU0: "Unknown Error"})
    for _ in range(3):
        h.sampler.sample_once()
    assert h.value("fracgpu_plugin_usage_sample_failures_total", reason="nvml_query") == 3, "counted every time"
    assert sum("could not list a GPU's processes" in r.message for r in caplog.records) == 1
    h.nvml_result = ([], {})
    h.sampler.sample_once()
    h.nvml_result = ([], {GPU0: "Unknown Error"})
    h.sampler.sample_once()
    assert sum("could not list a GPU's processes" in r.message for r in caplog.records) == 2, "again after recovery"
