"""The mock driver beyond NVML: libcuda, nvidia-smi, the CUDA probe, and the fake driver installation.

Every run happens in a subprocess (the loader reads LD_LIBRARY_PATH at start, and each process gets its own
driver state). Device nodes are plain files here: a missing node is one the process cannot open, which needs
no privileges; permission bits and real character devices are covered in tests/integration.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.mocknvml import PROFILES, read_profile
from harness.mocknvml.driver_root import LIBDIR, DriverInstall, build_driver, driver_version, install_driver

REPO = Path(__file__).resolve().parents[3]
TWO = PROFILES / "gpu80x2.profile"
MIXED = PROFILES / "mixed.profile"
MIB = 1048576

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc): cannot build the mocks")

# The CUDA driver API contract, called through ctypes exactly as a C program would through dlsym.
CUDA_CONTRACT = """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
out = {}
n, dev, ctx = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
free, total, ptr = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_ulonglong()
out["count_before_init"] = cu.cuDeviceGetCount(ctypes.byref(n))
out["get_before_init"] = cu.cuDeviceGet(ctypes.byref(dev), 0)
out["driver_version_before_init"] = [cu.cuDriverGetVersion(ctypes.byref(n)), n.value]
out["init_bad_flags"] = cu.cuInit(1)
out["init"] = cu.cuInit(0)
out["count"] = [cu.cuDeviceGetCount(ctypes.byref(n)), n.value]
out["get_bad_ordinal"] = cu.cuDeviceGet(ctypes.byref(dev), 99)
name = ctypes.create_string_buffer(8)
out["name_truncated"] = [cu.cuDeviceGetName(name, 8, 1), name.value.decode()]
uuid = ctypes.create_string_buffer(16)
out["uuid"] = [cu.cuDeviceGetUuid(uuid, 1), uuid.raw.hex()]
out["alloc_without_context"] = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(MIB))
out["info_without_context"] = cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["ctx_create"] = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 1)
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["info_fresh"] = [free.value, total.value]
out["alloc_zero"] = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(0))
out["alloc_too_much"] = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(total.value + 1))
first, second = ctypes.c_ulonglong(), ctypes.c_ulonglong()
out["alloc_1g"] = cu.cuMemAlloc_v2(ctypes.byref(first), ctypes.c_size_t(1024 * MIB))
out["alloc_rest"] = cu.cuMemAlloc_v2(ctypes.byref(second), ctypes.c_size_t(total.value - 1024 * MIB))
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["free_when_full"] = free.value
out["alloc_when_full"] = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1))
out["free_1g"] = cu.cuMemFree_v2(first)
out["free_again"] = cu.cuMemFree_v2(first)
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["free_after_free"] = free.value
out["ctx_destroy"] = cu.cuCtxDestroy_v2(ctx)
out["info_after_destroy"] = cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["ctx_create_again"] = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 1)
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["free_in_new_context"] = free.value
text = ctypes.c_char_p()
cu.cuGetErrorName(2, ctypes.byref(text))
out["error_name_2"] = text.value.decode()
print(json.dumps(out))
""".replace("MIB", str(MIB))

# What pynvml (the production discovery path) enumerates.
NVML_LIST = """
import json, pynvml
pynvml.nvmlInit()
gpus = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    gpus.append({"uuid": pynvml.nvmlDeviceGetUUID(h), "minor": pynvml.nvmlDeviceGetMinorNumber(h)})
print(json.dumps(gpus))
"""


@pytest.fixture(scope="module")
def dev_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The development build (profile from FRACGPU_MOCK_NVML_PROFILE)."""
    out = tmp_path_factory.mktemp("mockdriver")
    subprocess.run(
        ["bash", str(REPO / "harness/mocknvml/build.sh"), str(out)], check=True, capture_output=True, timeout=120
    )
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> DriverInstall:
    """A fake driver root for the two-GPU profile, without device nodes."""
    base = tmp_path_factory.mktemp("driverroot")
    return install_driver(base / "root", TWO, base / "build")


