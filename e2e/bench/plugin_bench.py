"""Benchmark of the node plugin: NodePrepareResources latency over its socket against a real apiserver,
and the plugin's RSS across many prepare/unprepare cycles.

    python -m e2e.bench.plugin_bench [--cycles 1000] [--out build/bench/plugin.json]

Starts its own control plane (etcd, apiserver, controller-manager, scheduler), a fake Node with 8 simulated
H100s, the plugin as a process, and claims allocated by the real scheduler; then calls the plugin like the
kubelet does. Reports medians and percentiles of this one run; asserts nothing.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from e2e import mocknvml
from e2e.bench.stats import summary_ms, table
from e2e.cluster.controlplane import ControlPlane
from e2e.kubelet_client import KubeletClient
from e2e.nodeplugin import DRIVER, NodePluginProcess
from tests.integration import kube


def rss_mib(pid: int) -> float:
    """Resident set size of `pid` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def _refs(claims: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]


def _timed(call: Any) -> float:
    start = time.perf_counter()
    response = call()
    elapsed = time.perf_counter() - start
    errors = [r.error for r in response.claims.values() if r.error]
    if errors:
        raise RuntimeError(f"plugin answered errors: {errors[:3]}")
    return elapsed


def run(cycles: int, workdir: Path) -> dict[str, Any]:
    """Run every measurement; return the report."""
    plane = ControlPlane(workdir / "cp")
    plane.start()
    try:
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        dyn = DynamicClient(api)
        node = "bench-node"
        kube.create_fake_node(api, node)
        kube.ensure_device_class(dyn, DRIVER, DRIVER)
        namespace = "bench"
        client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        kube.wait_for(
            lambda: kube.exists(lambda: client.CoreV1Api(api).read_namespaced_service_account("default", namespace)),
            30,
        )
        profile = mocknvml.PROFILES / "h100x8.profile"
        plugin = NodePluginProcess(
            workdir / "np", node, plane.kubeconfig, profile, mocknvml.build(workdir / "nvml"), "--log-level=warning"
        )
        kubelet: KubeletClient = plugin.start()
        kube.wait_for(
            lambda: client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}").items, 30
        )
        claims = kube.allocate_claims(
            api, dyn, namespace, node, device_class=DRIVER, memories=["1Gi"] * 33, timeout=120
        )
        single, batch = claims[:1], claims[1:]
        pid = plugin.procs.procs["plugin"].pid

        first = _timed(lambda: kubelet.prepare(_refs(single)))  # includes the Ready status write
        kubelet.unprepare(_refs(single))
        prepare_1: list[float] = []
        unprepare_1: list[float] = []
        rss: dict[str, float] = {}
        for i in range(cycles):
            prepare_1.append(_timed(lambda: kubelet.prepare(_refs(single))))
            unprepare_1.append(_timed(lambda: kubelet.unprepare(_refs(single))))
            if i + 1 == 50 or (i + 1) % max(1, cycles // 5) == 0:
                rss[f"after_{i + 1}_cycles_mib"] = rss_mib(pid)
        prepare_32: list[float] = []
        unprepare_32: list[float] = []
        for _ in range(30):
            prepare_32.append(_timed(lambda: kubelet.prepare(_refs(batch))))
            unprepare_32.append(_timed(lambda: kubelet.unprepare(_refs(batch))))
        kubelet.close()
        plugin.stop()
        return {
            "latency": {
                "prepare 1 claim": summary_ms(prepare_1),
                "unprepare 1 claim": summary_ms(unprepare_1),
                "prepare 32 claims": summary_ms(prepare_32),
                "unprepare 32 claims": summary_ms(unprepare_32),
            },
            "first_prepare_with_status_write_ms": round(first * 1000, 2),
            "rss": rss,
            "cycles": cycles,
        }
    finally:
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("build/bench/plugin.json"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="fgb-", dir="/tmp"))  # short: the plugin's unix sockets live here
    try:
        report = run(args.cycles, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("node plugin, NodePrepareResources over the socket, real kube-apiserver:")
    print(table(report["latency"]))
    print(f"first prepare (incl. Ready status write): {report['first_prepare_with_status_write_ms']} ms")
    print("plugin RSS: " + ", ".join(f"{k.removesuffix('_mib')}={v} MiB" for k, v in report["rss"].items()))
    print(f"report: {args.out}")


if __name__ == "__main__":
    main()
