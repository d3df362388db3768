"""A whole GPU's part of a claim's plan (pure): the share of a result on a GPU (its memory grant, reserved compute,
config and published attributes), the enforcement tier of each share from what the node offers, and the edits of the tiers this kind
applies itself (``nvml``: NVIDIA's memory-limit hook; ``hami-core``: HAMi-core's preload, cache and limits).
The ``mps`` tier's edits are the MPS kind's (``kinds/mps/plan.py``).

May import: ``kinds/share.py``, ``enforcement``, ``state``, ``core``, ``api``.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from api.compute import consumed_percent
from api.gpu_config import GpuConfig
from api.names import MEMORY_CAPACITY
from api.quantity import MiB, to_bytes
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings, is_selected
from kubelet_plugin.enforcement.tiers import EnforcementUnavailableError, GpuTiers, Tier, applied_tier
from kubelet_plugin.kinds.gpu.publish import gpu_entry, usable_memory
from kubelet_plugin.kinds.share import Edits, Share
from kubelet_plugin.state import cdi
from kubelet_plugin.state import device_metadata as meta
from kubelet_plugin.state.container_info import hami_cache_dir, hami_preload_file

HAMI_LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
HAMI_CACHE_IN_CONTAINER = "/tmp/fracgpu-hami"
NVML_HOOK = "apply-cuda-memory-limits"
NVML_REQUEST_ENV = "NVIDIA_GPU_MEMORY_REQUEST"
NVML_LIMIT_ENV = "NVIDIA_GPU_MEMORY_LIMIT"


@lru_cache(maxsize=512)
def published_attributes(gpu: GpuInfo, hami_core: bool, enforcement: Tier) -> Mapping[str, meta.Attribute]:
    """The GPU's attributes as its ResourceSlice device publishes them (``publish.gpu_entry``), as device metadata
    says them; computed once per GPU, HAMi-core availability and published tier (the step does not change them)."""
    return meta.attributes(gpu_entry(gpu, MiB, 0, hami_core, enforcement)["attributes"])


def gpu_share(
    result: Mapping[str, Any],
    gpu: GpuInfo,
    config: GpuConfig,
    settings: Settings,
    *,
    published: Tier,
    hami_core_installed: bool,
) -> Share:
    """The share of `result` on whole GPU `gpu`, granted what the scheduler consumed (an adminAccess result: the
    whole GPU, whatever it asked for); raises PrepareError for a MIG GPU itself, which only its partitions
    allocate. `published`: the GPU's published tier (its device metadata says it), `hami_core_installed`: as the
    publisher says it."""
    if is_selected(settings.mig_gpus, gpu.index, gpu.uuid):
        raise PrepareError(
            ErrorKind.UNKNOWN_DEVICE,
            f"device {result['device']} is MIG GPU {gpu.uuid} itself, which is allocated only by its partitions "
            "(DeviceClass mig.gpu.fracgpu.dev); a claim that tolerates its taint gpu.fracgpu.dev/mig-parent "
            "gets nothing: ask for a MIG partition, or a GPU not named in mig.gpus",
        )
    capacities = result.get("consumedCapacity")
    consumed = (capacities or {}).get(MEMORY_CAPACITY)
    admin = result.get("adminAccess") is True
    granted = (
        to_bytes(consumed)
        if consumed is not None and not admin
        else usable_memory(gpu, settings.memory_step_bytes, settings.memory_reserve_bytes)
    )  # an adminAccess result reaches the whole GPU, whatever it asked the scheduler for
    attributes = published_attributes(gpu, hami_core_installed, published)
    reserved = 0 if admin else consumed_percent(capacities)  # a monitor reserves nothing
    return Share(result, gpu, granted // MiB, config, attributes=attributes, compute_percent=reserved)


def with_tiers(shares: list[Share], settings: Settings, tiers: Mapping[str, GpuTiers], uid: str) -> list[Share]:
    """Each share with its enforcement tier (a MIG partition keeps ``mig``, which every tier a GpuConfig can ask
    for is weaker than). HAMi-core, once preloaded for one share, limits every GPU the container sees, so the
    claim's other ``none`` shares are ``hami-core`` too, and it cannot go with a MIG partition in one claim. nvml
    shares of one claim must have one grant: NVIDIA's hook reads a single NVIDIA_GPU_MEMORY_LIMIT per container.
    An MPS share must be its claim's only GPU. Raises PrepareError."""
    out = []
    for share in shares:
        if share.partition is not None or share.admin:  # an admin's tier stays none: nothing limits monitoring
            out.append(share)
            continue
        where = f"GPU {share.result['device']} ({share.gpu.uuid})"
        try:
            tier = applied_tier(settings.enforcement, share.config.enforcement, tiers[share.gpu.device_name], where)
        except EnforcementUnavailableError as err:
            raise PrepareError(
                ErrorKind.ENFORCEMENT_UNAVAILABLE, f"request {share.result['request']!r}: {err}"
            ) from None
        out.append(replace(share, tier=tier))
    if any(s.tier == "hami-core" for s in out):
        if any(s.partition is not None for s in out):
            raise PrepareError(
                ErrorKind.INVALID_CONFIG,
                f"claim {uid} has a MIG partition and a hami-core share, but HAMi-core preloaded for one limits every "
                "GPU of the container, the partition too: put the MIG partition in a claim of its own",
            )
        out = [replace(s, tier="hami-core") if s.tier == "none" else s for s in out]
    mps_gpus = {s.gpu.uuid for s in out if s.tier == "mps"}
    if mps_gpus and len({s.gpu.uuid for s in out}) > 1:
        raise PrepareError(
            ErrorKind.INVALID_CONFIG,
            f"claim {uid} has an MPS share and shares on {len({s.gpu.uuid for s in out})} GPUs, but a CUDA process is "
            "the client of one MPS daemon (one CUDA_MPS_PIPE_DIRECTORY), which serves one GPU: the process would "
            "see only that GPU. Put each MPS share in a claim of its own (one request, count 1) and give a container "
            "at most one of them",
        )
    grants = sorted({s.memory_mib for s in out if s.tier == "nvml"})
    if len(grants) > 1:
        raise PrepareError(
            ErrorKind.INVALID_CONFIG,
            f"claim {uid} has nvml-enforced shares of different sizes ({', '.join(f'{g} MiB' for g in grants)}), "
            f"but NVIDIA's hook reads one {NVML_LIMIT_ENV} per container: use one claim per share size",
        )
    return out


