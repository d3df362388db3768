"""Unit tests of the ResourceSlice builders (kubelet_plugin/publishing/slices.py)."""

from __future__ import annotations

from typing import Any

import pytest

from api.names import (
    COMPUTE_CAPACITY,
    DRIVER_NAME,
    MEMORY_CAPACITY,
    MPS_CLIENTS_CAPACITY,
    NUMA_NODE_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
)
from api.quantity import GiB, MiB, to_bytes
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.kinds.gpu.publish import usable_memory
from kubelet_plugin.publishing.slices import MAX_DEVICES_PER_SLICE, build_slices, device_entry

NODE = "node-a"
NODE_UID = "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
STEP = 256 * MiB


def gpu(index: int = 0, memory_mib: int = 81559, **overrides: Any) -> GpuInfo:
    fields: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-00000000-0000-4000-8000-{index:012d}",
        "product_name": "NVIDIA H100 80GB HBM3",
        "memory_total_bytes": memory_mib * MiB,
        "minor": index,
        "pci_bus_id": f"0000:{index % 256:02x}:00.0",
        "architecture": "Hopper",
        "cuda_compute_capability": "9.0",
        "driver_version": "580.65.06",
    }
    fields.update(overrides)
    return GpuInfo(**fields)


def memory_capacity(entry: dict[str, Any]) -> dict[str, Any]:
    capacity: dict[str, Any] = entry["capacity"][MEMORY_CAPACITY]
    return capacity


# --- usable memory ---------------------------------------------------------------------------------


def test_usable_memory_rounds_down_to_step() -> None:
    assert usable_memory(gpu(memory_mib=81559), STEP, 0) == 81408 * MiB
    assert usable_memory(gpu(memory_mib=81408), STEP, 0) == 81408 * MiB  # already aligned: unchanged
    assert usable_memory(gpu(memory_mib=81663), STEP, 0) == 81408 * MiB  # 81408 + 255: still down


def test_usable_memory_subtracts_reserve_before_rounding() -> None:
    # (81559 - 1000) = 80559 -> 80384; rounding first would give 81408 - 1000 = 80408 (not a step multiple)
    assert usable_memory(gpu(memory_mib=81559), STEP, 1000 * MiB) == 80384 * MiB


def test_usable_memory_never_negative() -> None:
    assert usable_memory(gpu(memory_mib=100), STEP, 200 * MiB) == 0
    assert usable_memory(gpu(memory_mib=100), STEP, 0) == 0


# --- one device ------------------------------------------------------------------------------------


def test_device_memory_capacity_and_policy() -> None:
    entry = device_entry(gpu(memory_mib=81559), STEP, 0)
    cap = memory_capacity(entry)
    assert cap["value"] == "81408Mi"  # 79.5Gi, written exactly in Mi
    assert to_bytes(cap["value"]) == int(79.5 * GiB)
    policy = cap["requestPolicy"]
    assert to_bytes(policy["default"]) == to_bytes(cap["value"])
    valid = policy["validRange"]
    assert set(valid) == {"min", "max", "step"}
    assert to_bytes(valid["min"]) == 0  # an adminAccess request of memory 0 fits a full GPU
    assert to_bytes(valid["max"]) == to_bytes(cap["value"])
    assert to_bytes(valid["step"]) == STEP
    assert set(entry["capacity"]) == {MEMORY_CAPACITY, COMPUTE_CAPACITY}


def test_device_memory_with_reserve_and_other_step() -> None:
    entry = device_entry(gpu(memory_mib=24576), 1024 * MiB, 512 * MiB)  # 24064Mi -> 23Gi
    cap = memory_capacity(entry)
    assert to_bytes(cap["value"]) == 23 * GiB
    assert to_bytes(cap["requestPolicy"]["validRange"]["max"]) == 23 * GiB
    assert to_bytes(cap["requestPolicy"]["validRange"]["step"]) == GiB
    assert to_bytes(cap["requestPolicy"]["default"]) == 23 * GiB


def test_device_value_is_a_step_multiple() -> None:
    for memory_mib in (15360, 16384, 40536, 81559, 97871, 144384):
        value = to_bytes(memory_capacity(device_entry(gpu(memory_mib=memory_mib), STEP, 0))["value"])
        assert value % STEP == 0
        assert memory_mib * MiB - STEP < value <= memory_mib * MiB


