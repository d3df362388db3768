"""Benchmark of the node plugin: NodePrepareResources latency over its socket against a real apiserver,
and the plugin's RSS across many prepare/unprepare cycles.

    python -m e2e.bench.plugin_bench [--cycles 1000] [--out build/bench/plugin.json]

Starts its own control plane (etcd, apiserver, controller-manager, scheduler) and one plugin process per entry
of CONFIGS, each on its own fake Node with 8 simulated H100s: ``--driver-edits=none``; ``--driver-edits=toolkit``
on a faithful fake driver root (the real nvidia-ctk generates its edits once, at start; every claim spec then
carries them); the same with the usage sampler on every second; ``mps``: every GPU an MPS GPU, the MPS supervisor
running the mock driver's daemons, so each prepare and unprepare also sets the GPU's ceiling through the control
client (the supervisor's idle CPU and RSS are reported; the mock daemons' RSS is not the real daemon's); ``mig``:
every GPU a MIG GPU with MIG mode on, each claim (of the MIG DeviceClass) served by a 1g.10gb partition which
each prepare creates and each unprepare destroys through NVML (the mock driver's: it keeps its instances in a
state file, so what is measured is the plugin's work, not a real driver's instance creation); and
``go-reference``, a minimal Go plugin on the
upstream kubeletplugin helper library (e2e/bench/goref: per claim a GET, a CDI spec file and a checkpoint write),
on a node whose slices the bench publishes as ours would. Claims are allocated by the real scheduler; the plugins
are called like the kubelet does, alternating between them cycle by cycle. Reports medians and percentiles, CPU
time per call (utime+stime of the plugin process over the cycles), RSS, and each fracgpu configuration's ratios
to the Go reference, of this one run; asserts nothing.

    python -m e2e.bench.plugin_bench --throttled [--configs none,go-reference] [--out build/bench/plugin-throttled.json]

The throttled run (`e2e.bench.throttle`): both plugins talk to the API server as one service account in a
priority level of one seat that rejects (429) what it cannot seat, flooded by that account's LISTs from the
bench while the kubelet's calls run (the storm outlasts every call); per plugin, `THROTTLED_PREPARES` single-claim
prepares at once (as for that many pods starting), each given the kubelet's 45 s. Reports per plugin how many
succeeded, their latency percentiles, and whether each failure said it was throttled.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from api.kube_config import from_kubeconfig
from api.kube_rest import KubeConnection, KubeRest
from api.names import MIG_DEVICE_CLASS_NAME
from e2e.bench import goref_plugin, throttle
from e2e.bench.stats import summary_ms, table
from harness import apf, kube, mocknvml
from harness.cluster import binaries
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KubeletClient
from harness.mocknvml.driver_root import install_driver
from harness.nodeplugin import DRIVER, NodePluginProcess
from kubelet_plugin.state import mps_files as mps


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of `pid` in MiB: all of it (``VmRSS``), or its anonymous memory (``RssAnon``: heap,
    stacks, the interpreter's objects) or its file pages (``RssFile``: mapped binaries and libraries, resident
    as far as the page cache holds them, so they vary with what else ran)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} for {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time `pid` has used so far, in seconds (/proc/<pid>/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _refs(claims: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]


REPO = Path(__file__).resolve().parents[2]


def precompile() -> None:
    """Write the bytecode the plugin runs at both optimisation levels (0, and 2 for the plugin's
    PYTHONOPTIMIZE=2), as the image holds it: a plugin compiling its ~500 modules from source at start keeps
    about 7 MiB more, and whether it can write them back depends on PYTHONDONTWRITEBYTECODE."""
    paths = {
        sysconfig.get_path("purelib"),
        sysconfig.get_path("platlib"),
        *(str(REPO / p) for p in ("api", "kubelet_plugin")),
    }
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-o", "0", "-o", "2", *sorted(paths)], check=True)


def _timed(call: Callable[[list[tuple[str, str, str]]], Any], refs: list[tuple[str, str, str]]) -> float:
    """Seconds `call(refs)` took; RuntimeError when the plugin answered an error for any claim."""
    start = time.perf_counter()
    response = call(refs)
    elapsed = time.perf_counter() - start
    errors = [r.error for r in response.claims.values() if r.error]
    if errors:
        raise RuntimeError(f"plugin answered errors: {errors[:3]}")
    return elapsed


GO_REFERENCE = "go-reference"

CONFIGS: dict[str, list[str]] = {
    "none": ["--driver-edits=none"],  # the plugin flags' defaults
    "toolkit": ["--driver-edits=toolkit"],  # claim specs carry the driver, as with the chart's defaults
    "toolkit-usage": ["--driver-edits=toolkit", "--usage-interval=1"],  # and the usage sampler, every second
    "mps": ["--driver-edits=none", "--mps-gpus=all"],  # every share an MPS client: the ceiling set per prepare
    "mig": ["--driver-edits=none", "--mig-gpus=all"],  # every claim a MIG partition, made and destroyed per call
    GO_REFERENCE: [],  # not fracgpu: the Go reference plugin of e2e/bench/goref
}
"""The plugin configurations measured side by side, by name: fracgpu's plugin flags, or the Go reference."""


