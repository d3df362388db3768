"""Benchmark of the controller: time from allocation to status written for a burst of claims, and its RSS.

    python -m e2e.bench.controller_bench [--claims 500] [--nodes 10] [--out build/bench/controller.json]

Starts its own control plane (etcd, apiserver, controller-manager, scheduler), fake Nodes with 8 simulated
80Gi GPUs each (slices built by the node plugin's `build_slices`), and the controller as a process under its
RBAC; then creates one pod per claim (10Gi each, from a ResourceClaimTemplate) as fast as it can. A watch
on the claims timestamps when each allocation appears and when our `status.devices` data appears; the
difference is the latency reported. Reports medians and percentiles of this one run; asserts nothing.
"""

import argparse
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import GPU_CRD_NAME, GPU_PLURAL, GPU_VERSION
from api.names import API_GROUP, DEVICE_CLASS_NAME, DRIVER_NAME
from controller.rbac import cluster_role_rules
from e2e.bench.stats import summary_ms, table
from e2e.cluster.controlplane import ControlPlane
from tests.integration import kube

GPUS_PER_NODE = 8
NAMESPACE = "bench"


def rss_mib(pid: int) -> dict[str, float]:
    """Current and peak resident set size of `pid`, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


class ClaimWatch:
    """Watches the claims of a namespace and records, per claim, when allocation and our data first appear."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.allocated: dict[str, float] = {}
        self.written: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        resource = client.ResourceV1Api(self.api)
        version = resource.list_namespaced_resource_claim(self.namespace).metadata.resource_version
        while not self._stop.is_set():
            response = resource.list_namespaced_resource_claim(
                self.namespace,
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
                        version = self._observe(json.loads(line), time.monotonic()) or version
                if self._stop.is_set():
                    break
            response.release_conn()

    def _observe(self, event: dict[str, Any], now: float) -> str | None:
        obj = event.get("object") or {}
        name = (obj.get("metadata") or {}).get("name")
        if not name or event.get("type") not in ("ADDED", "MODIFIED"):
            return None
        status = obj.get("status") or {}
        results = [
            r
            for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            if r["driver"] == DRIVER_NAME
        ]
        if results:
            self.allocated.setdefault(name, now)
            written = {
                (d["pool"], d["device"], d.get("shareID") or "")
                for d in status.get("devices") or []
                if d["driver"] == DRIVER_NAME and d.get("data")
            }
            if all((r["pool"], r["device"], r.get("shareID") or "") in written for r in results):
                self.written.setdefault(name, now)
        return str(obj["metadata"]["resourceVersion"])


def ledger_shares(api: client.ApiClient) -> int:
    """Total shares over all GPU objects."""
    items = client.CustomObjectsApi(api).list_cluster_custom_object(API_GROUP, GPU_VERSION, GPU_PLURAL)["items"]
    return sum(((g.get("status") or {}).get("shares") or 0) for g in items)


def run(claims: int, nodes: int, memory: str, workdir: Path, controller_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """One benchmark run in a fresh control plane under `workdir`; the figures as a dict."""
    plane = ControlPlane(workdir / "cluster")
    plane.start()
    controller: kube.ControllerProcess | None = None
    try:
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        api.configuration.connection_pool_maxsize = 16
        dyn = DynamicClient(api)
        kube.apply_crd(api, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
        kube.ensure_device_class(dyn, DEVICE_CLASS_NAME, DRIVER_NAME)
        node_names = []
        for i in range(nodes):
            node = kube.create_fake_node(api, f"bench-node-{i:02d}")
            kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], GPUS_PER_NODE))
            node_names.append(node["metadata"]["name"])
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
        controller = kube.ControllerProcess(workdir / "controller", kubeconfig, *controller_args)
        controller.start()
        kube.wait_for(lambda: ledger_shares(api) == 0 and len(_gpus(api)) == nodes * GPUS_PER_NODE, 60, what="ledger")
        idle_rss = rss_mib(controller.pid)

        watch = ClaimWatch(api, NAMESPACE)
        watch.start()
        time.sleep(1)
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
        kube.wait_for(lambda: len(watch.written) >= claims, 600, interval=0.5, what=f"{claims} claims written")
        all_written = time.monotonic() - started
        burst_rss = rss_mib(controller.pid)
        kube.wait_for(lambda: ledger_shares(api) == claims, 120, interval=0.25, what="ledger total")
        ledger_done = time.monotonic() - started
        watch.stop()
        latencies = [watch.written[n] - watch.allocated[n] for n in watch.written]
        allocation_span = max(watch.allocated.values()) - min(watch.allocated.values())
        writes = controller.metric("fracgpu_controller_claim_status_writes_total", result="ok")
        return {
            "claims": claims,
            "nodes": nodes,
            "gpus": nodes * GPUS_PER_NODE,
            "memory_per_claim": memory,
            "allocation_to_status_written": summary_ms(latencies),
            "pods_created_s": round(created, 2),
            "allocations_span_s": round(allocation_span, 2),
            "all_status_written_s": round(all_written, 2),
            "ledger_converged_s": round(ledger_done, 2),
            "claim_status_writes": int(writes),
            "controller_rss_mib_idle": idle_rss.get("VmRSS"),
            "controller_rss_mib_after_burst": burst_rss.get("VmRSS"),
            "controller_rss_mib_peak": burst_rss.get("VmHWM"),
        }
    finally:
        if controller is not None:
            controller.terminate()
        plane.stop()


def _gpus(api: client.ApiClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api).list_cluster_custom_object(
        API_GROUP, GPU_VERSION, GPU_PLURAL
    )["items"]
    return items


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark once and print its figures."""
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.controller_bench", description=__doc__)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=10, help=f"fake nodes with {GPUS_PER_NODE} GPUs of 80Gi each")
    parser.add_argument("--memory", default="10Gi", help="memory request of each claim")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument(
        "--controller-arg", action="append", default=[], help="extra controller flag (repeatable), e.g. --no-admission"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fracgpu-ctlbench-", dir="/tmp") as tmp:
        result = run(args.claims, args.nodes, args.memory, Path(tmp), tuple(args.controller_arg))
    print(table({"allocation -> status written": result["allocation_to_status_written"]}))
    for key, value in result.items():
        if key != "allocation_to_status_written":
            print(f"{key:32} {value}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
