"""GPU discovery through the real pynvml against the mock libnvidia-ml.so.1 (harness/mocknvml).

The library is built once per session; every NVML run happens in a subprocess because the dynamic
loader reads LD_LIBRARY_PATH only at process start.
"""

import ctypes.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.mocknvml import make_sysfs
from kubelet_plugin.publishing.discovery import normalise_pci_bus_id

REPO = Path(__file__).resolve().parents[4]
PROFILES = REPO / "harness" / "mocknvml" / "profiles"
MIB = 1048576
DRIVER = "580.65.06"

# Every symbol pynvml looks up for discovery, plus the versioned/unversioned variants we provide.
NEEDED_SYMBOLS = {
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
}

DISCOVER = """
import json
from kubelet_plugin.publishing.discovery import DiscoveryError, discover_gpus
try:
    gpus = discover_gpus()
except DiscoveryError as err:
    print(json.dumps({"error": str(err)}))
else:
    print(json.dumps({"gpus": [gpu.model_dump() for gpu in gpus]}))
"""

# Calls pynvml directly to check the NVML contract of the mock: error codes before and after init.
NVML_CONTRACT = """
import ctypes, json, pynvml

def code(fn, *args):
    try:
        fn(*args)
    except pynvml.NVMLError as err:
        return err.value
    return 0

out = {}
pynvml._LoadNvmlLibrary()  # load without initialising, as a caller that forgot nvmlInit would
lib = pynvml.nvmlLib
out["count_before_init"] = code(pynvml.nvmlDeviceGetCount)
out["handle_before_init"] = code(pynvml.nvmlDeviceGetHandleByIndex, 0)
out["driver_before_init"] = code(pynvml.nvmlSystemGetDriverVersion)
out["shutdown_before_init"] = code(pynvml.nvmlShutdown)
out["error_string_1"] = pynvml.nvmlErrorString(1)
pynvml.nvmlInit()
pynvml.nvmlInit()  # reference counted, like the real library
out["bad_index"] = code(pynvml.nvmlDeviceGetHandleByIndex, 99)
handle = pynvml.nvmlDeviceGetHandleByIndex(1)
out["memory_v2_total"] = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).total
out["memory_v2_bad_version"] = code(pynvml.nvmlDeviceGetMemoryInfo, handle, 0x01000028)
small = ctypes.create_string_buffer(8)
out["uuid_small_buffer"] = lib.nvmlDeviceGetUUID(handle, small, ctypes.c_uint(8))
out["bad_handle"] = lib.nvmlDeviceGetMinorNumber(ctypes.c_void_p(8), ctypes.byref(ctypes.c_uint()))
out["legacy_bus_id"] = pynvml.nvmlDeviceGetPciInfo(handle).busIdLegacy
out["bus_id"] = pynvml.nvmlDeviceGetPciInfo(handle).busId
out["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
out["by_uuid_index"] = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(handle)))
pynvml.nvmlShutdown()
out["count_still_initialised"] = pynvml.nvmlDeviceGetCount()
pynvml.nvmlShutdown()
out["count_after_shutdown"] = code(pynvml.nvmlDeviceGetCount)
out["second_shutdown"] = code(pynvml.nvmlShutdown)
print(json.dumps(out, default=bytes.decode))
"""


@pytest.fixture(scope="session")
def mock_lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding the freshly built mock libnvidia-ml.so.1."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on this machine: cannot build the mock NVML library")
    out = tmp_path_factory.mktemp("mocknvml")
    subprocess.run([str(REPO / "harness/mocknvml/build.sh"), str(out)], check=True, capture_output=True, timeout=60)
    assert (out / "libnvidia-ml.so.1").is_file()
    return out


def run_python(code: str, lib_dir: Path, profile: Path | None) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a fresh interpreter against the mock library; return its JSON output and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "FRACGPU_MOCK_NVML_PROFILE"}
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    env["PYTHONPATH"] = str(REPO)
    if profile is not None:
        env["FRACGPU_MOCK_NVML_PROFILE"] = str(profile)
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result, proc.stderr


