"""Watches NVML for GPU health in a thread of its own and records what it hears in a HealthBook.

Registers every GPU for XID critical error events (nvmlDeviceRegisterEvents) and waits on the event set with a
timeout (nvmlEventSetWait_v2: one event per call, NVML_ERROR_TIMEOUT when none came). After each XID it reads the
GPU's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, where the driver reports it). A wait answering
NVML_ERROR_GPU_IS_LOST, and every ``probe_interval`` seconds, each GPU is probed: lost (GPU_IS_LOST), or answering
with its recovery action, which is how a reset GPU becomes healthy again (`kubelet_plugin/health/book.py`). A GPU is opened by its UUID;
one the driver gives no handle for yet (lost since before the plugin started) is opened again at each probe. Any NVML failure is logged
and retried; the thread never ends before ``stop``. An XID the driver reports on a GPU instance (MIG) is recorded
on the memory slices of that instance's placement: the placement of the partition the checkpoint says that
instance is (``partition_of``), else the one the driver reports for the instance (nvmlDeviceGetGpuInstanceById,
nvmlGpuInstanceGetInfo), else (an instance gone already) on the whole GPU. Partitions that go away change nothing.
"""

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.health.book import HealthBook, SliceFault, Transition
from kubelet_plugin.health.metrics import HealthMetrics

log = logging.getLogger(__name__)
WAIT_MS = 500
RETRY_S = 5.0
NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t.gpuInstanceId of an event that is not about one GPU instance


