"""GPU discovery through NVML (``pynvml`` from ``nvidia-ml-py``).

The same code path runs against the real ``libnvidia-ml.so.1`` and against the mock one built from
``e2e/mocknvml/mock_nvml.c`` (selected with ``LD_LIBRARY_PATH`` and ``FRACGPU_MOCK_NVML_PROFILE``).
"""

import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from kubelet_plugin.model import GpuInfo

__all__ = ["DiscoveryError", "discover_gpus", "driver_version", "normalise_pci_bus_id"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

# NVML_DEVICE_ARCH_* -> the name the ResourceSlice publishes as `architecture`.
_ARCHITECTURES: dict[int, str] = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
    13: "Rubin",  # NVML_DEVICE_ARCH_RUBIN; not in every nvidia-ml-py release
}
_UNKNOWN_ARCHITECTURE = "Unknown"

# What to check, by NVML error code.
_HINTS: dict[int, str] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 not found — is the NVIDIA driver installed and is the driver root mounted "
        "(and on the library path) in this container?"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded — check `nvidia-smi` and `lsmod | grep nvidia` on the node"
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "no permission to talk to the driver — does the plugin container run privileged with /dev/nvidia* visible?"
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the user-space driver library and the kernel module differ in version — "
        "reboot the node or reload the module after a driver upgrade"
    ),
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: (
        "the installed driver's libnvidia-ml.so.1 lacks a function nvidia-ml-py needs — the driver is too old"
    ),
    pynvml.NVML_ERROR_GPU_IS_LOST: "a GPU fell off the bus — check `nvidia-smi` and the kernel log (Xid errors)",
    pynvml.NVML_ERROR_UNINITIALIZED: "NVML was not initialised — this is a bug in the plugin",
}
_DEFAULT_HINT = "check `nvidia-smi` on the node"

_PCI_BUS_ID = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


class DiscoveryError(Exception):
    """NVML could not be loaded or queried; the message says what failed and what to check."""


def _describe(err: pynvml.NVMLError) -> str:
    code = getattr(err, "value", None)
    hint = _HINTS.get(code, _DEFAULT_HINT) if isinstance(code, int) else _DEFAULT_HINT
    return f"{err} (NVML error {code}); {hint}"


def _nvml(what: str, fn: Callable[..., _T], *args: Any) -> _T:
    """Call one pynvml function; turn an NVMLError into a DiscoveryError that names ``what``."""
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        raise DiscoveryError(f"NVML {what} failed: {_describe(err)}") from err


def _text(value: object) -> str:
    """pynvml returns ``str`` on Python 3 in recent releases and ``bytes`` in older ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def normalise_pci_bus_id(bus_id: str) -> str:
    """Return ``bus_id`` (e.g. NVML's ``00000000:17:00.0``) as lower-case ``dddd:bb:dd.f``.

    The domain is printed with at least 4 hex digits, as Linux does in sysfs; a domain above 0xffff keeps
    all its digits. Raises ValueError for text that is not a PCI address.
    """
    match = _PCI_BUS_ID.fullmatch(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def _architecture(handle: object, index: int) -> str:
    """Architecture name of one GPU; 'Unknown' where the driver cannot say (old drivers, new chips)."""
    try:
        value = pynvml.nvmlDeviceGetArchitecture(handle)
    except pynvml.NVMLError as err:
        if getattr(err, "value", None) in (
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        ):
            return _UNKNOWN_ARCHITECTURE
        raise DiscoveryError(f"NVML architecture of GPU {index} failed: {_describe(err)}") from err
    return _ARCHITECTURES.get(int(value), _UNKNOWN_ARCHITECTURE)


def _gpu(index: int, driver_version: str) -> GpuInfo:
    handle = _nvml(f"handle of GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)
    pci = _nvml(f"PCI info of GPU {index}", pynvml.nvmlDeviceGetPciInfo, handle)
    raw_bus_id = _text(pci.busId)
    try:
        pci_bus_id = normalise_pci_bus_id(raw_bus_id)
    except ValueError as err:
        raise DiscoveryError(f"NVML gave GPU {index} an unexpected PCI bus id {raw_bus_id!r}") from err
    memory = _nvml(f"memory info of GPU {index}", pynvml.nvmlDeviceGetMemoryInfo, handle)
    major, minor = _nvml(f"compute capability of GPU {index}", pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    return GpuInfo(
        index=index,
        uuid=_text(_nvml(f"UUID of GPU {index}", pynvml.nvmlDeviceGetUUID, handle)),
        product_name=_text(_nvml(f"name of GPU {index}", pynvml.nvmlDeviceGetName, handle)),
        memory_total_bytes=int(memory.total),
        minor=int(_nvml(f"minor number of GPU {index}", pynvml.nvmlDeviceGetMinorNumber, handle)),
        pci_bus_id=pci_bus_id,
        architecture=_architecture(handle, index),
        cuda_compute_capability=f"{int(major)}.{int(minor)}",
        driver_version=driver_version,
    )


def discover_gpus() -> list[GpuInfo]:
    """Return every GPU NVML reports, ordered by NVML index.

    Initialises NVML and always shuts it down again (a failed shutdown is only logged). Raises
    DiscoveryError when NVML cannot be loaded or initialised, or when any query fails.
    """
    _nvml("initialisation (nvmlInit)", pynvml.nvmlInit)
    try:
        driver_version = _text(_nvml("driver version", pynvml.nvmlSystemGetDriverVersion))
        count = int(_nvml("device count", pynvml.nvmlDeviceGetCount))
        return [_gpu(index, driver_version) for index in range(count)]
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            _log.warning("nvmlShutdown failed: %s", err)


def driver_version() -> str:
    """The driver version NVML reports now (what driver edits are cached by); raises DiscoveryError."""
    _nvml("initialisation (nvmlInit)", pynvml.nvmlInit)
    try:
        return _text(_nvml("driver version", pynvml.nvmlSystemGetDriverVersion))
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            _log.warning("nvmlShutdown failed: %s", err)
