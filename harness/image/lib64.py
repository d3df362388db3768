"""`fracgpu.local/lib64-cuda-probe`: a workload image of the lib64 family (RHEL/Fedora layout), built locally.

Only Debian packages are at hand, so the image is assembled from them in that layout: glibc (every shared
object of Debian's `libc6`, taken from the cached base layer of rootfs.py) in `/usr/lib64` and nowhere else,
`/lib64 -> usr/lib64`, `/bin -> usr/bin`, `/sbin -> usr/sbin`, `/lib -> usr/lib`, no `/usr/lib/x86_64-linux-gnu`,
no `/etc/debian_version`; an `/etc/ld.so.conf` whose one directory is `/usr/lib64` (plus the usual include of
`/etc/ld.so.conf.d/*.conf`), and the image's own `/etc/ld.so.cache`, made at build time by the image's
`ldconfig`. Userland: Debian's static busybox (the shell and tools) and static `ldconfig`; the CUDA probe
at /usr/local/bin/cuda-probe. No driver file: those come from the claim's CDI spec.

What it can and cannot show: the NVIDIA toolkit mounts the driver's libraries at the driver's own libdir
(`/usr/lib/x86_64-linux-gnu` for our Debian-layout driver root), which the image's build-time cache cannot
list, so `ldconfig -p` names them only after the spec's `update-ldcache` hook rebuilt the cache. The loader
is Debian's, though, and Debian's ld.so also searches its multiarch directories by default: that a program
here can dlopen `libcuda.so.1` is not by itself proof of the hook (on a real RHEL image it would be).
"""

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from harness.cluster import binaries
from harness.image import oci, rootfs, small

LIB64_IMAGE = "fracgpu.local/lib64-cuda-probe:1"
LIBDIR = "usr/lib64"
PROBE_PATH = "usr/local/bin/cuda-probe"
GLIBC_LIST = "var/lib/dpkg/info/libc6:amd64.list"  # the files of Debian's glibc package, one path a line
MULTIARCH_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")  # where libc6 puts them
LDCONFIG = "usr/sbin/ldconfig"  # static: runs in any layout
EPOCH = 0
LD_SO_CONF = """\
# lib64 family: the libraries live in /usr/lib64 (/lib64 is a link to it). It is listed here because
# this image's loader and ldconfig are Debian's builds, whose default directories are the multiarch ones.
include /etc/ld.so.conf.d/*.conf
/usr/lib64
"""
OS_RELEASE = 'NAME="fracgpu lib64 test image"\nID=fracgpu-lib64\nID_LIKE="rhel fedora"\n'
TOP_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


def _is_shared_object(path: str) -> bool:
    name = PurePosixPath(path).name
    return ".so" in name and (name.endswith(".so") or ".so." in name)


def glibc_paths(package_list: str) -> list[str]:
    """The shared objects Debian's libc6 installs directly in its multiarch libdirs (from its dpkg .list)."""
    paths = [line.strip() for line in package_list.splitlines()]
    return sorted(p for p in paths if str(PurePosixPath(p).parent) in MULTIARCH_DIRS and _is_shared_object(p))


def _member_name(path: str) -> list[str]:
    """Where a package path can be in the base layer: as is, or below usr/ (Debian's merged /usr)."""
    rel = path.lstrip("/")
    return [rel, f"usr/{rel}"] if not rel.startswith("usr/") else [rel]


def _regular_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    for member in tar:
        if member.isreg():
            yield member


