"""Benchmark of the controller at cluster scale: allocation -> status latency, ledger currency, CPU per claim,
RSS and admission latency during a burst of claims.

    python -m e2e.bench.controller_bench [--claims 500] [--nodes 10] [--out build/bench/controller.json]
    python -m e2e.bench.controller_bench --cluster-scale      # 5000 claims on 500 nodes (minutes)

Starts its own control plane (etcd, apiserver, controller-manager, scheduler; the last two allowed
`--component-qps` requests/s), fake Nodes with 8 simulated 80Gi GPUs each (slices built by the node plugin's
`build_slices`), and the controller as a process under its RBAC with its webhook registered; then creates one
pod per claim (10Gi each, from a ResourceClaimTemplate) as fast as it can. Watches timestamp when each
allocation appears, when our `status.devices` data appears, and when each GPU object's ledger changes:

- allocation -> status written: per claim;
- ledger current: from the last allocation until every GPU object lists exactly the claims allocated on it;
- CPU per claim: the controller's user+system CPU from the burst's start until the ledger is current, divided
  by the claims;
- admission: dry-run creates of a claim our webhook validates, sent at a steady rate by their own client,
  timed before the burst (idle) and from the first pod created until the last status is written (burst);
  each followed by the same review sent straight to the webhook (the webhook's latency without the API server);
- bare writes: a GPU object status apply at the same rate from the bench's own client, on an object of
  another driver (the API server's answer to the controller's most frequent write, without the controller);
- where the time goes, during the burst (histograms scraped before and after it): the controller's queue
  wait, status write (as its writer thread sees it), ledger writes and passes, event loop lag and the
  webhook's own review time; the API server's own time for the same claim status applies, its call of our
  webhook, the dry-run creates, and API Priority and Fairness queueing of each priority level.

Reports medians and percentiles of this one run; asserts nothing.
"""

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import GPU_API_VERSION, GPU_CRD_NAME, GPU_KIND, GPU_PLURAL, GPU_VERSION
from api.names import API_GROUP, DEVICE_CLASS_NAME, DRIVER_NAME
from controller.admission.webhook_config import CLAIMS
from controller.core.rbac import cluster_role_rules
from e2e.bench import histograms
from e2e.bench.stats import summary_ms, table
from harness import kube
from harness.cluster.controlplane import ControlPlane

GPUS_PER_NODE = 8
NAMESPACE = "bench"
CLUSTER_SCALE = (5000, 500)
"""(claims, nodes) of `--cluster-scale`."""
DeviceKey = tuple[str, str]


