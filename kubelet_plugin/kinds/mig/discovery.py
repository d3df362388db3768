"""What the GPUs named by ``--mig-gpus`` offer for MIG, read through NVML (``pynvml``) once at start.

Per GPU: its MIG mode (current and pending) and, while it is on, every GPU-instance profile the driver reports
with its possible placements. Media-extension profiles (``+me``, ``-me``, ``+gfx``) are left out: they share the
GPU's media engines, which the counter model (``publishing/slices.py``) does not count. A GPU NVML cannot
answer for is ``error`` with NVML's message; a GPU without MIG is ``unsupported``; neither stops the others.
The plugin never changes MIG mode (that needs the GPU idle and often a reset: the operator's step).
"""

import ctypes
import logging
from collections.abc import Iterable

import pynvml

from kubelet_plugin.core.model import GpuInfo, MigGpu, MigProfile

log = logging.getLogger(__name__)

# NVML_GPU_INSTANCE_PROFILE_* indices to ask for: every one nvml.h defines (a driver answers NOT_SUPPORTED or
# INVALID_ARGUMENT for those its GPU lacks).
_PROFILE_INDICES = range(int(getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)))
_MAX_PLACEMENTS = 8
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _text(value: object) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def profile_name(nvml_name: str) -> str:
    """``MIG 1g.10gb`` -> ``1g.10gb``."""
    return nvml_name.removeprefix("MIG ").strip()


def is_media_variant(name: str) -> bool:
    """Whether a profile is a media-extension variant (``1g.10gb+me``, ``1g.10gb-me``, ``2g.20gb+gfx``)."""
    return "+" in name or "-" in name


def _placements(handle: object, profile_id: int) -> tuple[tuple[int, ...], int]:
    """The placement starts of a profile, ascending, and their size (memory slices)."""
    array = (pynvml.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
    count = ctypes.c_uint(_MAX_PLACEMENTS)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    found = [array[i] for i in range(count.value)]
    return tuple(sorted(int(p.start) for p in found)), max((int(p.size) for p in found), default=0)


def _profiles(handle: object) -> list[MigProfile]:
    """Every profile of an enabled GPU (media variants left out)."""
    out = []
    for index in _PROFILE_INDICES:
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except pynvml.NVMLError as err:
            if getattr(err, "value", None) in _ABSENT:
                continue
            raise
        name = profile_name(_text(info.name))
        if is_media_variant(name) or info.instanceCount == 0:
            continue
        starts, size = _placements(handle, int(info.id))
        if not starts or size == 0:
            continue
        profile = MigProfile(
            name=name,
            profile_id=int(info.id),
            compute_slices=int(info.sliceCount),
            memory_slices=size,
            memory_mib=int(info.memorySizeMB),
            multiprocessors=int(info.multiprocessorCount),
            placements=starts,
        )
        out.append(profile)
    return out


def _one(gpu: GpuInfo) -> MigGpu:
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as err:
            if getattr(err, "value", None) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return MigGpu(state="unsupported", detail=str(err))
            raise
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return MigGpu(state="pending-enable" if pending == pynvml.NVML_DEVICE_MIG_ENABLE else "disabled")
        if pending != pynvml.NVML_DEVICE_MIG_ENABLE:
            return MigGpu(state="pending-disable")
        found = _profiles(handle)
    except pynvml.NVMLError as err:
        return MigGpu(state="error", detail=f"NVML failed on GPU {gpu.index} ({gpu.uuid}): {err}")
    if not found:
        return MigGpu(state="error", detail=f"NVML reports no GPU-instance profile on GPU {gpu.index} ({gpu.uuid})")
    profiles = tuple(found)
    return MigGpu(
        state="enabled",
        memory_slices=max(start + p.memory_slices for p in profiles for start in p.placements),
        compute_slices=max(p.compute_slices for p in profiles),
        profiles=profiles,
    )


def discover_mig(gpus: Iterable[GpuInfo]) -> dict[str, MigGpu]:
    """Device name -> what that GPU offers for MIG, for each of `gpus` (those ``--mig-gpus`` names).

    One NVML session, always shut down. A failing ``nvmlInit`` makes every GPU ``error`` with its message.
    """
    gpus = list(gpus)
    if not gpus:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {g.device_name: MigGpu(state="error", detail=f"nvmlInit failed: {err}") for g in gpus}
    try:
        return {g.device_name: _one(g) for g in gpus}
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("nvmlShutdown failed", extra={"error": str(err)})
