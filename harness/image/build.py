"""Build the fracgpu image without Docker: `python -m harness.image.build [--out build/image] [--tag TAG]`.

Two layers: the cached debootstrap base (rootfs.py) and an app layer holding /opt/fracgpu, a venv with our
wheel and its dependencies installed inside a chroot of the base with no network (wheels are fetched on the
host first, pinned by constraints.txt like `make venv`), NVIDIA's `nvidia-ctk` and
`nvidia-cdi-hook` in /usr/bin (built on the host by harness/cluster/build-binaries.sh; the node plugin's driver
edits run the one and install the other), plus the non-root user 65532.
The OCI archive lands at `<out>/fracgpu-<tag>.oci.tar`, described by `<out>/image.json`.

The tag is `<version>-<git short commit>` with `-dirty` when the work tree differs from the commit; every
mtime of the app layer is the commit time (SOURCE_DATE_EPOCH overrides it), so an unchanged tree rebuilds to
the same layer digest.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import lock
from harness.cluster import binaries
from harness.cluster.binaries import cache_dir
from harness.image import hosttools, oci, rootfs

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "build" / "image"
IMAGE_REPO = "fracgpu.local/fracgpu"
VENV = "/opt/fracgpu"
USER_ID = 65532
USER_NAME = "fracgpu"
# Wheels for the image's interpreter: Debian bookworm's CPython 3.11 on glibc 2.36 (pip does not expand
# manylinux_2_36 to the older glibc tags it implies, so they are all listed).
GLIBC_MINOR = 36
WHEEL_PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)] + [
    f"{legacy}_x86_64" for legacy in ("manylinux2014", "manylinux2010", "manylinux1")
]
WHEEL_TARGET = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
WHEEL_TARGET += [arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform)]
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",  # set and frozenset constants in .pyc files are ordered by hash
    "PYTHONDONTWRITEBYTECODE": "1",  # only compileall writes .pyc files, all of them hash-based
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_NO_INPUT": "1",
}


@dataclass
class Timer:
    """Wall-clock seconds per build step, in order."""

    steps: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.steps[name] = round(time.monotonic() - started, 2)
            print(f"[image] {name}: {self.steps[name]:.1f}s", flush=True)

    @property
    def total(self) -> float:
        return round(sum(self.steps.values()), 2)


@dataclass(frozen=True)
class AppInputs:
    """What the app layer is made from, kept under <out>/inputs so a rebuild can reuse them."""

    app_wheel: Path
    wheels: Path  # our dependencies' wheels, exactly the set to install
    constraints: Path
    toolkit: dict[str, Path] = field(default_factory=dict)  # image /usr/bin name -> host binary


IMAGE_TOOLKIT = ("nvidia-ctk", "nvidia-cdi-hook")
"""NVIDIA Container Toolkit commands installed into the image's /usr/bin."""


@dataclass(frozen=True)
class BuildResult:
    archive: oci.ImageArchive
    tag: str
    version: str
    commit: str
    epoch: int
    base_cached: bool
    inputs: AppInputs
    timings: dict[str, float]

    @property
    def name(self) -> str:
        return self.archive.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.archive.name,
            "tag": self.tag,
            "version": self.version,
            "commit": self.commit,
            "source_date_epoch": self.epoch,
            "archive": str(self.archive.path),
            "archive_bytes": self.archive.path.stat().st_size,
            "manifest_digest": self.archive.manifest_digest,
            "config_digest": self.archive.config_digest,
            "layers": [layer.to_json() for layer in self.archive.layers],
            "base_cached": self.base_cached,
            "inputs": {
                k: {n: str(p) for n, p in v.items()} if isinstance(v, dict) else str(v)
                for k, v in vars(self.inputs).items()
            },
            "timings_s": self.timings,
        }


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()


def project_version() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
        return version


def project_dependencies() -> list[str]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        deps: list[str] = tomllib.load(f)["project"]["dependencies"]
        return deps


def source_state() -> tuple[str, bool, int]:
    """(short commit, dirty, commit time); ("unknown", True, now) outside a git checkout."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = bool(_git("status", "--porcelain"))  # untracked source would land in the wheel too
        epoch = int(_git("log", "-1", "--format=%ct"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True, int(time.time())
    return commit, dirty, epoch


def default_tag() -> str:
    commit, dirty, _ = source_state()
    tag = f"{project_version()}-{commit}{'-dirty' if dirty else ''}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tag)[:128]


def source_date_epoch() -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    return int(env) if env else source_state()[2]


def build_app_wheel(dest: Path, epoch: int) -> Path:
    """Our wheel, built from a copy of the tracked and untracked-but-not-ignored files (no stale build/)."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("fracgpu-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="fracgpu-src-") as tmp:
        src = Path(tmp) / "src"
        try:
            files = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
        except (OSError, subprocess.CalledProcessError):
            files = []
        if files:
            for rel in filter(None, files):
                path = REPO_ROOT / rel
                if path.is_file():
                    (src / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, src / rel)
        else:
            shutil.copytree(
                REPO_ROOT,
                src,
                ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__"),
            )
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dest), str(src)]
        if importlib.util.find_spec("setuptools") is not None:
            argv.insert(4, "--no-build-isolation")  # the venv's setuptools: no network, same result
        subprocess.run(argv, check=True, env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)})
    (wheel,) = dest.glob("fracgpu-*.whl")
    return wheel