def rss_mib(pid: int) -> dict[str, float]:
    """Current and peak resident set size of `pid`, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time `pid` has used, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Watch:
    """Watches one collection in a thread and hands each ADDED/MODIFIED object, with its arrival time, to
    `observe`."""

    def __init__(self, list_fn: Callable[..., Any]) -> None:
        self.list_fn = list_fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def observe(self, obj: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self._stop.is_set():  # the control plane stopping ends a watch that was told to stop
                raise

    def _watch(self) -> None:
        listed = self.list_fn(_preload_content=False)
        version = json.loads(listed.data)["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            response = self.list_fn(
                watch=True,
                resource_version=version,
                timeout_seconds=60,
                _preload_content=False,
                _request_timeout=(5, 90),
            )
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self.observe(obj, time.monotonic())
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if self._stop.is_set():
                    break
            response.release_conn()


class ClaimWatch(Watch):
    """Per claim: when its allocation and our data first appear, and the devices it was allocated."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        resource = client.ResourceV1Api(api)
        super().__init__(lambda **kw: resource.list_namespaced_resource_claim(namespace, **kw))
        self.allocated: dict[str, float] = {}
        self.written: dict[str, float] = {}
        self.devices: dict[str, set[DeviceKey]] = {}

    def observe(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        status = obj.get("status") or {}
        results = [
            r
            for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            if r["driver"] == DRIVER_NAME
        ]
        if results:
            self.allocated.setdefault(name, now)
            self.devices[name] = {(r["pool"], r["device"]) for r in results}
            written = {
                (d["pool"], d["device"], d.get("shareID") or "")
                for d in status.get("devices") or []
                if d["driver"] == DRIVER_NAME and d.get("data")
            }
            if all((r["pool"], r["device"], r.get("shareID") or "") in written for r in results):
                self.written.setdefault(name, now)


class GpuWatch(Watch):
    """Per GPU object: the claims its ledger lists, and when that list last changed."""

    def __init__(self, api: client.ApiClient) -> None:
        custom = client.CustomObjectsApi(api)
        super().__init__(lambda **kw: custom.list_cluster_custom_object(API_GROUP, GPU_VERSION, GPU_PLURAL, **kw))
        self.claims: dict[DeviceKey, frozenset[str]] = {}
        self.changed: dict[DeviceKey, float] = {}
        self.lock = threading.Lock()

    def observe(self, obj: dict[str, Any], now: float) -> None:
        spec = obj.get("spec") or {}
        key = (spec.get("pool", ""), spec.get("device", ""))
        listed = frozenset(c["name"] for c in (obj.get("status") or {}).get("claims") or [])
        with self.lock:
            if self.claims.get(key) != listed:
                self.claims[key] = listed
                self.changed[key] = now

    def current_since(self, want: dict[DeviceKey, frozenset[str]]) -> float | None:
        """When the ledger last changed, if every GPU object lists exactly the claims of `want` now; else None."""
        with self.lock:
            if any(self.claims.get(k, frozenset()) != v for k, v in want.items()):
                return None
            if any(v and k not in want for k, v in self.claims.items()):
                return None
            return max(self.changed.values(), default=0.0)


class AdmissionProbe:
    """Dry-run creates of a valid claim of ours, `rate` per second from their own client, each one timed; with
    `direct`, the webhook's URL, each followed by the same review sent straight to the webhook (no API server)."""

    def __init__(self, api: client.ApiClient, namespace: str, rate: float, direct: str | None = None) -> None:
        self.resource = client.ResourceV1Api(api)
        self.namespace = namespace
        self.interval = 1 / rate
        self.direct = direct
        self.samples: list[tuple[float, float]] = []  # (sent at, seconds)
        self.direct_samples: list[tuple[float, float]] = []
        self.errors = 0
        self.direct_errors = 0
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._pool = urllib3.PoolManager(cert_reqs="CERT_NONE", timeout=30)  # the webhook's certificate is self-signed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        body = probe_claim("probe", "1Gi")
        next_at = time.monotonic()
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                self.resource.create_namespaced_resource_claim(self.namespace, body, dry_run="All")
                self.samples.append((sent, time.monotonic() - sent))
            except ApiException:
                self.errors += 1
            if self.direct is not None:
                self._review(body)
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def _review(self, claim: dict[str, Any]) -> None:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "bench-probe",
                "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
                "operation": "CREATE",
                "namespace": self.namespace,
                "name": claim["metadata"]["name"],
                "object": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim},
                "userInfo": {"username": "bench"},
                "dryRun": True,
            },
        }
        sent = time.monotonic()
        try:
            answer = self._pool.request(
                "POST", str(self.direct), body=json.dumps(review), headers={"Content-Type": "application/json"}
            )
            allowed = answer.status == 200 and json.loads(answer.data)["response"]["allowed"]
        except (urllib3.exceptions.HTTPError, ValueError, KeyError, TypeError):
            allowed = False
        if allowed:
            self.direct_samples.append((sent, time.monotonic() - sent))
        else:
            self.direct_errors += 1

    def between(self, start: float, end: float, *, direct: bool = False) -> list[float]:
        return [took for sent, took in (self.direct_samples if direct else self.samples) if start <= sent <= end]


class WriteProbe:
    """The write the controller makes most, a server-side apply of a GPU object's status, made by a bare client of
    the bench's own, `rate` per second on an object of another driver (which the controller leaves alone), each
    timed: the API server's answer without the controller's process in between."""

    NAME = "bench-write-probe"

    def __init__(self, api: client.ApiClient, rate: float) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.interval = 1 / rate
        self.samples: list[tuple[float, float]] = []  # (sent at, seconds)
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _apply(self, body: dict[str, Any], *, status: bool) -> None:
        apply = self.custom.patch_cluster_custom_object_status if status else self.custom.patch_cluster_custom_object
        apply(
            API_GROUP,
            GPU_VERSION,
            GPU_PLURAL,
            self.NAME,
            body,
            field_manager="bench-write-probe",
            force=True,
            _content_type="application/apply-patch+yaml",
            _preload_content=False,
        )

    def start(self) -> None:
        spec = {"driver": "probe.bench.example", "pool": "probe", "device": "gpu-0", "node": "probe"}
        try:
            self._apply({**self._head(), "spec": spec}, status=False)
        except ApiException:
            self.errors += 1  # reported; the run goes on without these samples
            return
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _head(self) -> dict[str, Any]:
        return {"apiVersion": GPU_API_VERSION, "kind": GPU_KIND, "metadata": {"name": self.NAME}}

    def _run(self) -> None:
        next_at, shares = time.monotonic(), 0
        while not self._stop.is_set():
            shares += 1  # a changed status every time: a real write
            status = {
                "node": "probe",
                "totalMemory": "80Gi",
                "allocatedMemory": "0",
                "freeMemory": "80Gi",
                "shares": shares,
                "shareEnforcement": "",
            }
            sent = time.monotonic()
            try:
                self._apply({**self._head(), "status": status}, status=True)
                self.samples.append((sent, time.monotonic() - sent))
            except ApiException:
                self.errors += 1
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def between(self, start: float, end: float) -> list[float]:
        return [took for sent, took in self.samples if start <= sent <= end]


