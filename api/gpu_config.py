"""The opaque device config ``fracgpu.dev/v1alpha1`` ``GpuConfig``.

Users put it in ResourceClaim / DeviceClass ``config[].opaque.parameters`` for driver ``gpu.fracgpu.dev``.
Decoding is strict (unknown fields, wrong types and coercions such as ``"50"`` -> ``50`` are refused) and
every error names the field path inside ``parameters`` and what is allowed, so that the admission webhook
and the node plugin can show it to the user as is.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from api import bounded_json
from api.names import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME, MIG_DEVICE_CLASS_NAME, MPS_DEVICE_CLASS_NAME

Enforcement = Literal["none", "hami-core", "mps", "nvml"]
"""Weakest first (kubelet_plugin/enforcement/tiers.py says why)."""
ENFORCEMENT_MODES: tuple[str, ...] = get_args(Enforcement)

MAX_ENV_ENTRIES = 32
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV_PREFIXES: tuple[str, ...] = ("FRACGPU_", "NVIDIA_", "CUDA_")
MAX_PARAMETERS_BYTES = 10 * 1024
"""The API server's own limit for `opaque.parameters` (OpaqueParametersMaxLength)."""
MAX_PARAMETERS_DEPTH = 16
"""Levels of arrays/objects allowed in parameters (a GpuConfig needs 2: the object and its env map)."""
MAX_PROBLEMS = 20
"""Problems listed per config; the rest are counted."""
_SIMPLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")

_FIELD_RULES: dict[str, str] = {
    "apiVersion": f"must be {CONFIG_API_VERSION!r}",
    "kind": f"must be {CONFIG_KIND!r}",
    "enforcement": "must be one of " + ", ".join(repr(m) for m in ENFORCEMENT_MODES),
    "computeLimitPercent": "must be an integer between 1 and 100",
    "env": "must be an object mapping environment variable names to string values",
}
ALLOWED_FIELDS: tuple[str, ...] = tuple(_FIELD_RULES)


class GpuConfigError(ValueError):
    """A GpuConfig could not be decoded; ``problems`` holds one human-readable line per error."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("; ".join(self.problems))


class GpuConfig(BaseModel):
    """Per-claim settings of the fracgpu driver. Unset fields (``None`` / empty env) mean "no opinion"."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    api_version: Literal["fracgpu.dev/v1alpha1"] = Field(default=CONFIG_API_VERSION, alias="apiVersion")
    kind: Literal["GpuConfig"] = CONFIG_KIND
    enforcement: Enforcement | None = Field(
        default=None,
        description="raises this claim's memory enforcement to hami-core, mps or nvml; never lowers the node's floor "
        "(on an MPS GPU every share is mps)",
    )
    compute_limit_percent: int | None = Field(
        default=None,
        ge=1,
        le=100,
        alias="computeLimitPercent",
        description="share of the GPU's compute: MPS active thread percentage (mps tier), HAMi-core "
        "CUDA_DEVICE_SM_LIMIT (hami-core tier); ignored by the other tiers",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra container environment")

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        if len(env) > MAX_ENV_ENTRIES:
            raise ValueError(f"at most {MAX_ENV_ENTRIES} entries are allowed, got {len(env)}")
        for key, value in env.items():
            if not ENV_NAME_PATTERN.fullmatch(key):
                raise ValueError(f"variable name {key!r} must match {ENV_NAME_PATTERN.pattern}")
            if key.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(
                    f"variable name {key!r} is reserved: names starting with "
                    + ", ".join(RESERVED_ENV_PREFIXES)
                    + " are set by the driver"
                )
            if "\x00" in value:
                raise ValueError(f"value of {key!r} must not contain a NUL character")
            if _LONE_SURROGATE.search(value):
                raise ValueError(f"value of {key!r} must be valid Unicode (it has a lone surrogate)")
        return env

    def to_parameters(self) -> dict[str, Any]:
        """The wire form (camelCase, unset fields omitted) as it goes into ``opaque.parameters``."""
        out: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        if not self.env:
            out.pop("env", None)
        return out


def decode_gpu_config(raw: bytes | str | Mapping[str, object]) -> GpuConfig:
    """Decode ``opaque.parameters`` (JSON text or an already parsed mapping) into a GpuConfig.

    ``apiVersion`` and ``kind`` are required on the wire. Raises ``GpuConfigError`` naming each offending
    field path and what is allowed, and nothing else, whatever the input: parameters over
    ``MAX_PARAMETERS_BYTES`` bytes or ``MAX_PARAMETERS_DEPTH`` levels, integers too long to convert and
    strings that are not valid Unicode (lone surrogates) are refused without being looked at further.
    """
    data: object
    if isinstance(raw, bytes | str):
        if len(raw) > MAX_PARAMETERS_BYTES:
            raise GpuConfigError([_too_big(len(raw))])
        try:
            data = bounded_json.loads(raw, max_depth=MAX_PARAMETERS_DEPTH)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GpuConfigError([f"parameters are not valid JSON: {e}"]) from None
    else:
        data = raw
    shape = list(_shape_problems(data))
    if shape:
        raise GpuConfigError(_capped(shape))
    if not isinstance(data, Mapping):
        raise GpuConfigError([f"parameters must be a JSON object with apiVersion and kind, got {_json_type(data)}"])
    if not isinstance(raw, bytes | str):
        size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str).encode())
        if size > MAX_PARAMETERS_BYTES:
            raise GpuConfigError([_too_big(size)])
    problems = [f"{f}: required, {_FIELD_RULES[f]}" for f in ("apiVersion", "kind") if f not in data]
    # checked here, not by the model: the model also accepts its Python field names, the wire does not
    problems += [
        _replacement(key, data[key])
        if key in _PEER_FIELDS
        else f"{_name(key)}: unknown field; allowed fields are " + ", ".join(ALLOWED_FIELDS)
        for key in data
        if key not in _FIELD_RULES
    ]
    try:
        config = GpuConfig.model_validate({k: v for k, v in data.items() if k in _FIELD_RULES})
    except ValidationError as e:
        problems += [_describe(err) for err in e.errors()]
    if problems:
        raise GpuConfigError(_capped(problems))
    return config


