"""MIG discovery (kinds/mig/discovery.py) and the NVML MIG manager (kinds/mig/nvml.py) through the real pynvml
against the mock NVML, whose MIG model is the driver's (harness/mocknvml/mock_mig.h). Each run is a subprocess."""

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

REPO = Path(__file__).resolve().parents[5]
PROFILE = REPO / "harness" / "mocknvml" / "profiles" / "mig-products.profile"

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc): cannot build the mocks")

PRELUDE = """
import json
from kubelet_plugin.publishing.discovery import discover_gpus
from kubelet_plugin.kinds.mig.discovery import discover_mig
from kubelet_plugin.kinds.mig.nvml import MigError, NvmlMig
gpus = discover_gpus()
mig = discover_mig(gpus)
profiles = {d: {p.name: p for p in m.profiles} for d, m in mig.items()}
manager = NvmlMig()
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mocknvml")
    subprocess.run(
        ["bash", str(REPO / "harness/mocknvml/build.sh"), str(out)], check=True, capture_output=True, timeout=180
    )
    return out


def run(build: Path, code: str, state: Path | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_")}
    env |= {"LD_LIBRARY_PATH": str(build), "PYTHONPATH": str(REPO), "FRACGPU_MOCK_NVML_PROFILE": str(PROFILE)}
    if state is not None:
        env["FRACGPU_MOCK_NVML_STATE_DIR"] = str(state)
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_discovery_reads_each_mig_gpus_state_and_profiles(build: Path) -> None:
    found = run(
        build,
        """
        print(json.dumps({d: [m.state, m.memory_slices, m.compute_slices, sorted(p.name for p in m.profiles)]
                          for d, m in mig.items()}))
    """,
    )
    assert found == {
        "gpu-0": ["enabled", 8, 7, ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]],
        "gpu-1": ["enabled", 8, 7, ["1g.10gb", "1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]],
        "gpu-2": ["enabled", 8, 7, ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]],
        "gpu-3": ["enabled", 8, 7, ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]],
        "gpu-4": ["pending-enable", 0, 0, []],
        "gpu-5": ["unsupported", 0, 0, []],
    }, "media-extension profiles (+me) are left out"


def test_create_takes_the_ci_profile_the_gi_offers_and_destroy_undoes_it(build: Path, tmp_path: Path) -> None:
    found = run(
        build,
        """
        out = {}
        for device, name, start in (("gpu-0", "1g.10gb", 6), ("gpu-0", "3g.40gb", 0), ("gpu-1", "7g.40gb", 0),
                                    ("gpu-3", "2g.35gb", 4)):
            gpu = next(g for g in gpus if g.device_name == device)
            r = manager.create(gpu, profiles[device][name], start)
            out[f"{device} {name}"] = [r.gpu_instance, r.compute_instance, r.placement_start, r.memory_mib,
                                       r.multiprocessors, r.uuid.startswith("MIG-"), manager.alive(r)]
        live = manager.instances(gpus)
        out["live"] = sorted([i.parent_uuid[-1], i.gpu_instance, i.placement_start, list(i.compute_instances)] for i in live)
        try:
            manager.create(gpus[0], profiles["gpu-0"]["2g.20gb"], 0)
        except MigError as err:
            out["taken"] = [err.code, "Insufficient" in str(err)]
        for i in live:
            manager.destroy_instance(i)
        out["after"] = len(manager.instances(gpus))
        print(json.dumps(out))
    """,
        tmp_path,
    )
    assert found == {
        "gpu-0 1g.10gb": [9, 0, 6, 9984, 16, True, True],
        "gpu-0 3g.40gb": [2, 0, 0, 40448, 60, True, True],
        "gpu-1 7g.40gb": [0, 0, 0, 40448, 98, True, True],
        "gpu-3 2g.35gb": [3, 0, 4, 33280, 32, True, True],
        "live": [["0", 2, 0, [0]], ["0", 9, 6, [0]], ["1", 0, 0, [0]], ["3", 3, 4, [0]]],
        "taken": [23, True],
        "after": 0,
    }


def test_a_recorded_partition_that_was_recreated_is_not_alive(build: Path, tmp_path: Path) -> None:
    found = run(
        build,
        """
        r = manager.create(gpus[0], profiles["gpu-0"]["1g.10gb"], 6)
        manager.destroy(r)
        again = manager.create(gpus[0], profiles["gpu-0"]["1g.10gb"], 6)
        manager.destroy(r)  # the old record names the same ids and placement: the instance made since survives
        print(json.dumps([again.gpu_instance == r.gpu_instance, again.uuid != r.uuid, manager.alive(r),
                          manager.alive(again)]))
    """,
        tmp_path,
    )
    assert found == [True, True, False, True]
