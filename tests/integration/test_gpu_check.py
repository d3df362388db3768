"""The real-GPU check (e2e/gpu/check.sh) run as the device machine runs it, against the simulated driver.

The bundle is built as ``make gpu-check-bundle`` builds it (wheels for this interpreter only: they come from the
wheel cache after the first run), then check.sh unpacks it, makes a fresh venv from its wheels and runs our
discovery, driver edits and claim spec, and a container through nvidia-container-runtime and the bundled runc.
The faithful fake driver root has two GPUs, and its NVML, libcuda and nvidia-smi enumerate only the device
nodes a process can open, so a container that sees one GPU got exactly the spec's device. Needs root.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.gpu import bundle as gpu_bundle
from e2e.mocknvml import PROFILES, make_driver_root, read_profile
from e2e.mocknvml.driver_root import LIBDIR, DriverInstall, make_faithful_driver_root

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mknod'd device nodes and runc"),
]

CHECK = Path(gpu_bundle.REPO) / "e2e" / "gpu" / "check.sh"
PROFILE = PROFILES / "sim80gi-x2.profile"
GPU0, GPU1 = (read_profile(PROFILE)[f"gpu.{i}.uuid"] for i in (0, 1))
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fracgpu-gpucheck-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def bundle(base: Path) -> Path:
    out = base / "bundle"
    manifest = gpu_bundle.build(out, (PYTHON,))
    assert int(str(manifest["bytes"])) < gpu_bundle.CARRY_LIMIT_BYTES
    return out


@pytest.fixture(scope="module")
def driver(base: Path) -> DriverInstall:
    return make_faithful_driver_root(base / "root", PROFILE, base / "build")


def check(bundle: Path, driver_root: Path, nvml_dir: Path, *extra: str, **env: str) -> tuple[int, str]:
    """Run check.sh as the device machine would (python3 from PATH); its exit status and output."""
    argv = [str(CHECK), "--bundle", str(bundle), "--driver-root", str(driver_root), "--nvml-library-dir", str(nvml_dir)]
    environ = {**os.environ, "FRACGPU_MOCK_NVML_DEV_ROOT": str(driver_root), **env}
    environ.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        [*argv, *extra], capture_output=True, text=True, timeout=240, env=environ, cwd="/", check=False
    )
    return done.returncode, done.stdout + done.stderr


def test_the_check_passes_and_the_container_sees_exactly_the_granted_gpu(bundle: Path, driver: DriverInstall) -> None:
    rc, out = check(bundle, driver.root, driver.libdir, "--keep")
    kept = re.search(r"work dir kept: (\S+)", out)
    assert kept is not None, out
    work = Path(kept.group(1))
    try:
        assert rc == 0, out
        assert "[gpu-check] PASS" in out, out
        assert "[gpu-check] NVML GPUs: 2" in out, out  # the host sees both GPUs...
        assert f"granted: 10240 MiB of {GPU0}" in out, out
        smi = out.split("container nvidia-smi -L (exit 0):", 1)[1].split("container CUDA probe", 1)[0]
        assert GPU0 in smi and GPU1 not in smi, out  # ...the container only the granted one
        assert "device count 1" in out and f"device 0: NVIDIA H100 80GB HBM3 {GPU0}" in out, out
        assert "container NVIDIA_VISIBLE_DEVICES=void" in out, out
        assert "hooks (4): create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification" in out
        # NVIDIA's runtime, not our code, applied our spec: its log names the injected device.
        device = re.search(r"CDI device: (\S+)", out)
        assert device is not None, out
        assert (
            f"Injecting devices using CDI: [{device.group(1)}]" in (work / "nvidia-container-runtime.log").read_text()
        )
        spec_path = re.search(r"claim spec: (\S+\.json)", out)
        assert spec_path is not None, out
        spec = json.loads(Path(spec_path.group(1)).read_text())
        nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
        assert "/dev/nvidia0" in nodes and "/dev/nvidia1" not in nodes
        dev = out.split("container /dev:", 1)[1].split("\n", 1)[0].split()
        assert "nvidia0" in dev and "nvidia1" not in dev, out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_driver_root_without_libraries_fails_with_what_to_fix(
    bundle: Path, driver: DriverInstall, base: Path
) -> None:
    bare = make_driver_root(base / "bare-root", PROFILE)  # device nodes, no driver files
    rc, out = check(bundle, bare, driver.libdir)  # NVML still answers (discovery works), nvidia-ctk finds nothing
    assert rc == 1, out
    assert f"[gpu-check] FAIL: driver edits (nvidia-ctk): nvidia-ctk cdi generate on driver root {bare} exited" in out
    assert f"libcuda.so.{driver.version}: not found" in out, out  # the generator's own words
    assert "PASS" not in out


def test_an_old_python_is_refused_with_what_to_do(bundle: Path, driver: DriverInstall, base: Path) -> None:
    fake = base / "python3.10"
    fake.write_text('#!/bin/sh\ncase "$*" in *"< (3, 11)"*) exit 1 ;; *) echo 3.10 ;; esac\n')
    fake.chmod(0o755)
    rc, out = check(bundle, driver.root, base / "root" / LIBDIR, FRACGPU_GPU_CHECK_PYTHON=str(fake))
    assert rc == 2, out
    assert f"FAIL: {fake} is Python 3.10; the check needs CPython >= 3.11" in out, out
