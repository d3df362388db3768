"""Prometheus histograms scraped from a process's `/metrics` text: the difference of two scrapes and its quantiles.

A bench scrapes before and after its burst and reports the quantiles of what was observed in between
(`histogram_quantile`'s estimate: linear within the bucket the rank falls into).
"""

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Buckets = dict[float, float]
"""Upper bound (`le`) -> cumulative count."""
Scrape = dict[tuple[str, Labels], Buckets]


def parse(text: str) -> Scrape:
    """Every histogram series in `text`: (metric name, labels without `le`) -> cumulative buckets."""
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            labels = dict(sample.labels)
            le = float(labels.pop("le"))
            out.setdefault((family.name, frozenset(labels.items())), {})[le] = sample.value
    return out


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> Buckets:
    """The buckets of `name` observed between the scrapes, summed over the series whose labels include `labels`."""
    want = set(labels.items())
    out: Buckets = {}
    for (metric, series), buckets in after.items():
        if metric != name or not want <= series:
            continue
        earlier = before.get((metric, series), {})
        for le, count in buckets.items():
            out[le] = out.get(le, 0.0) + count - earlier.get(le, 0.0)
    return out


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """The `q` (0-1) quantile estimated from cumulative `buckets`; None when nothing was observed. A rank in the
    `+Inf` bucket gives the largest finite bound."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower


def summary_ms(buckets: Mapping[float, float]) -> dict[str, float] | None:
    """n and estimated p50/p90/p99 in milliseconds; None when nothing was observed."""
    n = max(buckets.values(), default=0.0)
    if n <= 0:
        return None
    out: dict[str, float] = {"n": int(n)}
    for label, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99)):
        value = quantile(buckets, q)
        out[label] = round(value * 1000, 1) if value is not None else 0.0
    return out
