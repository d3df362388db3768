"""Creating and destroying MIG partitions through NVML (``pynvml``): the one place that changes a GPU's instances.

A partition is a GPU instance (GI) of a profile at the placement the scheduler's device stands for
(``nvmlDeviceCreateGpuInstanceWithPlacement``) holding one compute instance (CI) that takes all of it. The CI
profile is read from the GI, never assumed: the GI is asked for each CI profile and the one whose slice count is
the GI's compute slices is taken (a CI profile that does not exist in that GI, as ``8_SLICE`` or a GI profile id
used as a CI profile id would, is refused by the driver: NVIDIA's DRA driver issue #1480). A failure after the GI
exists destroys what was made. Each call opens and closes its own NVML session.

``MigManager`` is what the preparer uses; ``NvmlMig`` implements it on the driver (and on the mock NVML of
``harness/mocknvml``, whose MIG model is the driver's), tests may give another with the same semantics.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pynvml

from kubelet_plugin.core.model import GpuInfo, MigProfile, MigRecord

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_GI_PROFILE_COUNT = int(getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))
_CI_PROFILE_COUNT = int(getattr(pynvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 0x9))
_MAX_INSTANCES = 8  # the most instances of one profile (7 one-slice GIs, 7 one-slice CIs) and then some

# What an NVML error means here, and what to do.
_MEANING: dict[int, str] = {
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: (
        "the placement's memory slices or the GPU's compute slices are taken by another GPU instance (one fracgpu "
        "did not create, or that a process still holds), or the profile has no instance left"
    ),
    pynvml.NVML_ERROR_IN_USE: "a process still uses it",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "MIG mode is off or the GPU does not offer this profile",
    pynvml.NVML_ERROR_NO_PERMISSION: "the plugin may not manage MIG: it needs root (the chart runs it privileged)",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "the driver does not offer this profile at this placement",
}


class MigError(Exception):
    """NVML refused a MIG operation; ``code`` is its NVML error code (None: not an NVML error)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def in_use(self) -> bool:
        return bool(self.code == pynvml.NVML_ERROR_IN_USE)


@dataclass(frozen=True)
class LiveInstance:
    """A GPU instance that exists on a GPU, with its compute instances' ids."""

    parent_uuid: str
    gpu_instance: int
    profile_id: int
    placement_start: int
    compute_instances: tuple[int, ...]


class MigManager(Protocol):
    """Creates, checks and destroys MIG partitions; every method raises MigError for what NVML refuses."""

    def create(self, gpu: GpuInfo, profile: MigProfile, start: int) -> MigRecord:
        """A partition of `profile` at placement `start` of `gpu`: its GI, its full CI and the MIG device."""
        ...

    def alive(self, record: MigRecord) -> bool:
        """Whether the partition still exists as recorded (same GI, CI, placement and MIG UUID)."""
        ...

    def destroy(self, record: MigRecord) -> None:
        """Destroy the partition's CI, then its GI; a partition already gone is fine. Instances that are now
        another partition (another placement, profile or MIG UUID) are left alone."""
        ...

    def instances(self, gpus: list[GpuInfo]) -> list[LiveInstance]:
        """Every GPU instance on `gpus` (those whose MIG mode is on)."""
        ...

    def destroy_instance(self, instance: LiveInstance) -> None:
        """Destroy a GPU instance and its compute instances (an orphan no claim owns)."""
        ...


def _describe(what: str, err: pynvml.NVMLError) -> MigError:
    code = getattr(err, "value", None)
    meaning = _MEANING.get(code, "") if isinstance(code, int) else ""
    return MigError(
        f"NVML {what} failed: {err}" + (f" ({meaning})" if meaning else ""), code if isinstance(code, int) else None
    )


def _call(what: str, fn: Callable[..., _T], *args: Any) -> _T:
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        raise _describe(what, err) from None


def _code(err: pynvml.NVMLError) -> int | None:
    code = getattr(err, "value", None)
    return code if isinstance(code, int) else None


def _text(value: object) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


@contextmanager
def _session() -> Iterator[None]:
    _call("initialisation (nvmlInit)", pynvml.nvmlInit)
    try:
        yield
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("nvmlShutdown failed", extra={"error": str(err)})


