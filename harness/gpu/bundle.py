"""Build what the real-GPU check carries to a machine that has an NVIDIA driver and nothing else.

    python -m harness.gpu.bundle [--out build/gpu-check] [--python 3.11 --python 3.12 --python 3.13]

writes into ``--out`` (replacing what was there):

- ``payload.tar.gz``: ``bin/`` with the pinned ``nvidia-ctk``, ``nvidia-cdi-hook``, ``nvidia-container-runtime``
  (built by harness/cluster/build-binaries.sh, linking only libc) and a static ``runc``; ``rootfs/``, the container's
  root: Debian's static busybox, the CUDA probe (harness/mocknvml/cuda_probe.c) and this machine's glibc, so the
  container runs the same userland on any host and links whatever driver libraries the CDI spec mounts;
- ``wheels/``: the wheels of every distribution the check imports, at their pins in constraints.txt (as
  ``make venv`` installs them), for each ``--python`` (manylinux x86-64), downloaded once into
  ``$FRACGPU_CACHE/wheels/gpu-check``;
- ``requirements.txt``: those distributions pinned (installed with ``--no-deps``: exactly this set);
- ``manifest.json``: component versions, the distributions and the size of the rest of the bundle.

The repository's own code is not in the bundle: it travels with the working tree.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from harness import lock
from harness.cluster import binaries
from harness.image import small
from harness.mocknvml import HERE as MOCKNVML

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "build" / "gpu-check"
PYTHONS = ("3.11", "3.12", "3.13")
TOOLS = (*binaries.TOOLKIT, "runc")
PROBE_IN_ROOTFS = "usr/local/bin/cuda-probe"
BUSYBOX_IN_ROOTFS = "bin/busybox"
# What a dynamically linked driver tool or library needs from glibc (libcuda and nvidia-smi link libdl,
# libpthread, librt and libm besides libc), copied from this machine into the container's root.
GLIBC_LIBS = (
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libresolv.so.2",
    "libgcc_s.so.1",
)
LOADER = "ld-linux-x86-64.so.2"
LIBDIR = "lib/x86_64-linux-gnu"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
# Imported by the check but not wheels it needs: the repository itself, and the editable install's finder.
NOT_CARRIED = frozenset({"fracgpu", "setuptools"})
CARRY_LIMIT_BYTES = 64 * 2**20
"""What the device tool carries at most: the bundle, the working tree and the other carried paths together."""


def imported_distributions(python: Path) -> dict[str, str]:
    """Distribution -> version of everything ``harness.gpu.check`` imports, as ``python`` has them installed."""
    code = (
        "import importlib.metadata as md, json, sys\n"
        "import harness.gpu.check\n"
        "names = md.packages_distributions()\n"
        "tops = {m.partition('.')[0] for m in list(sys.modules)} - set(sys.stdlib_module_names)\n"
        "print(json.dumps({d: md.version(d) for t in tops for d in names.get(t, [])}))\n"
    )
    done = subprocess.run([str(python), "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    found: dict[str, str] = json.loads(done.stdout)
    return {name: version for name, version in sorted(found.items()) if name.lower() not in NOT_CARRIED}


def _normalised(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _wheel(filename: str) -> tuple[str, str, list[str], str]:
    """(normalised name, version, python tags, abi tag) of a wheel file name."""
    parts = filename.removesuffix(".whl").split("-")
    return _normalised(parts[0]), parts[1], parts[-3].split("."), parts[-2]


def _installs_on(filename: str, python: str) -> bool:
    """A wheel (of one of ``PLATFORMS``) installs on CPython ``python`` (X.Y)."""
    _, _, python_tags, abi = _wheel(filename)
    minor = int(python.split(".")[1])
    if abi == "abi3":  # cp3N-abi3: any CPython 3.N or newer
        return any(t.startswith("cp3") and int(t[3:]) <= minor for t in python_tags)
    return f"cp3{minor}" in python_tags or any(t.startswith("py3") for t in python_tags)


def _wanted(filename: str, dists: dict[str, str]) -> bool:
    name, version, _, _ = _wheel(filename)
    return any(_normalised(n) == name and v == version for n, v in dists.items())


def download_wheels(dists: dict[str, str], pythons: tuple[str, ...], cache: Path) -> None:
    """Fill ``cache`` with a wheel of each distribution for each Python; only missing ones are downloaded."""
    cache.mkdir(parents=True, exist_ok=True)
    for python in pythons:
        have = [w.name for w in cache.glob("*.whl") if _installs_on(w.name, python)]
        missing = [f"{n}=={v}" for n, v in dists.items() if not any(_wanted(w, {n: v}) for w in have)]
        if not missing:
            continue
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(cache)]
        argv += ["--implementation", "cp", "--python-version", python, *(f"--platform={p}" for p in PLATFORMS)]
        print(f"[gpu-check bundle] downloading wheels for CPython {python}: {' '.join(missing)}", flush=True)
        subprocess.run([*argv, *missing], check=True)


def bundle_wheels(dists: dict[str, str], pythons: tuple[str, ...], cache: Path, out: Path) -> None:
    """Copy the cached wheels of ``dists`` that install on one of ``pythons`` into ``out``."""
    out.mkdir(parents=True)
    for wheel in sorted(cache.glob("*.whl")):
        if _wanted(wheel.name, dists) and any(_installs_on(wheel.name, p) for p in pythons):
            shutil.copy2(wheel, out / wheel.name)


def _glibc_dir() -> Path:
    """The directory this machine's libc.so.6 is loaded from."""
    done = subprocess.run(["ldd", sys.executable], capture_output=True, text=True, check=True)
    for line in done.stdout.splitlines():
        if line.strip().startswith("libc.so.6 =>"):
            return Path(line.split("=>", 1)[1].split()[0]).resolve().parent
    raise RuntimeError(f"cannot find libc.so.6 in `ldd {sys.executable}`:\n{done.stdout}")