def discover(lib_dir: Path, profile: Path | None) -> tuple[dict[str, Any], str]:
    return run_python(DISCOVER, lib_dir, profile)


def test_library_exports_what_pynvml_needs(mock_lib_dir: Path) -> None:
    if shutil.which("nm") is None:
        pytest.skip("no nm (binutils) on this machine")
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(mock_lib_dir / "libnvidia-ml.so.1")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    functions = {fields[2] for fields in (line.split() for line in out.splitlines()) if fields[1] == "T"}
    assert functions >= NEEDED_SYMBOLS, NEEDED_SYMBOLS - functions
    assert all(name.startswith("nvml") for name in functions), functions


H100X8_UUIDS = [
    "GPU-ba4495f0-43e6-53d7-b12c-a82819124276",
    "GPU-058c2c28-7299-5436-a1ab-6da30d23ece0",
    "GPU-74a171d4-d5ac-5a0a-b87e-03ba65d7f66a",
    "GPU-81722b19-93d2-5254-aa65-eb294c6efbbc",
    "GPU-3d91d840-a96e-5704-a80c-f83d3dddec56",
    "GPU-f02fae68-cdf7-5fc7-8590-e857ad9b9a4c",
    "GPU-afb25d2e-5fe9-5379-93cc-30e96483b6fc",
    "GPU-f5d82031-d4c0-5d44-9c6a-d3ec64174252",
]
H100X8_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def test_discovers_h100x8(mock_lib_dir: Path) -> None:
    result, _ = discover(mock_lib_dir, PROFILES / "h100x8.profile")
    gpus = result["gpus"]
    assert [g["uuid"] for g in gpus] == H100X8_UUIDS
    assert gpus == [
        {
            "index": i,
            "uuid": H100X8_UUIDS[i],
            "product_name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 81559 * MIB,
            "minor": i,
            "pci_bus_id": f"0000:{H100X8_BUSES[i]}:00.0",
            "architecture": "Hopper",
            "cuda_compute_capability": "9.0",
            "driver_version": DRIVER,
            "pcie_root": None,  # no sysfs asked for
            "numa_node": None,
        }
        for i in range(8)
    ]


def test_discovers_mixed(mock_lib_dir: Path) -> None:
    result, _ = discover(mock_lib_dir, PROFILES / "mixed.profile")
    fields = list(result["gpus"][0])  # GpuInfo field order
    rows = [tuple(gpu[field] for field in fields[:9]) for gpu in result["gpus"]]
    assert rows == [
        (0, "GPU-fcb87bd3-1909-5dd2-8f0a-7fb81345197d", "NVIDIA H100 80GB HBM3", 81559 * MIB, 0,
         "0000:18:00.0", "Hopper", "9.0", DRIVER),
        (1, "GPU-775e2cae-e862-51dd-9dae-a051f2ce1ece", "NVIDIA H100 80GB HBM3", 81559 * MIB, 1,
         "0000:2a:00.0", "Hopper", "9.0", DRIVER),
        (2, "GPU-3494b54e-aee5-534f-aa2d-ff9da8ec6faa", "NVIDIA A100-SXM4-40GB", 40960 * MIB, 2,
         "0000:3b:00.0", "Ampere", "8.0", DRIVER),
        (3, "GPU-889fdd3b-29ad-5c01-8e38-fde058a9f711", "NVIDIA L4", 23034 * MIB, 3,
         "0000:ca:00.0", "Ada Lovelace", "8.9", DRIVER),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "name", "mib", "count"),
    [
        ("a100x2.profile", "NVIDIA A100-SXM4-40GB", 40960, 2),
        ("gpu80x2.profile", "NVIDIA H100 80GB HBM3", 81559, 2),
    ],
)
def test_discovers_small_profiles(mock_lib_dir: Path, profile: str, name: str, mib: int, count: int) -> None:
    gpus = discover(mock_lib_dir, PROFILES / profile)[0]["gpus"]
    assert [(g["index"], g["minor"], g["product_name"], g["memory_total_bytes"]) for g in gpus] == [
        (i, i, name, mib * MIB) for i in range(count)
    ]
    assert len({g["uuid"] for g in gpus}) == len({g["pci_bus_id"] for g in gpus}) == count


