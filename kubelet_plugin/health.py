"""The kubelet's device-health source: each GPU is healthy while its device node is a character device (and,
with `with_reported_health`, while the driver reports nothing wrong with it: gpu_health)."""

from collections.abc import Callable

from kubelet_plugin.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.gpu_health import HealthBook
from kubelet_plugin.model import GpuInfo


class DeviceHealth:
    """``()`` -> (pool, device, healthy) for every GPU, sorted by device name, from a fresh device-node snapshot."""

    def __init__(self, pool: str, gpus: list[GpuInfo], nodes: Callable[[], DeviceNodeSnapshot]) -> None:
        self._pool = pool
        self._gpus = sorted(gpus, key=lambda g: g.device_name)
        self._nodes = nodes

    def __call__(self) -> list[tuple[str, str, bool]]:
        """The complete current health list (grpc_server's HealthSource)."""
        seen = self._nodes()
        return [(self._pool, g.device_name, seen.present(f"nvidia{g.minor}")) for g in self._gpus]


def with_reported_health(
    source: Callable[[], list[tuple[str, str, bool]]], book: HealthBook
) -> Callable[[], list[tuple[str, str, bool]]]:
    """``source``'s health list where a GPU is also unhealthy while the driver reports it degraded or fatal."""

    def health() -> list[tuple[str, str, bool]]:
        reported = book.snapshot()
        return [
            (pool, device, healthy and (device not in reported or reported[device].state == "healthy"))
            for pool, device, healthy in source()
        ]

    return health
