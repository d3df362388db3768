"""Benchmark of kube-scheduler throughput on our ResourceSlices against exclusive whole-GPU slices.

    python -m e2e.bench.scheduler_bench [--nodes 10] [--gpus 8] [--rounds 2]
        [--variants fracgpu,exclusive] [--profile-dir DIR] [--out build/bench/scheduler.json]

Starts its own control plane (etcd, apiserver, controller-manager, and the scheduler restarted with a config
allowing `--scheduler-qps` requests/s so that client-side rate limits do not cap it), fake Nodes with `--gpus`
simulated 80Gi GPUs each, and no kubelet: pods stay bound and never run. Per round, for one variant, it
publishes that variant's slices on every node (derived from the node plugin's `build_slices`), creates one
ResourceClaim per GPU (no template, so the controller-manager is not on the path) and then one unpinned pod
per claim as fast as it can, and records when each pod's `spec.nodeName` appears. Rounds alternate the
variants (A,B,A,B, a fresh namespace each); between rounds the pods and claims are deleted and the slices
replaced. A variant is a shape name, optionally `+N`: N claims per GPU of that shape allocated before the
measured burst (so the scheduler already tracks N times the GPU count in shares). Reports, per variant, pods/s, latency from
pod creation to binding, the scheduler's CPU per pod and its own metrics (attempt duration and the
DynamicResources plugin per extension point, which the scheduler samples); asserts nothing.
"""

import argparse
import json
import os
import signal
import ssl
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import to_bytes
from e2e.bench import scheduler_figures as figures
from harness import kube
from harness.cluster.controlplane import ControlPlane, free_port
from kubelet_plugin.publishing.slices import MAX_DEVICES_PER_SLICE, build_slices, slice_name

MiB = 1 << 20
STEP = 256 * MiB
SHARE = "10Gi"
GPU_GIB = 80  # each simulated GPU's memory
METRICS = (
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_plugin_execution_duration_seconds",
    "scheduler_schedule_attempts",
)

Device = dict[str, Any]


def _exclusive(device: Device) -> Device:
    """One allocation per device, no consumable capacity."""
    return {k: v for k, v in device.items() if k not in ("capacity", "allowMultipleAllocations")}


def _uuid_only(device: Device) -> Device:
    return {**device, "attributes": {"uuid": device["attributes"]["uuid"]}}


def _no_policy(device: Device) -> Device:
    capacity = {name: {"value": c["value"]} for name, c in device["capacity"].items()}
    return {**device, "capacity": capacity}


def _no_capacity(device: Device) -> Device:
    return {k: v for k, v in device.items() if k != "capacity"}


@dataclass(frozen=True)
class Shape:
    """How a GPU is published (a change of the plugin's device entry) and what each claim asks for."""

    description: str
    device: Callable[[Device], Device]
    memory: str | None  # the claim's capacity request; None: the whole device
    per_slice: int = MAX_DEVICES_PER_SLICE
    shared: bool = True  # several claims may share one device

    def slices(self, node: dict[str, Any], gpus: list[Any]) -> list[dict[str, Any]]:
        """This shape's slices for `node`: the node plugin's entries, changed by `device`, `per_slice` each."""
        name, uid = node["metadata"]["name"], node["metadata"]["uid"]
        built = build_slices(name, uid, DRIVER_NAME, gpus, step=STEP, reserve=0, generation=1)
        devices = [self.device(d) for s in built for d in s["spec"]["devices"]]
        chunks = [devices[i : i + self.per_slice] for i in range(0, len(devices), self.per_slice)]
        template = built[0]
        return [
            {
                **template,
                "metadata": {**template["metadata"], "name": slice_name(name, DRIVER_NAME, i)},
                "spec": {
                    **template["spec"],
                    "pool": {**template["spec"]["pool"], "resourceSliceCount": len(chunks)},
                    "devices": chunk,
                },
            }
            for i, chunk in enumerate(chunks)
        ]