def test_missing_profile_is_a_discovery_error(mock_lib_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.profile"
    result, stderr = discover(mock_lib_dir, missing)
    assert "NVML initialisation (nvmlInit) failed" in result["error"]
    assert "libnvidia-ml.so.1 not found" in result["error"]
    assert f"profile '{missing}'" in stderr
    assert "cannot open: No such file or directory" in stderr


def test_unset_profile_variable_is_named(mock_lib_dir: Path) -> None:
    result, stderr = discover(mock_lib_dir, None)
    assert "NVML initialisation (nvmlInit) failed" in result["error"]
    assert "FRACGPU_MOCK_NVML_PROFILE is not set" in stderr


GOOD_GPU = """driver_version = 580.65.06
gpu.0.uuid = GPU-00000000-0000-0000-0000-000000000001
gpu.0.name = NVIDIA H100 80GB HBM3
gpu.0.memory_mib = 81559
gpu.0.minor = 0
gpu.0.pci_bus_id = 0000:18:00.0
gpu.0.architecture = hopper
gpu.0.cuda_cc = 9.0
"""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (GOOD_GPU + "this is not a key value line\n", "line 9: expected 'key = value'"),
        (GOOD_GPU.replace("GPU-00000000", "GPU-zz"), "line 2: uuid must look like GPU-"),
        (GOOD_GPU.replace("0000:18:00.0", "18:00"), "line 6: pci_bus_id must look like"),
        (GOOD_GPU.replace("hopper", "fermi"), "line 7: architecture must be one of"),
        (GOOD_GPU + "gpu.1.uuid = GPU-00000000-0000-0000-0000-000000000002\n", "gpu.1 is incomplete"),
        (GOOD_GPU.replace("gpu.0.", "gpu.1."), "gpu.0 is incomplete"),
        (GOOD_GPU + GOOD_GPU.replace("gpu.0.", "gpu.1.").split("\n", 1)[1], "gpu.0 and gpu.1 have the same uuid"),
        (GOOD_GPU.replace("driver_version", "driver_versoin"), "line 1: unknown key"),
        (GOOD_GPU.split("\n", 1)[1], "driver_version is missing"),
        (GOOD_GPU + "gpu.0.pcie_root = 0000:17\n", "line 9: pcie_root must look like pci0000:17"),
        (GOOD_GPU + "gpu.0.numa_node = -2\n", "line 9: numa_node must be -1 (none) or a decimal integer"),
    ],
)
def test_malformed_profile_is_a_discovery_error(mock_lib_dir: Path, tmp_path: Path, text: str, problem: str) -> None:
    profile = tmp_path / "bad.profile"
    profile.write_text(text)
    result, stderr = discover(mock_lib_dir, profile)
    assert "NVML initialisation (nvmlInit) failed: Unknown Error (NVML error 999)" in result["error"]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"fracgpu mock NVML: profile '{profile}' (FRACGPU_MOCK_NVML_PROFILE)")
    assert problem in lines[0]


DISCOVER_WITH_SYSFS = """
import json, sys
from pathlib import Path
from kubelet_plugin.publishing.discovery import discover
found = discover((), Path(sys.argv[1]))
print(json.dumps({"gpus": [[g.pci_bus_id, g.pcie_root, g.numa_node] for g in found.gpus]}))
"""


