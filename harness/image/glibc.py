"""`fracgpu.local/debian-cuda-probe`: a glibc workload image for the e2e tests of driver edits.

Two layers: the cached Debian base of our own image (rootfs.py: glibc, ldconfig, a shell; containerd stores
it once, shared with the fracgpu image) and one small layer with the CUDA probe at /usr/local/bin/cuda-probe.
It carries no driver file: libcuda, libnvidia-ml and nvidia-smi must come from the claim's CDI spec.
"""

import shutil
import tempfile
from pathlib import Path

from harness.image import oci, rootfs

GLIBC_IMAGE = "fracgpu.local/debian-cuda-probe:1"
PROBE_PATH = "/usr/local/bin/cuda-probe"
EPOCH = 0


def build_glibc_workload(out_dir: Path, cuda_probe: Path) -> oci.ImageArchive:
    """The image archive under `out_dir`, with `cuda_probe` (a host-built binary linking only libc) in it."""
    base = rootfs.ensure_base()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = root / PROBE_PATH.lstrip("/")
        target.parent.mkdir(parents=True)
        shutil.copyfile(cuda_probe, target)
        target.chmod(0o755)
        for directory in ("usr", "usr/local", "usr/local/bin"):  # modes must not depend on the umask
            (root / directory).chmod(0o755)
        probe = oci.write_layer(root, out_dir / "cuda-probe-layer.tar.gz", epoch=EPOCH, paths=[PROBE_PATH])
    config = {
        "architecture": rootfs.ARCH,
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["/bin/sh"]},
    }
    return oci.write_image_archive(
        out_dir / "debian-cuda-probe.oci.tar",
        layers=[base.layer, probe],
        config=config,
        name=GLIBC_IMAGE,
        epoch=EPOCH,
    )