def _address(handle: Any) -> int:
    """The value of an nvmlDevice_t, to tell which GPU an event is about."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class NvmlHealthWatcher:
    """``run(stop)`` watches the GPUs' health; ``on_transition`` gets every change of a GPU's state."""

    def __init__(
        self,
        gpus: list[GpuInfo],
        book: HealthBook,
        *,
        ignored_xids: frozenset[int],
        on_transition: Callable[[Transition], None],
        metrics: HealthMetrics,
        probe_interval: float,
        nvml: Any = pynvml,
        clock: Callable[[], float] = time.monotonic,
        partition_of: Callable[[str, int], tuple[str, tuple[int, ...]] | None] | None = None,
    ) -> None:
        """``partition_of(gpu device, GPU instance id)``: the partition device that instance is and its memory
        slices (None: none of ours)."""
        self._gpus = gpus
        self._book = book
        self._ignored = ignored_xids
        self._on_transition = on_transition
        self._metrics = metrics
        self._probe_interval = probe_interval
        self._nvml = nvml
        self._clock = clock
        self._handles: dict[str, Any] = {}
        self._by_address: dict[int, str] = {}
        self._partition_of = partition_of or (lambda gpu, instance: None)

    def run(self, stop: threading.Event) -> None:
        """Watch until ``stop``; a failed NVML session is logged and started again after RETRY_S."""
        while not stop.is_set():
            try:
                self._session(stop)
            except Exception:
                log.exception("GPU health watch failed; restarting it", extra={"retry_s": RETRY_S})
                stop.wait(RETRY_S)

    def _emit(self, transition: Transition | None) -> None:
        if transition is not None:
            log.warning(
                "GPU health changed",
                extra={"gpu": transition.device, "before": transition.before, "after": transition.after,
                       "what": transition.what},
            )  # fmt: skip
            self._on_transition(transition)

    def _session(self, stop: threading.Event) -> None:
        nv = self._nvml
        nv.nvmlInit()
        event_set = None
        try:
            self._handles, self._by_address = {}, {}
            event_set = nv.nvmlEventSetCreate()
            self._probe_all(event_set)
            next_probe = self._clock() + self._probe_interval
            while not stop.is_set():
                self._wait_one(event_set)
                if self._clock() >= next_probe:
                    self._probe_all(event_set)
                    next_probe = self._clock() + self._probe_interval
        finally:
            if event_set is not None:
                try:
                    nv.nvmlEventSetFree(event_set)
                except nv.NVMLError as err:
                    log.warning("nvmlEventSetFree failed", extra={"error": str(err)})
            nv.nvmlShutdown()

    def _open(self, gpu: GpuInfo, event_set: Any) -> bool:
        """Get the handle of ``gpu`` by its UUID (so it is that GPU that answers) and register it for events;
        False where the driver cannot give one yet (a GPU lost at start): recorded lost, tried at each probe."""
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
        except nv.NVMLError as err:
            if err.value == nv.NVML_ERROR_GPU_IS_LOST:
                self._emit(self._book.record_lost(gpu.device_name))
            else:
                log.warning("no NVML handle for the GPU", extra={"gpu": gpu.device_name, "error": str(err)})
            return False
        self._handles[gpu.device_name] = handle
        self._by_address[_address(handle)] = gpu.device_name
        self._register(gpu.device_name, handle, event_set)
        return True

    def _register(self, name: str, handle: Any, event_set: Any) -> None:
        nv = self._nvml
        try:
            supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
            if not supported & nv.nvmlEventTypeXidCriticalError:
                log.warning("GPU reports no XID events; its health is probed only", extra={"gpu": name})
                return
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError as err:
            if err.value == nv.NVML_ERROR_GPU_IS_LOST:
                self._emit(self._book.record_lost(name))
            else:
                log.warning("cannot register for XID events; probing only", extra={"gpu": name, "error": str(err)})

    def _wait_one(self, event_set: Any) -> None:
        nv = self._nvml
        try:
            data = nv.nvmlEventSetWait_v2(event_set, WAIT_MS)
        except nv.NVMLError as err:
            if err.value == nv.NVML_ERROR_TIMEOUT:
                return
            if err.value == nv.NVML_ERROR_GPU_IS_LOST:
                self._probe_all(event_set)  # which GPU: the one whose calls now fail
                return
            raise
        name = self._by_address.get(_address(data.device))
        if name is None or not data.eventType & nv.nvmlEventTypeXidCriticalError:
            return
        xid = int(data.eventData)
        self._metrics.xid_events.labels(gpu=name, xid=str(xid)).inc()
        action = self._recovery_action(name)
        instance = int(getattr(data, "gpuInstanceId", NO_INSTANCE))
        fault = self._instance_fault(name, instance, xid) if instance != NO_INSTANCE else None
        if fault is not None:  # on one GPU instance: its memory slices; the recovery action is the GPU's
            self._emit(self._book.record_instance_xid(name, fault, self._ignored, action))
            return
        self._emit(self._book.record_xid(name, xid, self._ignored, action))

    def _instance_fault(self, name: str, instance: int, xid: int) -> SliceFault | None:
        """Where on GPU ``name`` GPU instance ``instance`` is: its partition and memory slices from the
        checkpoint, else the slices of the placement the driver reports for it; None where neither knows."""
        known = self._partition_of(name, instance)
        if known is not None:
            return SliceFault(xid=xid, xid_class="ignore", slices=known[1], instance=instance, partition=known[0])
        nv = self._nvml
        try:
            info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(self._handles[name], instance))
        except nv.NVMLError as err:
            log.warning("an XID on a GPU instance the driver no longer knows: recorded on the whole GPU",
                        extra={"gpu": name, "gpu_instance": instance, "xid": xid, "error": str(err)})  # fmt: skip
            return None
        start, size = int(info.placement.start), int(info.placement.size)
        return SliceFault(xid=xid, xid_class="ignore", slices=tuple(range(start, start + size)), instance=instance)

    def _recovery_action(self, name: str) -> int | None:
        """The GPU's recovery action, None where the driver does not report one (or the GPU does not answer)."""
        nv = self._nvml
        try:
            value = nv.nvmlDeviceGetFieldValues(self._handles[name], [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
        except nv.NVMLError:
            return None
        return int(value.value.uiVal) if value.nvmlReturn == nv.NVML_SUCCESS else None

    def _probe_all(self, event_set: Any) -> None:
        nv = self._nvml
        for gpu in self._gpus:
            name = gpu.device_name
            if name not in self._handles and not self._open(gpu, event_set):
                continue
            handle = self._handles[name]
            try:
                nv.nvmlDeviceGetUUID(handle)
            except nv.NVMLError as err:
                if err.value == nv.NVML_ERROR_GPU_IS_LOST:
                    self._emit(self._book.record_lost(name))
                else:
                    log.warning("GPU health probe failed", extra={"gpu": name, "error": str(err)})
                continue
            self._emit(self._book.record_answer(name, self._recovery_action(name)))
