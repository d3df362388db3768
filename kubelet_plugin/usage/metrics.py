"""Prometheus metrics of GPU memory use (on the plugin's registry, next to ``PluginMetrics``).

The per-claim and per-GPU gauges are served from the latest sample only: a claim that is no longer
prepared on this node, or a pod that no longer uses it, has no series from the next sample on, so the
number of series is bounded by the claims and pods of the node.
"""

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kubelet_plugin.usage.attribution import Snapshot

CLAIM_LABELS = ["namespace", "claim", "pod", "gpu_uuid"]


class _SnapshotCollector(Collector):
    """Yields the gauges of the last ``Snapshot`` given to ``set``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    def set(self, snapshot: Snapshot | None) -> None:
        with self._lock:
            self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return
        granted = GaugeMetricFamily(
            "fracgpu_plugin_claim_memory_granted_bytes",
            "GPU memory granted to a claim on one GPU; one series per pod using the claim, each the whole grant "
            "(aggregate with max, not sum).",
            labels=CLAIM_LABELS,
        )
        used = GaugeMetricFamily(
            "fracgpu_plugin_claim_memory_used_bytes",
            "GPU memory used by the processes of one pod's containers under a claim, on one GPU (NVML).",
            labels=CLAIM_LABELS,
        )
        for usage in snapshot.claims:
            labels = [usage.share.namespace, usage.share.name, usage.pod, usage.share.gpu_uuid]
            granted.add_metric(labels, usage.share.granted_bytes)
            used.add_metric(labels, usage.used_bytes)
        gpu_granted = GaugeMetricFamily(
            "fracgpu_plugin_gpu_memory_granted_bytes",
            "GPU memory granted to the claims prepared on this node, per GPU.",
            labels=["gpu_uuid"],
        )
        gpu_used = GaugeMetricFamily(
            "fracgpu_plugin_gpu_memory_used_bytes",
            "GPU memory used by all processes on a GPU (NVML), attributed to a claim or not.",
            labels=["gpu_uuid"],
        )
        for gpu in snapshot.gpus:
            gpu_granted.add_metric([gpu.uuid], gpu.granted_bytes)
            gpu_used.add_metric([gpu.uuid], gpu.used_bytes)
        unattributed = GaugeMetricFamily(
            "fracgpu_plugin_usage_unattributed_processes",
            "Processes of the last sample attributed to no claim (no claim's pod, unreadable cgroup, or a pod "
            "with several claims on that GPU).",
        )
        unattributed.add_metric([], snapshot.unattributed)
        yield from (granted, used, gpu_granted, gpu_used, unattributed)


class UsageMetrics:
    """The sampler's gauges (from the last sample) and counters."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._collector = _SnapshotCollector()
        registry.register(self._collector)
        self.sample_failures = Counter(
            "fracgpu_plugin_usage_sample_failures_total",
            "Samples of GPU memory use that failed, by reason (nvml_init, function_not_found, nvml_query, "
            "claims, internal).",
            ["reason"],
            registry=registry,
        )
        self.unreadable_cgroups = Counter(
            "fracgpu_plugin_usage_unreadable_cgroups_total",
            "Processes on a GPU whose /proc/<pid>/cgroup could not be read (not attributed to any claim).",
            registry=registry,
        )
        self.ledger_writes = Counter(
            "fracgpu_plugin_usage_ledger_writes_total",
            "Writes of a GPU's used memory to its GPU ledger object, by result (ok|error).",
            ["result"],
            registry=registry,
        )
        self.crossings = Counter(
            "fracgpu_plugin_usage_grant_crossings_total",
            "Times an unenforced share's processes went over its memory grant.",
            registry=registry,
        )

    def publish(self, snapshot: Snapshot | None) -> None:
        """Serve ``snapshot``'s gauges from now on (None: none, e.g. while NVML cannot be sampled)."""
        self._collector.set(snapshot)
