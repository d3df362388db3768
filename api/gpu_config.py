"""The opaque device config ``fracgpu.dev/v1alpha1`` ``GpuConfig``.

Users put it in ResourceClaim / DeviceClass ``config[].opaque.parameters`` for driver ``gpu.fracgpu.dev``.
Decoding is strict (unknown fields, wrong types and coercions such as ``"50"`` -> ``50`` are refused) and
every error names the field path inside ``parameters`` and what is allowed, so that the admission webhook
and the node plugin can show it to the user as is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from api.names import CONFIG_API_VERSION, CONFIG_KIND

Enforcement = Literal["none", "hami-core"]
ENFORCEMENT_MODES: tuple[str, ...] = ("none", "hami-core")

MAX_ENV_ENTRIES = 32
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV_PREFIXES: tuple[str, ...] = ("FRACGPU_", "NVIDIA_", "CUDA_")

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
        description="hami-core turns enforcement on for this claim; none never turns off a node's hami-core",
    )
    compute_limit_percent: int | None = Field(
        default=None, ge=1, le=100, alias="computeLimitPercent", description="HAMi-core CUDA_DEVICE_SM_LIMIT"
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
    field path and what is allowed.
    """
    data: object
    if isinstance(raw, bytes | str):
        try:
            data = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GpuConfigError([f"parameters are not valid JSON: {e}"]) from None
    else:
        data = raw
    if not isinstance(data, Mapping):
        raise GpuConfigError([f"parameters must be a JSON object with apiVersion and kind, got {_json_type(data)}"])
    problems = [f"{f}: required, {_FIELD_RULES[f]}" for f in ("apiVersion", "kind") if f not in data]
    # checked here, not by the model: the model also accepts its Python field names, the wire does not
    problems += [
        f"{key}: unknown field; allowed fields are " + ", ".join(ALLOWED_FIELDS)
        for key in data
        if key not in _FIELD_RULES
    ]
    try:
        config = GpuConfig.model_validate({k: v for k, v in data.items() if k in _FIELD_RULES})
    except ValidationError as e:
        problems += [_describe(err) for err in e.errors()]
    if problems:
        raise GpuConfigError(problems)
    return config


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
    loc = [str(p) for p in err["loc"]]
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


def _show(value: object) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
