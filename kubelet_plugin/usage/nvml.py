"""GPU memory per process through NVML (``pynvml``), for the usage sampler."""

from collections.abc import Callable, Iterable
from typing import Any

import pynvml

from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.usage.attribution import ProcessSample


class SampleError(Exception):
    """One sample could not be taken; ``reason`` is the counter label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ----- NVML -----------------------------------------------------------------------------------------


class NvmlProcesses:
    """GPU memory per process through NVML (``pynvml``), NVML kept initialised between samples."""

    def __init__(self, gpus: Iterable[GpuInfo]) -> None:
        self._uuids = [g.uuid for g in gpus]
        self._initialised = False
        self._calls: list[Callable[[object], list[Any]]] = [
            pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
            pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
        ]

    def sample(self) -> tuple[list[ProcessSample], dict[str, str]]:
        """Processes per GPU of this node, and the GPUs whose query failed (UUID -> error). Raises
        ``SampleError`` when NVML cannot be used at all (not loadable, or without the call)."""
        if not self._initialised:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                raise SampleError("nvml_init", f"NVML initialisation failed: {err}") from None
            self._initialised = True
        processes: list[ProcessSample] = []
        failed: dict[str, str] = {}
        for uuid in self._uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                infos = self._processes(handle)
            except pynvml.NVMLError as err:
                if getattr(err, "value", None) in (pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_GPU_IS_LOST):
                    self._initialised = False  # initialise again next time
                failed[uuid] = str(err)
                continue
            for info in infos:
                used = info.usedGpuMemory  # None where NVML cannot tell (reported as NVML_VALUE_NOT_AVAILABLE)
                processes.append(ProcessSample(gpu_uuid=uuid, pid=int(info.pid), used_bytes=int(used or 0)))
        return processes, failed

    def _processes(self, handle: object) -> list[Any]:
        """The GPU's compute processes by the newest versioned call the driver has (pynvml's unversioned
        wrapper refuses to fall back); raises ``SampleError`` when it has none."""
        for call in self._calls:
            try:
                result: list[Any] = call(handle)
                return result
            except pynvml.NVMLError as err:
                if getattr(err, "value", None) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                self._calls = [c for c in self._calls if c is not call]
        raise SampleError(
            "function_not_found",
            "the driver's NVML has no nvmlDeviceGetComputeRunningProcesses (_v3 or _v2; driver too old): GPU "
            "memory use per claim cannot be measured; set --usage-interval=0 to stop trying",
        )