def probe_claim(name: str, memory: str) -> dict[str, Any]:
    """A ResourceClaim asking our DeviceClass for `memory` (validated by our webhook)."""
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": memory}}},
    }
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


def wait_for_webhook(api: client.ApiClient, namespace: str) -> None:
    """The apiserver picks up the webhook configuration asynchronously: wait until it refuses a bad claim."""
    resource = client.ResourceV1Api(api)

    def refused() -> bool:
        try:
            resource.create_namespaced_resource_claim(namespace, probe_claim("bad", "0"), dry_run="All")
        except ApiException as err:
            return bool(err.status == 422)
        return False

    kube.wait_for(refused, 60, interval=0.5, what="the controller's webhook refusing a bad claim")


def apiserver_metrics(api: client.ApiClient) -> str:
    """The API server's /metrics text (as the admin client)."""
    method, url, headers, body, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body)
    response.read()
    return str(response.data.decode())


def controller_metrics(controller: kube.ControllerProcess) -> str:
    """The controller's /metrics text."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{controller.metrics_port}/metrics", timeout=10) as r:
        return str(r.read().decode())


BREAKDOWN: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("controller: claim queue wait", "controller", "fracgpu_controller_claim_queue_wait_seconds", {}),
    ("controller: claim status write", "controller", "fracgpu_controller_claim_status_write_seconds", {}),
    ("controller: GPU status write", "controller", "fracgpu_controller_ledger_write_seconds", {"kind": "status"}),
    ("controller: ledger pass", "controller", "fracgpu_controller_ledger_pass_seconds", {}),
    ("controller: event loop lag", "controller", "fracgpu_controller_event_loop_lag_seconds", {}),
    ("controller: gc pause, generation 2", "controller", "fracgpu_controller_gc_pause_seconds", {"generation": "2"}),
    ("controller: gc pause, any generation", "controller", "fracgpu_controller_gc_pause_seconds", {}),
    ("controller: webhook review (own)", "controller", "fracgpu_controller_admission_review_seconds", {}),
    (
        "apiserver: claim status apply",
        "apiserver",
        "apiserver_request_duration_seconds",
        {"verb": "APPLY", "resource": "resourceclaims", "subresource": "status"},
    ),
    (
        "apiserver: GPU status apply",
        "apiserver",
        "apiserver_request_duration_seconds",
        {"verb": "APPLY", "resource": "gpus", "subresource": "status"},
    ),
    (
        "apiserver: claim status update (scheduler)",
        "apiserver",
        "apiserver_request_duration_seconds",
        {"verb": "UPDATE", "resource": "resourceclaims", "subresource": "status"},
    ),
    (
        "apiserver: dry-run claim create (probe)",
        "apiserver",
        "apiserver_request_duration_seconds",
        {"verb": "POST", "resource": "resourceclaims", "dry_run": "All"},
    ),
    (
        "apiserver: its call of our webhook",
        "apiserver",
        "apiserver_admission_webhook_admission_duration_seconds",
        {"type": "validating"},
    ),
    *(
        (
            f"apiserver: APF queue wait, {level}",
            "apiserver",
            "apiserver_flowcontrol_request_wait_duration_seconds",
            {"priority_level": level},
        )
        for level in ("workload-low", "workload-high", "exempt")
    ),
)
"""(row, scrape, histogram, labels) of the burst's breakdown."""


def breakdown(before: dict[str, histograms.Scrape], after: dict[str, histograms.Scrape]) -> dict[str, Any]:
    """Estimated n/p50/p90/p99 of each `BREAKDOWN` histogram over the burst."""
    out: dict[str, Any] = {}
    for row, source, name, labels in BREAKDOWN:
        summary = histograms.summary_ms(histograms.delta(before[source], after[source], name, **labels))
        if summary is not None:
            out[row] = summary
    return out