def test_device_too_small_for_a_range_has_no_policy() -> None:
    # validRange needs min + step <= value: with min 0 one step of memory gets a range, less gets no policy
    one_step = memory_capacity(device_entry(gpu(memory_mib=300), STEP, 0))
    assert to_bytes(one_step["value"]) == STEP
    assert one_step["requestPolicy"]["validRange"] == {"min": "0", "max": "256Mi", "step": "256Mi"}
    cap = memory_capacity(device_entry(gpu(memory_mib=200), STEP, 0))
    assert to_bytes(cap["value"]) == 0
    assert "requestPolicy" not in cap


def test_device_attributes_present_and_typed() -> None:
    entry = device_entry(gpu(index=3, minor=7, pci_bus_id="0000:3b:00.0"), STEP, 0)
    attrs = entry["attributes"]
    assert attrs["uuid"] == {"string": "GPU-00000000-0000-4000-8000-000000000003"}
    assert attrs["index"] == {"int": 3}
    assert attrs["minor"] == {"int": 7}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "580.65.6"}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.0"}
    assert attrs["hamiCore"] == {"bool": False}
    assert device_entry(gpu(), STEP, 0, hami_core=True)["attributes"]["hamiCore"] == {"bool": True}
    for value in attrs.values():  # each attribute has exactly one typed member
        assert len(value) == 1
        assert next(iter(value)) in {"string", "int", "bool", "version"}
    assert isinstance(attrs["index"]["int"], int)
    assert isinstance(attrs["minor"]["int"], int)


def test_the_standard_topology_attributes_are_published_where_sysfs_said_them() -> None:
    attrs = device_entry(gpu(pcie_root="pci0000:17", numa_node=1), STEP, 0)["attributes"]
    assert attrs[PCIE_ROOT_ATTRIBUTE] == {"string": "pci0000:17"}
    assert attrs[NUMA_NODE_ATTRIBUTE] == {"int": 1}
    assert device_entry(gpu(pcie_root="pci0000:17", numa_node=0), STEP, 0)["attributes"][NUMA_NODE_ATTRIBUTE] == {
        "int": 0
    }
    unknown = device_entry(gpu(), STEP, 0)["attributes"]  # sysfs said neither: both left out, never guessed
    assert PCIE_ROOT_ATTRIBUTE not in unknown
    assert NUMA_NODE_ATTRIBUTE not in unknown
    assert unknown[PCI_BUS_ID_ATTRIBUTE] == {"string": "0000:00:00.0"}


@pytest.mark.parametrize(
    ("compute", "driver", "compute_semver", "driver_semver"),
    [
        ("8.6", "535.104.05", "8.6.0", "535.104.5"),
        ("10.0", "570.86.15", "10.0.0", "570.86.15"),
        ("12.1", "580.65", "12.1.0", "580.65.0"),
    ],
)
def test_version_attributes_are_semver(compute: str, driver: str, compute_semver: str, driver_semver: str) -> None:
    attrs = device_entry(gpu(cuda_compute_capability=compute, driver_version=driver), STEP, 0)["attributes"]
    assert attrs["cudaComputeCapability"] == {"version": compute_semver}
    assert attrs["driverVersion"] == {"version": driver_semver}


def test_device_name_and_sharing() -> None:
    entry = device_entry(gpu(index=5), STEP, 0)
    assert entry["name"] == "gpu-5"
    assert entry["allowMultipleAllocations"] is True


def test_product_name_fits_attribute_limit() -> None:
    entry = device_entry(gpu(product_name="X" * 100), STEP, 0)
    assert len(entry["attributes"]["productName"]["string"]) <= 64


# --- slices ----------------------------------------------------------------------------------------


def test_build_slices_one_pool_per_node() -> None:
    slices = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(1), gpu(0)], step=STEP, reserve=0, generation=4)
    assert len(slices) == 1
    s = slices[0]
    assert s["apiVersion"] == "resource.k8s.io/v1"
    assert s["kind"] == "ResourceSlice"
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": True}
    ]
    spec = s["spec"]
    assert spec["driver"] == DRIVER_NAME
    assert spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 4, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert all(d["allowMultipleAllocations"] is True for d in spec["devices"])