def build_rootfs(root: Path, cuda_probe: Path) -> None:
    """The container's root: busybox, the probe, glibc and what the toolkit's ldconfig hook expects."""
    deb = small.busybox_deb(binaries.cache_dir() / "debs")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        (root / "bin").mkdir(parents=True)
        shutil.copy2(Path(tmp) / "bin" / "busybox", root / BUSYBOX_IN_ROOTFS)
    probe = root / PROBE_IN_ROOTFS
    probe.parent.mkdir(parents=True)
    shutil.copy2(cuda_probe, probe)
    glibc = _glibc_dir()
    (root / LIBDIR).mkdir(parents=True)
    for name in (*GLIBC_LIBS, LOADER):
        shutil.copy2(glibc / name, root / LIBDIR / name)
    (root / "lib64").mkdir()
    shutil.copy2(glibc / LOADER, root / "lib64" / LOADER)  # the ELF interpreter path; a copy, not a link
    for directory in ("etc/ld.so.conf.d", "usr/lib/x86_64-linux-gnu", "usr/bin", "tmp", "proc", "sys", "dev", "run"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    # The glibc is Debian's: nvidia-cdi-hook update-ldcache then writes Debian's system search paths.
    shutil.copy2("/etc/debian_version", root / "etc" / "debian_version")
    for path in (root, *root.rglob("*")):
        if path.is_dir():
            path.chmod(0o1777 if path.name == "tmp" else 0o755)


def build_cuda_probe(build_dir: Path) -> Path:
    """Compile the mock driver's sources (build.sh) and return the CUDA probe among them."""
    subprocess.run(["bash", str(MOCKNVML / "build.sh"), str(build_dir)], check=True, capture_output=True)
    return build_dir / "cuda-probe"


def glibc_needed(binaries_: list[Path]) -> str:
    """The newest ``GLIBC_x.y`` symbol version any of the (dynamically linked) binaries references."""
    found = {tuple(int(n) for n in m) for b in binaries_ for m in re.findall(rb"GLIBC_(\d+)\.(\d+)", b.read_bytes())}
    return ".".join(map(str, max(found))) if found else "0"


def directory_size(path: Path) -> int:
    """Bytes of the regular files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def build(out: Path, pythons: tuple[str, ...]) -> dict[str, object]:
    """Write the bundle into ``out`` (see the module docstring); return its manifest."""
    tools = binaries.ensure_built(*TOOLS)
    dists = lock.pinned(list(imported_distributions(Path(sys.executable))))
    cache = binaries.cache_dir() / "wheels" / "gpu-check"
    download_wheels(dists, pythons, cache)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        payload = Path(tmp) / "payload"
        (payload / "bin").mkdir(parents=True)
        for name, path in tools.items():
            shutil.copy2(path, payload / "bin" / name)
        build_rootfs(payload / "rootfs", build_cuda_probe(Path(tmp) / "mocknvml"))
        with tarfile.open(out / "payload.tar.gz", "w:gz", compresslevel=6) as archive:
            archive.add(payload / "bin", arcname="bin")
            archive.add(payload / "rootfs", arcname="rootfs")
    bundle_wheels(dists, pythons, cache, out / "wheels")
    (out / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in dists.items()))
    versions = binaries.versions()
    manifest: dict[str, object] = {
        "nvidia_container_toolkit": versions["NVIDIA_CTK_VERSION"],
        "runc": versions["RUNC_VERSION"],
        "pythons": list(pythons),
        "host_glibc": glibc_needed([tools[name] for name in binaries.TOOLKIT]),  # they run on the host
        "distributions": dists,
        "bytes": directory_size(out),  # everything but this file
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    """Build the bundle and print its size; non-zero when it would not fit the device tool's carry limit."""
    p = argparse.ArgumentParser(prog="python -m harness.gpu.bundle", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="bundle directory (replaced)")
    p.add_argument(
        "--python", action="append", dest="pythons", help=f"CPython X.Y to carry wheels for (default {PYTHONS})"
    )
    args = p.parse_args(argv)
    out: Path = args.out.resolve()
    build(out, tuple(args.pythons or PYTHONS))
    size = directory_size(out)
    rel = os.path.relpath(out, REPO) if out.is_relative_to(REPO) else str(out)
    print(f"[gpu-check bundle] {rel}: {size / 2**20:.1f} MiB (the device tool carries at most 64 MiB in all)")
    if size > CARRY_LIMIT_BYTES:
        print(f"[gpu-check bundle] {rel} is larger than the device tool carries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
