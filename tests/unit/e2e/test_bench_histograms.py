"""Unit tests of the benches' histogram differences and quantiles (e2e/bench/histograms.py)."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from e2e.bench import histograms


def test_the_difference_of_two_scrapes_sums_matching_series_and_estimates_quantiles_within_buckets() -> None:
    registry = CollectorRegistry()
    seconds = Histogram("x_seconds", "x", ["kind"], registry=registry, buckets=(0.1, 0.5, 1, 2))
    seconds.labels("status").observe(5)  # before the first scrape: not counted
    before = histograms.parse(generate_latest(registry).decode())
    for value in [0.05] * 50 + [0.3] * 40 + [1.5] * 10:
        seconds.labels("status" if value != 0.3 else "apply").observe(value)
    after = histograms.parse(generate_latest(registry).decode())

    both = histograms.delta(before, after, "x_seconds")
    assert both == {0.1: 50, 0.5: 90, 1: 90, 2: 100, float("inf"): 100}
    assert histograms.summary_ms(both) == {"n": 100, "p50_ms": 100.0, "p90_ms": 500.0, "p99_ms": 1900.0}
    status = histograms.delta(before, after, "x_seconds", kind="status")
    assert status[float("inf")] == 60 and histograms.quantile(status, 0.5) == 0.1 * 30 / 50
    assert histograms.summary_ms(histograms.delta(after, after, "x_seconds")) is None
    assert histograms.quantile({1.0: 0, float("inf"): 3}, 0.5) == 1.0, "beyond the last bound: that bound"