SHAPES: dict[str, Shape] = {
    "fracgpu": Shape("our slices: memory as consumable capacity, shared, our attributes; 10Gi claims", dict, SHARE),
    "exclusive": Shape(
        "one device per GPU, our attributes, no capacity; whole-GPU claims", _exclusive, None, shared=False
    ),
    "fracgpu-uuid": Shape("ours with only the uuid attribute", _uuid_only, SHARE),
    "exclusive-uuid": Shape(
        "exclusive with only the uuid attribute", lambda d: _uuid_only(_exclusive(d)), None, shared=False
    ),
    "fracgpu-no-policy": Shape("ours, capacity without requestPolicy", _no_policy, SHARE),
    "fracgpu-slice-per-gpu": Shape("ours, one slice per GPU", dict, SHARE, per_slice=1),
    "exclusive-slice-per-gpu": Shape("exclusive, one slice per GPU", _exclusive, None, per_slice=1, shared=False),
    "shared-no-capacity": Shape("allowMultipleAllocations without capacity; whole-device claims", _no_capacity, None),
}


@dataclass(frozen=True)
class Variant:
    """A shape and how many claims per GPU are allocated before the measured burst."""

    shape: str
    preallocated: int = 0

    @property
    def name(self) -> str:
        return f"{self.shape}+{self.preallocated}" if self.preallocated else self.shape


def parse_variant(text: str) -> Variant:
    """`shape` or `shape+N`; ValueError naming the shapes when unknown, or when N claims per GPU and the
    burst's one would not fit a GPU (an exclusive device takes one claim)."""
    shape, _, count = text.partition("+")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if count and not count.isdigit():
        raise ValueError(f"{text!r}: after '+' give the number of claims per GPU allocated before the burst")
    pre = int(count or 0)
    if pre and not SHAPES[shape].shared:
        raise ValueError(f"{text!r}: devices of shape {shape} take one claim each; nothing can be preallocated")
    memory = SHAPES[shape].memory
    fits = GPU_GIB * (1 << 30) // to_bytes(memory) if memory else None
    if fits is not None and pre + 1 > fits:
        raise ValueError(f"{text!r}: a {GPU_GIB}Gi GPU holds {fits} claims of {memory}; preallocate at most {fits - 1}")
    return Variant(shape, pre)


