"""Command line: `python -m e2e.cluster up|down [--state-dir DIR]`."""

import argparse
import shutil
import sys
from pathlib import Path

from e2e.cluster.controlplane import ControlPlane
from e2e.cluster.node import SingleNodeCluster, down

DEFAULT_STATE_DIR = Path(".cluster")


def main(argv: list[str] | None = None) -> int:
    """Bring a local control plane up (detached) or down."""
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="default: %(default)s")
    parser.add_argument(
        "--node", action="store_true", help="a whole single-node cluster (kubelet, containerd) in its own netns"
    )
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir.resolve()
    if args.action == "down":
        stopped = down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    plane: ControlPlane | SingleNodeCluster = (
        SingleNodeCluster(state_dir, detached=True) if args.node else ControlPlane(state_dir, detached=True)
    )
    plane.start()
    print(f"control plane ready at {plane.server}\nexport KUBECONFIG={plane.kubeconfig}")
    print(f"logs: {plane.procs.logs}\nstop with: python -m e2e.cluster down --state-dir {args.state_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
