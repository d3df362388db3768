"""The `compute` capacity the node plugin publishes (issue 39; api/compute.py): 100 on every shared GPU, consumed
only when a request asks for it, in whole percent; on a MIG partition its compute slices' share of its GPU. The
consumption is checked with the scheduler's rules for a validRange (KEP-5075: a request below min is min, one
between steps is rounded up, a request that names no capacity consumes the default, and a device's allocations
together never exceed its value); the real kube-scheduler does the same in tests/integration/test_compute.py."""

from __future__ import annotations

import math
from typing import Any

import pytest

from api import published
from api.names import COMPUTE_CAPACITY, DRIVER_NAME, MEMORY_CAPACITY, MPS_CLIENTS_CAPACITY
from api.quantity import granted_in_range, parse_quantity
from kubelet_plugin.core.model import MigGpu
from kubelet_plugin.publishing.slices import build_slices, device_entry
from tests.unit.fake_mig import H100_MIG
from tests.unit.kubelet_plugin.publishing.test_slices import NODE, NODE_UID, STEP, gpu


def consumed(device: dict[str, Any], requests: dict[str, str]) -> dict[str, int]:
    """What an allocation of `requests` consumes of each of `device`'s capacities (KEP-5075, integer range)."""
    out = {}
    for name, capacity in device["capacity"].items():
        policy = capacity.get("requestPolicy")
        asked = requests.get(name)
        if asked is None:
            out[name] = int(parse_quantity(policy["default"] if policy else capacity["value"]))
            continue
        valid = policy["validRange"] if policy else None
        value = math.ceil(parse_quantity(asked))  # Quantity.Value() rounds up
        if valid is not None:
            value = granted_in_range(value, int(parse_quantity(valid["min"])), int(parse_quantity(valid["step"])))
        out[name] = value
    return out


def fits(device: dict[str, Any], placed: list[dict[str, str]]) -> bool:
    """Whether `placed` (each a request's capacities) fit on `device` together, as the scheduler counts them."""
    totals = {name: 0 for name in device["capacity"]}
    for requests in placed:
        for name, value in consumed(device, requests).items():
            totals[name] += value
    return all(totals[name] <= int(parse_quantity(c["value"])) for name, c in device["capacity"].items())


@pytest.mark.parametrize("enforcement", ["none", "hami-core", "nvml", "mps"])
def test_every_shared_gpu_offers_100_compute_consumed_only_when_asked(enforcement: str) -> None:
    device = device_entry(gpu(), STEP, 0, enforcement=enforcement)  # type: ignore[arg-type]
    capacity = device["capacity"][COMPUTE_CAPACITY]
    assert capacity == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }
    assert COMPUTE_CAPACITY in published.DRIVER_CAPACITIES
    assert consumed(device, {MEMORY_CAPACITY: "10Gi"})[COMPUTE_CAPACITY] == 0
    assert consumed(device, {})[COMPUTE_CAPACITY] == 0, "a whole GPU is held by its memory, not its compute"
    assert consumed(device, {COMPUTE_CAPACITY: "50"})[COMPUTE_CAPACITY] == 50
    assert consumed(device, {COMPUTE_CAPACITY: "500m"})[COMPUTE_CAPACITY] == 1, "rounded up to a whole percent"
    if enforcement == "mps":
        assert set(device["capacity"]) == {MEMORY_CAPACITY, COMPUTE_CAPACITY, MPS_CLIENTS_CAPACITY}


def test_two_shares_of_compute_50_fit_a_gpu_and_a_third_does_not() -> None:
    device = device_entry(gpu(), STEP, 0)
    half = {MEMORY_CAPACITY: "1Gi", COMPUTE_CAPACITY: "50"}
    assert fits(device, [half, half])
    assert not fits(device, [half, half, half])
    assert fits(device, [half, half, {MEMORY_CAPACITY: "1Gi"}]), "memory-only shares reserve no compute"
    assert fits(device, [{MEMORY_CAPACITY: "1Gi"}] * 20), "and are placed by memory alone, as before"


def test_a_gpu_too_small_to_share_by_memory_still_offers_compute() -> None:
    device = device_entry(gpu(memory_mib=100), STEP, 0)
    assert "requestPolicy" not in device["capacity"][MEMORY_CAPACITY]
    assert device["capacity"][COMPUTE_CAPACITY]["value"] == "100"


def test_a_mig_partition_offers_its_compute_slices_share_of_its_gpu_rounded_down() -> None:
    mig: dict[str, MigGpu] = {"gpu-0": H100_MIG}
    built = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(0)], step=STEP, reserve=0, generation=1, mig=mig)
    partitions = [
        d for s in built for d in s["spec"].get("devices", []) if d["attributes"]["type"] == {"string": "mig"}
    ]
    assert partitions
    for device in partitions:
        slices = device["attributes"]["computeSlices"]["int"]
        assert device["capacity"][COMPUTE_CAPACITY] == {"value": str(slices * 100 // 7)}, device["name"]
        assert "requestPolicy" not in device["capacity"][COMPUTE_CAPACITY], "a partition is allocated whole"
        assert "allowMultipleAllocations" not in device
    by_profile = {
        d["attributes"]["profile"]["string"]: int(d["capacity"][COMPUTE_CAPACITY]["value"]) for d in partitions
    }
    assert by_profile["1g.10gb"] == 14 and by_profile["3g.40gb"] == 42 and by_profile["7g.80gb"] == 100
    parents = [d for s in built for d in s["spec"].get("devices", []) if d["name"] == "gpu-0"]
    assert all(COMPUTE_CAPACITY not in d["capacity"] for d in parents), "a MIG GPU itself is never allocated"
