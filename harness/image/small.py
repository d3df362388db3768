"""The tiny images the e2e cluster needs besides ours, built locally, never pulled:

- `fracgpu.local/pause:3.10`: the pod sandbox, a static program of ours (pause.c);
- `fracgpu.local/busybox:<version>`: test workloads, from Debian's busybox-static package.
"""

import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.cluster import binaries
from harness.image import hosttools, oci

HERE = Path(__file__).resolve().parent
PAUSE_IMAGE = "fracgpu.local/pause:3.10"
BUSYBOX_IMAGE = "fracgpu.local/busybox:1.35"
EPOCH = 0


def _config(entrypoint: list[str], cmd: list[str] | None = None) -> dict[str, object]:
    config: dict[str, object] = {"Entrypoint": entrypoint, "Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"]}
    if cmd:
        config["Cmd"] = cmd
    return {"architecture": "amd64", "os": "linux", "config": config}


def build_pause(out_dir: Path) -> oci.ImageArchive:
    """Compile pause.c statically and pack it as the sandbox image."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir()
        subprocess.run(
            ["gcc", "-static", "-O2", "-Wall", "-Werror", "-o", str(root / "pause"), str(HERE / "pause.c")], check=True
        )
        layer = oci.write_layer(root, out_dir / "pause-layer.tar.gz", epoch=EPOCH)
    return oci.write_image_archive(
        out_dir / "pause.oci.tar", layers=[layer], config=_config(["/pause"]), name=PAUSE_IMAGE, epoch=EPOCH
    )


def busybox_deb(cache: Path) -> Path:
    """Debian's busybox-static package in `cache`, downloaded with apt-get the first time."""
    cache.mkdir(parents=True, exist_ok=True)
    debs = sorted(cache.glob("busybox-static_*.deb"))
    if debs:
        return debs[-1]
    hosttools.require_commands({"apt-get": "apt"})
    try:
        subprocess.run(["apt-get", "download", "busybox-static"], cwd=cache, check=True, capture_output=True)
    except subprocess.CalledProcessError:
        subprocess.run(["apt-get", "update"], check=True, capture_output=True)
        subprocess.run(["apt-get", "download", "busybox-static"], cwd=cache, check=True, capture_output=True)
    return sorted(cache.glob("busybox-static_*.deb"))[-1]


def build_busybox(out_dir: Path) -> oci.ImageArchive:
    """Debian's busybox-static with a symlink per applet, as the workload image."""
    deb = busybox_deb(binaries.cache_dir() / "debs")
    with tempfile.TemporaryDirectory() as tmp:
        extracted, root = Path(tmp) / "deb", Path(tmp) / "rootfs"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(extracted)], check=True)
        (root / "bin").mkdir(parents=True)
        shutil.copy2(extracted / "bin" / "busybox", root / "bin" / "busybox")
        applets = subprocess.run(
            [str(root / "bin" / "busybox"), "--list"], check=True, capture_output=True, text=True
        ).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (root / "bin" / applet).symlink_to("busybox")
        for directory in ("tmp", "etc", "proc", "sys", "dev"):
            (root / directory).mkdir(exist_ok=True)
        (root / "tmp").chmod(0o1777)
        layer = oci.write_layer(root, out_dir / "busybox-layer.tar.gz", epoch=EPOCH)
    return oci.write_image_archive(
        out_dir / "busybox.oci.tar", layers=[layer], config=_config(["/bin/sh"]), name=BUSYBOX_IMAGE, epoch=EPOCH
    )