@dataclass
class Started:
    """A running plugin under test: its process, its kubelet-side client, its 33 allocated claims."""

    pid: int
    stop: Callable[[], None]
    kubelet: KubeletClient
    claims: list[dict[str, Any]]
    supervisor: int | None = None
    """The MPS supervisor's pid (config mps)."""


def _start_go_reference(api: client.ApiClient, dyn: DynamicClient, workdir: Path, kubeconfig: Path) -> Started:
    """The Go reference plugin on its own fake node whose 8 H100s' slices the bench publishes; 33 claims there."""
    node = f"bench-{GO_REFERENCE}"
    node_object = kube.create_fake_node(api, node)
    kube.publish_gpus(dyn, node_object, DRIVER, kube.simulated_gpus(node, 8))
    plugin = goref_plugin.GoRefProcess(workdir / GO_REFERENCE, node, kubeconfig, goref_plugin.build())
    kubelet = plugin.start()
    claims = kube.allocate_claims(api, dyn, NAMESPACE, node, device_class=DRIVER, memories=["1Gi"] * 33, timeout=120)
    return Started(plugin.pid, plugin.stop, kubelet, claims)


def _start_plugin(
    api: client.ApiClient,
    dyn: DynamicClient,
    plane: ControlPlane,
    workdir: Path,
    mode: str,
    *,
    kubeconfig: Path | None = None,
) -> Started:
    """A plugin on its own fake node with 8 simulated H100s, configured as CONFIGS[mode], talking to the API server
    with `kubeconfig` (default: the control plane's admin); 33 claims there."""
    kubeconfig = kubeconfig or plane.kubeconfig
    if mode == GO_REFERENCE:
        return _start_go_reference(api, dyn, workdir, kubeconfig)
    node = f"bench-{mode}"
    toolkit = "--driver-edits=toolkit" in CONFIGS[mode]
    kube.create_fake_node(api, node)
    profile = mocknvml.PROFILES / "h100x8.profile"
    flags = ["--log-level=warning", *CONFIGS[mode]]
    if toolkit:
        tools = binaries.ensure_built("nvidia-ctk", "nvidia-cdi-hook")
        flags += [f"--nvidia-ctk={tools['nvidia-ctk']}", f"--nvidia-cdi-hook-source={tools['nvidia-cdi-hook']}"]
    nvml = mocknvml.build(workdir / "nvml")
    device_class, env = DRIVER, {}
    if "--mig-gpus=all" in flags:
        profile, device_class = _mig_profile(profile, workdir / "mig.profile"), MIG_DEVICE_CLASS_NAME
        (workdir / "mig-state").mkdir(exist_ok=True)
        env = {"FRACGPU_MOCK_NVML_STATE_DIR": str(workdir / "mig-state")}
        flags.append(f"--mig-minors-file={workdir / mode / 'driver-root' / mocknvml.MIG_MINORS}")
    supervisor: subprocess.Popen[bytes] | None = None
    if "--mps-gpus=all" in flags:
        supervisor, root = _start_mps_supervisor(nvml, profile)
        flags += [f"--mps-root={root}", f"--mps-control={nvml / 'nvidia-cuda-mps-control'}"]
    plugin = NodePluginProcess(workdir / mode, node, kubeconfig, profile, nvml, *flags, env=env)
    if toolkit:
        install_driver(plugin.driver_root, profile, workdir / "driver-build")
    kubelet = plugin.start()
    kube.wait_for(
        lambda: client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}").items, 30
    )
    claims = kube.allocate_claims(
        api, dyn, NAMESPACE, node, device_class=device_class, memories=["1Gi"] * 33, timeout=120
    )
    if supervisor is None:
        return Started(plugin.procs.procs["plugin"].pid, plugin.stop, kubelet, claims)

    def stop_both() -> None:
        plugin.stop()
        assert supervisor is not None
        supervisor.terminate()
        supervisor.wait(timeout=30)

    return Started(plugin.procs.procs["plugin"].pid, stop_both, kubelet, claims, supervisor.pid)


