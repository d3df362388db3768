"""Benchmark of controller failover: takeover time after the leader is killed (SIGKILL) during a burst of claims.

    python -m e2e.bench.ha_bench [--kills 5] [--claims 40] [--out build/bench/ha.json]

Real parts: a single-node local cluster (control plane, containerd, the real kubelet), fracgpu installed by its
chart with its default two controller replicas and lease settings (15 s / 10 s / 2 s). Per round: a burst of
`--claims` pods on a fake GPU node (e2e/ha.py); once some claims have their status, the leader's process is
killed; takeover time is from the kill to the first claim status written after it (by the new leader), then the
round waits until every claim has its status, the ledger matches and both replicas are Ready again. Prints
p50/max of the takeover and of kill -> all claims written; asserts nothing. Needs root.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from kubernetes import client

from e2e import ha
from e2e.bench.stats import summary_ms, table
from e2e.install import install, remove_dev_char_links
from harness import kube
from harness.cluster.node import SingleNodeCluster


def _converged(api: client.ApiClient, namespace: str, node: str, claims: int) -> bool:
    found = ha.claims_of(api, namespace)
    return len(found) == claims and all(map(ha.our_status, found)) and ha.ledger_matches(api, node, found)


def _round(
    api: client.ApiClient, cluster: SingleNodeCluster, node: str, claims: int, index: int
) -> dict[str, float | str]:
    old, pods = ha.wait_for_two_replicas_and_a_leader(api, timeout=300)
    namespace = f"ha-bench-{index}"
    cluster.kubectl("create", "namespace", namespace)
    kube.wait_for(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0 or None
        ),
        30,
    )
    burst = ha.create_burst(api, namespace, node, claims, "b")
    try:
        kube.wait_for(
            lambda: sum(map(ha.our_status, ha.claims_of(api, namespace))) >= claims // 4 or None, 120, interval=0.1
        )
        before = sum(map(ha.our_status, ha.claims_of(api, namespace)))
        ha.kill_controller(pods[old])
        killed = time.monotonic()
        time.sleep(1.0)  # what the killed process had sent before it died has landed by now
        before = max(before, sum(map(ha.our_status, ha.claims_of(api, namespace))))
        if before == claims:
            raise RuntimeError("every claim was written before the kill: use more --claims")
        first = kube.wait_for(
            lambda: time.monotonic() if sum(map(ha.our_status, ha.claims_of(api, namespace))) > before else None,
            120,
            interval=0.1,
        )
        kube.wait_for(lambda: _converged(api, namespace, node, claims) or None, 180, interval=0.25)
        done = time.monotonic()
        new = ha.leader(api)
    finally:
        ha.delete_burst(api, namespace, burst)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    print(f"kill {index}: {old} -> {new}: takeover {first - killed:.2f} s, all written {done - killed:.2f} s")
    return {"killed": old, "new_leader": str(new), "takeover_s": first - killed, "all_written_s": done - killed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.ha_bench", description=__doc__)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--claims", type=int, default=40, help="claims of each round's burst")
    parser.add_argument("--out", type=Path, default=Path("build/bench/ha.json"))
    args = parser.parse_args(argv)
    state_dir = Path(tempfile.mkdtemp(prefix="fracgpu-ha-", dir="/tmp"))
    cluster = SingleNodeCluster(state_dir, nvidia_runtime=True)
    cluster.start()
    installed = None
    rounds = []
    try:
        installed = install(cluster, image_out=state_dir / "image")
        api = ha.api_client(cluster.kubeconfig)
        with ha.fake_gpu_node(api) as node:
            for i in range(args.kills):
                rounds.append(_round(api, cluster, node, args.claims, i))
    finally:
        cluster.stop()
        if installed is not None:
            remove_dev_char_links(installed.driver_root)
        shutil.rmtree(state_dir, ignore_errors=True)
    summary = {
        "takeover": summary_ms([float(r["takeover_s"]) for r in rounds]),
        "kill_to_all_written": summary_ms([float(r["all_written_s"]) for r in rounds]),
    }
    print(table(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
