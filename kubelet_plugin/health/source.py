"""The kubelet's device-health source: each GPU is healthy while its device node is a character device (and,
with `with_reported_health`, while the driver reports nothing wrong with it: `kubelet_plugin/health/book.py`). An unhealthy GPU
carries a message saying why, which the kubelet shows in the pod's status (`allocatedResourcesStatus`)."""

from collections.abc import Callable, Mapping
from typing import NamedTuple

from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.health.book import HealthBook, Placement


class ReportedHealth(NamedTuple):
    """One device on the kubelet's health stream; `message` says why it is unhealthy (empty while healthy)."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


HealthSource = Callable[[], list[ReportedHealth]]
"""``()`` -> the complete current health list of the driver's devices (grpc_server's health stream)."""


class DeviceHealth:
    """``()`` -> every GPU's ReportedHealth (and every MIG partition's: its GPU's node), sorted by device name,
    from a fresh device-node snapshot."""

    def __init__(
        self,
        pool: str,
        gpus: list[GpuInfo],
        nodes: Callable[[], DeviceNodeSnapshot],
        partitions: Mapping[str, GpuInfo] | None = None,
    ) -> None:
        self._pool = pool
        devices = [(g.device_name, g) for g in gpus] + list((partitions or {}).items())
        self._devices = sorted(devices, key=lambda d: d[0])
        self._nodes = nodes

    def __call__(self) -> list[ReportedHealth]:
        """The complete current health list (a HealthSource)."""
        seen = self._nodes()
        out = []
        for name, g in self._devices:
            node = f"nvidia{g.minor}"
            present = seen.present(node)
            why = "" if present else f"its device node /dev/{node} is missing (GPU or driver gone)"
            out.append(ReportedHealth(self._pool, name, present, why))
        return out


def with_reported_health(
    source: HealthSource, book: HealthBook, partitions: Mapping[str, Placement] | None = None
) -> HealthSource:
    """``source``'s health list where a GPU is also unhealthy while the driver reports it degraded or fatal (the
    message then says what the driver reported, after ``source``'s own reason if any); a MIG partition (in
    ``partitions``: its GPU and memory slices) also while its GPU is, or while an XID is remembered on one of its
    memory slices."""

    def health() -> list[ReportedHealth]:
        reported = book.snapshot()
        out = []
        for entry in source():
            placement = (partitions or {}).get(entry.device)
            gpu = reported.get(placement.gpu if placement else entry.device)
            slices = placement.slices if placement else frozenset()
            if gpu is None or gpu.state_on(slices) == "healthy":
                out.append(entry)
                continue
            why = "; ".join(m for m in (entry.message, gpu.describe(slices)) if m)
            out.append(entry._replace(healthy=False, message=why))
        return out

    return health
