"""Summaries of latency samples for benchmark reports (medians and percentiles of one run)."""

import statistics


def percentile(samples: list[float], p: float) -> float:
    """The `p`-th percentile (0-100) by nearest rank."""
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary_ms(samples: list[float]) -> dict[str, float]:
    """n, p50, p90, p99 and max of samples given in seconds, reported in milliseconds."""
    return {
        "n": len(samples),
        "p50_ms": round(statistics.median(samples) * 1000, 2),
        "p90_ms": round(percentile(samples, 90) * 1000, 2),
        "p99_ms": round(percentile(samples, 99) * 1000, 2),
        "max_ms": round(max(samples) * 1000, 2),
    }


def table(rows: dict[str, dict[str, float]]) -> str:
    """A fixed-width text table of summaries keyed by row name."""
    columns = ["n", "p50_ms", "p90_ms", "p99_ms", "max_ms"]
    width = max(len(name) for name in rows) + 2
    lines = ["".ljust(width) + "".join(c.rjust(10) for c in columns)]
    lines += [name.ljust(width) + "".join(str(r[c]).rjust(10) for c in columns) for name, r in rows.items()]
    return "\n".join(lines)
