"""The kubelet's device-health source: each GPU is healthy while its device node is a character device."""

from collections.abc import Callable

from kubelet_plugin.devicenodes import DeviceNodeSnapshot
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
