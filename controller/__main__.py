"""Entry point of `fracgpu-controller`."""

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """Command-line interface of the controller."""
    return argparse.ArgumentParser(
        prog="fracgpu-controller",
        description="fracgpu controller: records the physical GPU of each ResourceClaim of gpu.fracgpu.dev "
        "in its status, keeps the `kubectl get gpus` ledger and validates claims at admission.",
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments; the controller loop lands with its issue (#4)."""
    build_parser().parse_args(argv)
    print("fracgpu-controller: the controller is not implemented yet (issue #4)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
