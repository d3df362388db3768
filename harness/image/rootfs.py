"""The base layer: a minimal Debian rootfs from debootstrap, trimmed, cached as a gzip layer blob.

The cache entry (`<cache>/rootfs/<suite>-<variant>-<key>.tar.gz` plus a `.json` with its digests) is keyed by
suite, variant, package list and the trim revision; delete it to rebuild the base.
"""

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.cluster.binaries import cache_dir
from harness.image import hosttools, oci

SUITE = "bookworm"
VARIANT = "minbase"
ARCH = "amd64"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
TRIM_REVISION = 1  # bump when trim() changes, so cached bases are rebuilt

# dpkg drops these paths from packages a derived image installs, as trim() dropped them here.
DPKG_EXCLUDES = """\
# fracgpu image: no docs, man pages or translations (licences stay)
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""


@dataclass(frozen=True)
class BaseRootfs:
    layer: oci.Layer
    created: int  # epoch the layer's mtimes are clamped to
    description: str  # for the image history
    cached: bool  # True when reused from the cache


def debian_mirror(suite: str = SUITE) -> str:
    """The Debian mirror apt uses for `suite` on this host (FRACGPU_DEBIAN_MIRROR overrides it)."""
    if env := os.environ.get("FRACGPU_DEBIAN_MIRROR"):
        return env
    sources = Path("/etc/apt/sources.list.d")
    for path in sorted(sources.glob("*.sources")) if sources.is_dir() else []:
        for stanza in path.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
                return fields["uris"].split()[0].rstrip("/")
    legacy = Path("/etc/apt/sources.list")
    for line in legacy.read_text().splitlines() if legacy.exists() else []:
        words = [w for w in line.split() if not w.startswith("[")]
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
            return words[1].rstrip("/")
    return DEFAULT_MIRROR


def cache_key(suite: str = SUITE, variant: str = VARIANT, packages: tuple[str, ...] = PACKAGES) -> str:
    spec = {"suite": suite, "variant": variant, "arch": ARCH, "packages": sorted(packages), "trim": TRIM_REVISION}
    return hashlib.sha256(oci.canonical_json(spec)).hexdigest()[:16]


def ensure_base(packages: tuple[str, ...] = PACKAGES, *, log: bool = True) -> BaseRootfs:
    """The cached base layer, made with debootstrap (about a minute) when absent."""
    key = cache_key(packages=packages)
    root = cache_dir() / "rootfs"
    blob, meta = root / f"{SUITE}-{VARIANT}-{key}.tar.gz", root / f"{SUITE}-{VARIANT}-{key}.json"
    if blob.exists() and meta.exists():
        data = json.loads(meta.read_text())
        layer = oci.Layer.from_json({**data["layer"], "path": str(blob)})
        if blob.stat().st_size == layer.size:
            if log:
                print(f"[image] base rootfs: cached {blob}", flush=True)
            return BaseRootfs(layer, int(data["created"]), str(data["description"]), cached=True)
    tools = hosttools.require_commands(hosttools.IMAGE_BUILD_COMMANDS)
    mirror = debian_mirror()
    scratch = root / f"tmp-{key}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        argv = [
            tools["debootstrap"],
            f"--variant={VARIANT}",
            f"--arch={ARCH}",
            f"--include={','.join(packages)}",
            SUITE,
            str(scratch / "rootfs"),
            mirror,
        ]
        description = " ".join(["debootstrap", *argv[1:-2], mirror])
        print(f"[image] base rootfs: {description} (first time: about a minute)", flush=True)
        started = time.monotonic()
        result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"debootstrap failed ({result.returncode}):\n{result.stdout[-4000:]}")
        print(f"[image] debootstrap done in {time.monotonic() - started:.0f}s; trimming and packing", flush=True)
        trim(scratch / "rootfs")
        created = int(time.time())
        layer = oci.write_layer(scratch / "rootfs", blob, epoch=created)
        meta.write_text(
            json.dumps({"layer": layer.to_json(), "created": created, "description": description}, indent=2)
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"[image] base rootfs: {blob} ({layer.size / 2**20:.1f} MiB)", flush=True)
    return BaseRootfs(layer, created, description, cached=False)


def trim(rootfs: Path) -> None:
    """Drop what a runtime image does not need: apt lists and caches, docs, man pages, logs, host files."""

    def clear(rel: str, keep: tuple[str, ...] = ()) -> None:
        top = rootfs / rel
        if not top.is_dir():
            return
        for entry in top.iterdir():
            if entry.name in keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    for rel in ("var/lib/apt/lists", "var/cache/apt", "tmp", "var/tmp", "dev"):
        clear(rel)
    clear("var/cache/debconf", keep=("config.dat", "templates.dat", "passwords.dat"))
    for log in (rootfs / "var/log").rglob("*"):
        if log.is_file() and not log.is_symlink():
            log.write_bytes(b"")  # keep the files (and their modes), not what the bootstrap wrote
    for rel in ("usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/linda"):
        clear(rel)
    clear("usr/share/locale", keep=("locale.alias",))
    docs = rootfs / "usr/share/doc"
    for package in docs.iterdir() if docs.is_dir() else []:
        for entry in package.iterdir() if package.is_dir() and not package.is_symlink() else []:
            if entry.name != "copyright":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for partial in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial"):
        (rootfs / partial).mkdir(parents=True, exist_ok=True)
    for old in rootfs.glob("var/lib/dpkg/*-old"):
        old.unlink()
    # debootstrap copied these from the build host; the container runtime provides its own.
    for rel in ("etc/resolv.conf", "etc/hostname", "etc/hosts"):
        (rootfs / rel).unlink(missing_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/fracgpu-slim").write_text(DPKG_EXCLUDES)