class PodWatch:
    """Watches the pods of a namespace and records when each one's `spec.nodeName` is first seen."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        version = core.list_namespaced_pod(self.namespace).metadata.resource_version
        while not self._stop.is_set():
            response = core.list_namespaced_pod(
                self.namespace,
                watch=True,
                resource_version=version,
                timeout_seconds=60,
                _preload_content=False,
                _request_timeout=(5, 90),
            )
            self._ready.set()
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        obj = json.loads(line).get("object") or {}
                        if (obj.get("spec") or {}).get("nodeName"):
                            self.bound.setdefault(obj["metadata"]["name"], time.monotonic())
                        version = obj.get("metadata", {}).get("resourceVersion") or version
                if self._stop.is_set():
                    break
            response.release_conn()


class Scheduler:
    """The plane's kube-scheduler replaced by one with a config file (client QPS), reachable for /metrics
    and /debug/pprof with the admin certificate."""

    def __init__(self, plane: ControlPlane, qps: int) -> None:
        self.plane = plane
        old = plane.procs.procs["kube-scheduler"].args
        assert isinstance(old, list)
        keep = [a for a in old[1:] if not a.startswith(("--kubeconfig=", "--leader-elect", "--secure-port="))]
        self.port = free_port(plane.host)
        config_file = plane.state_dir / "kube-scheduler.config.yaml"
        config_file.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(plane.state_dir / "kube-scheduler.kubeconfig"),
                        "qps": qps,
                        "burst": qps,
                    },
                    "leaderElection": {"leaderElect": False},
                    "enableProfiling": True,
                }
            )
        )
        plane.procs.stop("kube-scheduler")
        plane.procs.start("kube-scheduler", [old[0], f"--config={config_file}", f"--secure-port={self.port}", *keep])
        self.context = ssl.create_default_context(cafile=str(plane.ca_cert))
        self.context.load_cert_chain(str(plane.pki_dir / "admin.crt"), str(plane.pki_dir / "admin.key"))
        kube.wait_for(self._healthy, 60, what="kube-scheduler with the bench config")

    @property
    def pid(self) -> int:
        return self.plane.procs.procs["kube-scheduler"].pid

    def get(self, path: str, timeout: float = 10) -> bytes:
        url = f"https://{self.plane.host}:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=timeout, context=self.context) as response:
            body: bytes = response.read()
            return body

    def _healthy(self) -> bool:
        self.plane.procs.check_alive("kube-scheduler")
        try:
            return self.get("/healthz", 2) == b"ok"
        except OSError:
            return False

    def metrics(self) -> figures.Samples:
        return figures.parse_samples(self.get("/metrics").decode(), METRICS)

    def cpu_s(self) -> float:
        """User plus system CPU seconds the scheduler has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    """One control plane with fake nodes; `round()` measures one variant."""

    def __init__(self, workdir: Path, nodes: int, gpus: int, qps: int) -> None:
        self.plane = ControlPlane(workdir / "cluster")
        self.plane.start()
        self.scheduler = Scheduler(self.plane, qps)
        self.api = config.new_client_from_config(config_file=str(self.plane.kubeconfig))
        self.api.configuration.connection_pool_maxsize = 16
        self.dyn = DynamicClient(self.api)
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        kube.ensure_device_class(self.dyn, DEVICE_CLASS_NAME, DRIVER_NAME)
        self.nodes = [kube.create_fake_node(self.api, f"sched-node-{i:03d}") for i in range(nodes)]
        self.gpus = {
            n["metadata"]["name"]: kube.simulated_gpus(n["metadata"]["name"], gpus, GPU_GIB) for n in self.nodes
        }
        self.gpu_count = nodes * gpus
        self.published: str | None = None
        self.rounds = 0

    def stop(self) -> None:
        self.plane.stop()

    def publish(self, shape_name: str) -> None:
        """Replace every node's slices by those of `shape_name`."""
        if self.published == shape_name:
            return
        self.resource.delete_collection_resource_slice()
        kube.wait_for(lambda: not self.resource.list_resource_slice().items, 60, what="slices deleted")
        shape = SHAPES[shape_name]
        bodies = [body for node in self.nodes for body in shape.slices(node, self.gpus[node["metadata"]["name"]])]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self.resource.create_resource_slice, bodies))
        self.published = shape_name
        time.sleep(1)  # the scheduler's informer sees them

    def round(
        self, variant: Variant, profile: Path | None, profile_seconds: int, queued: bool = False
    ) -> dict[str, Any]:
        """Publish, preallocate, then measure one burst of one pod per GPU; clean up; the figures. `queued`:
        the scheduler is stopped (SIGSTOP) while the pods are created and measured from its resume, so its
        own rate is measured rather than the rate at which this process creates pods."""
        shape = SHAPES[variant.shape]
        self.publish(variant.shape)
        self.rounds += 1
        namespace = f"r{self.rounds:02d}-{variant.name.replace('+', '-pre')}"
        self.core.create_namespace({"metadata": {"name": namespace}})
        kube.wait_for(lambda: kube.exists(lambda: self.core.read_namespaced_service_account("default", namespace)), 30)
        try:
            if variant.preallocated:
                count = variant.preallocated * self.gpu_count
                self._claims(namespace, "pre", count, shape.memory)
                watch = PodWatch(self.api, namespace)
                watch.start()
                self._pods(namespace, "pre", count)
                kube.wait_for(lambda: len(watch.bound) >= count, 600, 0.5, f"{count} preallocated pods bound")
                watch.stop()
            count = self.gpu_count
            self._claims(namespace, "p", count, shape.memory)
            watch = PodWatch(self.api, namespace)
            watch.start()
            before, cpu_before = self.scheduler.metrics(), self.scheduler.cpu_s()
            profiler = None if queued or not profile else self._profile(profile, profile_seconds)
            if queued:
                os.kill(self.scheduler.pid, signal.SIGSTOP)
                try:
                    created = self._pods(namespace, "p", count)
                    kube.wait_for(lambda: len(self.core.list_namespaced_pod(namespace).items) >= count, 60)
                finally:
                    resumed = time.monotonic()
                    os.kill(self.scheduler.pid, signal.SIGCONT)
                profiler = self._profile(profile, profile_seconds) if profile else None
                created = dict.fromkeys(created, resumed)  # latency: from the resume, the queue's drain
            else:
                created = self._pods(namespace, "p", count)
            kube.wait_for(lambda: len(watch.bound.keys() & created.keys()) >= count, 600, 0.2, f"{count} pods bound")
            cpu = self.scheduler.cpu_s() - cpu_before
            after = self.scheduler.metrics()
            watch.stop()
            if profiler:
                profiler.join()
            bound = {p: t for p, t in watch.bound.items() if p in created}
            result: dict[str, Any] = {
                "round": self.rounds,
                "variant": variant.name,
                **figures.burst_figures(created, bound),
            }
            result["latencies_s"] = [bound[p] - created[p] for p in bound]
            result["scheduler_cpu_ms_per_pod"] = round(cpu / count * 1000, 2)
            result["scheduler"] = _scheduler_figures(before, after)
            return result
        finally:
            self._clean(namespace)

    def _claims(self, namespace: str, prefix: str, count: int, memory: str | None) -> None:
        spec = kube.claim_template("x", DEVICE_CLASS_NAME, memory)["spec"]["spec"]

        def create(i: int) -> None:
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "spec": spec}
            body["metadata"] = {"name": f"{prefix}{i:05d}"}
            self.resource.create_namespaced_resource_claim(namespace, body)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(count)))

    def _pods(self, namespace: str, prefix: str, count: int) -> dict[str, float]:
        """Create `count` unpinned pods, each with its own claim; pod -> when its create call started."""
        created: dict[str, float] = {}

        def create(i: int) -> None:
            name = f"{prefix}{i:05d}"
            created[name] = time.monotonic()
            self.core.create_namespaced_pod(namespace, bench_pod(name, name))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(count)))
        return created

    def _profile(self, path: Path, seconds: int) -> threading.Thread:
        def fetch() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.scheduler.get(f"/debug/pprof/profile?seconds={seconds}", seconds + 30))

        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        return thread

    def _clean(self, namespace: str) -> None:
        """Delete the round's pods at once (no kubelet confirms), then its claims (dropping the scheduler's
        finalizer ourselves), and wait until none is left, so the next round finds every device free."""
        self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        kube.wait_for(lambda: not self.core.list_namespaced_pod(namespace).items, 120, 0.5, "pods deleted")
        self.resource.delete_collection_namespaced_resource_claim(namespace)

        def unfinalize(name: str) -> None:
            try:
                self.resource.patch_namespaced_resource_claim(name, namespace, {"metadata": {"finalizers": None}})
            except ApiException as err:
                if err.status != 404:
                    raise

        def gone() -> bool:
            left = [c.metadata.name for c in self.resource.list_namespaced_resource_claim(namespace).items]
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(unfinalize, left))
            return not left

        kube.wait_for(gone, 300, 0.5, "claims deleted")
        self.core.delete_namespace(namespace)
        time.sleep(1)  # the scheduler's informer sees the deletions


