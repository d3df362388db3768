"""MIG (Multi-Instance GPU) names both components share: how the node plugin publishes a MIG GPU and its possible
partitions in the ResourceSlice, what it says about a MIG GPU it cannot offer, and the condition that carries a
partition's MIG UUID to the claim. Pure: names, small value types and their text.

A MIG GPU (one named by the plugin's ``--mig-gpus``) is published as
- one device ``gpu-<index>`` of type ``mig-parent``: the GPU itself, never allocatable (tainted
  ``gpu.fracgpu.dev/mig-parent``, selected by no chart DeviceClass, refused at prepare); it carries the GPU's
  identity, its MIG state and slice totals, so the ledger has one object per physical GPU;
- while its MIG mode is on, one device per possible partition (``type: mig``): a GPU-instance profile at one of
  its placements, its `memory` capacity exactly the profile's memory (a grant is never below its request),
  consuming that placement's memory-slice counters and the profile's compute slices from the
  GPU's counter set (``sharedCounters`` in a slice of its own), so the scheduler never over-commits a GPU.
"""

import re
from typing import Final, Literal

TYPE_ATTRIBUTE: Final = "type"
"""Device attribute (string): ``gpu`` (a whole GPU, shareable by memory), ``mig`` (a possible MIG partition) or
``mig-parent`` (a MIG GPU itself)."""
TYPE_GPU: Final = "gpu"
TYPE_MIG: Final = "mig"
TYPE_MIG_PARENT: Final = "mig-parent"
DeviceType = Literal["gpu", "mig", "mig-parent"]

PROFILE_ATTRIBUTE: Final = "profile"
"""string: the GPU-instance profile of a partition, as NVIDIA names it (``1g.10gb``)."""
PLACEMENT_ATTRIBUTE: Final = "placementStart"
"""int: the first memory slice of a partition's placement."""
MEMORY_SLICES_ATTRIBUTE: Final = "memorySlices"
"""int: a partition's memory slices (its placement size); on a parent, the GPU's total."""
COMPUTE_SLICES_ATTRIBUTE: Final = "computeSlices"
"""int: a partition's compute slices; on a parent, the GPU's total."""
PARTITION_MEMORY_ATTRIBUTE: Final = "memoryMiB"
"""int: the partition's memory as the driver reports it (MiB), what CUDA sees; the `memory` capacity is exactly
this (see ``partition_memory``)."""
MULTIPROCESSORS_ATTRIBUTE: Final = "multiprocessors"
"""int: the streaming multiprocessors of a partition (its GPU instance's)."""
STATE_ATTRIBUTE: Final = "migState"
"""string on a parent: its MIG state (``MigState``)."""

PARENT_TAINT_KEY: Final = "gpu.fracgpu.dev/mig-parent"
"""Taint (NoSchedule) of every parent device: a MIG GPU is allocated only by its partitions."""
PARTITION_CONDITION: Final = "MigPartition"
"""Condition the node plugin sets on a claim's status.devices entry of a partition: status True, reason
``Created``, message the MIG UUID of the partition it created (the controller copies it into `data.migUUID`)."""
PARTITION_REASON: Final = "Created"

MigState = Literal["enabled", "disabled", "pending-enable", "pending-disable", "unsupported", "error"]
"""A MIG GPU's state: ``enabled`` (partitions are published), ``disabled`` (MIG mode off), ``pending-enable`` /
``pending-disable`` (a mode change waits for a GPU reset), ``unsupported`` (the GPU cannot do MIG), ``error``
(NVML failed; the plugin's log and Node Event say how)."""

_MIG_UUID = re.compile(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MiB = 1 << 20


def counter_set_name(index: int) -> str:
    """The counter set of the GPU of NVML index `index` (a DNS label)."""
    return f"gpu-{index}"


def memory_slice_counter(slice_index: int) -> str:
    """The counter of one memory slice (capacity 1)."""
    return f"memory-slice-{slice_index}"


COMPUTE_SLICES_COUNTER: Final = "compute-slices"


def partition_device_name(index: int, profile: str, start: int) -> str:
    """The device name of `profile` at placement `start` on GPU `index`: ``gpu-0-mig-1g-10gb-at-6`` (a DNS label:
    the profile's ``.`` and ``+`` become ``-``)."""
    return f"gpu-{index}-mig-{re.sub(r'[^a-z0-9]+', '-', profile.lower()).strip('-')}-at-{start}"


def partition_memory(memory_mib: int) -> int:
    """The `memory` capacity a partition publishes, in bytes: exactly its memory as NVML reports the GPU-instance
    profile's (``memorySizeMB``, MiB), what a CUDA context in it can allocate.

    A grant is a floor: the scheduler gives a request only a partition whose capacity holds it, so the capacity is
    never rounded up. NVIDIA names profiles in decimal GB and keeps a reserve per partition (``1g.10gb`` on an
    H100 80GB has 9984 MiB), so ``memory: 10Gi`` does not fit a ``1g.10gb``: ask for ``9984Mi`` or select the
    profile by name."""
    return memory_mib * _MiB


def size_key(memory_slices: int, compute_slices: int) -> tuple[int, int]:
    """How small a partition is, smallest first: the counters it draws from its GPU, memory slices first, then
    compute slices (``1g.20gb`` before ``2g.20gb``, ``3g.40gb`` before ``4g.40gb``)."""
    return memory_slices, compute_slices


def is_mig_uuid(text: object) -> bool:
    """Whether `text` is a MIG UUID as the driver writes them (``MIG-<8>-<4>-<4>-<4>-<12>``, lower-case hex)."""
    return isinstance(text, str) and _MIG_UUID.fullmatch(text) is not None


def state_message(state: str, index: int | None = None) -> str:
    """What a MIG GPU's state means and what to do (the GPU object, the plugin's log and Node Event say it)."""
    gpu = f"-i {index} " if index is not None else ""
    if state == "enabled":
        return "MIG mode is on: its partitions are published"
    if state == "disabled":
        return (
            "MIG mode is off, so no partition is published: enable it on the node with "
            f"`nvidia-smi {gpu}-mig 1` while no process uses the GPU (a GPU reset or reboot may follow), then delete "
            "the node's fracgpu-kubelet-plugin pod; fracgpu does not switch MIG mode itself"
        )
    if state == "pending-enable":
        return (
            "MIG mode is enabled but pending a GPU reset, so no partition is published: reset the GPU "
            f"(`nvidia-smi {gpu}-r` with no process on it) or reboot the node, then delete the node's "
            "fracgpu-kubelet-plugin pod"
        )
    if state == "pending-disable":
        return (
            "MIG mode is being turned off (pending a GPU reset), so no partition is published; take the GPU out of "
            "the chart value mig.gpus to offer it whole"
        )
    if state == "unsupported":
        return (
            "this GPU cannot do MIG (A100, A30, H100, H200 and newer datacenter GPUs can), so nothing is published "
            "for it: take it out of the chart value mig.gpus to offer it whole or as shares"
        )
    return "the node plugin could not read this GPU's MIG mode or profiles, so nothing is published: see its log"
