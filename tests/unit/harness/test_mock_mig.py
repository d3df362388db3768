"""The mock driver's MIG (harness/mocknvml/mock_mig.h) against the real pynvml and the CUDA probe: the profiles and
placements of NVIDIA's tables, the driver's error codes, instance ids, capability minors and MIG UUIDs, state
shared by every process of a state dir, and what a process given one partition's capability nodes sees.

Each run is a subprocess (the loader reads LD_LIBRARY_PATH at start; each process has its own driver state).
Device nodes are plain files (a missing one is one the process cannot open), which needs no privileges."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.mocknvml import PROFILES

REPO = Path(__file__).resolve().parents[3]
PROFILE = PROFILES / "mig-products.profile"

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc): cannot build the mocks")

# (GPU index in PROFILE, product) -> [(profile, id, memory MiB, SMs, instances, placement starts)] as NVIDIA's
# `nvidia-smi mig -lgip` lists them (memory = the GiB it prints * 1024).
TABLES = {
    0: [("1g.10gb", 19, 9984, 16, 7, [0, 1, 2, 3, 4, 5, 6]), ("2g.20gb", 14, 20096, 32, 3, [0, 2, 4]),
        ("3g.40gb", 9, 40448, 60, 2, [0, 4]), ("4g.40gb", 5, 40448, 64, 1, [0]), ("7g.80gb", 0, 81152, 132, 1, [0]),
        ("1g.10gb+me", 20, 9984, 16, 1, [0, 1, 2, 3, 4, 5, 6]), ("1g.20gb", 15, 20096, 26, 4, [0, 2, 4, 6])],
    1: [("1g.5gb", 19, 4864, 14, 7, [0, 1, 2, 3, 4, 5, 6]), ("2g.10gb", 14, 9984, 28, 3, [0, 2, 4]),
        ("3g.20gb", 9, 20096, 42, 2, [0, 4]), ("4g.20gb", 5, 20096, 56, 1, [0]), ("7g.40gb", 0, 40448, 98, 1, [0]),
        ("1g.5gb+me", 20, 4864, 14, 1, [0, 1, 2, 3, 4, 5, 6]), ("1g.10gb", 15, 9984, 14, 4, [0, 2, 4, 6])],
    2: [("1g.10gb", 19, 9728, 14, 7, [0, 1, 2, 3, 4, 5, 6]), ("2g.20gb", 14, 19968, 28, 3, [0, 2, 4]),
        ("3g.40gb", 9, 40192, 42, 2, [0, 4]), ("4g.40gb", 5, 40192, 56, 1, [0]), ("7g.80gb", 0, 80896, 98, 1, [0]),
        ("1g.10gb+me", 20, 9728, 14, 1, [0, 1, 2, 3, 4, 5, 6]), ("1g.20gb", 15, 19968, 14, 4, [0, 2, 4, 6])],
    3: [("1g.18gb", 19, 16384, 16, 7, [0, 1, 2, 3, 4, 5, 6]), ("2g.35gb", 14, 33280, 32, 3, [0, 2, 4]),
        ("3g.71gb", 9, 66816, 60, 2, [0, 4]), ("4g.71gb", 5, 66816, 64, 1, [0]), ("7g.141gb", 0, 143360, 132, 1, [0]),
        ("1g.18gb+me", 20, 16384, 16, 1, [0, 1, 2, 3, 4, 5, 6]), ("1g.35gb", 15, 33280, 26, 4, [0, 2, 4, 6])],
}  # fmt: skip

HELPERS = """
import ctypes, json, sys, pynvml as n
def code(fn, *args):
    try:
        fn(*args)
    except n.NVMLError as err:
        return err.value
    return 0
def placement(start, size):
    p = n.c_nvmlGpuInstancePlacement_t(); p.start, p.size = start, size
    return ctypes.byref(p)
n.nvmlInit()
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mockmig")
    subprocess.run(
        ["bash", str(REPO / "harness/mocknvml/build.sh"), str(out)], check=True, capture_output=True, timeout=180
    )
    return out


