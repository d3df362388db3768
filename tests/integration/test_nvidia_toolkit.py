"""NVIDIA's container toolkit (built from its pinned Go module) against the faithful fake driver root.

Needs root: the driver root gets mknod-made character devices, and visibility by permission bits is checked
by running the mocks as an unprivileged uid (setpriv). Nothing here starts a cluster.
"""

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import binaries
from harness.mocknvml import PROFILES, read_profile
from harness.mocknvml.driver_root import LIBDIR, DriverInstall, make_faithful_driver_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mknod'd device nodes and setpriv")

PROFILE = PROFILES / "gpu80x2.profile"
HOOK = "/var/lib/kubelet/plugins/gpu.fracgpu.dev/nvidia-cdi-hook"
NOBODY = 65534
CONTAINER_LIBDIR = "/" + LIBDIR


@pytest.fixture(scope="module")
def toolkit() -> dict[str, Path]:
    return binaries.ensure_built(*binaries.TOOLKIT)


@pytest.fixture(scope="module")
def driver() -> Iterator[DriverInstall]:
    """A faithful driver root under a world-traversable directory (the unprivileged runs must reach it)."""
    base = Path(tempfile.mkdtemp(prefix="fracgpu-driver-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield make_faithful_driver_root(base / "root", PROFILE, base / "build")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def generate(toolkit: dict[str, Path], root: Path, *extra: str) -> dict[str, Any]:
    """`nvidia-ctk cdi generate` in management mode against root; the spec as JSON."""
    argv = [
        str(toolkit["nvidia-ctk"]),
        "cdi",
        "generate",
        "--mode=management",
        f"--driver-root={root}",
        f"--dev-root={root}",
        f"--nvidia-cdi-hook-path={HOOK}",
        "--vendor=k8s.gpu.fracgpu.dev",
        "--class=driver",
        "--format=json",
        *extra,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    spec: dict[str, Any] = json.loads(proc.stdout)
    return spec


def hook_args(spec: dict[str, Any], name: str) -> list[str]:
    hooks = [h for h in spec["containerEdits"]["hooks"] if h["args"][1] == name]
    assert len(hooks) == 1, [h["args"][:2] for h in spec["containerEdits"]["hooks"]]
    assert hooks[0]["path"] == HOOK
    args: list[str] = hooks[0]["args"][2:]
    return args


def run_as(uid: int, argv: list[str], driver: DriverInstall, devroot: Path) -> subprocess.CompletedProcess[str]:
    """Run argv as uid (no groups) with the driver's libraries on the loader path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_")}
    env |= {"LD_LIBRARY_PATH": str(driver.libdir), "FRACGPU_MOCK_NVML_DEV_ROOT": str(devroot)}
    prefix = [] if uid == 0 else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return subprocess.run([*prefix, *argv], env=env, capture_output=True, text=True, timeout=30, check=False)


def test_toolkit_binaries_link_only_libc(toolkit: dict[str, Path]) -> None:
    for name, path in toolkit.items():
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
        assert needed == ["libc.so.6"], (name, needed)
    version = subprocess.run([str(toolkit["nvidia-ctk"]), "--version"], capture_output=True, text=True, check=True)
    assert binaries.version_of("nvidia-ctk").removeprefix("v") in version.stdout


def test_cdi_generate_lists_the_fake_driver(toolkit: dict[str, Path], driver: DriverInstall) -> None:
    spec = generate(toolkit, driver.root)
    ver = driver.version
    assert spec["kind"] == "k8s.gpu.fracgpu.dev/driver"
    edits = spec["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    for lib in (f"libcuda.so.{ver}", f"libnvidia-ml.so.{ver}", f"libnvidia-ptxjitcompiler.so.{ver}"):
        assert mounts[f"{CONTAINER_LIBDIR}/{lib}"] == str(driver.libdir / lib)
    assert mounts["/usr/bin/nvidia-smi"] == str(driver.nvidia_smi)
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    links = hook_args(spec, "create-symlinks")
    # SONAME links appear only because the libraries are real ELF files with the real sonames.
    for link in (
        f"libcuda.so.{ver}::{CONTAINER_LIBDIR}/libcuda.so.1",
        f"libnvidia-ml.so.{ver}::{CONTAINER_LIBDIR}/libnvidia-ml.so.1",
        f"libcuda.so.1::{CONTAINER_LIBDIR}/libcuda.so",
    ):
        assert link in links
    assert hook_args(spec, "update-ldcache") == ["--folder", CONTAINER_LIBDIR]
    assert hook_args(spec, "enable-cuda-compat") == [f"--host-driver-version={ver}"]
    nodes = {n["path"]: (n["major"], n.get("minor", 0)) for n in spec["devices"][0]["containerEdits"]["deviceNodes"]}
    minors = sorted(int(v) for k, v in read_profile(PROFILE).items() if k.endswith(".minor"))
    assert {f"/dev/nvidia{m}": (195, m) for m in minors}.items() <= nodes.items()


def test_cdi_transform_root_rewrites_host_paths(
    toolkit: dict[str, Path], driver: DriverInstall, tmp_path: Path
) -> None:
    spec_file = tmp_path / "driver.json"
    spec_file.write_text(json.dumps(generate(toolkit, driver.root)))
    out = tmp_path / "moved.json"  # the output format follows the file extension
    argv = [str(toolkit["nvidia-ctk"]), "cdi", "transform", "root", f"--input={spec_file}", f"--output={out}"]
    argv += [f"--from={driver.root}", "--to=/run/nvidia/driver", "--relative-to=host"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    moved = json.loads(out.read_text())
    original = json.loads(spec_file.read_text())["containerEdits"]["mounts"]
    assert len(moved["containerEdits"]["mounts"]) == len(original) > 0
    for before, after in zip(original, moved["containerEdits"]["mounts"], strict=True):
        assert after["containerPath"] == before["containerPath"]
        if before["hostPath"].startswith(f"{driver.root}/"):
            assert after["hostPath"] == "/run/nvidia/driver" + before["hostPath"].removeprefix(str(driver.root))
        else:  # e.g. /dev/null at /var/run/nvidia-container-devices/void: not the driver's
            assert after["hostPath"] == before["hostPath"]
    host_paths = {m["containerPath"]: m["hostPath"] for m in moved["containerEdits"]["mounts"]}
    assert host_paths[f"{CONTAINER_LIBDIR}/libcuda.so.{driver.version}"] == (
        f"/run/nvidia/driver/{LIBDIR}/libcuda.so.{driver.version}"
    )


def test_cdi_hook_creates_the_soname_links(toolkit: dict[str, Path], driver: DriverInstall, tmp_path: Path) -> None:
    """The generated create-symlinks hook, run against a bundle, makes libcuda.so.1 resolvable in the rootfs."""
    links = hook_args(generate(toolkit, driver.root), "create-symlinks")
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / LIBDIR).mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.2.0", "root": {"path": "rootfs"}}))
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps({"ociVersion": "1.2.0", "id": "t", "status": "creating", "pid": 1, "bundle": str(bundle)})
    )
    argv = [str(toolkit["nvidia-cdi-hook"]), "create-symlinks", *links, f"--container-spec={state}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    libdir = bundle / "rootfs" / LIBDIR
    assert (libdir / "libcuda.so.1").readlink() == Path(f"libcuda.so.{driver.version}")
    assert (libdir / "libcuda.so").readlink() == Path("libcuda.so.1")
    assert (libdir / "libnvidia-ml.so.1").readlink() == Path(f"libnvidia-ml.so.{driver.version}")


def test_permission_on_the_device_node_decides_visibility(driver: DriverInstall) -> None:
    """A process that cannot open /dev/nvidia1 sees one GPU, through nvidia-smi and CUDA; root sees both."""
    gpus = [(read_profile(PROFILE)[f"gpu.{i}.name"], read_profile(PROFILE)[f"gpu.{i}.uuid"]) for i in (0, 1)]
    devroot = driver.root.parent / "devroot"  # reachable by the unprivileged uid, unlike pytest's tmp_path
    (devroot / "dev").mkdir(parents=True)
    for path in (devroot, devroot / "dev"):
        path.chmod(0o755)
    for minor in (0, 1):
        node = devroot / "dev" / f"nvidia{minor}"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        node.chmod(0o666)  # mknod's mode is masked by the umask
    (devroot / "dev" / "nvidia1").chmod(0o000)
    smi = [str(driver.nvidia_smi), "-L"]
    probe = [str(driver.cuda_probe)]

    as_nobody = run_as(NOBODY, smi, driver, devroot)
    assert as_nobody.stdout.splitlines() == [f"GPU 0: {gpus[0][0]} (UUID: {gpus[0][1]})"], as_nobody.stderr
    seen = json.loads(run_as(NOBODY, probe, driver, devroot).stdout)
    assert [d["uuid"] for d in seen["devices"]] == [gpus[0][1]]

    as_root = run_as(0, smi, driver, devroot)  # root may open a mode-000 node, as with the real driver
    assert as_root.stdout.splitlines() == [f"GPU {i}: {n} (UUID: {u})" for i, (n, u) in enumerate(gpus)]
    assert json.loads(run_as(0, probe, driver, devroot).stdout)["device_count"] == 2
