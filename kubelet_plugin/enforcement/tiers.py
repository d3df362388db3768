"""Memory-enforcement tiers per GPU: what each GPU can give, and which tier a claim's share gets (pure).

Tiers, weakest first:

- ``none``: the grant is advisory (the scheduler's accounting, the env and the info files);
- ``hami-core``: HAMi-core's ``libvgpu.so`` preloaded into the container (needs the library on the node);
  soft: a workload can drop the preload;
- ``mps``: the share is a CUDA MPS client of its GPU's control daemon (``kubelet_plugin/mps_supervisor``), which the
  GPU's EXCLUSIVE_PROCESS compute mode makes the only way onto that GPU. The grant is the client's pinned device
  memory limit and its compute ceiling (reserved ``compute``, or ``computeLimitPercent``: ``api/compute.py``) its
  active thread percentage, both in the client's environment,
  where CUDA lets a process lower them but not raise them above what the GPU's daemon sets: the daemon holds
  the ceiling (the largest grant and percentage on that GPU), the environment each share's own value. Stronger
  than hami-core (the driver applies it, no preload to drop), weaker than nvml (within the ceiling a workload
  that rewrites its environment can take more than its grant; nvml's cgroup limit cannot be lifted from
  inside the container). Only on the GPUs the operator names (``--mps-gpus``), and there every share is mps;
- ``nvml``: NVIDIA's toolkit hook ``nvidia-cdi-hook apply-cuda-memory-limits``, a ``createRuntime`` hook that
  calls the driver's ``nvmlDeviceSetMemoryLimits_v1`` on the container's cgroup. Needs the cgroup v2 unified
  hierarchy where the hook looks (``/sys/fs/cgroup``), a driver whose NVML has that call and answers the
  probe for the GPU, and ``--driver-edits=toolkit`` (the plugin installs the hook binary on the host).

- ``mig``: a MIG partition's own (``--mig-gpus``): its memory, SMs and caches are the hardware's partition, so
  nothing a process does gets it more; never a whole GPU's tier, never asked for by a GpuConfig (a claim gets it
  by its DeviceClass, ``mig.gpu.fracgpu.dev``), and stronger than every other tier a GpuConfig can ask for.

The node's mode is the floor: ``auto`` is the strongest tier each GPU offers, an explicit tier is that tier;
on an MPS GPU the floor is ``mps`` whatever the mode (a process outside MPS cannot use the GPU there).
A claim's GpuConfig may raise its tier above the floor, never lower it; a tier the GPU cannot give is an
``EnforcementUnavailableError`` naming the GPU and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from api.gpu_config import Enforcement
from kubelet_plugin.core.model import NodeMode

Tier = Literal["none", "hami-core", "mps", "nvml", "mig"]

TIERS: tuple[Tier, ...] = get_args(Tier)
"""Weakest first."""
OFFERED_BY_GPUS: tuple[Enforcement, ...] = get_args(Enforcement)
"""The tiers a whole GPU can offer and a GpuConfig can ask for (``mig`` is a partition's own)."""
ATTRIBUTE = "memoryEnforcement"
"""ResourceSlice device attribute (string): the GPU's tier, `GpuTiers.published`."""
MPS_ATTRIBUTE = "mps"
"""ResourceSlice device attribute (bool): an MPS GPU (every share on it is an MPS client)."""


def strength(tier: Tier) -> int:
    """Position of `tier` in TIERS (0 = none)."""
    return TIERS.index(tier)


class NodeFacts(BaseModel):
    """What the node offers to every GPU; each `*_problem` is None when the fact holds, else why not."""

    model_config = ConfigDict(frozen=True)

    cgroup_problem: str | None
    """None: the cgroup v2 unified hierarchy is mounted where the hook looks."""
    driver_edits_problem: str | None
    """None: --driver-edits=toolkit, so the hook binary is installed on the host."""
    hami_core_problem: str | None
    """None: HAMi-core's library is present."""


class NvmlLimits(BaseModel):
    """One GPU's answer to the NVML probe: `problem` None when the driver can set memory limits on it."""

    model_config = ConfigDict(frozen=True)

    problem: str | None


class MpsFacts(BaseModel):
    """One GPU's MPS facts: `selected` when the operator made it an MPS GPU (--mps-gpus); `problem` None when its
    control daemon is up, else why not."""

    model_config = ConfigDict(frozen=True)

    selected: bool = False
    problem: str | None = None


NOT_MPS = MpsFacts()
"""A GPU the operator did not make an MPS GPU."""
MPS_ONLY = "an MPS GPU runs every share as an MPS client"


class GpuTiers(BaseModel):
    """The tiers one GPU offers and, for each other tier, why not."""

    model_config = ConfigDict(frozen=True)

    available: tuple[Tier, ...]
    """Weakest first; always starts with ``none``."""
    missing: dict[str, str] = {}
    """tier -> the reason it is not available."""
    required: Tier | None = None
    """The tier every share on this GPU gets, whatever the node's mode (``mps`` on an MPS GPU)."""

    @property
    def strongest(self) -> Tier:
        return self.available[-1]

    @property
    def published(self) -> Tier:
        """The tier this GPU stands for in its ResourceSlice: `required`, else the strongest available."""
        return self.required or self.strongest


def gpu_tiers(node: NodeFacts, nvml: NvmlLimits, mps: MpsFacts = NOT_MPS) -> GpuTiers:
    """The tiers of one GPU from the node's facts, the GPU's NVML probe and its MPS facts."""
    missing: dict[str, str] = {}
    if mps.selected:
        missing["hami-core"] = MPS_ONLY
        missing["nvml"] = (
            f"{MPS_ONLY}, whose memory its MPS server allocates outside the container's cgroup that NVIDIA's hook "
            "limits"
        )
        if mps.problem is not None:
            missing["mps"] = mps.problem
        return GpuTiers(
            available=tuple(t for t in OFFERED_BY_GPUS if t not in missing), missing=missing, required="mps"
        )
    missing["mps"] = "it is not an MPS GPU (chart value mps.gpus, plugin flag --mps-gpus)"
    if node.hami_core_problem is not None:
        missing["hami-core"] = node.hami_core_problem
    nvml_problems = [p for p in (node.driver_edits_problem, node.cgroup_problem, nvml.problem) if p is not None]
    if nvml_problems:
        missing["nvml"] = "; ".join(nvml_problems)
    ordered = {t: missing[t] for t in TIERS if t in missing}
    return GpuTiers(available=tuple(t for t in OFFERED_BY_GPUS if t not in missing), missing=ordered)


class EnforcementUnavailableError(ValueError):
    """A share asks for a tier its GPU cannot give; the message names the GPU, the asker and what to do."""


def applied_tier(mode: NodeMode, requested: Tier | None, gpu: GpuTiers, where: str) -> Tier:
    """The tier a share on `gpu` gets: the node's floor (`mode`, ``auto`` = the GPU's strongest) raised to the
    claim's `requested` tier, never lowered. `where` names the GPU in errors (e.g. ``GPU gpu-0 (GPU-…)``).

    Raises EnforcementUnavailableError when that tier is not in `gpu.available`.
    """
    floor: Tier = gpu.required or (gpu.strongest if mode == "auto" else mode)
    tier = max(floor, requested or "none", key=strength)
    if tier in gpu.available:
        return tier
    if requested == tier and strength(tier) > strength(floor):
        asker = f"the claim's GpuConfig asks for enforcement {tier!r}"
    elif gpu.required == tier:
        asker = f"{where} is an MPS GPU, where every share is an MPS client"
    else:
        asker = f"this node's enforcement mode is {mode!r} (--enforcement, chart value enforcement.mode)"
    raise EnforcementUnavailableError(
        f"{asker}, but {where} cannot give it: {gpu.missing.get(tier, 'not offered')}; this GPU offers "
        + ", ".join(repr(t) for t in gpu.available)
        + _advice(tier)
    )


def _advice(tier: Tier) -> str:
    if tier == "nvml":
        return (
            " (nvml needs cgroup v2, a driver whose NVML has nvmlDeviceSetMemoryLimits_v1 (r615 or newer) and "
            "driverEdits: toolkit); select such GPUs with the attribute memoryEnforcement, or ask for less"
        )
    if tier == "hami-core":
        return " (hami-core needs HAMi-core's libvgpu.so on the node, chart value enforcement.hamiCore.libraryPath)"
    if tier == "mps":
        return (
            " (mps needs the GPU named in the chart value mps.gpus and its MPS control daemon running: see the "
            "fracgpu-mps DaemonSet's pod on this node); select such GPUs with the attribute mps"
        )
    return ""


def weakest(tiers: Mapping[str, Tier] | list[Tier]) -> Tier:
    """The weakest of several tiers (``none`` for none): what holds for all of them."""
    values = list(tiers.values()) if isinstance(tiers, Mapping) else tiers
    return min(values, key=strength, default="none")