def bench_pod(name: str, claim: str) -> dict[str, Any]:
    """An unpinned pod (any node may take it) using the existing ResourceClaim `claim`; never started."""
    pod = kube.pod_with_claim(name, None, "-", {"gpu": claim})
    del pod["spec"]["nodeSelector"]
    return pod


def _scheduler_figures(before: figures.Samples, after: figures.Samples) -> dict[str, Any]:
    attempts = "scheduler_scheduling_attempt_duration_seconds"
    plugin = "scheduler_plugin_execution_duration_seconds"
    out: dict[str, Any] = {
        "attempt_mean_ms": figures.mean_ms(before, after, attempts, result="scheduled"),
        "attempts": {
            result: figures.delta(before, after, "scheduler_schedule_attempts_total", result=result)
            for result in ("scheduled", "unschedulable", "error")
        },
    }
    for point in ("PreFilter", "Filter", "Reserve", "PreBind", "Score", "PreScore"):
        out[f"dra_{point}_mean_ms"] = figures.mean_ms(
            before, after, plugin, plugin="DynamicResources", extension_point=point
        )
    return out


def summarize(rounds: list[dict[str, Any]], variants: list[Variant]) -> dict[str, Any]:
    """Per variant: pods/s of each round and their median, pooled latency, CPU per pod; ratios to the first."""
    from e2e.bench.stats import summary_ms

    out: dict[str, Any] = {}
    for variant in variants:
        mine = [r for r in rounds if r["variant"] == variant.name]
        out[variant.name] = {
            "description": SHAPES[variant.shape].description,
            "preallocated_per_gpu": variant.preallocated,
            "pods_per_s_rounds": [r["pods_per_s"] for r in mine],
            "pods_per_s": round(statistics.median(r["pods_per_s"] for r in mine), 2),
            "latency": summary_ms([x for r in mine for x in r["latencies_s"]]),
            "scheduler_cpu_ms_per_pod": round(statistics.median(r["scheduler_cpu_ms_per_pod"] for r in mine), 2),
        }
    base = out[variants[0].name]
    for figures_ in out.values():
        figures_["pods_per_s_vs_first"] = figures.ratio(figures_["pods_per_s"], base["pods_per_s"])
        figures_["cpu_per_pod_vs_first"] = figures.ratio(
            figures_["scheduler_cpu_ms_per_pod"], base["scheduler_cpu_ms_per_pod"]
        )
    return out


