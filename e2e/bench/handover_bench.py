"""Benchmark of the node plugin handover: time-to-Running of GPU pods created during `kubectl rollout restart`.

    python -m e2e.bench.handover_bench [--rollouts 3] [--pods 7] [--interval 1.5] [--out build/bench/handover.json]

Real parts: a single-node local cluster (control plane, containerd, the real kubelet), fracgpu installed by its
chart. Two modes, one after the other on the same cluster: `before` (main's behaviour here: the plugin stops at
SIGTERM, FRACGPU_HANDOVER_TIMEOUT=0, and the DaemonSet replaces it without surge) and `handover` (the chart's
default: surge, 25 s). Per mode, `--rollouts`
restarts of the plugin DaemonSet; during each, `--pods` pods of a 1Gi share each are created `--interval` s apart,
and creation to container start is taken from the pods' own timestamps. Prints p50/p99 per mode and how many pods
met "driver is not registered"; asserts nothing. Needs root.
"""

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from e2e import rollout as r
from e2e.bench.stats import summary_ms, table
from e2e.install import NAMESPACE, install, remove_dev_char_links
from harness.cluster.node import SingleNodeCluster

#: mode -> (FRACGPU_HANDOVER_TIMEOUT, maxSurge): `before` is main's behaviour in this cluster (host network and
#: a metrics port made its chart pick maxUnavailable 1 / maxSurge 0; the plugin stopped at SIGTERM).
MODES = {"before": ("0", 0), "handover": ("25", 1)}


def _set_mode(cluster: SingleNodeCluster, timeout: str, surge: int) -> None:
    """Set the plugin's handover timeout and update strategy; wait until the DaemonSet rolled to them."""
    ds = r.daemonset_name(cluster)
    old = {p["metadata"]["uid"] for p in r.plugin_pods(cluster)}
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1 - surge, "maxSurge": surge}}
    cluster.kubectl(
        "patch",
        "daemonset",
        ds,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"updateStrategy": strategy}}),
    )
    cluster.kubectl("set", "env", f"daemonset/{ds}", "-n", NAMESPACE, f"FRACGPU_HANDOVER_TIMEOUT={timeout}")
    r.wait_rolled(cluster, old, timeout=120)


def _one_mode(cluster: SingleNodeCluster, rollouts: int, pods: int, interval: float) -> dict[str, Any]:
    seconds: list[float] = []
    refused = 0
    for i in range(rollouts):
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", ns)
        while cluster.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode:
            time.sleep(0.5)
        old = {p["metadata"]["uid"] for p in r.plugin_pods(cluster)}
        cluster.kubectl("rollout", "restart", f"daemonset/{r.daemonset_name(cluster)}", "-n", NAMESPACE)
        names = r.create_pods(cluster, ns, f"r{i}", pods, interval)
        r.wait_rolled(cluster, old, timeout=180)
        times = r.pod_times(cluster, ns, names, timeout=600)
        seconds += times.seconds.values()
        refused += sum(r.NOT_REGISTERED in m for m in times.messages)
        cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s")
    return {"summary": summary_ms(seconds), "not_registered_events": refused, "seconds": sorted(seconds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.handover_bench", description=__doc__)
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--pods", type=int, default=7, help="pods created during each rollout")
    parser.add_argument("--interval", type=float, default=1.5, help="seconds between two pod creations")
    parser.add_argument("--out", type=Path, default=Path("build/bench/handover.json"))
    args = parser.parse_args(argv)
    state_dir = Path(tempfile.mkdtemp(prefix="fracgpu-handover-", dir="/tmp"))
    cluster = SingleNodeCluster(state_dir, nvidia_runtime=True)
    cluster.start()
    installed = None
    try:
        installed = install(cluster, image_out=state_dir / "image")
        results = {}
        for mode, (timeout, surge) in MODES.items():
            _set_mode(cluster, timeout, surge)
            results[mode] = _one_mode(cluster, args.rollouts, args.pods, args.interval)
    finally:
        cluster.stop()
        if installed is not None:
            remove_dev_char_links(installed.driver_root)
        shutil.rmtree(state_dir, ignore_errors=True)
    print(table({mode: res["summary"] for mode, res in results.items()}))
    for mode, res in results.items():
        print(f"{mode}: {res['not_registered_events']} 'driver is not registered' events")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