def _mig_profile(profile: Path, out: Path) -> Path:
    """`profile` with every GPU's MIG mode on (written to `out`)."""
    minors = [k.removesuffix(".minor") for k in mocknvml.read_profile(profile) if k.endswith(".minor")]
    out.write_text(profile.read_text() + "".join(f"\n{gpu}.mig_mode = enabled" for gpu in minors) + "\n")
    return out


def _start_mps_supervisor(nvml: Path, profile: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The MPS supervisor for every GPU of `profile`, running the mock driver's daemons (their sockets under a
    short /tmp directory: a socket path has at most 107 bytes); returns it and its MPS root once all run."""
    root = Path(tempfile.mkdtemp(prefix="fgb-", dir="/tmp")) / "m"
    (root / "state").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRACGPU_", "CUDA_"))} | {
        "LD_LIBRARY_PATH": str(nvml), "FRACGPU_MOCK_NVML_PROFILE": str(profile),
        "FRACGPU_MOCK_NVML_STATE_DIR": str(root / "state"), "FRACGPU_MPS_GPUS": "all", "FRACGPU_MPS_ROOT": str(root),
        "FRACGPU_MPS_CONTROL": str(nvml / "nvidia-cuda-mps-control"), "FRACGPU_METRICS_PORT": "0",
        "FRACGPU_LOG_LEVEL": "warning",
    }  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "kubelet_plugin.mps_supervisor"], env=env)
    uuids = [v for k, v in mocknvml.read_profile(profile).items() if k.endswith(".uuid")]
    kube.wait_for(lambda: all(mps.read_status(root, u)[1] is None for u in uuids), 60)
    return proc, root


def mps_processes(supervisor: int) -> dict[str, float]:
    """RSS (MiB) of the supervisor and of its daemons (the mock driver's: not the real daemon's footprint)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    daemons = [rss_mib(int(pid)) for pid in children]
    return {
        "supervisor_rss_mib": rss_mib(supervisor),
        "daemons": len(daemons),
        "mock_daemon_rss_mib_each": round(sum(daemons) / max(1, len(daemons)), 2),
    }


NAMESPACE = "bench"


