"""Pure figures of the scheduler bench: throughput of one burst, and deltas of the scheduler's own metrics."""

from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from e2e.bench.stats import summary_ms

# (metric name, label subset) -> value; histograms contribute their `_sum` and `_count` samples.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def burst_figures(created: Mapping[str, float], bound: Mapping[str, float]) -> dict[str, object]:
    """Pods per second and per-pod latency of one burst: `created` (pod -> when its create call started) and
    `bound` (pod -> when its `spec.nodeName` was first seen), both in seconds on one clock. Throughput is the
    bound pods over the span from the first create to the last binding. Raises ValueError when a bound pod
    has no creation time or nothing was bound, rather than reporting a figure of nothing."""
    if not bound:
        raise ValueError("no pod was bound: nothing to measure")
    unknown = sorted(set(bound) - set(created))
    if unknown:
        raise ValueError(f"bound pods without a creation time: {unknown[:5]}")
    start = min(created.values())
    span = max(bound.values()) - start
    return {
        "pods": len(bound),
        "span_s": round(span, 3),
        "created_span_s": round(max(created.values()) - start, 3),
        "pods_per_s": round(len(bound) / span, 2) if span > 0 else float("inf"),
        "latency": summary_ms([bound[p] - created[p] for p in bound]),
    }


def parse_samples(text: str, names: Iterable[str]) -> Samples:
    """The samples of the metric families `names` (a histogram's `_sum`/`_count`, a counter's total) in a
    Prometheus text exposition, keyed by sample name and labels (without `le`)."""
    wanted = set(names)
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                continue
            key = (sample.name, frozenset(sample.labels.items()))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """Growth of the sum of every sample called `name` whose labels include `labels`, from `before` to `after`."""
    want = set(labels.items())

    def total(samples: Samples) -> float:
        return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)

    return total(after) - total(before)


def mean_ms(before: Samples, after: Samples, histogram: str, **labels: str) -> float | None:
    """Mean of the observations a histogram gained between two scrapes, in ms (None when it gained none)."""
    count = delta(before, after, f"{histogram}_count", **labels)
    if count <= 0:
        return None
    return round(delta(before, after, f"{histogram}_sum", **labels) / count * 1000, 3)


def ratio(numerator: float, denominator: float) -> float:
    """`numerator / denominator` rounded to two places; ValueError on a zero denominator."""
    if denominator == 0:
        raise ValueError("ratio with a zero denominator")
    return round(numerator / denominator, 2)
