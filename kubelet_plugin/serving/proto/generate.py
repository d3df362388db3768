"""Compile the kubelet-facing .proto files of this package into committed Python modules.

Usage (from anywhere; paths are resolved from this file)::

    python -m kubelet_plugin.serving.proto.generate          # (re)write the generated files
    python -m kubelet_plugin.serving.proto.generate --check  # exit 1 and list stale files, write nothing

For every ``<name>.proto`` next to this file it produces ``<name>_pb2.py``, ``<name>_pb2.pyi``,
``<name>_pb2_grpc.py`` and ``<name>_pb2_grpc.pyi``. ``protoc`` runs with ``-I .`` from the repository
root, so the generated modules import each other as ``kubelet_plugin.serving.proto.<name>_pb2``. The output
depends on the installed grpcio-tools and mypy-protobuf versions: regenerate after upgrading them.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parents[2]
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    """The .proto sources, relative to the repository root, sorted."""
    return sorted(p.relative_to(REPO_ROOT) for p in PROTO_DIR.glob("*.proto"))


def _plugin(name: str) -> Path:
    """Locate a protoc plugin executable: next to the running interpreter first, then on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return candidate
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found; install the dev extras (mypy-protobuf)")
    return Path(found)


def generate_into(out_dir: Path) -> list[Path]:
    """Run protoc for all sources into ``out_dir`` (a root mirroring the repository layout).

    Returns the generated files, relative to ``out_dir``. Raises ``SystemExit`` if protoc fails.
    """
    protos = proto_files()
    if not protos:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        ".",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(p) for p in protos),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"protoc failed ({proc.returncode}):\n{proc.stderr}")
    return sorted(p.relative_to(out_dir) for p in out_dir.rglob("*") if p.is_file())


def _committed_generated() -> set[Path]:
    """Generated-looking files currently in the package directory, relative to the repository root."""
    return {
        p.relative_to(REPO_ROOT) for p in PROTO_DIR.iterdir() if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def stale_files() -> list[Path]:
    """Files (relative to the repository root) that differ from a fresh generation, are missing, or are
    generated leftovers without a source. Empty when everything is up to date. Writes nothing here."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        fresh = generate_into(out)
        stale = {
            rel
            for rel in fresh
            if not (REPO_ROOT / rel).is_file() or not filecmp.cmp(out / rel, REPO_ROOT / rel, shallow=False)
        }
        stale |= _committed_generated() - set(fresh)
    return sorted(stale)


def write() -> list[Path]:
    """Regenerate in place: write changed files, delete generated leftovers. Returns changed paths."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        fresh = generate_into(out)
        changed: list[Path] = []
        for rel in fresh:
            target = REPO_ROOT / rel
            if not target.is_file() or not filecmp.cmp(out / rel, target, shallow=False):
                shutil.copyfile(out / rel, target)
                changed.append(rel)
        for rel in sorted(_committed_generated() - set(fresh)):
            (REPO_ROOT / rel).unlink()
            changed.append(rel)
    return changed


def main(argv: list[str] | None = None) -> int:
    """Command-line entry; returns the exit status (1 = stale files with ``--check``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only report stale generated files")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for rel in stale:
            print(f"stale: {rel}")
        if stale:
            print("run: python -m kubelet_plugin.serving.proto.generate", file=sys.stderr)
            return 1
        return 0
    for rel in write():
        print(f"wrote: {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