_PEER_FIELDS = frozenset({"sharing"})
"""Fields of other drivers' GpuConfigs (NVIDIA's DRA driver, the example driver) that fracgpu replaces."""
_SHARE_BY_MEMORY = (
    "fracgpu shares a GPU by memory: drop it and ask for the share in the request, "
    f"capacity.requests.memory (e.g. 10Gi), of the DeviceClass {DRIVER_NAME}"
)


def _replacement(key: str, value: object) -> str:
    """The problem of a peer driver's field, naming what a fracgpu claim writes instead (docs/migrating.md)."""
    strategy = value.get("strategy") if isinstance(value, Mapping) else None
    head = f"{key}: unknown field (the sharing config of NVIDIA's DRA driver or the example driver)"
    if strategy == "MPS":
        return (
            f"{head}; for MPS ask capacity.requests.memory (e.g. 10Gi) of the DeviceClass {MPS_DEVICE_CLASS_NAME} "
            "(MPS GPUs, chart value deviceClass.mps.create): each share is an MPS client limited to its memory; "
            "mpsConfig.defaultActiveThreadPercentage is GpuConfig computeLimitPercent here"
        )
    if strategy == "SpacePartitioning":
        return (
            f"{head}; for a partition of its own ask capacity.requests.memory (e.g. 10Gi) of the DeviceClass "
            f"{MIG_DEVICE_CLASS_NAME} (the smallest MIG partition that holds it, on the MIG GPUs the chart value "
            "mig.gpus names), or for a share of a GPU "
            f"of {DRIVER_NAME}"
        )
    return f"{head}; {_SHARE_BY_MEMORY}; its pods share the GPU's time as any CUDA processes do"


def _too_big(size: int) -> str:
    return f"parameters: {size} bytes of JSON, at most {MAX_PARAMETERS_BYTES} are allowed"


