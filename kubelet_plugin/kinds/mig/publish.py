"""What a MIG GPU publishes (pure): the MIG GPU itself (``type: mig-parent``, tainted so that nothing allocates it),
its shared counters (a counter per memory slice and ``compute-slices``) and every possible partition (``type: mig``:
a GPU-instance profile at one placement, consuming the placement's memory slices and the profile's compute slices),
smallest first (``mig_devices``): the scheduler takes the first device that matches and fits, so a memory request
gets the partition that draws the fewest counters among those that hold it and whose slices are free. Names and attributes: ``api/mig.py``.

May import: ``core``, ``api``.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api import compute
from api import mig as names
from api.names import COMPUTE_CAPACITY, MEMORY_CAPACITY
from api.quantity import format_bytes
from kubelet_plugin.core.attributes import identity_attributes
from kubelet_plugin.core.model import GpuInfo, MigGpu, MigProfile
from kubelet_plugin.enforcement.tiers import ATTRIBUTE as ENFORCEMENT_ATTRIBUTE

MIG_TIER = "mig"
"""The `memoryEnforcement` of a MIG partition: memory and compute enforced by the hardware."""


@dataclass(frozen=True)
class MigDevice:
    """A possible MIG partition as published: `profile` of `gpu` at placement `start`."""

    name: str
    gpu: GpuInfo
    profile: MigProfile
    start: int
    total_compute_slices: int = 0
    """Its GPU's compute slices (0: not known)."""

    @property
    def memory(self) -> int:
        """The published `memory` capacity (bytes): exactly the partition's memory."""
        return names.partition_memory(self.profile.memory_mib)

    @property
    def compute(self) -> int:
        """The published `compute` capacity (percent): its compute slices' share of its GPU's, rounded down."""
        return compute.partition_percent(self.profile.compute_slices, self.total_compute_slices)


def mig_devices(gpus: list[GpuInfo], mig: Mapping[str, MigGpu]) -> list[MigDevice]:
    """Every possible partition of the GPUs in `mig` (device name -> its MIG facts) whose MIG mode is on, in the
    order the scheduler should try them: the fewest counters first, memory slices then compute slices
    (``names.size_key``: ``1g.20gb`` before ``2g.20gb``, ``3g.40gb`` before ``4g.40gb``); then by GPU, filling one
    GPU before the next; on a GPU the highest placement first, so small partitions fill a GPU from the top and
    leave the low placements, where the large profiles fit. On one GPU a profile's memory grows with its memory
    slices, so the first partition that holds a request is also the one of least memory that does."""
    out = [
        MigDevice(names.partition_device_name(g.index, p.name, start), g, p, start, facts.compute_slices)
        for g in gpus
        if (facts := mig.get(g.device_name)) is not None and facts.state == "enabled"
        for p in facts.profiles
        for start in p.placements
    ]
    return sorted(
        out,
        key=lambda d: (*names.size_key(d.profile.memory_slices, d.profile.compute_slices), d.gpu.index, -d.start),
    )


def mig_catalog(gpus: list[GpuInfo], mig: Mapping[str, MigGpu]) -> dict[str, MigDevice]:
    """The published partitions by device name."""
    return {d.name: d for d in mig_devices(gpus, mig)}


def _usable_memory(gpu: GpuInfo, step: int, reserve: int) -> int:
    """The MIG GPU's memory as a whole GPU would offer it (total minus reserve, in whole steps): for the ledger."""
    return max(0, (gpu.memory_total_bytes - reserve) // step * step)


def _identity(gpu: GpuInfo) -> dict[str, Any]:
    """The attributes a MIG GPU and its partitions share: the physical GPU's, and enforcement ``mig``."""
    return {**identity_attributes(gpu), ENFORCEMENT_ATTRIBUTE: {"string": MIG_TIER}}


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
        "capacity": {MEMORY_CAPACITY: {"value": format_bytes(_usable_memory(gpu, step, reserve))}},
        "taints": [parent_taint, *(taints or [])],
    }


def partition_entry(device: MigDevice, *, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """One possible partition: its profile, placement, memory and compute (its slices' share of its GPU, in percent,
    as a whole GPU's `compute` capacity counts it, so that one selector or capacity request reads both kinds),
    consuming its slices of its GPU's counters."""
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
        "capacity": {
            MEMORY_CAPACITY: {"value": format_bytes(device.memory)},
            COMPUTE_CAPACITY: {"value": str(device.compute)},
        },
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