def gpus_of(profile: Path) -> list[dict[str, str]]:
    """The profile's GPUs in index order: name, uuid, memory_mib, minor."""
    values = read_profile(profile)
    count = len({k.split(".")[1] for k in values if k.startswith("gpu.")})
    fields = ("name", "uuid", "memory_mib", "minor")
    return [{f: values[f"gpu.{i}.{f}"] for f in fields} for i in range(count)]


def dev_root(base: Path, minors: list[int]) -> Path:
    """A device root whose dev/ holds nvidia<minor> (plain files) for the given minors only."""
    (base / "dev").mkdir(parents=True, exist_ok=True)
    for minor in minors:
        (base / "dev" / f"nvidia{minor}").write_bytes(b"")
    return base


def run(
    argv: list[str], lib_dir: Path, *, profile: Path | None = None, devroot: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run argv with only lib_dir on the loader path and only the given mock settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_")}
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    env["PYTHONPATH"] = str(REPO)
    if profile is not None:
        env["FRACGPU_MOCK_NVML_PROFILE"] = str(profile)
    if devroot is not None:
        env["FRACGPU_MOCK_NVML_DEV_ROOT"] = str(devroot)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


def probe(build: Path, lib_dir: Path, *args: str, **kw: Any) -> dict[str, Any]:
    proc = run([str(build / "cuda-probe"), *args], lib_dir, **kw)
    result: dict[str, Any] = json.loads(proc.stdout)
    result["exit"] = proc.returncode
    return result


def test_nvidia_smi_list_uses_the_real_format(dev_build: Path) -> None:
    proc = run([str(dev_build / "nvidia-smi"), "-L"], dev_build, profile=MIXED)
    assert proc.returncode == 0, proc.stderr
    expected = [f"GPU {i}: {g['name']} (UUID: {g['uuid']})" for i, g in enumerate(gpus_of(MIXED))]
    assert proc.stdout.splitlines() == expected


def test_nvidia_smi_query_gpu_csv(dev_build: Path) -> None:
    smi = str(dev_build / "nvidia-smi")
    plain = run([smi, "--query-gpu=uuid,name,memory.total", "--format=csv,noheader"], dev_build, profile=MIXED)
    assert plain.stdout.splitlines() == [f"{g['uuid']}, {g['name']}, {g['memory_mib']} MiB" for g in gpus_of(MIXED)]
    headed = run([smi, "--query-gpu=index,memory.free", "--format=csv,nounits"], dev_build, profile=MIXED)
    assert headed.stdout.splitlines()[:2] == ["index, memory.free [MiB]", f"0, {gpus_of(MIXED)[0]['memory_mib']}"]
    bad = run([smi, "--query-gpu=uuid,temperature.gpu", "--format=csv"], dev_build, profile=MIXED)
    assert bad.returncode == 2
    assert '"temperature.gpu" is not a valid field' in bad.stderr


def test_nvidia_smi_table_shows_driver_and_memory(dev_build: Path) -> None:
    proc = run([str(dev_build / "nvidia-smi")], dev_build, profile=TWO)
    assert proc.returncode == 0, proc.stderr
    assert "Driver Version: 580.65.06" in proc.stdout
    assert "CUDA Version: 13.0" in proc.stdout
    assert proc.stdout.count(f"0MiB / {gpus_of(TWO)[0]['memory_mib']}MiB") == 2


def test_nvidia_smi_without_nvml_says_so(dev_build: Path, tmp_path: Path) -> None:
    alone = tmp_path / "bin"
    alone.mkdir()
    shutil.copy2(dev_build / "nvidia-smi", alone / "nvidia-smi")
    if run(["ldconfig", "-p"], alone).stdout.count("libnvidia-ml.so.1"):
        pytest.skip("this machine has a real libnvidia-ml.so.1 in its loader cache")
    proc = run([str(alone / "nvidia-smi"), "-L"], alone, profile=TWO)
    assert proc.returncode == 12
    assert "couldn't find libnvidia-ml.so" in proc.stderr


def test_probe_agrees_with_the_profile(dev_build: Path) -> None:
    result = probe(dev_build, dev_build, profile=MIXED)
    assert result["exit"] == 0
    assert result["driver_version"] == int(read_profile(MIXED)["cuda_driver_version"])
    seen = [(d["name"], d["uuid"], d["total_mib"], d["free_mib"]) for d in result["devices"]]
    assert seen == [(g["name"], g["uuid"], int(g["memory_mib"]), int(g["memory_mib"])) for g in gpus_of(MIXED)]


def test_probe_allocation_is_reflected_in_free_memory(dev_build: Path) -> None:
    total = int(gpus_of(TWO)[0]["memory_mib"])
    ok = probe(dev_build, dev_build, "1024", profile=TWO)["alloc"]
    assert ok == {"mib": 1024, "result": "CUDA_SUCCESS", "free_mib_before": total, "free_mib_after": total - 1024}
    too_much = probe(dev_build, dev_build, str(total + 1), profile=TWO)["alloc"]
    assert too_much["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert too_much["free_mib_after"] == too_much["free_mib_before"] == total


def test_cuda_driver_api_contract(dev_build: Path) -> None:
    proc = run([sys.executable, "-c", CUDA_CONTRACT], dev_build, profile=MIXED)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    total = int(gpus_of(MIXED)[1]["memory_mib"]) * MIB
    assert out["count_before_init"] == out["get_before_init"] == 3  # CUDA_ERROR_NOT_INITIALIZED
    assert out["driver_version_before_init"] == [0, 13000]
    assert out["init_bad_flags"] == 1  # CUDA_ERROR_INVALID_VALUE
    assert out["init"] == 0
    assert out["count"] == [0, 4]
    assert out["get_bad_ordinal"] == 101  # CUDA_ERROR_INVALID_DEVICE
    assert out["name_truncated"] == [0, "NVIDIA "]
    assert out["uuid"] == [0, gpus_of(MIXED)[1]["uuid"].removeprefix("GPU-").replace("-", "")]
    assert out["alloc_without_context"] == out["info_without_context"] == 201  # CUDA_ERROR_INVALID_CONTEXT
    assert out["ctx_create"] == 0
    assert out["info_fresh"] == [total, total]
    assert out["alloc_zero"] == 1
    assert out["alloc_too_much"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert out["alloc_1g"] == out["alloc_rest"] == 0
    assert out["free_when_full"] == 0
    assert out["alloc_when_full"] == 2
    assert out["free_1g"] == 0
    assert out["free_again"] == 1  # not a live allocation any more
    assert out["free_after_free"] == 1024 * MIB
    assert out["ctx_destroy"] == 0
    assert out["info_after_destroy"] == 201  # the destroyed context was current; none is now
    assert out["ctx_create_again"] == 0
    assert out["free_in_new_context"] == total  # destroying the context released its allocations
    assert out["error_name_2"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_only_gpus_whose_device_node_opens_are_enumerated(dev_build: Path, tmp_path: Path) -> None:
    """A process that cannot open /dev/nvidia1 sees one GPU, through NVML, nvidia-smi and CUDA alike."""
    gpus = gpus_of(TWO)
    only0 = dev_root(tmp_path / "only0", [0])
    smi = run([str(dev_build / "nvidia-smi"), "-L"], dev_build, profile=TWO, devroot=only0)
    assert smi.stdout.splitlines() == [f"GPU 0: {gpus[0]['name']} (UUID: {gpus[0]['uuid']})"]
    assert [d["uuid"] for d in probe(dev_build, dev_build, profile=TWO, devroot=only0)["devices"]] == [gpus[0]["uuid"]]
    # Hiding GPU 0 instead: the other one is now index 0, keeping its own minor and UUID.
    only1 = dev_root(tmp_path / "only1", [1])
    nvml = run([sys.executable, "-c", NVML_LIST], dev_build, profile=TWO, devroot=only1)
    assert json.loads(nvml.stdout) == [{"uuid": gpus[1]["uuid"], "minor": 1}], nvml.stderr
    both = dev_root(tmp_path / "both", [0, 1])
    assert len(probe(dev_build, dev_build, profile=TWO, devroot=both)["devices"]) == 2


def test_no_openable_gpu_means_no_device(dev_build: Path, tmp_path: Path) -> None:
    empty = dev_root(tmp_path / "none", [])
    result = probe(dev_build, dev_build, profile=TWO, devroot=empty)
    assert (result["exit"], result["error"], result["result"]) == (1, "cuInit", "CUDA_ERROR_NO_DEVICE")
    smi = run([str(dev_build / "nvidia-smi"), "-L"], dev_build, profile=TWO, devroot=empty)
    assert (smi.returncode, smi.stdout) == (6, "No devices were found\n")


def test_installed_driver_layout(installed: DriverInstall) -> None:
    version = driver_version(TWO)
    assert installed.version == version
    libdir = installed.root / LIBDIR
    assert installed.libdir == libdir
    for lib, soname in (("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1")):
        real = libdir / f"{lib}.so.{version}"
        assert real.read_bytes()[:4] == b"\x7fELF"
        assert not real.is_symlink()
        assert (libdir / soname).readlink() == Path(real.name)
    assert (libdir / "libnvidia-ptxjitcompiler.so.1").resolve().name == f"libnvidia-ptxjitcompiler.so.{version}"
    assert installed.nvidia_smi == installed.root / "usr/bin/nvidia-smi"
    assert installed.nvidia_smi.read_bytes()[:4] == b"\x7fELF"
    assert (installed.root / f"lib/firmware/nvidia/{version}/gsp_ga10x.bin").is_file()


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
def test_installed_libraries_have_real_sonames_and_need_only_libc(installed: DriverInstall) -> None:
    glibc = {"libc.so.6", "ld-linux-x86-64.so.2"}  # the loader itself is needed for thread-local storage
    for path in [*sorted(installed.libdir.glob(f"*.so.{installed.version}")), installed.nvidia_smi]:
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
        assert set(needed) <= glibc, (path, needed)
        if path.name.startswith(("libcuda.", "libnvidia-ml.")):
            assert f"Library soname: [{path.name.split('.so.')[0]}.so.1]" in dynamic


def test_installed_driver_carries_its_profile(installed: DriverInstall, tmp_path: Path) -> None:
    """No FRACGPU_MOCK_NVML_PROFILE needed: the compiled-in profile answers, filtered by device nodes."""
    gpus = gpus_of(TWO)
    both = dev_root(tmp_path / "both", [0, 1])
    smi = run([str(installed.nvidia_smi), "-L"], installed.libdir, devroot=both)
    assert smi.stdout.splitlines() == [f"GPU {i}: {g['name']} (UUID: {g['uuid']})" for i, g in enumerate(gpus)]
    seen = probe(installed.cuda_probe.parent, installed.libdir, devroot=both)["devices"]
    assert [d["uuid"] for d in seen] == [g["uuid"] for g in gpus]
    only1 = dev_root(tmp_path / "only1", [1])
    assert [d["uuid"] for d in probe(installed.cuda_probe.parent, installed.libdir, devroot=only1)["devices"]] == [
        gpus[1]["uuid"]
    ]
    # The environment still wins over the compiled-in profile (for development).
    other = run([str(installed.nvidia_smi), "-L"], installed.libdir, profile=MIXED, devroot=dev_root(tmp_path, [0]))
    assert other.stdout.splitlines() == [f"GPU 0: {gpus_of(MIXED)[0]['name']} (UUID: {gpus_of(MIXED)[0]['uuid']})"]


def test_installed_driver_defaults_to_the_real_dev(installed: DriverInstall) -> None:
    """Without FRACGPU_MOCK_NVML_DEV_ROOT the libraries open /dev/nvidia<minor>, as inside a container."""
    if any(Path(f"/dev/nvidia{g['minor']}").exists() for g in gpus_of(TWO)):
        pytest.skip("this machine has /dev/nvidia device nodes")
    smi = run([str(installed.nvidia_smi), "-L"], installed.libdir)
    assert (smi.returncode, smi.stdout) == (6, "No devices were found\n")


def test_profile_without_driver_version_is_refused(tmp_path: Path) -> None:
    profile = tmp_path / "bad.profile"
    profile.write_text("gpu.0.name = x\n")
    with pytest.raises(ValueError, match=r"bad\.profile has no driver_version"):
        driver_version(profile)


def test_unreadable_profile_fails_the_build_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"cannot read profile '.*missing\.profile'"):
        build_driver(tmp_path / "missing.profile", tmp_path / "out")
