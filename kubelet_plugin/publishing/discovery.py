"""GPU discovery through NVML (``pynvml`` from ``nvidia-ml-py``).

The same code path runs against the real ``libnvidia-ml.so.1`` and against the mock one built from
``harness/mocknvml/mock_nvml.c`` (selected with ``LD_LIBRARY_PATH`` and ``FRACGPU_MOCK_NVML_PROFILE``).
"""

import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pynvml
from pydantic import BaseModel, ConfigDict

from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.publishing.pci_topology import numa_node, pcie_root

__all__ = [
    "Discovery",
    "DiscoveryError",
    "GpuLostError",
    "UnknownLostGpu",
    "discover",
    "discover_gpus",
    "driver_version",
    "normalise_pci_bus_id",
    "resolve_lost",
]

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


class GpuLostError(DiscoveryError):
    """A GPU answered NVML_ERROR_GPU_IS_LOST: it fell off the bus; ``index``: its NVML index."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class UnknownLostGpu(BaseModel):
    """A lost GPU whose identity (UUID, memory) nobody can vouch for: left out of the ResourceSlice."""

    model_config = ConfigDict(frozen=True)

    index: int
    reason: str


class Discovery(BaseModel):
    """What discovery found. ``gpus``: every GPU to publish, by index, lost ones with their remembered identity;
    ``lost``: device names of those lost (published tainted); ``unknown``: lost GPUs left out."""

    model_config = ConfigDict(frozen=True)

    gpus: list[GpuInfo]
    lost: tuple[str, ...] = ()
    unknown: tuple[UnknownLostGpu, ...] = ()


def _describe(err: pynvml.NVMLError) -> str:
    code = getattr(err, "value", None)
    hint = _HINTS.get(code, _DEFAULT_HINT) if isinstance(code, int) else _DEFAULT_HINT
    return f"{err} (NVML error {code}); {hint}"


def _nvml(what: str, fn: Callable[..., _T], *args: Any, index: int | None = None) -> _T:
    """Call one pynvml function; turn an NVMLError into a DiscoveryError that names ``what`` (a GpuLostError
    where GPU ``index`` answered NVML_ERROR_GPU_IS_LOST)."""
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        message = f"NVML {what} failed: {_describe(err)}"
        if index is not None and getattr(err, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLostError(index, message) from err
        raise DiscoveryError(message) from err


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
        message = f"NVML architecture of GPU {index} failed: {_describe(err)}"
        if getattr(err, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLostError(index, message) from err
        raise DiscoveryError(message) from err
    return _ARCHITECTURES.get(int(value), _UNKNOWN_ARCHITECTURE)


def _gpu(index: int, driver_version: str) -> GpuInfo:
    handle = _nvml(f"handle of GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index, index=index)
    pci = _nvml(f"PCI info of GPU {index}", pynvml.nvmlDeviceGetPciInfo, handle, index=index)
    raw_bus_id = _text(pci.busId)
    try:
        pci_bus_id = normalise_pci_bus_id(raw_bus_id)
    except ValueError as err:
        raise DiscoveryError(f"NVML gave GPU {index} an unexpected PCI bus id {raw_bus_id!r}") from err
    memory = _nvml(f"memory info of GPU {index}", pynvml.nvmlDeviceGetMemoryInfo, handle, index=index)
    major, minor = _nvml(
        f"compute capability of GPU {index}", pynvml.nvmlDeviceGetCudaComputeCapability, handle, index=index
    )
    return GpuInfo(
        index=index,
        uuid=_text(_nvml(f"UUID of GPU {index}", pynvml.nvmlDeviceGetUUID, handle, index=index)),
        product_name=_text(_nvml(f"name of GPU {index}", pynvml.nvmlDeviceGetName, handle, index=index)),
        memory_total_bytes=int(memory.total),
        minor=int(_nvml(f"minor number of GPU {index}", pynvml.nvmlDeviceGetMinorNumber, handle, index=index)),
        pci_bus_id=pci_bus_id,
        architecture=_architecture(handle, index),
        cuda_compute_capability=f"{int(major)}.{int(minor)}",
        driver_version=driver_version,
    )


def discover_gpus() -> list[GpuInfo]:
    """Return every GPU NVML reports, ordered by NVML index.

    Initialises NVML and always shuts it down again (a failed shutdown is only logged). Raises
    DiscoveryError when NVML cannot be loaded or initialised, or when any query fails (a lost GPU too).
    """
    _, answered, lost = _query_all()
    if lost:
        raise lost[min(lost)]
    return answered


def _query_all() -> tuple[str, list[GpuInfo], dict[int, GpuLostError]]:
    """One NVML session: the driver version, the GPUs that answer and the lost ones (index -> their error).
    Any other failure raises DiscoveryError."""
    _nvml("initialisation (nvmlInit)", pynvml.nvmlInit)
    try:
        version = _text(_nvml("driver version", pynvml.nvmlSystemGetDriverVersion))
        count = int(_nvml("device count", pynvml.nvmlDeviceGetCount))
        answered: list[GpuInfo] = []
        lost: dict[int, GpuLostError] = {}
        for index in range(count):
            try:
                answered.append(_gpu(index, version))
            except GpuLostError as err:
                lost[index] = err
        return version, answered, lost
    finally:
        _shutdown()


def _shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as err:
        _log.warning("nvmlShutdown failed: %s", err)


def discover(remembered: Sequence[GpuInfo] = (), sys_root: Path | None = None) -> Discovery:
    """Every GPU NVML reports, where a GPU answering NVML_ERROR_GPU_IS_LOST does not fail discovery; with
    ``sys_root`` (the host's ``/sys``) each GPU that answers also with its PCIe root and NUMA node (``pci_topology``).

    NVML can no longer say who a lost GPU is, so its identity is taken from ``remembered`` (what NVML said when
    this node's plugin last discovered it, gpu_inventory) — only when that record is of this node's GPUs as they
    are now: every GPU that answers has the UUID and PCI bus id remembered at its index. Otherwise the lost GPU
    is ``unknown``. Any other failure raises DiscoveryError, as discover_gpus does.
    """
    version, answered, lost = _query_all()
    if sys_root is not None:
        answered = [
            g.model_copy(
                update={"pcie_root": pcie_root(sys_root, g.pci_bus_id), "numa_node": numa_node(sys_root, g.pci_bus_id)}
            )
            for g in answered
        ]
    return resolve_lost(answered, {i: str(err) for i, err in lost.items()}, remembered, version)


def resolve_lost(
    answered: Sequence[GpuInfo], lost: dict[int, str], remembered: Sequence[GpuInfo], version: str
) -> Discovery:
    """The Discovery of ``answered`` GPUs and ``lost`` ones (index -> what NVML said), see ``discover``."""
    by_index = {g.index: g for g in remembered}
    stale = [
        g.device_name
        for g in answered
        if (r := by_index.get(g.index)) is None or (r.uuid, r.pci_bus_id) != (g.uuid, g.pci_bus_id)
    ]
    gpus = list(answered)
    known: list[str] = []
    unknown: list[UnknownLostGpu] = []
    for index, error in sorted(lost.items()):
        record = by_index.get(index)
        if record is None:
            unknown.append(UnknownLostGpu(index=index, reason=f"{error}; no earlier record of this GPU"))
        elif stale:
            reason = f"{error}; the earlier record of this node's GPUs differs for {', '.join(stale)}"
            unknown.append(UnknownLostGpu(index=index, reason=reason))
        else:
            gpus.append(record.model_copy(update={"driver_version": version}))
            known.append(record.device_name)
    return Discovery(gpus=sorted(gpus, key=lambda g: g.index), lost=tuple(known), unknown=tuple(unknown))


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
