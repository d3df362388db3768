"""Prometheus metrics of the node plugin (one registry per plugin instance)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from api.kube_metrics import ApiMetrics

# Prepare of one claim takes milliseconds: buckets resolve 1 ms up to the kubelet's 45 s call timeout.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 45.0)


class PluginMetrics:
    """Counters, histograms and gauges for NodePrepareResources / NodeUnprepareResources."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.api = ApiMetrics("plugin", self.registry)
        """The API requests throttled, sent again and given up (`api.kube_metrics`), counted by the connection."""
        self.requests = Counter(
            "fracgpu_plugin_claims_total",
            "Claims handled, by operation (prepare|unprepare) and result (ok|error).",
            ["operation", "result"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "fracgpu_plugin_request_duration_seconds",
            "Duration of one NodePrepareResources / NodeUnprepareResources call.",
            ["operation"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "fracgpu_plugin_requests_in_flight",
            "Calls being served now, by operation.",
            ["operation"],
            registry=self.registry,
        )
        self.errors = Counter(
            "fracgpu_plugin_errors_total",
            "Per-claim errors by operation and type (claim_not_found, uid_mismatch, not_allocated, "
            "undecodable, api_timeout, api_throttled, api_error, lock_timeout, invalid_config, device_node_missing, "
            "unknown_device, device_changed, driver_edits, status_update, internal).",
            ["operation", "type"],
            registry=self.registry,
        )
        self.prepared_claims = Gauge(
            "fracgpu_plugin_prepared_claims", "Claims prepared on this node now.", registry=self.registry
        )
        self.lock_timeouts = Counter(
            "fracgpu_plugin_node_lock_timeouts_total",
            "Calls that gave up waiting for the node-wide prepare lock (held by another call or plugin instance).",
            registry=self.registry,
        )
        self.checkpoint_corruptions = Counter(
            "fracgpu_plugin_checkpoint_corruptions_total",
            "Unreadable checkpoints that were moved aside and rebuilt.",
            registry=self.registry,
        )
        self.driver_edits_failures = Counter(
            "fracgpu_plugin_driver_edits_failures_total",
            "Failed generations of the driver edits (nvidia-ctk); while the last one failed, prepare fails.",
            registry=self.registry,
        )
        self.checkpoint_too_new = Gauge(
            "fracgpu_plugin_checkpoint_too_new",
            "1 while the checkpoint is of a schema newer than this plugin reads (prepare and unprepare refused).",
            registry=self.registry,
        )