def write_constraints(path: Path) -> Path:
    """The repository's pins (constraints.txt, as `make venv` and CI install them), checked and copied to `path`."""
    lock.read_pins()  # a clear LockError when it is missing or malformed
    shutil.copyfile(lock.CONSTRAINTS, path)
    return path


def download_wheels(dest: Path, constraints: Path) -> None:
    """Wheels of our dependencies into `dest`; from <cache>/wheels alone when it has them, else PyPI fills it."""
    cache = cache_dir() / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        *WHEEL_TARGET,
    ]
    base += ["-c", str(constraints), *project_dependencies()]
    offline = [*base, "--no-index", "--find-links", str(cache), "-d", str(dest), "--quiet"]
    if subprocess.run(offline, capture_output=True, check=False).returncode == 0:
        print(f"[image] dependency wheels: cached in {cache}", flush=True)
        return
    print(f"[image] dependency wheels: downloading into {cache}", flush=True)
    subprocess.run([*base, "-d", str(cache), "--quiet"], check=True)
    subprocess.run(offline, check=True)


def prepare_inputs(out: Path, epoch: int) -> AppInputs:
    inputs = out / "inputs"
    constraints = write_constraints(_mkdir(inputs) / "constraints.txt")
    wheel = build_app_wheel(inputs / "app", epoch)
    download_wheels(inputs / "wheels", constraints)
    return AppInputs(wheel, inputs / "wheels", constraints, binaries.ensure_built(*IMAGE_TOOLKIT))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _extract(base: oci.Layer, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    subprocess.run(
        ["tar", "-xzf", str(base.path), "-C", str(dest), "--numeric-owner", "--same-permissions"], check=True
    )
    for name, minor in (("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)):  # for the chroot only
        os.mknod(dest / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        os.chmod(dest / "dev" / name, 0o666)


def _chroot(root: Path, *argv: str) -> None:
    result = subprocess.run(["chroot", str(root), *argv], env=CHROOT_ENV, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"in the image rootfs, {' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )


def build_app_layer(
    base: oci.Layer, inputs: AppInputs, out: Path, *, epoch: int, work: Path, timer: Timer | None = None
) -> oci.Layer:
    """Install the venv into a scratch copy of the base (in a chroot) and pack what changed into `out`."""
    timer = timer or Timer()
    root = work / "rootfs"
    try:
        with timer.step("extract base"):
            _extract(base, root)
        with timer.step("install venv (chroot)"):
            staged = _mkdir(root / "tmp" / "fracgpu-inputs")
            shutil.copytree(inputs.wheels, staged / "wheels")
            shutil.copy2(inputs.app_wheel, staged / inputs.app_wheel.name)
            shutil.copy2(inputs.constraints, staged / "constraints.txt")
            pips = sorted((root / "usr/share/python-wheels").glob("pip-*.whl"))
            if not pips:
                raise RuntimeError("the base has no pip wheel in /usr/share/python-wheels (python3-venv missing?)")
            inner = "/tmp/fracgpu-inputs"
            # A venv without pip: pip runs from Debian's pip wheel and never lands in the image.
            _chroot(root, "/usr/bin/python3", "-m", "venv", "--without-pip", VENV)
            _chroot(
                root, f"{VENV}/bin/python", f"/usr/share/python-wheels/{pips[-1].name}/pip", "install", "--no-index",
                "--no-compile", "--find-links", f"{inner}/wheels", "-c", f"{inner}/constraints.txt", f"{inner}/{inputs.app_wheel.name}",
            )  # fmt: skip
        with timer.step("compile bytecode"):
            # Hash-based .pyc files do not depend on mtimes, so the layer stays reproducible. Levels 0 and 2:
            # the controller runs plain, the node plugin with PYTHONOPTIMIZE=2 (the chart's env).
            _chroot(
                root,
                f"{VENV}/bin/python",
                "-m",
                "compileall",
                "-q",
                "-o",
                "0",
                "-o",
                "2",
                "--invalidation-mode",
                "checked-hash",
                f"{VENV}/lib",
            )
        _add_user(root)
        for name, host_binary in inputs.toolkit.items():
            target = root / "usr" / "bin" / name
            shutil.copyfile(host_binary, target)
            target.chmod(0o755)
        toolkit = [f"usr/bin/{name}" for name in inputs.toolkit]
        with timer.step("pack app layer"):
            paths = ["etc/passwd", "etc/group", *toolkit, VENV.lstrip("/")]
            layer = oci.write_layer(root, out, epoch=epoch, paths=paths)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return layer


def _add_user(root: Path) -> None:
    passwd, group = root / "etc/passwd", root / "etc/group"
    if f":{USER_ID}:" not in passwd.read_text():
        with passwd.open("a") as f:
            f.write(f"{USER_NAME}:x:{USER_ID}:{USER_ID}:fracgpu:/nonexistent:/usr/sbin/nologin\n")
        with group.open("a") as f:
            f.write(f"{USER_NAME}:x:{USER_ID}:\n")


def image_config(*, version: str, commit: str, epoch: int, base: rootfs.BaseRootfs) -> dict[str, Any]:
    """OCI image config (without rootfs, which write_image_archive fills in)."""
    created = oci.rfc3339(epoch)
    labels = {
        "org.opencontainers.image.title": "fracgpu",
        "org.opencontainers.image.description": "Kubernetes DRA driver sharing NVIDIA GPUs by memory (controller and node plugin)",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": commit,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.base.name": f"debian:{rootfs.SUITE} ({rootfs.VARIANT} debootstrap)",
    }
    return {
        "created": created,
        "architecture": rootfs.ARCH,
        "os": "linux",
        "config": {
            # Non-root by default; the node plugin's DaemonSet runs as root (it needs /dev and kubelet dirs).
            "User": f"{USER_ID}:{USER_ID}",
            "Env": [
                f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                f"VIRTUAL_ENV={VENV}",
                "LANG=C.UTF-8",
                "PYTHONUNBUFFERED=1",
            ],
            "Cmd": ["fracgpu-controller", "--help"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "history": [
            {"created": oci.rfc3339(base.created), "created_by": base.description},
            {
                "created": created,
                "created_by": f"python -m harness.image.build: {VENV} venv with fracgpu {version} ({commit}), user {USER_ID}",
            },
        ],
    }


def build_image(out: Path = DEFAULT_OUT, *, tag: str | None = None, repo: str = IMAGE_REPO) -> BuildResult:
    """Build the image archive under `out` and describe it in `out/image.json`."""
    os.umask(0o022)  # file modes in the layer must not depend on the caller's umask
    if os.geteuid() != 0:
        raise PermissionError("building the image needs root (debootstrap, chroot, device nodes)")
    hosttools.require_commands(hosttools.IMAGE_BUILD_COMMANDS)
    out = out.resolve()
    timer = Timer()
    version = project_version()
    commit, dirty, _ = source_state()
    tag = tag or default_tag()
    epoch = source_date_epoch()
    print(f"[image] building {repo}:{tag} (SOURCE_DATE_EPOCH={epoch}) into {out}", flush=True)
    with timer.step("base rootfs"):
        base = rootfs.ensure_base()
    with timer.step("wheels"):
        inputs = prepare_inputs(out, epoch)
    app = build_app_layer(base.layer, inputs, out / "app-layer.tar.gz", epoch=epoch, work=out / "work", timer=timer)
    with timer.step("write archive"):
        for old in out.glob("fracgpu-*.oci.tar"):
            old.unlink()
        archive = oci.write_image_archive(
            out / f"fracgpu-{tag}.oci.tar",
            layers=[base.layer, app],
            config=image_config(version=version, commit=commit + ("-dirty" if dirty else ""), epoch=epoch, base=base),
            name=f"{repo}:{tag}",
            epoch=epoch,
            annotations={"org.opencontainers.image.version": version, "org.opencontainers.image.revision": commit},
        )
    result = BuildResult(
        archive, tag, version, commit, epoch, base.cached, inputs, {**timer.steps, "total": timer.total}
    )
    (out / "image.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.image.build", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: build/image)")
    parser.add_argument("--tag", help="image tag (default: <version>-<git short commit>[-dirty])")
    parser.add_argument("--repo", default=IMAGE_REPO, help="image repository (default: %(default)s)")
    args = parser.parse_args(argv)
    result = build_image(args.out, tag=args.tag, repo=args.repo)
    size = result.archive.path.stat().st_size
    print(f"image:    {result.name}")
    print(f"archive:  {result.archive.path} ({size / 2**20:.1f} MiB)")
    print(f"manifest: {result.archive.manifest_digest}")
    for layer in result.archive.layers:
        print(f"layer:    {layer.digest} ({layer.size / 2**20:.1f} MiB gzip)")
    print(f"time:     {result.timings['total']:.1f}s (base rootfs {'cached' if result.base_cached else 'built'})")
    print(f"import:   ctr images import {result.archive.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
