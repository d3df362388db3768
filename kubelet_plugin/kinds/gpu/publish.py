"""What a whole GPU publishes (pure): a device shareable by ``memory`` in steps and by ``compute`` in percent
(``api/compute.py``), with its identity, place,
enforcement tier and HAMi-core availability. The attributes are also what a claim's device metadata says
(``prepare/plan.py`` reads them through ``GpuAttributes``, computed once per GPU and tier).

May import: ``enforcement``, ``core``, ``api``.
"""

from typing import Any

from api import compute
from api import mig as names
from api.names import COMPUTE_CAPACITY, MEMORY_CAPACITY
from api.quantity import format_bytes
from kubelet_plugin.core.attributes import identity_attributes
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.enforcement.tiers import ATTRIBUTE as ENFORCEMENT_ATTRIBUTE
from kubelet_plugin.enforcement.tiers import MPS_ATTRIBUTE, Tier


def usable_memory(gpu: GpuInfo, step: int, reserve: int) -> int:
    """Memory offered for sharing: total minus reserve, rounded down to a multiple of `step` (≥ 0)."""
    return max(0, (gpu.memory_total_bytes - reserve) // step * step)


def gpu_entry(
    gpu: GpuInfo,
    step: int,
    reserve: int,
    hami_core: bool = False,
    enforcement: Tier = "none",
    *,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """One `spec.devices[]` entry: a GPU shareable by `memory` in steps of `step` bytes and by `compute` (100,
    consumed only when a request asks for it: ``api.compute.gpu_capacity``); `hami_core`: the
    node can enforce limits with HAMi-core (its library is installed), published as attribute `hamiCore`;
    `enforcement`: the GPU's memory-enforcement tier (``GpuTiers.published``), attribute `memoryEnforcement`, and
    whether it is an MPS GPU, attribute `mps` (an MPS GPU's server capacity: ``kinds/mps/publish.py``);
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
            **identity_attributes(gpu),
            "hamiCore": {"bool": hami_core},
            ENFORCEMENT_ATTRIBUTE: {"string": enforcement},
            MPS_ATTRIBUTE: {"bool": enforcement == "mps"},
        },
        "capacity": {MEMORY_CAPACITY: capacity, COMPUTE_CAPACITY: compute.gpu_capacity()},
    }
    if taints:
        entry["taints"] = taints
    return entry
