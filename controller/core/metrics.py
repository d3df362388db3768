"""Prometheus metrics of the controller (`/metrics` on `--metrics-port`)."""

import asyncio
import gc
import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from api.kube_metrics import ApiMetrics

API = ApiMetrics("controller")
"""The controller's own API requests (its writes, lists and the Lease; `api.kube_rest`) throttled, sent again and
given up. kopf's watches and lists retry on their own (kopf logs each retry) and are not counted here."""
RECONCILES = Counter("fracgpu_controller_claim_reconciles_total", "Claim reconciles (with or without a write)")
STATUS_WRITES = Counter(
    "fracgpu_controller_claim_status_writes_total", "Server-side applies of claim status.devices data", ["result"]
)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10)
"""Seconds; fine around the 0.5-3 s where a claim's allocation -> status latency spreads under load."""
STATUS_WRITE_SECONDS = Histogram(
    "fracgpu_controller_claim_status_write_seconds",
    "Duration of one claim status apply, as the controller's writer thread sees it",
    buckets=LATENCY_BUCKETS,
)
QUEUE_WAIT_SECONDS = Histogram(
    "fracgpu_controller_claim_queue_wait_seconds",
    "Seconds a claim waited in the work queue for a status writer (from being queued to a writer taking it)",
    buckets=LATENCY_BUCKETS,
)
RECONCILE_QUEUE = Gauge("fracgpu_controller_claim_queue_depth", "Claims waiting to be reconciled")
LEDGER_WRITES = Counter("fracgpu_controller_ledger_writes_total", "Writes to GPU objects", ["kind", "result"])
LEDGER_WRITE_SECONDS = Histogram(
    "fracgpu_controller_ledger_write_seconds", "Duration of one GPU object write", ["kind"], buckets=LATENCY_BUCKETS
)
LEDGER_PASS_SECONDS = Histogram(
    "fracgpu_controller_ledger_pass_seconds",
    "Duration of one ledger pass (recompute and writes of the GPUs marked since the last)",
    buckets=LATENCY_BUCKETS,
)
LOOP_LAG_SECONDS = Histogram(
    "fracgpu_controller_event_loop_lag_seconds",
    "How late the main event loop (kopf's watches and handlers, the status writers' scheduling) ran a timer",
    buckets=LATENCY_BUCKETS,
)
LEDGER_OBJECTS = Gauge("fracgpu_controller_gpus", "GPU objects in the desired ledger")
EVENTS = Counter("fracgpu_controller_events_total", "Events posted on claims", ["reason"])
POD_EVENTS = Counter(
    "fracgpu_controller_pod_events_total",
    "Events posted on pods: a claim's Event told to a pod it concerns",
    ["reason"],
)
POD_EVENTS_DEFERRED = Counter(
    "fracgpu_controller_pod_events_deferred_total",
    "Events on pods held back by the per-pod rate limit (told later if still true)",
    ["reason"],
)
OBJECTS_SKIPPED = Counter(
    "fracgpu_controller_objects_skipped_total",
    "Objects read with parts skipped (reason deep: nested deeper than the decoder keeps; number: an integer too "
    "long to convert) or skipped whole (unreadable: not the shape of its kind)",
    ["resource", "reason"],
)
ADMISSION = Counter("fracgpu_controller_admission_reviews_total", "Admission reviews", ["kind", "allowed"])
GC_PAUSE_SECONDS = Histogram(
    "fracgpu_controller_gc_pause_seconds",
    "Duration of one garbage collection of the Python interpreter (every thread waits for it)",
    ["generation"],
    buckets=LATENCY_BUCKETS,
)
GC_FROZEN = Gauge(
    "fracgpu_controller_gc_frozen_objects", "Objects frozen at the last heap compaction (skipped by full collections)"
)
ADMISSION_SECONDS = Histogram(
    "fracgpu_controller_admission_review_seconds",
    "Seconds the webhook server took for one admission review, from its request read to its answer",
    buckets=LATENCY_BUCKETS,
)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Start the metrics HTTP server in a daemon thread (port 0: do nothing)."""
    if port:
        start_http_server(port, addr=address)


_gc_started: list[float] = []


def _time_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[:] = [time.perf_counter()]
    elif _gc_started:
        GC_PAUSE_SECONDS.labels(str(info["generation"])).observe(time.perf_counter() - _gc_started.pop())


def time_gc() -> None:
    """Time every garbage collection into `GC_PAUSE_SECONDS` (idempotent)."""
    if _time_gc not in gc.callbacks:
        gc.callbacks.append(_time_gc)


LOOP_LAG_PERIOD = 0.25
"""Seconds between the event loop lag probe's timers."""


async def loop_lag() -> None:
    """Observe how late the event loop runs a timer (`LOOP_LAG_SECONDS`): every status write, watch event and
    ledger pass waits behind whatever holds the loop (or the GIL) that long. Runs until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LOOP_LAG_PERIOD
        await asyncio.sleep(LOOP_LAG_PERIOD)
        LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - due))