class NvmlMig:
    """MigManager on the NVIDIA driver."""

    def create(self, gpu: GpuInfo, profile: MigProfile, start: int) -> MigRecord:
        where = f"{profile.name} at placement {start} of GPU {gpu.index} ({gpu.uuid})"
        with _session():
            handle = _call(f"handle of GPU {gpu.uuid}", pynvml.nvmlDeviceGetHandleByUUID, gpu.uuid)
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, profile.memory_slices
            gi = _call(
                f"creating the GPU instance {where}",
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                handle,
                profile.profile_id,
                ctypes.byref(placement),
            )
            ci = None
            try:
                gi_id = int(_call("GPU instance info", pynvml.nvmlGpuInstanceGetInfo, gi).id)
                ci_profile = _full_ci_profile(gi, profile, where)
                ci = _call(
                    f"creating the compute instance of {where}",
                    pynvml.nvmlGpuInstanceCreateComputeInstance,
                    gi,
                    int(ci_profile.id),
                )
                ci_id = int(_call("compute instance info", pynvml.nvmlComputeInstanceGetInfo, ci).id)
                uuid, memory = _mig_device(handle, gi_id, ci_id, where)
            except MigError:
                _undo(gi, ci, where)
                raise
        return MigRecord(
            parent_uuid=gpu.uuid,
            gpu_instance=gi_id,
            compute_instance=ci_id,
            profile=profile.name,
            profile_id=profile.profile_id,
            placement_start=start,
            memory_slices=profile.memory_slices,
            uuid=uuid,
            memory_mib=memory,
            multiprocessors=int(ci_profile.multiprocessorCount),
        )

    def alive(self, record: MigRecord) -> bool:
        with _session():
            found = _find(record)
            if found is None:
                return False
            handle = _call("GPU handle", pynvml.nvmlDeviceGetHandleByUUID, record.parent_uuid)
            try:
                uuid, _ = _mig_device(handle, record.gpu_instance, record.compute_instance, record.uuid)
            except MigError:
                return False
            return uuid == record.uuid

    def destroy(self, record: MigRecord) -> None:
        with _session():
            found = _find(record)
            if found is None:
                return
            handle = _call("GPU handle", pynvml.nvmlDeviceGetHandleByUUID, record.parent_uuid)
            try:
                uuid, _ = _mig_device(handle, record.gpu_instance, record.compute_instance, record.uuid)
            except MigError:
                uuid = None
            if uuid != record.uuid:
                return  # the recorded partition is gone; these instances are another one (made again since)
            gi, ci = found
            _call(
                f"destroying the compute instance of MIG partition {record.uuid}", pynvml.nvmlComputeInstanceDestroy, ci
            )
            _call(f"destroying the GPU instance of MIG partition {record.uuid}", pynvml.nvmlGpuInstanceDestroy, gi)

    def instances(self, gpus: list[GpuInfo]) -> list[LiveInstance]:
        out: list[LiveInstance] = []
        with _session():
            for gpu in gpus:
                handle = _call(f"handle of GPU {gpu.uuid}", pynvml.nvmlDeviceGetHandleByUUID, gpu.uuid)
                try:
                    current, _ = pynvml.nvmlDeviceGetMigMode(handle)
                except pynvml.NVMLError:
                    continue  # no MIG: no instance
                if current != pynvml.NVML_DEVICE_MIG_ENABLE:
                    continue
                out += _instances_of(gpu.uuid, handle)
        return out

    def destroy_instance(self, instance: LiveInstance) -> None:
        what = f"GPU instance {instance.gpu_instance} of GPU {instance.parent_uuid}"
        with _session():
            handle = _call(
                f"handle of GPU {instance.parent_uuid}", pynvml.nvmlDeviceGetHandleByUUID, instance.parent_uuid
            )
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, instance.gpu_instance)
            except pynvml.NVMLError as err:
                if _code(err) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    return
                raise _describe(f"looking up {what}", err) from None
            for ci_id in instance.compute_instances:
                try:
                    ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                except pynvml.NVMLError as err:
                    if _code(err) == pynvml.NVML_ERROR_NOT_FOUND:
                        continue
                    raise _describe(f"looking up compute instance {ci_id} of {what}", err) from None
                _call(f"destroying compute instance {ci_id} of {what}", pynvml.nvmlComputeInstanceDestroy, ci)
            _call(f"destroying {what}", pynvml.nvmlGpuInstanceDestroy, gi)


