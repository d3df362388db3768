"""The plugin bench's throttled run (e2e/bench/throttle.py): the APF objects it creates, what each failure is
counted as, and the report side by side."""

import json

import pytest

from e2e.bench import plugin_bench
from e2e.bench.throttle import Outcome, describe, failure_kind, throttled_report
from harness.apf import apf_reject

FRACGPU_THROTTLED = (
    "cannot read ResourceClaim bench/c1: throttled by the API server (429 Too Many Requests; it asked to wait 8 s); "
    "tried 5 times in 34.1 s; the wait did not fit in the call's 35.0 s; the kubelet retries"
)
GO_THROTTLED = (
    "failed to fetch ResourceClaim bench/c2: the server has received too many requests and has asked us to try "
    "again later (get resourceclaims.resource.k8s.io c2)"
)


def test_the_trap_is_one_seat_that_rejects_and_takes_every_request_of_the_account() -> None:
    level, schema = apf_reject("trap", "bench", "storm")
    limited = level["spec"]["limited"]
    assert limited["nominalConcurrencyShares"] == 1 and limited["limitResponse"] == {"type": "Reject"}
    assert limited["lendablePercent"] == 0 and limited["borrowingLimitPercent"] == 0
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": "trap"}
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {"name": "storm", "namespace": "bench"}}]
    assert rule["resourceRules"][0]["verbs"] == ["*"] and rule["nonResourceRules"][0]["nonResourceURLs"] == ["*"]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (FRACGPU_THROTTLED, "throttled"),
        (GO_THROTTLED, "throttled"),
        ("cannot read ResourceClaim bench/c1: API server unreachable: cannot connect to 10.0.0.1:6443", "unreachable"),
        ("cannot read ResourceClaim bench/c1: timed out: the API server did not answer within 5 s", "unreachable"),
        ("the kubelet's call failed: DEADLINE_EXCEEDED", "unreachable"),
        ("ResourceClaim bench/c1 not found", "other"),
    ],
)
def test_each_failure_is_counted_as_what_its_message_says(error: str, kind: str) -> None:
    assert failure_kind(error) == kind


def test_the_report_counts_successes_latencies_and_what_each_failure_said() -> None:
    outcomes = {
        "none": [Outcome(2.0), Outcome(9.0), Outcome(30.0), Outcome(34.5, FRACGPU_THROTTLED)],
        "go-reference": [
            Outcome(1.0),
            Outcome(45.0, "the kubelet's call failed: DEADLINE_EXCEEDED"),
            Outcome(3.0, "boom"),
        ],
    }
    report = throttled_report(outcomes, {"rejected": 900, "served": 40})
    ours, theirs = report["plugins"]["none"], report["plugins"]["go-reference"]
    assert (ours["prepares"], ours["succeeded"]) == (4, 3)
    assert ours["latency"]["n"] == 3 and ours["latency"]["p50_ms"] == 9000.0 and ours["latency"]["max_ms"] == 30000.0
    assert ours["gave_up_after"]["max_ms"] == 34500.0
    assert ours["failures"] == {"throttled": 1} and ours["every_failure_said_why"]
    assert ours["examples"]["throttled"] == FRACGPU_THROTTLED
    assert theirs["failures"] == {"unreachable": 1, "other": 1} and not theirs["every_failure_said_why"]
    assert report["flood"] == {"rejected": 900, "served": 40}
    json.dumps(report)  # written as the bench's JSON report

    text = describe(report)
    assert "flood 900 rejected (429) / 40 served" in text
    assert "none: 3/4 prepares succeeded" in text and "go-reference: 1/3 prepares succeeded" in text
    assert "  succeeded: p50 9.0 s, p90 30.0 s, max 30.0 s" in text
    assert f"  failures that said throttled: 1, e.g. {FRACGPU_THROTTLED}" in text


def test_a_plugin_with_no_success_or_no_failure_has_no_such_row() -> None:
    report = throttled_report(
        {"none": [Outcome(45.0, FRACGPU_THROTTLED)], "go": [Outcome(1.0)]}, {"rejected": 1, "served": 0}
    )
    assert report["plugins"]["none"]["latency"] is None and report["plugins"]["go"]["gave_up_after"] is None
    assert "succeeded: p50" not in describe(report).split("go:")[0]


def test_the_throttled_run_compares_fracgpu_with_the_go_reference_by_default() -> None:
    assert plugin_bench.THROTTLED_CONFIGS == ["none", plugin_bench.GO_REFERENCE]
    assert set(plugin_bench.THROTTLED_CONFIGS) <= set(plugin_bench.CONFIGS)
    assert plugin_bench.THROTTLED_PREPARES == 8