def _more_gpu(index: int, bus: str, topology: str) -> str:
    """GOOD_GPU's lines as GPU `index` on PCI bus `bus`, with `topology`'s lines."""
    gpu = GOOD_GPU.split("\n", 1)[1].replace("gpu.0.", f"gpu.{index}.").replace("minor = 0", f"minor = {index}")
    return gpu.replace("0000:18:", f"0000:{bus}:").replace("000000000001", f"00000000000{index}") + topology


def test_discovery_reads_each_gpus_topology_from_the_driver_roots_sysfs(mock_lib_dir: Path, tmp_path: Path) -> None:
    """The sysfs the harness lays out for a profile (make_sysfs) is read back as the profile says: each GPU's PCIe
    root and NUMA node; a GPU absent from sysfs (here: its link removed) has neither."""
    profile = tmp_path / "topology.profile"
    profile.write_text(
        (PROFILES / "gpu80x2.profile").read_text()
        + _more_gpu(2, "9a", "gpu.2.pcie_root = pci0000:99\ngpu.2.numa_node = -1\n")
        + _more_gpu(3, "ab", "gpu.3.pcie_root = pci0000:aa\n")
    )
    sysfs = make_sysfs(tmp_path / "root", profile)
    (sysfs / "bus/pci/devices/0000:ab:00.0").unlink()
    env_code = f"import sys; sys.argv = ['x', {str(sysfs)!r}]\n" + DISCOVER_WITH_SYSFS
    result, _ = run_python(env_code, mock_lib_dir, profile)
    assert result["gpus"] == [
        ["0000:18:00.0", "pci0000:17", 0],
        ["0000:2a:00.0", "pci0000:29", 1],
        ["0000:9a:00.0", "pci0000:99", None],  # numa_node -1: no NUMA affinity
        ["0000:ab:00.0", None, None],
    ]


def test_good_profile_fixture_is_valid(mock_lib_dir: Path, tmp_path: Path) -> None:
    profile = tmp_path / "good.profile"
    profile.write_text(GOOD_GPU)
    result, stderr = discover(mock_lib_dir, profile)
    assert [g["uuid"] for g in result["gpus"]] == ["GPU-00000000-0000-0000-0000-000000000001"]
    assert stderr == ""


def test_no_library_at_all(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    result, _ = discover(tmp_path, PROFILES / "h100x8.profile")
    assert "NVML Shared Library Not Found" in result["error"]
    assert "is the NVIDIA driver installed and is the driver root mounted" in result["error"]


def test_nvml_contract(mock_lib_dir: Path) -> None:
    out, _ = run_python(NVML_CONTRACT, mock_lib_dir, PROFILES / "mixed.profile")
    assert out == {
        "count_before_init": 1,  # NVML_ERROR_UNINITIALIZED
        "handle_before_init": 1,
        "driver_before_init": 1,
        "shutdown_before_init": 1,
        "error_string_1": "Uninitialized",
        "bad_index": 2,  # NVML_ERROR_INVALID_ARGUMENT
        "memory_v2_total": 81559 * MIB,
        "memory_v2_bad_version": 25,  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        "uuid_small_buffer": 7,  # NVML_ERROR_INSUFFICIENT_SIZE
        "bad_handle": 2,
        "legacy_bus_id": "0000:2A:00.0",
        "bus_id": "00000000:2A:00.0",
        "cuda_driver_version": 13000,
        "by_uuid_index": 1,
        "count_still_initialised": 4,
        "count_after_shutdown": 1,
        "second_shutdown": 1,
    }


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("00000000:17:00.0", "0000:17:00.0"),
        ("00000000:AB:1F.7", "0000:ab:1f.7"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("00010000:01:00.0", "10000:01:00.0"),
    ],
)
def test_normalise_pci_bus_id(raw: str, normal: str) -> None:
    assert normalise_pci_bus_id(raw) == normal


@pytest.mark.parametrize("raw", ["", "17:00.0", "0000:17:00", "0000:17:00.8", "000000000:17:00.0"])
def test_normalise_pci_bus_id_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalise_pci_bus_id(raw)