def _full_ci_profile(gi: object, profile: MigProfile, where: str) -> Any:
    """The CI profile of the GI that takes all its compute slices, as the GI reports it."""
    offered = []
    for index in range(_CI_PROFILE_COUNT):
        try:
            info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except pynvml.NVMLError as err:
            if _code(err) in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                continue  # no such CI profile in this GI
            raise _describe("compute instance profiles", err) from None
        if int(info.sliceCount) == profile.compute_slices:
            return info
        offered.append(f"{_text(info.name)} ({info.sliceCount} slices)")
    raise MigError(
        f"the GPU instance {where} offers no compute instance profile of {profile.compute_slices} slices "
        f"(it offers {', '.join(offered) or 'none'})"
    )


def _mig_device(handle: object, gi_id: int, ci_id: int, where: str) -> tuple[str, int]:
    """The MIG UUID and memory (MiB) of the MIG device of GI `gi_id`, CI `ci_id`."""
    count = int(_call("MIG device count", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle))
    for index in range(count):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError as err:
            if _code(err) == pynvml.NVML_ERROR_NOT_FOUND:
                break
            raise _describe("MIG device handle", err) from None
        if (
            int(_call("GPU instance id", pynvml.nvmlDeviceGetGpuInstanceId, mig)) == gi_id
            and int(_call("compute instance id", pynvml.nvmlDeviceGetComputeInstanceId, mig)) == ci_id
        ):
            uuid = _text(_call("MIG device UUID", pynvml.nvmlDeviceGetUUID, mig))
            memory = int(_call("MIG device memory", pynvml.nvmlDeviceGetMemoryInfo, mig).total) >> 20
            return uuid, memory
    raise MigError(f"the driver lists no MIG device for the instances it just created ({where})")


def _undo(gi: object, ci: object | None, where: str) -> None:
    """Destroy what a failed create made (logged, never raised: the create's error is the one to report)."""
    try:
        if ci is not None:
            pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)
    except pynvml.NVMLError as err:
        log.error("cannot destroy a half-created MIG partition", extra={"partition": where, "error": str(err)})


def _find(record: MigRecord) -> tuple[object, object] | None:
    """(GI, CI) handles of the record's instances when they are still the recorded ones; None when gone."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(record.parent_uuid)
        gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, record.gpu_instance)
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
        if int(info.placement.start) != record.placement_start or int(info.profileId) != record.profile_id:
            return None
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, record.compute_instance)
    except pynvml.NVMLError as err:
        if _code(err) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
            return None
        if _code(err) == pynvml.NVML_ERROR_NOT_SUPPORTED:  # MIG mode is off now: no instance exists
            return None
        raise _describe(f"looking up MIG partition {record.uuid}", err) from None
    return gi, ci


def _instances_of(uuid: str, handle: object) -> list[LiveInstance]:
    out = []
    for index in range(_GI_PROFILE_COUNT):
        try:
            profile_id = int(pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index).id)
        except pynvml.NVMLError:
            continue
        array = (pynvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        _call(
            "listing GPU instances",
            pynvml.nvmlDeviceGetGpuInstances,
            handle,
            profile_id,
            array,
            ctypes.byref(count),
        )
        for gi in array[: count.value]:
            info = _call("GPU instance info", pynvml.nvmlGpuInstanceGetInfo, gi)
            cis: list[int] = []
            for ci_index in range(_CI_PROFILE_COUNT):
                ci_array = (pynvml.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
                ci_count = ctypes.c_uint(_MAX_INSTANCES)
                try:
                    pynvml.nvmlGpuInstanceGetComputeInstances(gi, ci_index, ci_array, ctypes.byref(ci_count))
                except pynvml.NVMLError:
                    continue
                cis += [int(pynvml.nvmlComputeInstanceGetInfo(c).id) for c in ci_array[: ci_count.value]]
            out.append(LiveInstance(uuid, int(info.id), profile_id, int(info.placement.start), tuple(sorted(cis))))
    return out
