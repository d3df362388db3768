"""The lib64 image family and NVIDIA's update-ldcache hook, without a cluster: the hook is what makes the
driver's libraries appear in the image's loader cache.

The e2e lib64 image (harness/image/lib64.py) is laid out as a bundle rootfs; the fake driver's files are placed
at the container paths the generated spec mounts them at; then the spec's own hooks run against the bundle as
a runtime runs them. Needs root: mknod'd device nodes, the image's `ldconfig -r`, a bind mount and the hook's
pivot_root.
"""

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import binaries
from harness.image import lib64
from harness.mocknvml import PROFILES
from harness.mocknvml.driver_root import LIBDIR, DriverInstall, make_faithful_driver_root

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mknod, chroot, bind mount, pivot_root"),
]

PROFILE = PROFILES / "gpu80x2.profile"
DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")
# The driver's libdir as the container sees it; /lib is a link to usr/lib in the image, so either spelling.
DRIVER_PATHS = {f"/{LIBDIR}", f"/{LIBDIR.removeprefix('usr/')}"}


@pytest.fixture(scope="module")
def driver() -> Iterator[DriverInstall]:
    base = Path(tempfile.mkdtemp(prefix="fracgpu-lib64-", dir="/tmp"))
    try:
        yield make_faithful_driver_root(base / "root", PROFILE, base / "build")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def driver_spec(driver: DriverInstall, hook: Path) -> dict[str, Any]:
    """nvidia-ctk's spec for the driver root, as the plugin generates it (management mode)."""
    argv = [
        str(binaries.ensure_built("nvidia-ctk")["nvidia-ctk"]), "cdi", "generate", "--mode=management",
        f"--driver-root={driver.root}", f"--dev-root={driver.root}", f"--nvidia-cdi-hook-path={hook}",
        "--vendor=k8s.gpu.fracgpu.dev", "--class=driver", "--format=json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    spec: dict[str, Any] = json.loads(done.stdout)
    return spec


def run_hook(hook: dict[str, Any], bundle: Path) -> None:
    """A CDI hook as the runtime runs it: its argv, the container state on stdin."""
    state = {"ociVersion": "1.2.0", "id": "lib64", "status": "creating", "pid": os.getpid(), "bundle": str(bundle)}
    argv = [hook["path"], *hook["args"][1:]]
    done = subprocess.run(argv, input=json.dumps(state), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (argv, done.stderr)


def resolved(root: Path) -> dict[str, str]:
    """The driver's sonames the image's loader cache names, with their paths' directories."""
    return {n: p.rsplit("/", 1)[0] for n, p in lib64.cached_libraries(root).items() if n in DRIVER_LIBS}


def test_only_the_update_ldcache_hook_puts_the_driver_on_a_lib64_images_cache(
    driver: DriverInstall, tmp_path: Path
) -> None:
    hook_binary = binaries.ensure_built("nvidia-cdi-hook")["nvidia-cdi-hook"]
    edits = driver_spec(driver, hook_binary)["containerEdits"]
    bundle = tmp_path / "bundle"
    root = bundle / "rootfs"
    root.mkdir(parents=True)
    lib64.lay_out_rootfs(root, driver.cuda_probe)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.2.0", "root": {"path": "rootfs"}}))
    assert "libc.so.6" in lib64.cached_libraries(root) and not (root / LIBDIR).exists()
    for mount in edits["mounts"]:  # the driver's files where the spec mounts them (copies do for ldconfig)
        if mount["hostPath"].startswith(f"{driver.root}/"):
            target = root / mount["containerPath"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(mount["hostPath"], target)
    hooks = {h["args"][1]: h for h in edits["hooks"]}

    run_hook(hooks["create-symlinks"], bundle)
    assert (root / LIBDIR / "libcuda.so.1").is_symlink()
    assert resolved(root) == {}, "libraries and their soname links alone are not on the image's cache"

    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)  # a runtime's rootfs is a mount
    try:
        run_hook(hooks["update-ldcache"], bundle)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
    found = resolved(root)
    assert sorted(found) == sorted(DRIVER_LIBS) and set(found.values()) <= DRIVER_PATHS, found
    assert lib64.cached_libraries(root)["libc.so.6"].rsplit("/", 1)[0] in ("/usr/lib64", "/lib64")
    assert lib64.cached_libraries(root)["libc.so.6"].rsplit("/", 1)[0] in ("/usr/lib64", "/lib64")
    drop_ins = {p.name[:7]: p.read_text().split() for p in (root / "etc/ld.so.conf.d").glob("*-nvcr-*.conf")}
    assert drop_ins["00-nvcr"] == [f"/{LIBDIR}"], drop_ins  # the spec's --folder, ahead of the image's dirs
    # no /etc/debian_version: the hook took the image for the lib64 family and listed its system dirs
    assert {"/lib64", "/usr/lib64"} <= set(drop_ins["zz-nvcr"]) and f"/{LIBDIR}" not in drop_ins["zz-nvcr"]
