"""`make demo`: a local single-node cluster with two simulated 80Gi GPUs, fracgpu installed by Helm, and
fractional pods running; prints the GPU ledger, each claim's recorded GPU and what each container got.

    python -m e2e.demo up [--state-dir .demo]     # leaves the cluster running
    python -m e2e.demo down [--state-dir .demo]
"""

import argparse
import shutil
import sys
import time
from pathlib import Path

from e2e import workloads as w
from e2e.install import install, remove_dev_char_links
from harness.cluster import binaries
from harness.cluster.node import SingleNodeCluster, down

NAMESPACE = "demo"


def up(state_dir: Path) -> None:
    """Start everything and show the result."""
    started = time.monotonic()
    print("== starting a single-node cluster (etcd, apiserver, scheduler, controller-manager, containerd, kubelet)")
    print("   in its own network namespace; first run builds upstream binaries from Go modules (many minutes)")
    cluster = SingleNodeCluster(state_dir, detached=True)
    cluster.start()
    print(
        f"== node Ready; installing fracgpu with helm (image built locally, never pulled) [{time.monotonic() - started:.0f}s]"
    )
    installed = install(cluster, image_out=state_dir / "image")
    (state_dir / "driver-root").write_text(str(installed.driver_root))
    print(f"== fracgpu installed ({installed.image}); starting pods [{time.monotonic() - started:.0f}s]")
    cluster.kubectl("create", "namespace", NAMESPACE)
    while cluster.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode:
        time.sleep(0.5)
    w.apply(
        cluster,
        NAMESPACE,
        w.claim_template("gpu-40gi", "40Gi"),
        w.claim_template("whole-gpu", None),
        w.claim_template("gpu-100gi", "100Gi"),
        w.gpu_pod("share-a", "gpu-40gi"),
        w.gpu_pod("share-b", "gpu-40gi"),
    )
    w.wait_running(cluster, NAMESPACE, ["share-a", "share-b"])
    w.apply(cluster, NAMESPACE, w.gpu_pod("whole", "whole-gpu"), w.gpu_pod("too-big", "gpu-100gi"))
    w.wait_running(cluster, NAMESPACE, ["whole"])
    try:
        verdict = w.unschedulable(cluster, NAMESPACE, "too-big")
        why = w.claim_event(cluster, NAMESPACE, "too-big", "UnsatisfiableGpuRequest")
    except TimeoutError as err:  # a demo reports what it saw rather than stopping
        verdict, why = "(still pending)", str(err)
    time.sleep(2)  # let the ledger catch up with the last allocation

    print(f"\n$ kubectl get gpus\n{cluster.kubectl('get', 'gpus').stdout}")
    print(f"$ kubectl get pods -n {NAMESPACE}\n{cluster.kubectl('get', 'pods', '-n', NAMESPACE).stdout}")
    print("claims and the GPU the controller recorded in their status:")
    for pod in ("share-a", "share-b", "whole"):
        claim = w.claim_of(cluster, NAMESPACE, pod)
        gpu = w.recorded_gpu(claim)
        print(
            f"  {pod:8} claim {claim['metadata']['name']:22} -> {gpu['node']}/{gpu['device']} "
            f"{gpu['uuid']} granted {gpu['memory']} of {gpu['memoryTotal']}"
        )
    print("\nwhat each container got (its own output):")
    for pod in ("share-a", "share-b", "whole"):
        seen = w.report(cluster, NAMESPACE, pod)
        print(
            f"  {pod:8} NVIDIA_VISIBLE_DEVICES={seen.env.get('NVIDIA_VISIBLE_DEVICES', '')} "
            f"/run/fracgpu: {seen.grants()} /dev: {' '.join(sorted(seen.nodes))}"
        )
    print(f"\n  too-big  Pending: {verdict}")
    print(f"           the controller's Event UnsatisfiableGpuRequest on its claim: {why}")
    kubectl = binaries.binary("kubectl")
    print(f"\n== done in {time.monotonic() - started:.0f}s; the cluster keeps running:")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"alias kubectl={kubectl}")
    print("kubectl get gpus; kubectl get resourceclaims -A -o yaml   # stop it with: make demo-down")


def teardown(state_dir: Path) -> None:
    """Stop the demo cluster and remove its state."""
    stopped = down(state_dir)
    marker = state_dir / "driver-root"
    if marker.exists():
        remove_dev_char_links(Path(marker.read_text()))
    shutil.rmtree(state_dir, ignore_errors=True)
    print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=Path(".demo"))
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()
    if args.action == "down":
        teardown(state_dir)
        return 0
    if (state_dir / "pids.json").exists():
        print(f"a demo seems to be running already ({state_dir}); `make demo-down` first", file=sys.stderr)
        return 1
    up(state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