def run(build: Path, code: str, *, state: Path | None = None, devroot: Path | None = None,
        processes: Path | None = None) -> Any:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_")}
    env |= {"LD_LIBRARY_PATH": str(build), "PYTHONPATH": str(REPO), "FRACGPU_MOCK_NVML_PROFILE": str(PROFILE)}
    for key, value in (("STATE_DIR", state), ("DEV_ROOT", devroot), ("PROCESSES", processes)):
        if value is not None:
            env[f"FRACGPU_MOCK_NVML_{key}"] = str(value)
    done = subprocess.run([sys.executable, "-c", HELPERS + textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def cap(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    return 3 + 135 * gpu_minor + 9 * gi + (0 if ci is None else 1 + ci)


def test_profiles_and_placements_are_nvidias(build: Path) -> None:
    found = run(
        build,
        """
        out = {}
        for i in range(4):
            h = n.nvmlDeviceGetHandleByIndex(i)
            rows = []
            for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    p = n.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
                except n.NVMLError as err:
                    assert err.value in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_INVALID_ARGUMENT), err
                    continue
                arr = (n.c_nvmlGpuInstancePlacement_t * 8)(); count = ctypes.c_uint(8)
                n.nvmlDeviceGetGpuInstancePossiblePlacements(h, p.id, arr, ctypes.byref(count))
                rows.append([p.name.removeprefix("MIG "), p.id, p.memorySizeMB, p.multiprocessorCount,
                             p.instanceCount, [arr[k].start for k in range(count.value)]])
            out[i] = rows
        print(json.dumps(out))
    """,
    )
    for index, rows in TABLES.items():
        assert [tuple(r) for r in found[str(index)]] == [(*r[:5], r[5]) for r in rows], index


def test_mig_mode_and_what_a_gpu_without_it_answers(build: Path) -> None:
    found = run(
        build,
        """
        h = [n.nvmlDeviceGetHandleByIndex(i) for i in (0, 4, 5)]
        out = {"enabled": n.nvmlDeviceGetMigMode(h[0]), "pending": n.nvmlDeviceGetMigMode(h[1]),
               "l4": code(n.nvmlDeviceGetMigMode, h[2]),
               "profiles_while_pending": code(n.nvmlDeviceGetGpuInstanceProfileInfo, h[1], 0),
               "create_while_pending": code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h[1], 19, placement(0, 1))}
        print(json.dumps(out))
    """,
    )
    assert found == {"enabled": [1, 1], "pending": [0, 1], "l4": 3, "profiles_while_pending": 3,
                     "create_while_pending": 3}  # fmt: skip


def test_create_and_destroy_answer_the_drivers_error_codes(build: Path, tmp_path: Path) -> None:
    processes = tmp_path / "processes"
    found = run(
        build,
        """
        import os
        h = n.nvmlDeviceGetHandleByIndex(0)
        out = {}
        out["bad_placement"] = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 19, placement(7, 1))
        out["bad_size"] = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 14, placement(0, 1))
        out["unknown_profile"] = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 99, placement(0, 1))
        big = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, placement(4, 4))
        out["overlap"] = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 19, placement(5, 1))
        small = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, placement(0, 2))
        out["compute_exceeded"] = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 5, placement(0, 4))
        out["ci_too_big"] = code(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, small, 4, 0)
        out["ci_8_slice"] = code(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, big, 5, 0)
        out["ci_index_past_count"] = code(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, big, 9, 0)
        ci = n.nvmlGpuInstanceCreateComputeInstance(big, 2)
        out["gi_with_ci"] = code(n.nvmlGpuInstanceDestroy, big)
        mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        open(os.environ["PROCS"], "w").write(n.nvmlDeviceGetUUID(mig) + " 4242 1048576\\n")
        out["ci_in_use"] = code(n.nvmlComputeInstanceDestroy, ci)
        open(os.environ["PROCS"], "w").write("")
        out["ci_free"] = code(n.nvmlComputeInstanceDestroy, ci)
        out["gi_free"] = code(n.nvmlGpuInstanceDestroy, big)
        out["stale_handle"] = code(n.nvmlGpuInstanceGetInfo, big)
        print(json.dumps(out))
    """.replace('os.environ["PROCS"]', repr(str(processes))),
        processes=processes,
    )
    assert found == {
        "bad_placement": 2, "bad_size": 2, "unknown_profile": 2, "overlap": 23, "compute_exceeded": 23,
        "ci_too_big": 3, "ci_8_slice": 3, "ci_index_past_count": 2, "gi_with_ci": 19, "ci_in_use": 19,
        "ci_free": 0, "gi_free": 0, "stale_handle": 2,
    }  # fmt: skip


def test_ids_cap_minors_and_uuids_and_state_shared_through_the_state_dir(build: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    made = run(
        build,
        """
        h = n.nvmlDeviceGetHandleByIndex(0)
        out = []
        for pid, start, size, ci_profile in ((19, 6, 1, 0), (14, 2, 2, 1)):
            gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, placement(start, size))
            ci = n.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
            out.append([n.nvmlGpuInstanceGetInfo(gi).id, n.nvmlComputeInstanceGetInfo(ci).id])
        print(json.dumps(out))
    """,
        state=state,
    )
    assert made == [[9, 0], [6, 0]], "ids of the (start, size) blocks, upper half first: 1 at 6 -> 9, 2 at 2 -> 6"
    seen = run(
        build,
        """
        h = n.nvmlDeviceGetHandleByIndex(0)
        devices = []
        for i in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError:
                break
            devices.append([n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m), n.nvmlDeviceGetUUID(m),
                            n.nvmlDeviceGetName(m), n.nvmlDeviceGetMemoryInfo(m).total >> 20])
        print(json.dumps(devices))
    """,
        state=state,
    )
    assert [d[:2] for d in seen] == [[6, 0], [9, 0]], "another process sees the same instances"
    assert seen[0][3:] == ["NVIDIA H100 80GB HBM3 MIG 2g.20gb", 20096]
    assert all(d[2].startswith("MIG-") and len(d[2]) == 40 for d in seen) and seen[0][2] != seen[1][2]
    again = run(
        build,
        """
        h = n.nvmlDeviceGetHandleByIndex(0)
        gi = n.nvmlDeviceGetGpuInstanceById(h, 9)
        n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, 0)); n.nvmlGpuInstanceDestroy(gi)
        gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, placement(6, 1)); n.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        print(json.dumps(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(h, 1))))
    """,
        state=state,
    )
    assert again != seen[1][2], "a re-created instance is another MIG device"
    assert cap(0, 9) == 84 and cap(0, 9, 0) == 85, "gpu0/gi9/access is 3 + 9 * 9"


def devroot_with(tmp_path: Path, caps: list[int], gpu_minors: tuple[int, ...] = (0,)) -> Path:
    root = tmp_path / f"root-{'-'.join(map(str, caps)) or 'none'}"
    (root / "dev" / "nvidia-caps").mkdir(parents=True)
    for minor in gpu_minors:
        (root / "dev" / f"nvidia{minor}").write_bytes(b"")
    for minor in caps:
        (root / "dev" / "nvidia-caps" / f"nvidia-cap{minor}").write_bytes(b"")
    return root


def test_managing_instances_needs_the_config_capability(build: Path, tmp_path: Path) -> None:
    without = devroot_with(tmp_path, [])
    found = run(
        build,
        """
        h = n.nvmlDeviceGetHandleByIndex(0)
        print(json.dumps(code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, 19, placement(0, 1))))
    """,
        devroot=without,
    )
    assert found == 4  # NVML_ERROR_NO_PERMISSION


def test_a_process_given_one_partitions_caps_sees_only_it(build: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    run(
        build,
        """
        h = n.nvmlDeviceGetHandleByIndex(0)
        for pid, start, size, ci in ((19, 6, 1, 0), (14, 2, 2, 1)):
            n.nvmlGpuInstanceCreateComputeInstance(n.nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, placement(start, size)), ci)
        print(json.dumps(0))
    """,
        state=state,
    )
    two_g = devroot_with(tmp_path, [cap(0, 6), cap(0, 6, 0)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_")}
    env |= {"LD_LIBRARY_PATH": str(build), "FRACGPU_MOCK_NVML_PROFILE": str(PROFILE),
            "FRACGPU_MOCK_NVML_STATE_DIR": str(state), "FRACGPU_MOCK_NVML_DEV_ROOT": str(two_g)}  # fmt: skip
    probe = json.loads(subprocess.run([str(build / "cuda-probe")], env=env, capture_output=True, text=True,
                                      timeout=30, check=True).stdout)  # fmt: skip
    assert probe["device_count"] == 1
    (device,) = probe["devices"]
    assert (device["name"], device["total_mib"], device["multiprocessor_count"]) == (
        "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        20096,
        32,
    )
    smi = subprocess.run(
        [str(build / "nvidia-smi"), "-L"], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    lines = smi.stdout.splitlines()
    assert lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert len(lines) == 2 and lines[1].startswith("  MIG 2g.20gb      Device  0: (UUID: MIG-")
    assert lines[1].split("UUID: ")[1].rstrip(")") == device["mig_uuid"], "CUDA's v2 UUID is NVML's MIG UUID"
    none = devroot_with(tmp_path, [])
    env["FRACGPU_MOCK_NVML_DEV_ROOT"] = str(none)
    nothing = json.loads(subprocess.run([str(build / "cuda-probe")], env=env, capture_output=True, text=True,
                                        timeout=30, check=False).stdout)  # fmt: skip
    assert nothing["result"] == "CUDA_ERROR_NO_DEVICE", "a MIG-mode GPU is no CUDA device itself"
