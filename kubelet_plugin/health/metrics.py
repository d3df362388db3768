"""Prometheus metrics of GPU health (registered in the plugin's registry)."""

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from kubelet_plugin.health.book import STATES, GpuHealth


class HealthMetrics:
    """``fracgpu_plugin_gpu_health{gpu,state}`` (1 for the GPU's current state), XID events and slice writes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.health = Gauge(
            "fracgpu_plugin_gpu_health",
            "1 for each GPU's current health state (healthy, degraded, fatal), 0 for the others.",
            ["gpu", "state"],
            registry=registry,
        )
        self.xid_events = Counter(
            "fracgpu_plugin_xid_events_total",
            "XID critical error events NVML reported, by GPU and XID (ignored ones included).",
            ["gpu", "xid"],
            registry=registry,
        )

        self.slice_writes = Counter(
            "fracgpu_plugin_slice_writes_total",
            "ResourceSlices written (created, replaced or deleted) by this plugin: health changes are coalesced.",
            registry=registry,
        )

    def set_health(self, health: Mapping[str, GpuHealth]) -> None:
        """Publish every GPU's state."""
        for gpu, h in health.items():
            for state in STATES:
                self.health.labels(gpu=gpu, state=state).set(1 if h.state == state else 0)
