"""Command line: `python -m harness.cluster up|down [--state-dir DIR] [--node | --nodes N]`."""

import argparse
import shutil
import sys
from pathlib import Path

from harness.cluster.controlplane import ControlPlane
from harness.cluster.multinode import MultiNodeCluster, default_profiles
from harness.cluster.node import SingleNodeCluster, down

DEFAULT_STATE_DIR = Path(".cluster")


def main(argv: list[str] | None = None) -> int:
    """Bring a local control plane up (detached) or down."""
    parser = argparse.ArgumentParser(prog="python -m harness.cluster", description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="default: %(default)s")
    nodes = parser.add_mutually_exclusive_group()
    nodes.add_argument(
        "--node", action="store_true", help="a whole single-node cluster (kubelet, containerd) in its own netns"
    )
    nodes.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="N kubelet nodes, each in its own network and mount namespace, against one control plane "
        "(simulated GPU profiles alternate 2x H100 80GB, 1x A100 40GB; install fracgpu with e2e.install)",
    )
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir.resolve()
    if args.action == "down":
        stopped = down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    if args.nodes is not None and args.nodes < 1:
        parser.error(f"--nodes must be at least 1, not {args.nodes}")
    plane: ControlPlane | SingleNodeCluster | MultiNodeCluster
    if args.nodes:
        plane = MultiNodeCluster(state_dir, default_profiles(args.nodes), detached=True)
    elif args.node:
        plane = SingleNodeCluster(state_dir, detached=True)
    else:
        plane = ControlPlane(state_dir, detached=True)
    plane.start()
    print(f"control plane ready at {plane.server}\nexport KUBECONFIG={plane.kubeconfig}")
    print(f"logs: {plane.procs.logs}\nstop with: python -m harness.cluster down --state-dir {args.state_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