def ledger_shares(api: client.ApiClient) -> int:
    """Total shares over all GPU objects."""
    return sum(((g.get("status") or {}).get("shares") or 0) for g in _gpus(api))


def run(
    claims: int,
    nodes: int,
    memory: str,
    workdir: Path,
    *,
    controller_args: tuple[str, ...] = (),
    component_qps: int | None = 500,
    admission_rate: float = 10.0,
) -> dict[str, Any]:
    """One benchmark run in a fresh control plane under `workdir`; the figures as a dict."""
    plane = ControlPlane(workdir / "cluster", component_qps=component_qps)
    plane.start()
    controller: kube.ControllerProcess | None = None
    try:
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        api.configuration.connection_pool_maxsize = 16
        dyn = DynamicClient(api)
        kube.apply_crd(api, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
        kube.ensure_device_class(dyn, DEVICE_CLASS_NAME, DRIVER_NAME)

        def fake_node(i: int) -> str:
            node = kube.create_fake_node(api, f"bench-node-{i:03d}")
            kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], GPUS_PER_NODE))
            return str(node["metadata"]["name"])

        with ThreadPoolExecutor(8) as pool:
            node_names = list(pool.map(fake_node, range(nodes)))
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        kube.wait_for(lambda: kube.exists(lambda: core.read_namespaced_service_account("default", NAMESPACE)), 30)
        kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate").create(
            namespace=NAMESPACE, body=kube.claim_template("share", DEVICE_CLASS_NAME, memory)
        )
        kubeconfig = kube.service_account_kubeconfig(
            api,
            server=plane.server,
            ca_cert=plane.ca_cert,
            namespace="fracgpu-system",
            name="fracgpu-controller",
            rules=cluster_role_rules(),
            path=workdir / "controller.kubeconfig",
        )
        with kube.chart_made_webhook_configuration(api, DRIVER_NAME):
            controller = kube.ControllerProcess(workdir / "controller", kubeconfig, *controller_args)
            controller.start(timeout=120)
            gpus = nodes * GPUS_PER_NODE
            kube.wait_for(
                lambda: ledger_shares(api) == 0 and len(_gpus(api)) == gpus, 60 + gpus / 20, interval=1, what="ledger"
            )
            wait_for_webhook(api, NAMESPACE)
            idle_rss = rss_mib(controller.pid)

            probe_api = config.new_client_from_config(config_file=str(plane.kubeconfig))
            webhook = f"https://127.0.0.1:{controller.webhook_port}/{CLAIMS.id}"
            probe = AdmissionProbe(probe_api, NAMESPACE, admission_rate, direct=webhook)
            probe.start()
            writes_probe = WriteProbe(probe_api, admission_rate)
            writes_probe.start()
            time.sleep(max(3.0, 30 / admission_rate))  # idle admission samples
            watch, gpu_watch = ClaimWatch(api, NAMESPACE), GpuWatch(api)
            watch.start()
            gpu_watch.start()
            time.sleep(1)
            scraped = {"controller": controller_metrics(controller), "apiserver": apiserver_metrics(api)}
            cpu_before = cpu_seconds(controller.pid)
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        lambda i: core.create_namespaced_pod(
                            NAMESPACE, kube.pod_with_claim(f"p{i:04d}", "share", node_names[i % nodes])
                        ),
                        range(claims),
                    )
                )
            created = time.monotonic() - started
            budget = max(600.0, claims * 0.2)
            kube.wait_for(lambda: len(watch.written) >= claims, budget, interval=0.5, what=f"{claims} claims written")
            all_written = time.monotonic()
            probe.stop()
            writes_probe.stop()
            before = {k: histograms.parse(v) for k, v in scraped.items()}
            after = {
                "controller": histograms.parse(controller_metrics(controller)),
                "apiserver": histograms.parse(apiserver_metrics(api)),
            }
            burst_rss = rss_mib(controller.pid)
            want: dict[DeviceKey, set[str]] = {}
            for name, keys in watch.devices.items():
                for key in keys:
                    want.setdefault(key, set()).add(name)
            frozen = {k: frozenset(v) for k, v in want.items()}
            ledger_at = kube.wait_for(lambda: gpu_watch.current_since(frozen), 300, interval=0.25, what="ledger")
            cpu = cpu_seconds(controller.pid) - cpu_before
            watch.stop()
            gpu_watch.stop()
            writes = controller.metric("fracgpu_controller_claim_status_writes_total", result="ok")
            frozen_objects = controller.metric("fracgpu_controller_gc_frozen_objects")
    finally:
        if controller is not None:
            controller.terminate()
        plane.stop()
    latencies = [watch.written[n] - watch.allocated[n] for n in watch.written]
    last_allocation = max(watch.allocated.values())
    idle = probe.between(0, started)
    burst = probe.between(started, all_written)
    direct = probe.between(started, all_written, direct=True)
    bare_writes = writes_probe.between(started, all_written)
    return {
        "claims": claims,
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "memory_per_claim": memory,
        "component_qps": component_qps,
        "allocation_to_status_written": summary_ms(latencies),
        "admission_idle": summary_ms(idle) if idle else None,
        "admission_during_burst": summary_ms(burst) if burst else None,
        "webhook_direct_during_burst": summary_ms(direct) if direct else None,
        "bare_gpu_status_apply_during_burst": summary_ms(bare_writes) if bare_writes else None,
        "bare_write_errors": writes_probe.errors,
        "admission_errors": probe.errors,
        "webhook_direct_errors": probe.direct_errors,
        "pods_created_s": round(created, 2),
        "allocations_span_s": round(last_allocation - min(watch.allocated.values()), 2),
        "all_status_written_s": round(all_written - started, 2),
        "ledger_current_after_last_allocation_s": round(ledger_at - last_allocation, 2),
        "controller_cpu_ms_per_claim": round(cpu * 1000 / claims, 2),
        "claim_status_writes": int(writes),
        "controller_rss_mib_idle": idle_rss.get("VmRSS"),
        "controller_rss_mib_after_burst": burst_rss.get("VmRSS"),
        "controller_rss_mib_peak": burst_rss.get("VmHWM"),
        "controller_gc_frozen_objects": int(frozen_objects),
        "burst_breakdown": breakdown(before, after),
    }


