"""Unit tests of GPU compute as a capacity in a claim's plan and status (issue 39): the reserved compute
(`consumedCapacity.compute`) is the ceiling the mps tier (active thread percentage) and the hami-core tier
(CUDA_DEVICE_SM_LIMIT) apply, `computeLimitPercent` lowers it but never raises it, the MPS GPU's ceiling is the
largest of its shares', a memory-only share is planned as before, and the ComputeEnforcement condition says
what enforces the reservation (kubelet_plugin/prepare/plan.py, kubelet_plugin/prepare/ready.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from api.compute import ceiling, consumed_percent
from api.kube_rest import KubeRest
from api.names import DRIVER_NAME
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.kinds.mps import limits
from kubelet_plugin.kinds.mps.control import Limits
from kubelet_plugin.kinds.mps.plan import MPS_THREADS_ENV
from kubelet_plugin.prepare.ready import apply_ready, is_ready
from tests.unit.kubelet_plugin.prepare.test_plan import (
    GPUS,
    claim,
    config,
    env_of,
    gpu_config,
    make_settings,
    only_device,
    planned,
    result,
)
from tests.unit.kubelet_plugin.prepare.test_plan_mps import mps_settings, root, tiers_of  # noqa: F401  (fixtures)
from tests.unit.kubelet_plugin.prepare.test_ready_status import RecordingRest


def with_compute(r: dict[str, Any], percent: str) -> dict[str, Any]:
    """`r` as the scheduler allocates it on a GPU that publishes `compute`: every capacity listed."""
    r["consumedCapacity"] = {**r.get("consumedCapacity", {}), "compute": percent}
    return r


@pytest.fixture
def hami_settings(root: Path, tmp_path: Path) -> Settings:  # noqa: F811  (the fixture above)
    lib = tmp_path / "vgpu" / "libvgpu.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF")
    return make_settings(root, enforcement="hami-core", hami_core_library=lib)


@pytest.mark.parametrize(
    ("reserved", "limit", "expected"),
    [(0, None, None), (50, None, 50), (0, 30, 30), (50, 30, 30), (50, 80, 50), (100, None, 100)],
)
def test_the_ceiling_is_the_reservation_or_a_smaller_compute_limit(
    reserved: int, limit: int | None, expected: int | None
) -> None:
    assert ceiling(reserved, limit) == expected


@pytest.mark.parametrize(
    ("consumed", "percent"),
    [
        (None, 0),
        ({}, 0),
        ({"memory": "1Gi"}, 0),
        ({"compute": "0"}, 0),
        ({"compute": "50"}, 50),
        ({"compute": "500m"}, 1),
        ({"compute": "x"}, 0),
    ],
)
def test_consumed_compute_is_read_in_whole_percent(consumed: dict[str, str] | None, percent: int) -> None:
    assert consumed_percent(consumed) == percent


@pytest.mark.parametrize(("limit", "expected"), [(None, "50"), (30, "30"), (80, "50")])
def test_an_mps_share_that_reserved_compute_gets_it_as_its_active_thread_percentage(
    mps_settings: Settings,  # noqa: F811
    limit: int | None,
    expected: str,
) -> None:
    configs = [config(gpu_config(computeLimitPercent=limit))] if limit is not None else None
    allocated = claim([with_compute(result(memory="10Gi"), "50")], configs)
    plan = planned(allocated, mps_settings, GPUS, tiers=tiers_of(mps_settings))
    assert env_of(only_device(plan).container_edits)[MPS_THREADS_ENV] == expected
    (file,) = plan.files
    assert file.info.devices[0].active_thread_percentage == int(expected)
    assert plan.mps_grants == {GPUS["gpu-0"].uuid: ((10240, int(expected)),)}


def test_a_memory_only_mps_share_gets_no_percentage_as_before(mps_settings: Settings) -> None:  # noqa: F811
    for r in (result(memory="10Gi"), with_compute(result(memory="10Gi"), "0")):
        plan = planned(claim([r]), mps_settings, GPUS, tiers=tiers_of(mps_settings))
        assert MPS_THREADS_ENV not in env_of(only_device(plan).container_edits)
        assert plan.files[0].info.devices[0].active_thread_percentage is None


def test_two_shares_of_50_hold_their_gpus_daemon_at_50_and_a_memory_only_share_lifts_it_to_100() -> None:
    assert limits.ceiling([(10240, 50), (4096, 50)]) == Limits(memory_mib=10240, percentage=50)
    assert limits.ceiling([(10240, 50), (4096, None)]) == Limits(memory_mib=10240, percentage=100)


@pytest.mark.parametrize(("limit", "expected"), [(None, "50"), (20, "20"), (90, "50")])
def test_a_hami_core_share_that_reserved_compute_gets_it_as_its_sm_limit(
    hami_settings: Settings, limit: int | None, expected: str
) -> None:
    configs = [config(gpu_config(computeLimitPercent=limit))] if limit is not None else None
    plan = planned(claim([with_compute(result(memory="3Gi"), "50")], configs), hami_settings, GPUS)
    assert env_of(only_device(plan).container_edits)["CUDA_DEVICE_SM_LIMIT"] == expected


def test_a_memory_only_hami_core_share_gets_no_sm_limit(hami_settings: Settings) -> None:
    plan = planned(claim([with_compute(result(memory="3Gi"), "0")]), hami_settings, GPUS)
    assert "CUDA_DEVICE_SM_LIMIT" not in env_of(only_device(plan).container_edits)


def test_an_admin_access_result_reserves_no_compute(mps_settings: Settings) -> None:  # noqa: F811
    r = with_compute(result(memory="0"), "50") | {"adminAccess": True}
    plan = planned(claim([r]), mps_settings, GPUS, tiers=tiers_of(mps_settings))
    assert MPS_THREADS_ENV not in env_of(only_device(plan).container_edits)


# --- ComputeEnforcement ------------------------------------------------------------------------------


def status_claim(compute: str | None, limit: int | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"request": "gpu", "driver": DRIVER_NAME, "pool": "n", "device": "gpu-0", "shareID": "s1"}
    r["consumedCapacity"] = {"memory": "10Gi", **({"compute": compute} if compute is not None else {})}
    parameters = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": limit}
    configs = [{"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}] if limit else []
    return {
        "metadata": {"name": "c", "namespace": "ns", "generation": 1},
        "status": {"allocation": {"devices": {"results": [r], "config": configs}}},
    }


def applied_conditions(body: dict[str, Any], tier: str) -> dict[str, dict[str, Any]]:
    rest = RecordingRest()
    apply_ready(cast(KubeRest, rest), body, DRIVER_NAME, "n", {("n", "gpu-0", "s1"): tier})
    (applied,) = rest.applied
    (entry,) = applied["status"]["devices"]
    return {c["type"]: c for c in entry["conditions"]}


@pytest.mark.parametrize(
    ("tier", "status", "reason", "said"),
    [
        ("mps", "True", "Mps", "ceiling 50 % as the MPS client's active thread percentage"),
        ("hami-core", "True", "HamiCore", "ceiling 50 % of the GPU's streaming multiprocessors as HAMi-core's"),
        ("nvml", "False", "NotEnforced", "not enforced on tier nvml"),
        ("none", "False", "NotEnforced", "not enforced on tier none"),
    ],
)
def test_a_share_that_reserved_compute_is_told_what_enforces_it(tier: str, status: str, reason: str, said: str) -> None:
    body = status_claim("50")
    condition = applied_conditions(body, tier)["ComputeEnforcement"]
    assert (condition["status"], condition["reason"]) == (status, reason)
    assert condition["message"].startswith("50 % of the GPU's compute reserved"), condition["message"]
    assert said in condition["message"], condition["message"]
    tiers: dict[tuple[str, str, str | None], str] = {("n", "gpu-0", "s1"): tier}
    body["status"]["devices"] = [{"driver": DRIVER_NAME, "pool": "n", "device": "gpu-0", "shareID": "s1"}]
    body["status"]["devices"][0]["conditions"] = list(applied_conditions(body, tier).values())
    assert is_ready(body, DRIVER_NAME, tiers)
    body["status"]["devices"][0]["conditions"] = [
        c for c in body["status"]["devices"][0]["conditions"] if c["type"] != "ComputeEnforcement"
    ]
    assert not is_ready(body, DRIVER_NAME, tiers), "a status without the condition is written again"


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        (30, "computeLimitPercent 30 sets the ceiling below it"),
        (80, "computeLimitPercent 80 is above the reservation, so the ceiling is the reservation"),
    ],
)
def test_the_condition_says_how_compute_limit_percent_maps(limit: int, said: str) -> None:
    message = applied_conditions(status_claim("50", limit), "mps")["ComputeEnforcement"]["message"]
    assert said in message and f"ceiling {min(limit, 50)} %" in message, message
    memory = applied_conditions(status_claim("50", limit), "mps")["MemoryEnforcement"]["message"]
    assert f"active threads {min(limit, 50)} %" in memory, memory


@pytest.mark.parametrize("compute", [None, "0"])
def test_a_memory_only_share_gets_no_compute_condition(compute: str | None) -> None:
    assert set(applied_conditions(status_claim(compute), "mps")) == {"Ready", "MemoryEnforcement"}