def render(summary: dict[str, Any]) -> str:
    """A text table of `summarize`'s result."""
    head = f"{'variant':28}{'pods/s':>9}{'rounds':>20}{'p50 ms':>9}{'p99 ms':>9}{'cpu ms/pod':>11}{'x first':>9}"
    lines = [head]
    for name, s in summary.items():
        lines.append(
            f"{name:28}{s['pods_per_s']:>9}{s['pods_per_s_rounds']!s:>20}{s['latency']['p50_ms']:>9}"
            f"{s['latency']['p99_ms']:>9}{s['scheduler_cpu_ms_per_pod']:>11}{s['pods_per_s_vs_first']:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the rounds once and print their figures."""
    parser = argparse.ArgumentParser(
        prog="python -m e2e.bench.scheduler_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=10, help="fake nodes")
    parser.add_argument("--gpus", type=int, default=8, help="simulated 80Gi GPUs per node (one pod per GPU a round)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each variant, alternated")
    parser.add_argument(
        "--variants",
        default="fracgpu,exclusive",
        help=f"comma-separated, ratios against the first; shapes: {', '.join(SHAPES)}; 'shape+N': N claims per "
        "GPU allocated before the burst",
    )
    parser.add_argument("--scheduler-qps", type=int, default=500, help="the scheduler's client QPS and burst")
    parser.add_argument(
        "--queued",
        action="store_true",
        help="create each burst while the scheduler is stopped and time it from its resume (the scheduler's own "
        "rate, not pod creation's); latency is then the drain of that queue",
    )
    parser.add_argument("--profile-dir", type=Path, help="write a CPU profile of the scheduler per round here")
    parser.add_argument("--profile-seconds", type=int, default=10)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    try:
        variants = [parse_variant(v.strip()) for v in args.variants.split(",") if v.strip()]
    except ValueError as err:
        parser.error(str(err))
    if not variants:
        parser.error("--variants names no variant")
    for flag in ("nodes", "gpus", "rounds", "scheduler_qps", "profile_seconds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fracgpu-schedbench-", dir="/tmp") as tmp:
        bench = Bench(Path(tmp), args.nodes, args.gpus, args.scheduler_qps)
        try:
            for _ in range(args.rounds):
                for variant in variants:
                    profile = (
                        args.profile_dir / f"r{bench.rounds + 1:02d}-{variant.name}.pprof" if args.profile_dir else None
                    )
                    result = bench.round(variant, profile, args.profile_seconds, args.queued)
                    print(
                        f"round {result['round']:2} {variant.name:28} {result['pods_per_s']:8} pods/s  "
                        f"p50 {result['latency']['p50_ms']} ms  p99 {result['latency']['p99_ms']} ms  "
                        f"cpu {result['scheduler_cpu_ms_per_pod']} ms/pod  {json.dumps(result['scheduler'])}",
                        flush=True,
                    )
                    rounds.append(result)
        finally:
            bench.stop()
    summary = summarize(rounds, variants)
    print(render(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "nodes": args.nodes,
            "gpus_per_node": args.gpus,
            "summary": summary,
            "rounds": [{k: v for k, v in r.items() if k != "latencies_s"} for r in rounds],
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
