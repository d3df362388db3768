"""The NVML probe for memory limits (kubelet_plugin/enforcement/probe.py) through the real pynvml against the
mock libnvidia-ml.so.1, and the mock's nvmlDeviceSetMemoryLimits_v1 itself (harness/mocknvml/mock_nvml_limits.c).

Each NVML run is a subprocess: the loader reads LD_LIBRARY_PATH at process start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[4]
PROFILE = REPO / "harness" / "mocknvml" / "profiles" / "gpu80x2.profile"
UUID0 = "GPU-e311ac15-7c36-5bd0-91a6-3dc862bb53b2"
UUID1 = "GPU-1d492704-49c3-5be7-977e-269165e18e2c"
MIB = 1048576


@pytest.fixture(scope="module")
def mock_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None:
        pytest.fail("no C compiler (cc): the mock NVML library cannot be built")
    out = tmp_path_factory.mktemp("mocknvml")
    subprocess.run([str(REPO / "harness/mocknvml/build.sh"), str(out)], check=True, capture_output=True, timeout=120)
    return out


def run(code: str, lib_dir: Path, profile: Path, *args: str, **env: str) -> Any:
    """The JSON `code` prints, run with `args` in a fresh interpreter on the mock at `lib_dir` with `profile`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_NVML")}
    environ.update(LD_LIBRARY_PATH=str(lib_dir), PYTHONPATH=str(REPO), FRACGPU_MOCK_NVML_PROFILE=str(profile), **env)
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


PROBE = f"""
import json
from kubelet_plugin.enforcement.probe import probe_nvml_limits
print(json.dumps({{u: p.problem for u, p in probe_nvml_limits([{UUID0!r}, {UUID1!r}]).items()}}))
"""

# Calls the mock's nvmlDeviceSetMemoryLimits_v1 as go-nvml does: a struct {const char *, u64 soft, u64 hard}.
SET = """
import ctypes, json, sys
import pynvml
class Limits(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong)]
pynvml.nvmlInit()
fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceSetMemoryLimits_v1")
out = []
for uuid, path, soft, hard in json.loads(sys.argv[1]):
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    out.append(fn(handle, ctypes.byref(Limits(path.encode(), soft, hard))))
print(json.dumps(out))
"""


def profile_with(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "test.profile"
    path.write_text(PROFILE.read_text() + "\n" + "\n".join(lines) + "\n")
    return path


def test_probe_finds_the_call_on_every_gpu(mock_build: Path) -> None:
    assert run(PROBE, mock_build, PROFILE) == {UUID0: None, UUID1: None}


def test_probe_per_gpu_not_supported(mock_build: Path, tmp_path: Path) -> None:
    result = run(PROBE, mock_build, profile_with(tmp_path, "gpu.1.memory_limits = not_supported"))
    assert result[UUID0] is None
    assert result[UUID1] == f"the driver says GPU {UUID1} does not support memory limits (nvmlDeviceSetMemoryLimits_v1)"


def test_probe_without_the_symbol(mock_build: Path) -> None:
    result = run(PROBE, mock_build / "without-memory-limits", PROFILE)
    expected = "the driver's libnvidia-ml.so.1 has no nvmlDeviceSetMemoryLimits_v1 (it came with driver r615)"
    assert result == {UUID0: expected, UUID1: expected}


def test_probe_records_nothing(mock_build: Path, tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    run(PROBE, mock_build, PROFILE, FRACGPU_MOCK_NVML_LIMITS_RECORD=str(record))
    assert not record.exists()  # the probe passes no limits: nothing was set


def test_set_limits_records_each_call(mock_build: Path, tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup" / "ctr"
    cgroup.mkdir(parents=True)
    record = tmp_path / "calls.jsonl"
    calls = [
        [UUID0, str(cgroup), 10240 * MIB, 10240 * MIB],  # ok
        [UUID1, str(tmp_path / "absent"), MIB, MIB],  # NVML_ERROR_OPERATING_SYSTEM: no such cgroup
        [UUID1, str(cgroup), 2 * MIB, MIB],  # soft above hard: invalid argument
        [UUID1, str(cgroup), MIB, 90000 * MIB],  # above the GPU's 81559 MiB
        [UUID1, str(cgroup), MIB, 2**64 - 1],  # NVML_DEVICE_MEMORY_LIMIT_MAX: no hard limit
    ]
    returns = run(SET, mock_build, PROFILE, json.dumps(calls), FRACGPU_MOCK_NVML_LIMITS_RECORD=str(record))
    assert returns == [0, 17, 2, 2, 0]
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert lines == [
        {"uuid": u, "cgroup": p, "soft": s, "hard": h, "return": r}
        for (u, p, s, h), r in zip(calls, [0, 17, 2, 2, 0], strict=True)
    ]


def test_record_path_from_the_profile(mock_build: Path, tmp_path: Path) -> None:
    """A process without the environment (an OCI hook) records where the profile says."""
    record = tmp_path / "from-profile.jsonl"
    profile = profile_with(tmp_path, f"memory_limits_record = {record}")
    calls = [[UUID0, str(tmp_path), MIB, MIB]]
    run(SET, mock_build, profile, json.dumps(calls))
    assert json.loads(record.read_text()) == {
        "uuid": UUID0,
        "cgroup": str(tmp_path),
        "soft": MIB,
        "hard": MIB,
        "return": 0,
    }


def test_profile_refuses_a_bad_memory_limits_value(mock_build: Path, tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_NVML")}
    environ.update(
        LD_LIBRARY_PATH=str(mock_build),
        FRACGPU_MOCK_NVML_PROFILE=str(profile_with(tmp_path, "gpu.0.memory_limits = maybe")),
    )
    code = "import pynvml\ntry:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as e:\n    print(e.value)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.stdout.strip() == "999"  # NVML_ERROR_UNKNOWN: malformed profile
    assert "memory_limits must be supported or not_supported" in proc.stderr
