"""Command line: `python -m e2e.cluster up|down [--state-dir DIR]`."""

import argparse
import shutil
import sys
from pathlib import Path

from e2e.cluster.controlplane import ControlPlane
from e2e.cluster.processes import stop_recorded

DEFAULT_STATE_DIR = Path(".cluster")


def main(argv: list[str] | None = None) -> int:
    """Bring a local control plane up (detached) or down."""
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="default: %(default)s")
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir.resolve()
    if args.action == "down":
        stopped = stop_recorded(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    plane = ControlPlane(state_dir, detached=True)
    plane.start()
    print(f"control plane ready at {plane.server}\nexport KUBECONFIG={plane.kubeconfig}")
    print(f"logs: {plane.procs.logs}\nstop with: make cluster-down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