def extract_glibc(base_layer: Path, root: Path) -> list[str]:
    """Copy libc6's shared objects from the base layer into `root/usr/lib64` and ldconfig into `root/usr/sbin`;
    return the library names. RuntimeError naming the layer when it lacks either."""
    with tarfile.open(base_layer) as tar:
        listing = tar.extractfile(GLIBC_LIST)
        if listing is None:
            raise RuntimeError(f"{base_layer} has no {GLIBC_LIST}: delete it so rootfs.ensure_base() rebuilds it")
        wanted = {name: PurePosixPath(p).name for p in glibc_paths(listing.read().decode()) for name in _member_name(p)}
    wanted[LDCONFIG] = LDCONFIG
    found: dict[str, str] = {}
    with tarfile.open(base_layer) as tar:  # a second pass: the layer is a gzip stream
        for member in _regular_members(tar):
            if member.name not in wanted or wanted[member.name] in found.values():
                continue
            source = tar.extractfile(member)
            assert source is not None  # a regular member
            rel = LDCONFIG if member.name == LDCONFIG else f"{LIBDIR}/{wanted[member.name]}"
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with source, target.open("wb") as out:
                shutil.copyfileobj(source, out)
            target.chmod(member.mode & 0o7777)
            found[member.name] = wanted[member.name]
    libraries = sorted(v for k, v in found.items() if k != LDCONFIG)
    if LDCONFIG not in found or "libc.so.6" not in libraries or "ld-linux-x86-64.so.2" not in libraries:
        raise RuntimeError(f"{base_layer}: no glibc found (got {libraries}, ldconfig: {LDCONFIG in found})")
    return libraries


def _install_busybox(root: Path) -> None:
    deb = small.busybox_deb(binaries.cache_dir() / "debs")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        bindir = root / "usr" / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(tmp) / "bin" / "busybox", bindir / "busybox")
    applets = subprocess.run(
        [str(bindir / "busybox"), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        if applet != "busybox" and not (bindir / applet).exists():
            (bindir / applet).symlink_to("busybox")


def lay_out_rootfs(root: Path, cuda_probe: Path) -> None:
    """Write the image's tree into the empty directory `root` and build its ld.so.cache (chroots: needs root)."""
    if os.geteuid() != 0:
        raise PermissionError("the lib64 image's ld.so.cache is built with `ldconfig -r` (a chroot): run as root")
    for directory in ("usr/bin", "usr/sbin", "usr/lib", LIBDIR, "usr/local/bin", "etc/ld.so.conf.d", "root"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for directory in ("proc", "sys", "dev", "tmp", "run", "var/tmp"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for link, target in TOP_LINKS.items():
        (root / link).symlink_to(target)
    extract_glibc(rootfs.ensure_base().layer.path, root)
    _install_busybox(root)
    shutil.copyfile(cuda_probe, root / PROBE_PATH)
    (root / PROBE_PATH).chmod(0o755)
    (root / "etc/ld.so.conf").write_text(LD_SO_CONF)
    (root / "etc/os-release").write_text(OS_RELEASE)
    for path in (root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())):
        path.chmod(0o755)  # modes must not depend on the umask
    for scratch in ("tmp", "var/tmp"):
        (root / scratch).chmod(0o1777)
    # -X: keep the tree as laid out (no soname links); the cache lists what /etc/ld.so.conf names.
    subprocess.run([str(root / LDCONFIG), "-X", "-r", str(root)], check=True, capture_output=True, text=True)


def cached_libraries(root: Path) -> dict[str, str]:
    """`ldconfig -p` of the image's own cache: soname -> path (the first entry of each name)."""
    printed = subprocess.run(
        [str(root / LDCONFIG), "-C", str(root / "etc/ld.so.cache"), "-p"], check=True, capture_output=True, text=True
    ).stdout
    found: dict[str, str] = {}
    for line in printed.splitlines():
        name, _, rest = line.strip().partition(" ")
        if " => " in rest:  # not the header or the "Cache generated by" trailer
            found.setdefault(name, rest.rsplit(" => ", 1)[1])
    return found


def pack(root: Path, out_dir: Path) -> oci.ImageArchive:
    """The laid-out `root` as a one-layer image archive under `out_dir`."""
    layer = oci.write_layer(root, out_dir / "lib64-layer.tar.gz", epoch=EPOCH)
    config = {
        "architecture": rootfs.ARCH,
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/usr/sbin"], "Cmd": ["/bin/sh"]},
    }
    return oci.write_image_archive(
        out_dir / "lib64-cuda-probe.oci.tar", layers=[layer], config=config, name=LIB64_IMAGE, epoch=EPOCH
    )
