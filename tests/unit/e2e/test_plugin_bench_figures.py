"""The plugin bench's derived figures: CPU time from /proc and ratios to the Go reference plugin."""

import os
import time

from e2e.bench.plugin_bench import cpu_seconds, ratios


def _part(scale: float, rss_last: float) -> dict[str, object]:
    row = {"n": 10, "p50_ms": 2.0 * scale, "p90_ms": 4.0 * scale, "p99_ms": 8.0 * scale, "max_ms": 9.0}
    return {
        "latency": {"prepare 1 claim": row},
        "cpu": {"per_1_claim_call_ms": 1.5 * scale},
        "rss": {"after_50_cycles_mib": 1.0, "after_1000_cycles_mib": rss_last},
    }


def test_ratios_divide_percentiles_cpu_and_the_last_rss_sample() -> None:
    got = ratios(_part(3.0, 60.0), _part(1.0, 20.0))
    assert got == {
        "prepare 1 claim p50": 3.0,
        "prepare 1 claim p90": 3.0,
        "prepare 1 claim p99": 3.0,
        "cpu per_1_claim_call_ms": 3.0,
        "rss": 3.0,  # after 1000 cycles, not after 50 (which would give 1.0)
    }


def test_cpu_seconds_counts_this_process_busy_time() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.15