def tier_edits(share: Share, group: Sequence[Share], settings: Settings, claim_uid: str) -> Edits:
    """What the ``nvml`` or ``hami-core`` tier adds to `share`'s device (`group`: its request's shares, in CUDA
    order); nothing for another tier."""
    edits = Edits()
    if share.tier == "nvml":
        edits.env[NVML_REQUEST_ENV] = edits.env[NVML_LIMIT_ENV] = str(share.memory_mib)
        edits.hooks.append(nvml_hook(settings, share.gpu.uuid))
    if share.tier == "hami-core":
        edits.mounts += hami_mounts(settings, claim_uid)
        edits.env["FRACGPU_ENFORCEMENT"] = "hami-core"
        for i, s in enumerate(group):
            edits.env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{s.memory_mib}m"
        edits.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{HAMI_CACHE_IN_CONTAINER}/vgpu.cache"
        if (percent := share.compute_ceiling) is not None:
            edits.env["CUDA_DEVICE_SM_LIMIT"] = str(percent)
    return edits


def nvml_hook(settings: Settings, uuid: str) -> cdi.Hook:
    """NVIDIA's ``createRuntime`` hook that has the driver cap the container's cgroup on GPU `uuid` at
    NVIDIA_GPU_MEMORY_REQUEST (soft) / NVIDIA_GPU_MEMORY_LIMIT (hard), in MiB; the hook binary is the one
    driver edits install on the host, the driver root the host's."""
    root = settings.host_driver_root or settings.driver_root
    return cdi.Hook(
        hook_name="createRuntime",
        path=str(settings.cdi_hook_path),
        args=["nvidia-cdi-hook", NVML_HOOK, "--driver-root", str(root), "--gpu-id", uuid],
        env=["NVIDIA_CTK_DEBUG=false"],
    )


def hami_mounts(settings: Settings, uid: str) -> list[cdi.Mount]:
    """HAMi-core's mounts; only for a share whose tier is hami-core, which `tiers` offers only while the library
    is on the node."""
    library = settings.hami_core_library
    ro = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    rw = ["rw", "nosuid", "nodev", "rbind", "rprivate"]
    return [
        cdi.Mount(host_path=str(library), container_path=HAMI_LIBRARY_IN_CONTAINER, options=ro),
        cdi.Mount(host_path=str(hami_preload_file(settings)), container_path="/etc/ld.so.preload", options=ro),
        cdi.Mount(host_path=str(settings.hami_core_lock_dir), container_path="/tmp/vgpulock", options=rw),
        cdi.Mount(host_path=str(hami_cache_dir(settings, uid)), container_path=HAMI_CACHE_IN_CONTAINER, options=rw),
    ]
