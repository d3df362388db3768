"""Per-process GPU memory through the real pynvml against the mock libnvidia-ml.so.1 (its control file).

Each NVML run is a subprocess: the dynamic loader reads LD_LIBRARY_PATH only at process start.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import mocknvml

REPO = Path(__file__).resolve().parents[4]
MOCK = REPO / "harness" / "mocknvml"
PROFILE = MOCK / "profiles" / "gpu80x2.profile"
GPU0 = "GPU-e311ac15-7c36-5bd0-91a6-3dc862bb53b2"
GPU1 = "GPU-1d492704-49c3-5be7-977e-269165e18e2c"

SAMPLE = """
import json
from kubelet_plugin.publishing.discovery import discover_gpus
from kubelet_plugin.usage.nvml import NvmlProcesses, SampleError
nvml = NvmlProcesses(discover_gpus())
out = []
for _ in range(2):  # NVML stays initialised between samples
    try:
        processes, failed = nvml.sample()
    except SampleError as err:
        out.append({"reason": err.reason, "error": str(err)})
    else:
        out.append({"processes": [p.model_dump() for p in processes], "failed": failed})
print(json.dumps(out))
"""

CONTRACT = """
import ctypes, json, pynvml
pynvml.nvmlInit()
lib = pynvml.nvmlLib
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {}
for name, struct in (("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.c_nvmlProcessInfo_v3_t),
                     ("nvmlDeviceGetComputeRunningProcesses_v2", pynvml.c_nvmlProcessInfo_v2_t)):
    fn = getattr(lib, name)
    count = ctypes.c_uint(0)
    first = fn(h, ctypes.byref(count), None)
    arr = (struct * 1)()
    one = ctypes.c_uint(1)
    small = fn(h, ctypes.byref(one), arr)
    arr = (struct * 4)()
    four = ctypes.c_uint(4)
    ok = fn(h, ctypes.byref(four), arr)
    out[name] = [first, count.value, small, one.value, ok, four.value,
                 [(arr[i].pid, arr[i].usedGpuMemory, arr[i].gpuInstanceId) for i in range(four.value)]]

class V1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
arr = (V1 * 4)()
n = ctypes.c_uint(4)
ret = lib.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(n), arr)
out["v1"] = [ret, n.value, [(arr[i].pid, arr[i].usedGpuMemory) for i in range(n.value)]]
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on this machine: cannot build the mock NVML library")
    root = tmp_path_factory.mktemp("usage-nvml")
    return {
        "with": mocknvml.build_nvml_variant(root / "with"),
        "without": mocknvml.build_nvml_variant(root / "without", "-DMOCK_NO_RUNNING_PROCESSES"),
    }


def _run(lib: Path, script: str, control: Path | None) -> Any:
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "FRACGPU_MOCK_NVML_PROFILE": str(PROFILE)}
    env.pop("FRACGPU_MOCK_NVML_PROCESSES", None)
    if control is not None:
        env["FRACGPU_MOCK_NVML_PROCESSES"] = str(control)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_processes_from_the_control_file(libs: dict[str, Path], tmp_path: Path) -> None:
    control = tmp_path / "processes"
    control.write_text(
        f"# pid bytes per GPU\n{GPU0} 4242 1073741824\n{GPU0} 4343 5\n  {GPU1} 77 2147483648\n"
        "GPU-not-on-this-node 1 1\nnot a line\n"
    )
    (samples, stderr) = _run(libs["with"], SAMPLE, control)
    expected = {
        "processes": [
            {"gpu_uuid": GPU0, "pid": 4242, "used_bytes": 1 << 30},
            {"gpu_uuid": GPU0, "pid": 4343, "used_bytes": 5},
            {"gpu_uuid": GPU1, "pid": 77, "used_bytes": 2 << 30},
        ],
        "failed": {},
    }
    assert samples == [expected, expected]
    assert "skipping malformed line: not a line" in stderr


def test_no_control_file_means_no_processes(libs: dict[str, Path], tmp_path: Path) -> None:
    assert _run(libs["with"], SAMPLE, None)[0][0] == {"processes": [], "failed": {}}
    assert _run(libs["with"], SAMPLE, tmp_path / "absent")[0][0] == {"processes": [], "failed": {}}


def test_a_failing_gpu_is_reported_alone(libs: dict[str, Path], tmp_path: Path) -> None:
    control = tmp_path / "processes"
    control.write_text(f"{GPU0} error 999\n{GPU1} 77 1024\n")
    (first, _), _ = _run(libs["with"], SAMPLE, control)
    assert first == {
        "processes": [{"gpu_uuid": GPU1, "pid": 77, "used_bytes": 1024}],
        "failed": {GPU0: "Unknown Error"},
    }


def test_nvml_without_the_call(libs: dict[str, Path]) -> None:
    (samples, _) = _run(libs["without"], SAMPLE, None)
    assert [s["reason"] for s in samples] == ["function_not_found", "function_not_found"]
    assert "has no nvmlDeviceGetComputeRunningProcesses" in samples[0]["error"]


def test_the_calls_follow_nvmls_size_contract(libs: dict[str, Path], tmp_path: Path) -> None:
    control = tmp_path / "processes"
    control.write_text(f"{GPU0} 10 100\n{GPU0} 11 200\n")
    (out, _) = _run(libs["with"], CONTRACT, control)
    insufficient, success = 7, 0
    for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
        assert out[name] == [
            insufficient,
            2,
            insufficient,
            2,
            success,
            2,
            [[10, 100, 0xFFFFFFFF], [11, 200, 0xFFFFFFFF]],
        ]
    assert out["v1"] == [success, 2, [[10, 100], [11, 200]]]