def ratios(part: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """`part`'s latency percentiles, CPU per call and last RSS divided by `reference`'s (>1: `part` costs more)."""

    def ratio(a: float, b: float) -> float:
        return round(a / b, 2) if b else float("inf")

    out = {
        f"{row} {p}": ratio(part["latency"][row][f"{p}_ms"], reference["latency"][row][f"{p}_ms"])
        for row in part["latency"]
        for p in ("p50", "p90", "p99")
    }
    out |= {f"cpu {key}": ratio(value, reference["cpu"][key]) for key, value in part["cpu"].items()}
    last = max(part["rss"], key=lambda k: int(k.split("_")[1]))
    out["rss"] = ratio(part["rss"][last], reference["rss"][last])
    return out


def _prepare_cluster(plane: ControlPlane) -> tuple[client.ApiClient, DynamicClient]:
    """The bench's DeviceClasses and namespace on a started control plane; its admin clients."""
    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    dyn = DynamicClient(api)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    kube.ensure_device_class(  # as the chart's (charts/fracgpu/templates/deviceclass.yaml)
        dyn, MIG_DEVICE_CLASS_NAME, DRIVER,
        f'"type" in device.attributes["{DRIVER}"] && device.attributes["{DRIVER}"].type == "mig"',
    )  # fmt: skip
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
    kube.wait_for(
        lambda: kube.exists(lambda: client.CoreV1Api(api).read_namespaced_service_account("default", NAMESPACE)),
        30,
    )
    return api, dyn


def run(cycles: int, workdir: Path, configs: list[str]) -> dict[str, Any]:
    """Run every measurement, every configuration interleaved cycle by cycle; return the report."""
    precompile()
    plane = ControlPlane(workdir / "cp")
    plane.start()
    try:
        api, dyn = _prepare_cluster(plane)
        started = {mode: _start_plugin(api, dyn, plane, workdir, mode) for mode in configs}
        samples: dict[str, dict[str, list[float]]] = {
            mode: {"prepare 1 claim": [], "unprepare 1 claim": [], "prepare 32 claims": [], "unprepare 32 claims": []}
            for mode in configs
        }
        first: dict[str, float] = {}
        rss: dict[str, dict[str, float]] = {mode: {} for mode in configs}
        rss_split: dict[str, dict[str, float]] = {mode: {} for mode in configs}  # after the last cycle
        cpu: dict[str, dict[str, float]] = {mode: {} for mode in configs}
        for mode, plugin in started.items():
            first[mode] = _timed(plugin.kubelet.prepare, _refs(plugin.claims[:1]))  # fracgpu: incl. Ready write
            plugin.kubelet.unprepare(_refs(plugin.claims[:1]))
        cpu_before = {mode: cpu_seconds(plugin.pid) for mode, plugin in started.items()}
        supervisor_before = {m: cpu_seconds(p.supervisor) for m, p in started.items() if p.supervisor is not None}
        mps_figures: dict[str, dict[str, float]] = {}
        cycles_started = time.monotonic()
        for i in range(cycles):
            for mode, plugin in started.items():
                single = _refs(plugin.claims[:1])
                samples[mode]["prepare 1 claim"].append(_timed(plugin.kubelet.prepare, single))
                samples[mode]["unprepare 1 claim"].append(_timed(plugin.kubelet.unprepare, single))
                if i + 1 == 50 or (i + 1) % max(1, cycles // 5) == 0:
                    rss[mode][f"after_{i + 1}_cycles_mib"] = rss_mib(plugin.pid)
                if i + 1 == cycles:
                    rss_split[mode] = {f"{f}_mib": rss_mib(plugin.pid, f) for f in ("RssAnon", "RssFile")}
        cycles_took = time.monotonic() - cycles_started
        for mode, plugin in started.items():
            spent = cpu_seconds(plugin.pid) - cpu_before[mode]
            cpu[mode]["per_1_claim_call_ms"] = round(spent / (2 * cycles) * 1000, 3)
            cpu_before[mode] = cpu_seconds(plugin.pid)
            if plugin.supervisor is not None:
                supervisor_cpu = cpu_seconds(plugin.supervisor) - supervisor_before[mode]
                mps_figures[mode] = mps_processes(plugin.supervisor) | {
                    "supervisor_cpu_ms_per_s": round(supervisor_cpu / cycles_took * 1000, 3)
                }
        batches = 30
        for _ in range(batches):
            for mode, plugin in started.items():
                batch = _refs(plugin.claims[1:])
                samples[mode]["prepare 32 claims"].append(_timed(plugin.kubelet.prepare, batch))
                samples[mode]["unprepare 32 claims"].append(_timed(plugin.kubelet.unprepare, batch))
        for mode, plugin in started.items():
            spent = cpu_seconds(plugin.pid) - cpu_before[mode]
            cpu[mode]["per_32_claim_call_ms"] = round(spent / (2 * batches) * 1000, 3)
            plugin.kubelet.close()
            plugin.stop()
        parts = {
            mode: {
                "latency": {name: summary_ms(values) for name, values in samples[mode].items()},
                "first_prepare_ms": round(first[mode] * 1000, 2),
                "cpu": cpu[mode],
                "rss": rss[mode],
                "rss_after_the_cycles": rss_split[mode],
                **({"mps": mps_figures[mode]} if mode in mps_figures else {}),
            }
            for mode in configs
        }
        report: dict[str, Any] = {"configs": parts, "cycles": cycles}
        if GO_REFERENCE in parts:
            report["ratios_to_go_reference"] = {
                mode: ratios(part, parts[GO_REFERENCE]) for mode, part in parts.items() if mode != GO_REFERENCE
            }
        return report
    finally:
        plane.stop()


THROTTLED_OUT = Path("build/bench/plugin-throttled.json")
THROTTLED_PREPARES = 8
"""Single-claim prepares sent to each plugin at once during the storm (as for 8 pods starting on a node)."""
THROTTLED_CONFIGS = ["none", GO_REFERENCE]
STORM_ACCOUNT = "bench-storm"


def _storm_kubeconfig(api: client.ApiClient, plane: ControlPlane, workdir: Path) -> Path:
    """A service account with every right (the plugins' and the flood's), every request of which a one-seat
    Reject priority level takes; its kubeconfig."""
    kubeconfig = kube.service_account_kubeconfig(
        api,
        server=plane.server,
        ca_cert=plane.ca_cert,
        namespace=NAMESPACE,
        name=STORM_ACCOUNT,
        rules=[{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        path=workdir / "storm.kubeconfig",
    )
    apf.create_apf_reject(KubeRest(KubeConnection.of(api)), STORM_ACCOUNT, NAMESPACE, STORM_ACCOUNT)
    return kubeconfig


def _call(kubelet: KubeletClient, refs: list[tuple[str, str, str]]) -> throttle.Outcome:
    """One kubelet prepare call (the kubelet's 45 s deadline); its outcome, a failed call's gRPC status as its
    error."""
    start = time.perf_counter()
    try:
        response = kubelet.prepare(refs)
    except grpc.RpcError as err:
        return throttle.Outcome(time.perf_counter() - start, f"the kubelet's call failed: {err.code().name}")
    errors = [r.error for r in response.claims.values() if r.error]
    return throttle.Outcome(time.perf_counter() - start, "; ".join(errors))


def run_throttled(workdir: Path, configs: list[str], prepares: int = THROTTLED_PREPARES) -> dict[str, Any]:
    """The throttled run (module doc): every plugin of `configs` under one APF storm, `prepares` single-claim
    prepares each at once; the report (`throttle.throttled_report`)."""
    precompile()
    plane = ControlPlane(workdir / "cp")
    plane.start()
    try:
        api, dyn = _prepare_cluster(plane)
        core = client.CoreV1Api(api)
        for i in range(throttle.FLOOD_CONFIGMAPS):
            core.create_namespaced_config_map(
                NAMESPACE, {"metadata": {"name": f"bulk-{i}"}, "data": {"b": "x" * 16384}}
            )
        kubeconfig = _storm_kubeconfig(api, plane, workdir)
        started = {mode: _start_plugin(api, dyn, plane, workdir, mode, kubeconfig=kubeconfig) for mode in configs}
        for plugin in started.values():  # before the storm: each plugin works
            _timed(plugin.kubelet.prepare, _refs(plugin.claims[:1]))
            plugin.kubelet.unprepare(_refs(plugin.claims[:1]))
        flood = throttle.Flood(
            KubeRest(KubeConnection(from_kubeconfig([kubeconfig])), timeout=10, budget=0),
            f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        )
        flood.start()
        try:
            kube.wait_for(lambda: flood.rejected > 0, 30, what="the flood answered 429")
            with ThreadPoolExecutor(max_workers=prepares * len(started)) as pool:
                futures = {
                    mode: [pool.submit(_call, plugin.kubelet, _refs([claim])) for claim in plugin.claims[:prepares]]
                    for mode, plugin in started.items()
                }
                outcomes = {mode: [f.result() for f in calls] for mode, calls in futures.items()}
        finally:
            counts = flood.stop()
        for plugin in started.values():
            plugin.kubelet.unprepare(_refs(plugin.claims[:prepares]))
            plugin.kubelet.close()
            plugin.stop()
        return throttle.throttled_report(outcomes, counts) | {"prepares_per_plugin": prepares}
    finally:
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("build/bench/plugin.json"))
    parser.add_argument(
        "--configs",
        default=None,
        help=f"comma-separated subset of {', '.join(CONFIGS)} (default: all; with --throttled: "
        f"{','.join(THROTTLED_CONFIGS)})",
    )
    parser.add_argument(
        "--throttled",
        action="store_true",
        help="the throttled run instead: the plugins under one API Priority and Fairness storm (module doc)",
    )
    parser.add_argument(
        "--prepares", type=int, default=THROTTLED_PREPARES, help="with --throttled: prepares per plugin"
    )
    args = parser.parse_args()
    configs = (args.configs or ",".join(THROTTLED_CONFIGS if args.throttled else CONFIGS)).split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    if args.throttled and args.out == parser.get_default("out"):
        args.out = THROTTLED_OUT
    workdir = Path(tempfile.mkdtemp(prefix="fgb-", dir="/tmp"))  # short: the plugin's unix sockets live here
    try:
        report = (
            run_throttled(workdir, configs, args.prepares) if args.throttled else run(args.cycles, workdir, configs)
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.throttled:
        print(throttle.describe(report))
        print(f"report: {args.out}")
        return
    for mode, part in report["configs"].items():
        what = "Go reference plugin (kubeletplugin helper)" if mode == GO_REFERENCE else " ".join(CONFIGS[mode])
        print(f"node plugin, {what}, NodePrepareResources over the socket, real kube-apiserver:")
        print(table(part["latency"]))
        print(f"first prepare: {part['first_prepare_ms']} ms")
        print("plugin CPU: " + ", ".join(f"{k.removesuffix('_ms')}={v} ms" for k, v in part["cpu"].items()))
        print("plugin RSS: " + ", ".join(f"{k.removesuffix('_mib')}={v} MiB" for k, v in part["rss"].items()))
        print(
            "  of which: "
            + ", ".join(f"{k.removesuffix('_mib')}={v} MiB" for k, v in part["rss_after_the_cycles"].items())
        )
        if "mps" in part:
            print("MPS supervisor (mock daemons): " + ", ".join(f"{k}={v}" for k, v in part["mps"].items()))
    for mode, values in report.get("ratios_to_go_reference", {}).items():
        print(f"fracgpu {' '.join(CONFIGS[mode])} / Go reference:")
        print("  " + ", ".join(f"{k}={v}" for k, v in values.items()))
    print(f"report: {args.out}")


if __name__ == "__main__":
    main()