def _capped(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return [*problems[:MAX_PROBLEMS], f"parameters: {len(problems) - MAX_PROBLEMS} more problems not listed"]


def _shape_problems(data: object) -> Iterator[str]:
    """Problems of the value as JSON, before any field is read: too deep, parts the decoder skipped,
    integers too long to convert, lone surrogates. Iterative; looks no deeper than the depth limit."""
    limit = sys.get_int_max_str_digits()
    stack: list[tuple[str, object, int]] = [("", data, 1)]
    while stack:
        path, node, depth = stack.pop()
        where = f"parameters.{path}" if path and not path.startswith("[") else f"parameters{path}"
        if isinstance(node, bounded_json.Skipped):
            deep = node.reason == bounded_json.REASON_DEEP
            yield (
                _too_deep(path)
                if deep
                else f"{where}: integer with more than {limit} digits; numbers must fit the field's range"
            )
        elif isinstance(node, Mapping | list | tuple):
            if depth > MAX_PARAMETERS_DEPTH:
                yield _too_deep(path)
                continue
            items = node.items() if isinstance(node, Mapping) else enumerate(node)
            for key, child in reversed(list(items)):
                if isinstance(key, str) and _LONE_SURROGATE.search(key):
                    yield f"{where}: field name {_show(key)} is not valid Unicode (lone surrogate)"
                    continue
                sub = (
                    f"{path}[{key}]"
                    if isinstance(node, list | tuple)
                    else f"{path}.{_name(key)}"
                    if path
                    else _name(key)
                )
                stack.append((sub, child, depth + 1))
        elif isinstance(node, str) and (bad := _LONE_SURROGATE.search(node)):
            yield f"{where}: not valid Unicode (lone surrogate {_show(bad.group())} at character {bad.start()})"
        elif isinstance(node, int) and not isinstance(node, bool) and limit and node.bit_length() * 0.30103 > limit:
            yield f"{where}: integer with more than {limit} digits; numbers must fit the field's range"


def _too_deep(path: str) -> str:
    at = f" (at {bounded_json.short_path(path, 6)})" if path else ""
    return (
        f"parameters: nested deeper than {MAX_PARAMETERS_DEPTH} levels{at}; at most {MAX_PARAMETERS_DEPTH} levels "
        "of arrays and objects are allowed (a GpuConfig needs 2)"
    )


def _name(key: object) -> str:
    """A field name as it can be shown: plain when simple, else quoted and cut."""
    text = str(key) if isinstance(key, str | int) and not isinstance(key, bool) else _show(key)
    return text if _SIMPLE_NAME.fullmatch(text) else _show(key)


def merge_configs(configs: Sequence[GpuConfig]) -> GpuConfig:
    """Fold configs in order: a later entry's set fields override earlier ones; env maps are merged with
    later keys winning. Apply class configs first, then claim configs. An empty sequence gives defaults.

    Raises ``GpuConfigError`` if the merged env exceeds the entry limit.
    """
    enforcement: Enforcement | None = None
    compute: int | None = None
    env: dict[str, str] = {}
    for c in configs:
        if c.enforcement is not None:
            enforcement = c.enforcement
        if c.compute_limit_percent is not None:
            compute = c.compute_limit_percent
        env.update(c.env)
    try:
        return GpuConfig(enforcement=enforcement, compute_limit_percent=compute, env=env)
    except ValidationError as e:
        raise GpuConfigError([_describe(err) for err in e.errors()]) from None


def _describe(err: ErrorDetails) -> str:
    loc = [_name(p) for p in err["loc"]]
    path = ".".join(loc) if loc else "parameters"
    field = loc[0] if loc else ""
    etype = err["type"]
    got = err.get("input")
    if etype == "extra_forbidden":
        return f"{path}: unknown field; allowed fields are " + ", ".join(ALLOWED_FIELDS)
    if etype == "value_error":
        # our own validators: the message already says what is allowed
        msg = str(err.get("ctx", {}).get("error", err["msg"]))
        return f"{path}: {msg}"
    if field == "env" and len(loc) >= 2:
        return f"{path}: value must be a string, got {_show(got)}"
    if field == "env" and etype == "dict_type":
        return f"{path}: {_FIELD_RULES['env']}, got {_show(got)}"
    rule = _FIELD_RULES.get(field)
    if rule is not None:
        return f"{path}: {rule}, got {_show(got)}"
    return f"{path}: {err['msg']}"


def _show(value: object, limit: int = 80) -> str:
    """A value as JSON, cut to `limit` characters; never raises (any input, any depth, any number)."""
    if isinstance(value, str):
        value = value[: limit + 1]  # no need to encode more than is shown
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError, RecursionError):  # not JSON, integer beyond the digit limit, too deep
        text = f"a {_json_type(value)}" if not isinstance(value, int) else "an integer with too many digits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    return type(value).__name__
