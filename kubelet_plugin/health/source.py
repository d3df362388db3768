"""The kubelet's device-health source: each GPU is healthy while its device node is a character device (and,
with `with_reported_health`, while the driver reports nothing wrong with it: `kubelet_plugin/health/book.py`). An unhealthy GPU
carries a message saying why, which the kubelet shows in the pod's status (`allocatedResourcesStatus`)."""

from collections.abc import Callable
from typing import NamedTuple

from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.health.book import HealthBook
from kubelet_plugin.prepare.devicenodes import DeviceNodeSnapshot


class ReportedHealth(NamedTuple):
    """One device on the kubelet's health stream; `message` says why it is unhealthy (empty while healthy)."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


HealthSource = Callable[[], list[ReportedHealth]]
"""``()`` -> the complete current health list of the driver's devices (grpc_server's health stream)."""


class DeviceHealth:
    """``()`` -> every GPU's ReportedHealth, sorted by device name, from a fresh device-node snapshot."""

    def __init__(self, pool: str, gpus: list[GpuInfo], nodes: Callable[[], DeviceNodeSnapshot]) -> None:
        self._pool = pool
        self._gpus = sorted(gpus, key=lambda g: g.device_name)
        self._nodes = nodes

    def __call__(self) -> list[ReportedHealth]:
        """The complete current health list (a HealthSource)."""
        seen = self._nodes()
        out = []
        for g in self._gpus:
            node = f"nvidia{g.minor}"
            present = seen.present(node)
            why = "" if present else f"its device node /dev/{node} is missing (GPU or driver gone)"
            out.append(ReportedHealth(self._pool, g.device_name, present, why))
        return out


def with_reported_health(source: HealthSource, book: HealthBook) -> HealthSource:
    """``source``'s health list where a GPU is also unhealthy while the driver reports it degraded or fatal (the
    message then says what the driver reported, after ``source``'s own reason if any)."""

    def health() -> list[ReportedHealth]:
        reported = book.snapshot()
        out = []
        for entry in source():
            driver = reported.get(entry.device)
            if driver is None or driver.state == "healthy":
                out.append(entry)
                continue
            why = "; ".join(m for m in (entry.message, driver.describe()) if m)
            out.append(entry._replace(healthy=False, message=why))
        return out

    return health
