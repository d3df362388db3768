"""The ResourceSlices that describe this node's GPUs (pure functions; publishing is in publisher.py)."""

from collections.abc import Mapping
from typing import Any

from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION
from api.names import MEMORY_CAPACITY, MPS_CLIENTS_CAPACITY
from api.quantity import format_bytes
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.enforcement.tiers import ATTRIBUTE as ENFORCEMENT_ATTRIBUTE
from kubelet_plugin.enforcement.tiers import MPS_ATTRIBUTE, Tier

MAX_DEVICES_PER_SLICE = 128  # resource.k8s.io/v1 ResourceSliceMaxDevices
MAX_TAINTED_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithTaints: a slice where any device has taints
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
    if memory >= 2 * step:  # validRange needs min + step <= value
        # default = all of it: a request without capacity (a whole GPU, the scheduler's extended-resource
        # claim) consumes the whole GPU, so it never meets a share (without a policy, the value is consumed)
        capacity["requestPolicy"] = {
            "default": format_bytes(memory),
            "validRange": {"min": format_bytes(step), "max": format_bytes(memory), "step": format_bytes(step)},
        }
    entry: dict[str, Any] = {
        "name": gpu.device_name,
        "allowMultipleAllocations": True,
        "attributes": {
            "uuid": {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "minor": {"int": gpu.minor},
            "productName": {"string": gpu.product_name[:64]},
            "architecture": {"string": gpu.architecture},
            "cudaComputeCapability": {"version": _semver(gpu.cuda_compute_capability)},
            "driverVersion": {"version": _semver(gpu.driver_version)},
            "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
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
    mps_binding: bool = False,
) -> list[dict[str, Any]]:
    """All slices of the node's pool (pool = node name), at most 128 devices each (64 once any device has
    taints), at least one slice. `enforcement`: device name -> the strongest tier that GPU offers (absent:
    none); `taints`: device name -> its taints (absent: none)."""
    tiers = enforcement or {}
    tainted = taints or {}
    devices = [
        device_entry(
            g,
            step,
            reserve,
            hami_core,
            tiers.get(g.device_name, "none"),
            taints=tainted.get(g.device_name),
            mps_binding=mps_binding,
        )
        for g in sorted(gpus, key=lambda g: g.index)
    ]
    size = MAX_TAINTED_DEVICES_PER_SLICE if any(tainted.values()) else MAX_DEVICES_PER_SLICE
    chunks = [devices[i : i + size] for i in range(0, len(devices), size)] or [[]]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node, driver, i),
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
                ],
            },
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]
