"""The ResourceSlices that describe this node's GPUs (pure functions; publishing is in publisher.py).

One pool per node, in three kinds of slices:

- ``<node>-<driver>-<i>``: the whole GPUs (``type: gpu``, shareable by memory) and the MIG GPUs themselves
  (``type: mig-parent``, never allocatable; see ``api/mig.py``);
- ``<node>-<driver>-counters-<i>``: the ``sharedCounters`` of the MIG GPUs whose MIG mode is on, one counter set
  per GPU (``gpu-<index>``): a counter per memory slice (1 each) and ``compute-slices`` (7);
- ``<node>-<driver>-mig-<iii>``: every possible partition of those GPUs (``type: mig``), a GPU-instance profile at
  one placement, consuming the placement's memory slices and the profile's compute slices.

The scheduler takes, for a request, the first device in pool, slice-name and device order that matches and fits,
so the partitions are published smallest first (``mig_devices``): a memory request gets the smallest partition
that holds it among those whose slices are free.

Every GPU and partition carries Kubernetes' standard attributes ``resource.kubernetes.io/pciBusID``, ``pcieRoot``
and ``numaNode`` (the last two where sysfs says them, ``pci_topology``; a partition has its GPU's).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api import mig as names
from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION
from api.names import (
    MEMORY_CAPACITY,
    MPS_CLIENTS_CAPACITY,
    NUMA_NODE_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
)
from api.quantity import format_bytes
from kubelet_plugin.core.model import GpuInfo, MigGpu, MigProfile
from kubelet_plugin.enforcement.tiers import ATTRIBUTE as ENFORCEMENT_ATTRIBUTE
from kubelet_plugin.enforcement.tiers import MPS_ATTRIBUTE, Tier

MAX_DEVICES_PER_SLICE = 128  # resource.k8s.io/v1 ResourceSliceMaxDevices
MAX_TAINTED_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures: taints or consumesCounters
MAX_COUNTER_SETS_PER_SLICE = 8  # ResourceSliceMaxCounterSets
MIG_TIER = "mig"
"""The `memoryEnforcement` of a MIG partition: memory and compute enforced by the hardware."""


@dataclass(frozen=True)
class MigDevice:
    """A possible MIG partition as published: `profile` of `gpu` at placement `start`."""

    name: str
    gpu: GpuInfo
    profile: MigProfile
    start: int

    @property
    def memory(self) -> int:
        """The published `memory` capacity (bytes): the partition's memory rounded up to a whole GiB."""
        return names.nominal_memory(self.profile.memory_mib)


def mig_devices(gpus: list[GpuInfo], mig: Mapping[str, MigGpu]) -> list[MigDevice]:
    """Every possible partition of the GPUs in `mig` (device name -> its MIG facts) whose MIG mode is on, in the
    order the scheduler should try them: the smallest memory first; among profiles of equal memory the balanced
    one before the memory-heavy one (``2g.20gb`` before ``1g.20gb``), then fewer compute slices (``3g.40gb``
    before ``4g.40gb``); then by GPU, filling one GPU before the next; on a GPU the highest placement first, so
    small partitions fill a GPU from the top and leave the low placements, where the large profiles fit."""
    out = [
        MigDevice(names.partition_device_name(g.index, p.name, start), g, p, start)
        for g in gpus
        if (facts := mig.get(g.device_name)) is not None and facts.state == "enabled"
        for p in facts.profiles
        for start in p.placements
    ]
    return sorted(
        out,
        key=lambda d: (
            d.memory,
            names.is_memory_heavy(d.profile.compute_slices, d.profile.memory_slices),
            d.profile.compute_slices,
            d.gpu.index,
            -d.start,
        ),
    )


def mig_catalog(gpus: list[GpuInfo], mig: Mapping[str, MigGpu]) -> dict[str, MigDevice]:
    """The published partitions by device name."""
    return {d.name: d for d in mig_devices(gpus, mig)}


MPS_CLIENTS_VOLTA = 48
MPS_CLIENTS_BEFORE_VOLTA = 16


def mps_clients(gpu: GpuInfo) -> int:
    """How many clients one MPS server takes on `gpu`: 48 from Volta (compute capability 7.0) on, 16 before."""
    major = gpu.cuda_compute_capability.split(".", 1)[0]
    return MPS_CLIENTS_VOLTA if major.isdigit() and int(major) >= 7 else MPS_CLIENTS_BEFORE_VOLTA


