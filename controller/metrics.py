"""Prometheus metrics of the controller (`/metrics` on `--metrics-port`)."""

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter("fracgpu_controller_claim_reconciles_total", "Claim reconciles (with or without a write)")
STATUS_WRITES = Counter(
    "fracgpu_controller_claim_status_writes_total", "Server-side applies of claim status.devices data", ["result"]
)
STATUS_WRITE_SECONDS = Histogram(
    "fracgpu_controller_claim_status_write_seconds",
    "Duration of one claim status apply",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RECONCILE_QUEUE = Gauge("fracgpu_controller_claim_queue_depth", "Claims waiting to be reconciled")
LEDGER_WRITES = Counter("fracgpu_controller_ledger_writes_total", "Writes to GPU objects", ["kind", "result"])
LEDGER_OBJECTS = Gauge("fracgpu_controller_gpus", "GPU objects in the desired ledger")
EVENTS = Counter("fracgpu_controller_events_total", "Events posted on claims", ["reason"])
OBJECTS_SKIPPED = Counter(
    "fracgpu_controller_objects_skipped_total",
    "Objects read with parts skipped (reason deep: nested deeper than the decoder keeps; number: an integer too "
    "long to convert) or skipped whole (unreadable: not the shape of its kind)",
    ["resource", "reason"],
)
ADMISSION = Counter("fracgpu_controller_admission_reviews_total", "Admission reviews", ["kind", "allowed"])


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Start the metrics HTTP server in a daemon thread (port 0: do nothing)."""
    if port:
        start_http_server(port, addr=address)
