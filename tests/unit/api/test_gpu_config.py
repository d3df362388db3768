"""Unit tests of the opaque GpuConfig (api/gpu_config.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.gpu_config import (
    MAX_ENV_ENTRIES,
    GpuConfig,
    GpuConfigError,
    decode_gpu_config,
    merge_configs,
)
from api.names import CONFIG_API_VERSION, CONFIG_KIND

HEAD: dict[str, Any] = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}


def params(**fields: Any) -> dict[str, Any]:
    return {**HEAD, **fields}


def error_of(raw: Any) -> str:
    with pytest.raises(GpuConfigError) as info:
        decode_gpu_config(raw)
    assert isinstance(info.value, ValueError)
    return str(info.value)


# --- valid -----------------------------------------------------------------------------------------


def test_minimal_config_has_no_opinions() -> None:
    cfg = decode_gpu_config(json.dumps(HEAD))
    assert cfg == GpuConfig()
    assert cfg.enforcement is None
    assert cfg.compute_limit_percent is None
    assert cfg.env == {}
    assert cfg.to_parameters() == HEAD


def test_full_config_from_str_bytes_and_mapping() -> None:
    raw = params(enforcement="hami-core", computeLimitPercent=50, env={"OMP_NUM_THREADS": "4", "_x1": ""})
    for form in (json.dumps(raw), json.dumps(raw).encode(), raw):
        cfg = decode_gpu_config(form)
        assert cfg.enforcement == "hami-core"
        assert cfg.compute_limit_percent == 50
        assert cfg.env == {"OMP_NUM_THREADS": "4", "_x1": ""}
        assert cfg.to_parameters() == raw


@pytest.mark.parametrize("value", [1, 100])
def test_compute_limit_bounds_accepted(value: int) -> None:
    assert decode_gpu_config(params(computeLimitPercent=value)).compute_limit_percent == value


def test_enforcement_none_and_null_fields() -> None:
    assert decode_gpu_config(params(enforcement="none")).enforcement == "none"
    cfg = decode_gpu_config(params(enforcement=None, computeLimitPercent=None))
    assert cfg == GpuConfig()


def test_env_at_limit_accepted() -> None:
    env = {f"V{i}": str(i) for i in range(MAX_ENV_ENTRIES)}
    assert decode_gpu_config(params(env=env)).env == env


# --- invalid ---------------------------------------------------------------------------------------


def test_malformed_json() -> None:
    assert "not valid JSON" in error_of('{"apiVersion": ')
    assert "not valid JSON" in error_of(b"\xff\xfe")


@pytest.mark.parametrize(("raw", "kind"), [("[]", "an array"), ('"x"', "a string"), ("3", "a number")])
def test_not_an_object(raw: str, kind: str) -> None:
    msg = error_of(raw)
    assert "must be a JSON object" in msg
    assert kind in msg


def test_unknown_field_lists_allowed_fields() -> None:
    msg = error_of(params(memoryLimitOverheadPercent=5))
    assert msg.startswith("memoryLimitOverheadPercent: unknown field")
    for allowed in ("apiVersion", "kind", "enforcement", "computeLimitPercent", "env"):
        assert allowed in msg


@pytest.mark.parametrize(
    ("sharing", "names"),
    [
        ({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}, ["DeviceClass gpu.fracgpu.dev"]),
        (
            {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
            ["mps.gpu.fracgpu.dev", "computeLimitPercent"],
        ),
        (
            {"strategy": "SpacePartitioning", "spacePartitioningConfig": {"partitionCount": 4}},
            ["mig.gpu.fracgpu.dev", "chart value mig.gpus"],
        ),
        ("TimeSlicing", ["DeviceClass gpu.fracgpu.dev"]),
    ],
)
def test_a_peer_drivers_sharing_config_is_refused_naming_the_replacement(sharing: object, names: list[str]) -> None:
    """NVIDIA's DRA driver and the example driver spell sharing as a config; fracgpu spells it as memory."""
    msg = error_of(params(sharing=sharing))
    assert msg.startswith("sharing: unknown field (the sharing config of NVIDIA's DRA driver or the example driver)")
    assert "capacity.requests.memory" in msg
    for name in names:
        assert name in msg
    assert "allowed fields are" not in msg
    others = {"mps.gpu.fracgpu.dev", "mig.gpu.fracgpu.dev"} - set(names)
    assert not any(other in msg for other in others)


def test_an_nvidia_gpu_config_gets_every_problem() -> None:
    nvidia = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    problems = _problems(nvidia)
    assert problems[0].startswith("sharing: unknown field (the sharing config") and "mps.gpu.fracgpu.dev" in problems[0]
    assert problems[1] == "apiVersion: must be 'fracgpu.dev/v1alpha1', got \"resource.nvidia.com/v1beta1\""
    assert len(problems) == 2


def _problems(raw: Any) -> tuple[str, ...]:
    with pytest.raises(GpuConfigError) as info:
        decode_gpu_config(raw)
    return info.value.problems


def test_snake_case_name_is_unknown_on_the_wire() -> None:
    assert "compute_limit_percent: unknown field" in error_of(params(compute_limit_percent=5))