def test_build_slices_reserve_and_step_are_used() -> None:
    slices = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(0)], step=STEP, reserve=1000 * MiB, generation=1)
    assert to_bytes(memory_capacity(slices[0]["spec"]["devices"][0])["value"]) == 80384 * MiB


def test_build_slices_splits_at_128_devices() -> None:
    gpus = [gpu(i) for i in reversed(range(130))]
    slices = build_slices(NODE, NODE_UID, DRIVER_NAME, gpus, step=STEP, reserve=0, generation=9)
    assert MAX_DEVICES_PER_SLICE == 128
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 2]
    for s in slices:
        assert s["spec"]["pool"] == {"name": NODE, "generation": 9, "resourceSliceCount": 2}
        assert s["spec"]["nodeName"] == NODE
        assert s["metadata"]["ownerReferences"][0]["uid"] == NODE_UID
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert names == [f"gpu-{i}" for i in range(130)]  # numeric order, each device once
    assert len({s["metadata"]["name"] for s in slices}) == 2


def test_build_slices_without_gpus_publishes_one_empty_slice() -> None:
    slices = build_slices(NODE, NODE_UID, DRIVER_NAME, [], step=STEP, reserve=0, generation=2)
    assert len(slices) == 1
    assert slices[0]["spec"]["devices"] == []
    assert slices[0]["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    assert slices[0]["metadata"]["ownerReferences"][0]["kind"] == "Node"


def test_build_slices_generation_carried_through() -> None:
    for generation in (0, 1, 17, 2**40):
        slices = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(0)], step=STEP, reserve=0, generation=generation)
        assert slices[0]["spec"]["pool"]["generation"] == generation


def test_slice_names_are_deterministic() -> None:
    a = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(0)], step=STEP, reserve=0, generation=1)
    b = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(0)], step=STEP, reserve=0, generation=2)
    assert a[0]["metadata"]["name"] == b[0]["metadata"]["name"]


def test_memory_enforcement_attribute_per_gpu() -> None:
    """Each GPU publishes the strongest tier it offers (default none), for CEL selectors and the ledger."""
    assert device_entry(gpu(), STEP, 0)["attributes"]["memoryEnforcement"] == {"string": "none"}
    slices = build_slices(
        "node-a",
        "uid-1",
        DRIVER_NAME,
        [gpu(0), gpu(1)],
        step=STEP,
        reserve=0,
        generation=1,
        enforcement={"gpu-0": "nvml", "gpu-1": "hami-core"},
    )
    (published,) = slices
    assert [d["attributes"]["memoryEnforcement"]["string"] for d in published["spec"]["devices"]] == [
        "nvml",
        "hami-core",
    ]


# --- MPS client slots ------------------------------------------------------------------------------


@pytest.mark.parametrize(("capability", "clients"), [("9.0", "48"), ("7.0", "48"), ("6.1", "16")])
def test_an_mps_gpu_publishes_the_clients_its_server_takes_each_share_consuming_one(
    capability: str, clients: str
) -> None:
    entry = device_entry(gpu(cuda_compute_capability=capability), STEP, 0, enforcement="mps")
    assert entry["capacity"][MPS_CLIENTS_CAPACITY] == {
        "value": clients,
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": clients, "step": "1"}},
    }


def test_a_gpu_without_mps_publishes_no_client_slots() -> None:
    assert MPS_CLIENTS_CAPACITY not in device_entry(gpu(), STEP, 0, enforcement="none")["capacity"]


def test_an_mps_gpu_of_separated_trust_domains_carries_the_binding_conditions() -> None:
    entry = device_entry(gpu(), STEP, 0, enforcement="mps", mps_binding=True)
    assert (entry["bindingConditions"], entry["bindingFailureConditions"]) == (
        ["MpsTrustDomainAdmitted"],
        ["MpsTrustDomainConflict"],
    )
    assert "bindingConditions" not in device_entry(gpu(), STEP, 0, enforcement="mps"), "scope cluster: no wait"
    assert "bindingConditions" not in device_entry(gpu(), STEP, 0, enforcement="nvml", mps_binding=True)
