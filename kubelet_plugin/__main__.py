"""Entry point of `fracgpu-kubelet-plugin`."""

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """Command-line interface of the node plugin."""
    return argparse.ArgumentParser(
        prog="fracgpu-kubelet-plugin",
        description="fracgpu node plugin: publishes this node's NVIDIA GPUs as shareable DRA devices and "
        "prepares ResourceClaims of gpu.fracgpu.dev as CDI devices for the kubelet.",
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments; the plugin lands with its issue (#3)."""
    build_parser().parse_args(argv)
    print("fracgpu-kubelet-plugin: the node plugin is not implemented yet (issue #3)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