def usable_memory(gpu: GpuInfo, step: int, reserve: int) -> int:
    """Memory offered for sharing: total minus reserve, rounded down to a multiple of `step` (≥ 0)."""
    return max(0, (gpu.memory_total_bytes - reserve) // step * step)


def device_entry(
    gpu: GpuInfo,
    step: int,
    reserve: int,
    hami_core: bool = False,
    enforcement: Tier = "none",
    *,
    taints: list[dict[str, str]] | None = None,
    mps_binding: bool = False,
) -> dict[str, Any]:
    """One `spec.devices[]` entry: a GPU shareable by `memory` in steps of `step` bytes; `hami_core`: the
    node can enforce limits with HAMi-core (its library is installed), published as attribute `hamiCore`;
    `enforcement`: the GPU's memory-enforcement tier (``GpuTiers.published``), attribute `memoryEnforcement`, and
    whether it is an MPS GPU, attribute `mps`, with capacity `mpsClients`: the clients its MPS server takes, of
    which each allocation consumes one unless it asks for more (one per CUDA process), so the scheduler never
    places a share the server would refuse with CUDA_ERROR_MPS_MAX_CLIENTS_REACHED; with `mps_binding` (MPS trust
    domains kept apart, any scope but cluster) also the binding condition the scheduler waits on before it binds a pod
    there, which the controller sets once it has found the claim's trust domain alone on the GPU (or the failure
    condition, when another domain holds it: the scheduler then places the claim again);
    `taints`: its `taints` (GPU health, `kubelet_plugin.health.book.plan_taints`), left out when none."""
    memory = usable_memory(gpu, step, reserve)
    capacity: dict[str, Any] = {"value": format_bytes(memory)}
    if memory >= step:  # validRange needs min + step <= value
        # default = all of it: a request without capacity (a whole GPU, the scheduler's extended-resource
        # claim) consumes the whole GPU, so it never meets a share (without a policy, the value is consumed).
        # min 0: a positive request is granted the same multiple of step as with min = step, and an adminAccess
        # request of `memory: 0` (which the scheduler must still fit, though it never counts it once allocated)
        # fits a GPU with no memory free; admission refuses 0 on any other request
        capacity["requestPolicy"] = {
            "default": format_bytes(memory),
            "validRange": {"min": "0", "max": format_bytes(memory), "step": format_bytes(step)},
        }
    entry: dict[str, Any] = {
        "name": gpu.device_name,
        "allowMultipleAllocations": True,
        "attributes": {
            names.TYPE_ATTRIBUTE: {"string": names.TYPE_GPU},
            "uuid": {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "minor": {"int": gpu.minor},
            "productName": {"string": gpu.product_name[:64]},
            "architecture": {"string": gpu.architecture},
            "cudaComputeCapability": {"version": _semver(gpu.cuda_compute_capability)},
            "driverVersion": {"version": _semver(gpu.driver_version)},
            **_pci(gpu),
            "hamiCore": {"bool": hami_core},
            ENFORCEMENT_ATTRIBUTE: {"string": enforcement},
            MPS_ATTRIBUTE: {"bool": enforcement == "mps"},
        },
        "capacity": {MEMORY_CAPACITY: capacity},
    }
    if enforcement == "mps":
        clients = str(mps_clients(gpu))
        entry["capacity"][MPS_CLIENTS_CAPACITY] = {
            "value": clients,
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": clients, "step": "1"}},
        }
        if mps_binding:
            entry["bindingConditions"] = [ADMITTED_CONDITION]
            entry["bindingFailureConditions"] = [CONFLICT_CONDITION]
    if taints:
        entry["taints"] = taints
    return entry


def _identity(gpu: GpuInfo) -> dict[str, Any]:
    """The attributes a MIG GPU and its partitions share: the physical GPU's."""
    return {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "productName": {"string": gpu.product_name[:64]},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": _semver(gpu.cuda_compute_capability)},
        "driverVersion": {"version": _semver(gpu.driver_version)},
        **_pci(gpu),
        ENFORCEMENT_ATTRIBUTE: {"string": MIG_TIER},
    }


def _pci(gpu: GpuInfo) -> dict[str, Any]:
    """Kubernetes' standard attributes of where the GPU sits: its PCI address, and its PCIe root and NUMA node where
    sysfs says them (left out where it does not)."""
    attributes: dict[str, Any] = {PCI_BUS_ID_ATTRIBUTE: {"string": gpu.pci_bus_id}}
    if gpu.pcie_root is not None:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": gpu.pcie_root}
    if gpu.numa_node is not None:
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": gpu.numa_node}
    return attributes


def parent_entry(
    gpu: GpuInfo, mig: MigGpu, step: int, reserve: int, *, taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """The device of a MIG GPU itself: its identity, MIG state and slice totals for the ledger; tainted NoSchedule
    so that nothing allocates it (its partitions are the allocatable devices)."""
    attributes = {
        names.TYPE_ATTRIBUTE: {"string": names.TYPE_MIG_PARENT},
        **_identity(gpu),
        names.STATE_ATTRIBUTE: {"string": mig.state},
    }
    if mig.state == "enabled":
        attributes[names.MEMORY_SLICES_ATTRIBUTE] = {"int": mig.memory_slices}
        attributes[names.COMPUTE_SLICES_ATTRIBUTE] = {"int": mig.compute_slices}
    parent_taint = {"key": names.PARENT_TAINT_KEY, "value": mig.state, "effect": "NoSchedule"}
    return {
        "name": gpu.device_name,
        "attributes": attributes,
        "capacity": {MEMORY_CAPACITY: {"value": format_bytes(usable_memory(gpu, step, reserve))}},
        "taints": [parent_taint, *(taints or [])],
    }


def partition_entry(device: MigDevice, *, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """One possible partition: its profile, placement and memory, consuming its slices of its GPU's counters."""
    p = device.profile
    counters = {
        names.memory_slice_counter(i): {"value": "1"} for i in range(device.start, device.start + p.memory_slices)
    }
    counters[names.COMPUTE_SLICES_COUNTER] = {"value": str(p.compute_slices)}
    entry: dict[str, Any] = {
        "name": device.name,
        "attributes": {
            names.TYPE_ATTRIBUTE: {"string": names.TYPE_MIG},
            names.PROFILE_ATTRIBUTE: {"string": p.name},
            **_identity(device.gpu),
            names.PLACEMENT_ATTRIBUTE: {"int": device.start},
            names.MEMORY_SLICES_ATTRIBUTE: {"int": p.memory_slices},
            names.COMPUTE_SLICES_ATTRIBUTE: {"int": p.compute_slices},
            names.PARTITION_MEMORY_ATTRIBUTE: {"int": p.memory_mib},
            names.MULTIPROCESSORS_ATTRIBUTE: {"int": p.multiprocessors},
        },
        "capacity": {MEMORY_CAPACITY: {"value": format_bytes(device.memory)}},
        "consumesCounters": [{"counterSet": names.counter_set_name(device.gpu.index), "counters": counters}],
    }
    if taints:
        entry["taints"] = taints
    return entry


def counter_set(gpu: GpuInfo, mig: MigGpu) -> dict[str, Any]:
    """The shared counters of a MIG GPU: one per memory slice and its compute slices."""
    counters = {names.memory_slice_counter(i): {"value": "1"} for i in range(mig.memory_slices)}
    counters[names.COMPUTE_SLICES_COUNTER] = {"value": str(mig.compute_slices)}
    return {"name": names.counter_set_name(gpu.index), "counters": counters}


def _semver(version: str) -> str:
    """`9.0` → `9.0.0`, `580.65.06` → `580.65.6`: DRA version attributes must be semantic versions."""
    parts = [str(int(p)) for p in version.split(".")[:3] if p.isdigit()]
    return ".".join([*parts, "0", "0", "0"][:3])


def slice_name(node: str, driver: str, index: int) -> str:
    """Deterministic name of the `index`-th slice of this node's pool."""
    return f"{node}-{driver}-{index}"


def build_slices(
    node: str,
    node_uid: str,
    driver: str,
    gpus: list[GpuInfo],
    *,
    step: int,
    reserve: int,
    generation: int,
    hami_core: bool = False,
    enforcement: Mapping[str, Tier] | None = None,
    taints: Mapping[str, list[dict[str, str]]] | None = None,
    mig: Mapping[str, MigGpu] | None = None,
    mps_binding: bool = False,
) -> list[dict[str, Any]]:
    """All slices of the node's pool (pool = node name), at least one (see the module docstring).
    `enforcement`: device name -> the strongest tier that GPU offers (absent: none); `taints`: device name -> its
    taints (absent: none; a MIG GPU's apply to its partitions too); `mig`: the GPUs named MIG GPUs -> their MIG
    facts (they are published as MIG GPUs, never whole). Device slices hold at most 128 devices (64 once a device
    has taints or consumes counters), counter slices at most 8 counter sets."""
    tiers = enforcement or {}
    tainted = taints or {}
    migs = mig or {}
    ordered = sorted(gpus, key=lambda g: g.index)
    devices = [
        parent_entry(g, migs[g.device_name], step, reserve, taints=tainted.get(g.device_name))
        if g.device_name in migs
        else device_entry(
            g,
            step,
            reserve,
            hami_core,
            tiers.get(g.device_name, "none"),
            taints=tainted.get(g.device_name),
            mps_binding=mps_binding,
        )
        for g in ordered
    ]
    size = MAX_TAINTED_DEVICES_PER_SLICE if any("taints" in d for d in devices) else MAX_DEVICES_PER_SLICE
    chunks: list[tuple[str, str, list[dict[str, Any]]]] = [
        (slice_name(node, driver, i // size), "devices", devices[i : i + size]) for i in range(0, len(devices), size)
    ] or [(slice_name(node, driver, 0), "devices", [])]
    counter_sets = [
        counter_set(g, migs[g.device_name]) for g in ordered if migs.get(g.device_name, _OFF).state == "enabled"
    ]
    for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE):
        name = f"{node}-{driver}-counters-{i // MAX_COUNTER_SETS_PER_SLICE}"
        chunks.append((name, "sharedCounters", counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE]))
    partitions = [
        partition_entry(d, taints=[*tainted.get(d.gpu.device_name, []), *tainted.get(d.name, [])] or None)
        for d in mig_devices(ordered, migs)
    ]
    for i in range(0, len(partitions), MAX_TAINTED_DEVICES_PER_SLICE):
        name = f"{node}-{driver}-mig-{i // MAX_TAINTED_DEVICES_PER_SLICE:03d}"  # in name order: smallest first
        chunks.append((name, "devices", partitions[i : i + MAX_TAINTED_DEVICES_PER_SLICE]))
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
                ],
            },
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                field: content,
            },
        }
        for name, field, content in chunks
    ]


_OFF = MigGpu(state="disabled")
