"""The scheduler bench's pure parts: burst figures, metric deltas, variants and slice shapes."""

import pytest

from api.names import DRIVER_NAME, MEMORY_CAPACITY
from e2e.bench import scheduler_figures as figures
from e2e.bench.scheduler_bench import SHAPES, STEP, Variant, parse_variant
from harness.kube import simulated_gpus
from kubelet_plugin.publishing.slices import build_slices

NODE = {"metadata": {"name": "n1", "uid": "uid-1"}}


def test_burst_figures_span_from_first_create_to_last_binding() -> None:
    created = {"a": 10.0, "b": 10.5, "c": 11.0}
    bound = {"a": 10.2, "b": 11.5, "c": 12.0}
    result = figures.burst_figures(created, bound)
    assert result["pods"] == 3
    assert result["span_s"] == 2.0
    assert result["created_span_s"] == 1.0
    assert result["pods_per_s"] == 1.5
    latency = result["latency"]
    assert isinstance(latency, dict)
    assert latency["p50_ms"] == 1000.0
    assert latency["max_ms"] == 1000.0
    assert latency["n"] == 3


def test_burst_figures_refuses_nothing_bound_or_unknown_pods() -> None:
    with pytest.raises(ValueError, match="no pod was bound"):
        figures.burst_figures({"a": 1.0}, {})
    with pytest.raises(ValueError, match=r"without a creation time.*'b'"):
        figures.burst_figures({"a": 1.0}, {"a": 2.0, "b": 2.0})


EXPOSITION_BEFORE = """\
# HELP scheduler_scheduling_attempt_duration_seconds [STABLE] Scheduling attempt latency
# TYPE scheduler_scheduling_attempt_duration_seconds histogram
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="scheduled",le="0.1"} 4
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="scheduled",le="+Inf"} 4
scheduler_scheduling_attempt_duration_seconds_sum{profile="default-scheduler",result="scheduled"} 0.2
scheduler_scheduling_attempt_duration_seconds_count{profile="default-scheduler",result="scheduled"} 4
# HELP scheduler_plugin_execution_duration_seconds Plugin duration
# TYPE scheduler_plugin_execution_duration_seconds histogram
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="DynamicResources",status="Success"} 1
scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",plugin="DynamicResources",status="Success"} 10
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="NodeAffinity",status="Success"} 5
scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",plugin="NodeAffinity",status="Success"} 5
# HELP scheduler_schedule_attempts_total Number of attempts
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 4
# HELP other_metric ignored
# TYPE other_metric gauge
other_metric 7
"""


def _after() -> str:
    return (
        EXPOSITION_BEFORE.replace('result="scheduled"} 0.2', 'result="scheduled"} 0.8')
        .replace('result="scheduled"} 4\n#', 'result="scheduled"} 10\n#', 1)
        .replace('plugin="DynamicResources",status="Success"} 1\n', 'plugin="DynamicResources",status="Success"} 1.5\n')
        .replace('plugin="DynamicResources",status="Success"} 10', 'plugin="DynamicResources",status="Success"} 20')
        .replace('result="scheduled"} 4\n# HELP other', 'result="scheduled"} 9\n# HELP other')
    )


def test_metric_deltas_and_means_select_by_label() -> None:
    names = (
        "scheduler_scheduling_attempt_duration_seconds",
        "scheduler_plugin_execution_duration_seconds",
        "scheduler_schedule_attempts",
    )
    before, after = figures.parse_samples(EXPOSITION_BEFORE, names), figures.parse_samples(_after(), names)
    assert not any(name.startswith("other") or name.endswith("_bucket") for name, _ in after)
    # 6 attempts gained 0.6 s: 100 ms each
    assert figures.mean_ms(before, after, "scheduler_scheduling_attempt_duration_seconds", result="scheduled") == 100
    # DynamicResources' Filter gained 10 observations and 0.5 s; NodeAffinity's did not change
    dra = figures.mean_ms(
        before,
        after,
        "scheduler_plugin_execution_duration_seconds",
        plugin="DynamicResources",
        extension_point="Filter",
    )
    assert dra == 50
    assert figures.mean_ms(before, after, "scheduler_plugin_execution_duration_seconds", plugin="NodeAffinity") is None
    assert figures.delta(before, after, "scheduler_schedule_attempts_total", result="scheduled") == 5


def test_ratio() -> None:
    assert figures.ratio(3, 4) == 0.75
    with pytest.raises(ValueError, match="zero"):
        figures.ratio(1, 0)


def test_parse_variant() -> None:
    assert parse_variant("fracgpu") == Variant("fracgpu", 0)
    assert parse_variant("fracgpu+3") == Variant("fracgpu", 3)
    assert parse_variant("fracgpu+3").name == "fracgpu+3"
    with pytest.raises(ValueError, match="unknown shape 'nope'; known: fracgpu, exclusive"):
        parse_variant("nope")
    with pytest.raises(ValueError, match="take one claim each"):
        parse_variant("exclusive+1")
    with pytest.raises(ValueError, match="number of claims per GPU"):
        parse_variant("fracgpu+x")
    assert parse_variant("fracgpu+7") == Variant("fracgpu", 7)  # 7 + the burst's 1 fill 80Gi in 10Gi shares
    with pytest.raises(ValueError, match="holds 8 claims of 10Gi; preallocate at most 7"):
        parse_variant("fracgpu+8")
    assert parse_variant("shared-no-capacity+20").preallocated == 20


def test_fracgpu_shape_is_what_the_plugin_publishes() -> None:
    gpus = simulated_gpus("n1", 8)
    assert SHAPES["fracgpu"].slices(NODE, gpus) == build_slices(
        "n1", "uid-1", DRIVER_NAME, gpus, step=STEP, reserve=0, generation=1
    )


def test_exclusive_shape_one_whole_device_per_gpu() -> None:
    gpus = simulated_gpus("n1", 8)
    [body] = SHAPES["exclusive"].slices(NODE, gpus)
    devices = body["spec"]["devices"]
    assert [d["name"] for d in devices] == [g.device_name for g in gpus]
    assert all("capacity" not in d and "allowMultipleAllocations" not in d for d in devices)
    ours = build_slices("n1", "uid-1", DRIVER_NAME, gpus, step=STEP, reserve=0, generation=1)[0]["spec"]["devices"]
    assert [d["attributes"] for d in devices] == [d["attributes"] for d in ours]
    assert SHAPES["exclusive"].memory is None and SHAPES["fracgpu"].memory == "10Gi"


def test_variation_shapes_change_one_thing() -> None:
    gpus = simulated_gpus("n1", 3)
    per_gpu = SHAPES["fracgpu-slice-per-gpu"].slices(NODE, gpus)
    assert [len(s["spec"]["devices"]) for s in per_gpu] == [1, 1, 1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in per_gpu} == {3}
    assert len({s["metadata"]["name"] for s in per_gpu}) == 3
    [uuid_only] = SHAPES["fracgpu-uuid"].slices(NODE, gpus)
    assert all(
        set(d["attributes"]) == {"uuid"} and MEMORY_CAPACITY in d["capacity"] for d in uuid_only["spec"]["devices"]
    )
    [no_policy] = SHAPES["fracgpu-no-policy"].slices(NODE, gpus)
    assert all(set(d["capacity"][MEMORY_CAPACITY]) == {"value"} for d in no_policy["spec"]["devices"])
    [no_capacity] = SHAPES["shared-no-capacity"].slices(NODE, gpus)
    assert all("capacity" not in d and d["allowMultipleAllocations"] for d in no_capacity["spec"]["devices"])
