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
from typing import Any

from kubelet_plugin.core.model import GpuInfo, MigGpu
from kubelet_plugin.enforcement.tiers import Tier
from kubelet_plugin.kinds.gpu.publish import gpu_entry
from kubelet_plugin.kinds.mig.publish import counter_set, mig_devices, parent_entry, partition_entry
from kubelet_plugin.kinds.mps.publish import with_mps_server

MAX_DEVICES_PER_SLICE = 128  # resource.k8s.io/v1 ResourceSliceMaxDevices
MAX_TAINTED_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures: taints or consumesCounters
MAX_COUNTER_SETS_PER_SLICE = 8  # ResourceSliceMaxCounterSets


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
    """A whole GPU's `spec.devices[]` entry (``kinds/gpu/publish.py``), with its MPS server's capacity and binding
    conditions when its tier is ``mps`` (``kinds/mps/publish.py``)."""
    entry = gpu_entry(gpu, step, reserve, hami_core, enforcement, taints=taints)
    return with_mps_server(entry, gpu, binding=mps_binding) if enforcement == "mps" else entry


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