def test_wrong_api_version_and_kind() -> None:
    msg = error_of({"apiVersion": "fracgpu.dev/v1", "kind": "GPUConfig"})
    assert "apiVersion: must be 'fracgpu.dev/v1alpha1', got \"fracgpu.dev/v1\"" in msg
    assert "kind: must be 'GpuConfig', got \"GPUConfig\"" in msg


def test_missing_api_version_and_kind() -> None:
    msg = error_of({"computeLimitPercent": 10})
    assert "apiVersion: required, must be 'fracgpu.dev/v1alpha1'" in msg
    assert "kind: required, must be 'GpuConfig'" in msg


def test_bad_enforcement() -> None:
    msg = error_of(params(enforcement="mig"))
    assert msg == "enforcement: must be one of 'none', 'hami-core', 'mps', 'nvml', got \"mig\""


def test_mps_is_a_tier() -> None:
    assert decode_gpu_config(params(enforcement="mps", computeLimitPercent=30)).enforcement == "mps"


@pytest.mark.parametrize(
    ("value", "shown"),
    [(150, "150"), (0, "0"), (-1, "-1"), ("50", '"50"'), (50.0, "50.0"), (True, "true"), ([50], "[50]")],
)
def test_bad_compute_limit(value: object, shown: str) -> None:
    msg = error_of(params(computeLimitPercent=value))
    assert msg == f"computeLimitPercent: must be an integer between 1 and 100, got {shown}"


def test_compute_limit_string_in_json_not_coerced() -> None:
    raw = '{"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": "50"}'
    assert "computeLimitPercent: must be an integer between 1 and 100" in error_of(raw)


@pytest.mark.parametrize("prefix", ["FRACGPU_", "NVIDIA_", "CUDA_"])
def test_reserved_env_prefix(prefix: str) -> None:
    msg = error_of(params(env={f"{prefix}VISIBLE_DEVICES": "all"}))
    assert msg.startswith("env: ")
    assert "reserved" in msg
    assert f"{prefix}VISIBLE_DEVICES" in msg
    assert "FRACGPU_, NVIDIA_, CUDA_" in msg


@pytest.mark.parametrize("key", ["1ABC", "A-B", "A B", "", "ÄB", "A=B"])
def test_bad_env_name(key: str) -> None:
    msg = error_of(params(env={key: "x"}))
    assert msg.startswith("env: variable name")
    assert "^[A-Za-z_][A-Za-z0-9_]*$" in msg


def test_env_value_must_be_string() -> None:
    assert error_of(params(env={"A": 1})) == "env.A: value must be a string, got 1"


def test_env_must_be_object() -> None:
    msg = error_of(params(env=["A=1"]))
    assert msg.startswith("env: must be an object mapping environment variable names to string values")


def test_env_too_many_entries() -> None:
    msg = error_of(params(env={f"V{i}": "x" for i in range(MAX_ENV_ENTRIES + 1)}))
    assert f"at most {MAX_ENV_ENTRIES} entries" in msg


def test_env_value_with_nul_refused() -> None:
    assert "NUL" in error_of(params(env={"A": "x\x00y"}))


def test_all_problems_reported_together() -> None:
    with pytest.raises(GpuConfigError) as info:
        decode_gpu_config(params(enforcement="x", computeLimitPercent=0, bogus=1))
    assert len(info.value.problems) == 3


# --- merge -----------------------------------------------------------------------------------------


def test_merge_later_overrides_field_by_field() -> None:
    cls_cfg = GpuConfig(enforcement="hami-core", compute_limit_percent=30, env={"A": "class", "B": "class"})
    claim_cfg = GpuConfig(compute_limit_percent=70, env={"B": "claim", "C": "claim"})
    merged = merge_configs([cls_cfg, claim_cfg])
    assert merged.enforcement == "hami-core"  # not set by the claim: kept from the class
    assert merged.compute_limit_percent == 70
    assert merged.env == {"A": "class", "B": "claim", "C": "claim"}
    reverse = merge_configs([claim_cfg, cls_cfg])
    assert reverse.compute_limit_percent == 30
    assert reverse.env["B"] == "class"


def test_merge_empty_and_single() -> None:
    assert merge_configs([]) == GpuConfig()
    one = GpuConfig(enforcement="none", env={"X": "1"})
    assert merge_configs([one]) == one


def test_merge_env_over_limit_refused() -> None:
    a = GpuConfig(env={f"A{i}": "x" for i in range(MAX_ENV_ENTRIES)})
    b = GpuConfig(env={"B": "x"})
    with pytest.raises(GpuConfigError, match="at most"):
        merge_configs([a, b])


# --- property --------------------------------------------------------------------------------------

_env_names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,15}\Z").filter(
    lambda k: not k.startswith(("FRACGPU_", "NVIDIA_", "CUDA_"))
)
_env_values = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=20)

valid_configs = st.builds(
    GpuConfig,
    enforcement=st.sampled_from([None, "none", "hami-core"]),
    compute_limit_percent=st.one_of(st.none(), st.integers(1, 100)),
    env=st.dictionaries(_env_names, _env_values, max_size=MAX_ENV_ENTRIES),
)


@given(valid_configs)
def test_valid_config_round_trips_through_json(cfg: GpuConfig) -> None:
    text = json.dumps(cfg.to_parameters())
    assert decode_gpu_config(text) == cfg
    assert decode_gpu_config(text.encode()) == cfg