def _gpus(api: client.ApiClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api).list_cluster_custom_object(
        API_GROUP, GPU_VERSION, GPU_PLURAL
    )["items"]
    return items


SUMMARIES = (
    "allocation_to_status_written",
    "admission_idle",
    "admission_during_burst",
    "webhook_direct_during_burst",
    "bare_gpu_status_apply_during_burst",
    "burst_breakdown",
)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark once and print its figures."""
    parser = argparse.ArgumentParser(
        prog="python -m e2e.bench.controller_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=10, help=f"fake nodes with {GPUS_PER_NODE} GPUs of 80Gi each")
    parser.add_argument(
        "--cluster-scale",
        action="store_true",
        help=f"{CLUSTER_SCALE[0]} claims on {CLUSTER_SCALE[1]} nodes (overrides --claims and --nodes)",
    )
    parser.add_argument("--memory", default="10Gi", help="memory request of each claim")
    parser.add_argument(
        "--component-qps", type=int, default=500, help="--kube-api-qps of the scheduler and controller-manager"
    )
    parser.add_argument("--admission-rate", type=float, default=10.0, help="admission probes per second")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument(
        "--controller-arg", action="append", default=[], help="extra controller flag (repeatable), e.g. --workers=8"
    )
    args = parser.parse_args(argv)
    claims, nodes = CLUSTER_SCALE if args.cluster_scale else (args.claims, args.nodes)
    with tempfile.TemporaryDirectory(prefix="fracgpu-ctlbench-", dir="/tmp") as tmp:
        result = run(
            claims,
            nodes,
            args.memory,
            Path(tmp),
            controller_args=tuple(args.controller_arg),
            component_qps=args.component_qps,
            admission_rate=args.admission_rate,
        )
    rows = {
        "allocation -> status written": result["allocation_to_status_written"],
        "admission, idle": result["admission_idle"],
        "admission, during the burst": result["admission_during_burst"],
        "webhook straight, during the burst": result["webhook_direct_during_burst"],
        "bare client GPU status apply, burst": result["bare_gpu_status_apply_during_burst"],
    }
    print(table({k: v for k, v in rows.items() if v}))
    print("\nduring the burst (estimated from histogram buckets):")
    width = max((len(k) for k in result["burst_breakdown"]), default=0) + 2
    for row, summary in result["burst_breakdown"].items():
        print(row.ljust(width) + "".join(f"{k}={v}".rjust(14) for k, v in summary.items()))
    for key, value in result.items():
        if key not in SUMMARIES:
            print(f"{key:40} {value}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
