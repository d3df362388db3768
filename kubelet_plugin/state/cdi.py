"""CDI (Container Device Interface) spec model, naming and writer (the CDI specification's rules).

One transient spec per claim: kind ``k8s.<driver>/claim``, devices ``<claimUID>-<device>[-<shareID>]``,
file ``<cdi_dir>/k8s.<driver>-claim_<claimUID>.json``. The writer always stamps the spec with the minimum
``cdiVersion`` its fields need, so that the oldest CDI library able to parse it can.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from api.names import CDI_CLASS, CDI_VENDOR_PREFIX

KNOWN_VERSIONS: tuple[str, ...] = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
BASELINE_VERSION = "0.3.0"
CLAIM_ANNOTATION = "fracgpu.dev/claim"  # spec annotation: "<namespace>/<name>" of the claim (for recovery)
SPEC_FILE_MODE = 0o644

_ALNUM = "A-Za-z0-9"
_VENDOR_CLASS_RE = re.compile(rf"^[A-Za-z]([{_ALNUM}._-]*[{_ALNUM}])?$")
DEVICE_NAME_RE = re.compile(rf"^[{_ALNUM}]([{_ALNUM}_.:-]*[{_ALNUM}])?$")
_ANNOTATION_NAME_RE = re.compile(rf"^[{_ALNUM}]([{_ALNUM}_.-]*[{_ALNUM}])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_UINT32_MAX = 2**32 - 1
_INT64_MAX = 2**63 - 1


# ---------------------------------------------------------------------------------------------------
# name rules


def validate_vendor_or_class(name: str, what: str = "vendor") -> None:
    """CDI vendor/class rule: chars ``A-Za-z0-9._-``, starts with a letter, ends with a letter or digit."""
    if not _VENDOR_CLASS_RE.fullmatch(name):
        raise ValueError(
            f"invalid CDI {what} {name!r}: use only A-Z a-z 0-9 . _ -, start with a letter and "
            "end with a letter or digit"
        )


def validate_device_name(name: str) -> None:
    """CDI device-name rule: chars ``A-Za-z0-9-_.:``, starting and ending with a letter or digit."""
    if not DEVICE_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid CDI device name {name!r}: use only A-Z a-z 0-9 - _ . :, start and end with a letter or digit"
        )


def validate_kind(kind: str) -> None:
    """``<vendor>/<class>`` with each part valid, vendor ≤ 253 and class ≤ 63 characters."""
    vendor, sep, cls = kind.partition("/")
    if not sep:
        raise ValueError(f"invalid CDI kind {kind!r}: must be <vendor>/<class>")
    validate_vendor_or_class(vendor, "vendor")
    validate_vendor_or_class(cls, "class")
    if len(vendor) > 253 or len(cls) > 63:
        raise ValueError(f"invalid CDI kind {kind!r}: vendor ≤ 253 and class ≤ 63 characters")


def _validate_annotations(annotations: dict[str, str] | None) -> dict[str, str] | None:
    """Keys must be qualified names (``[prefix/]name``, as Kubernetes annotation keys)."""
    for key in annotations or {}:
        prefix, sep, name = key.rpartition("/")
        if (
            not _ANNOTATION_NAME_RE.fullmatch(name)
            or len(name) > 63
            or (sep and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)))
        ):
            raise ValueError(f"invalid annotation key {key!r}: must be a qualified name ([prefix/]name)")
    return annotations


def _validate_env(env: list[str]) -> list[str]:
    for entry in env:
        if entry.find("=") <= 0:
            raise ValueError(f"invalid env entry {entry!r}: must be NAME=VALUE with a non-empty NAME")
    return env


def cdi_vendor(driver_name: str) -> str:
    """CDI vendor of a DRA driver: ``k8s.<driver>``."""
    vendor = f"{CDI_VENDOR_PREFIX}{driver_name}"
    validate_vendor_or_class(vendor, "vendor")
    return vendor


def cdi_kind(driver_name: str) -> str:
    """CDI kind of per-claim specs: ``k8s.<driver>/claim``."""
    return f"{cdi_vendor(driver_name)}/{CDI_CLASS}"


def cdi_device_name(claim_uid: str, device: str, share_id: str | None) -> str:
    """``<claimUID>-<device>[-<shareID>]``: unique per claim and per share, never reused (runtimes cache)."""
    name = f"{claim_uid}-{device}" if share_id is None else f"{claim_uid}-{device}-{share_id}"
    validate_device_name(name)
    return name


def cdi_device_id(driver: str, claim_uid: str, device: str, share_id: str | None) -> str:
    """Fully qualified CDI device ID ``<kind>=<name>`` as returned to the kubelet."""
    return f"{cdi_kind(driver)}={cdi_device_name(claim_uid, device, share_id)}"


def spec_file_prefix(driver: str) -> str:
    """File-name prefix of this driver's per-claim specs: ``k8s.<driver>-claim_``."""
    return f"{cdi_vendor(driver)}-{CDI_CLASS}_"


def spec_path(cdi_dir: Path, driver: str, claim_uid: str) -> Path:
    """``<cdi_dir>/k8s.<driver>-claim_<claimUID>.json`` (CDI's transient spec name)."""
    validate_device_name(claim_uid)  # also rules out path separators
    return cdi_dir / f"{spec_file_prefix(driver)}{claim_uid}.json"


# ---------------------------------------------------------------------------------------------------
# spec model


def _empty(value: object) -> bool:
    return not value


#: CDI annotations: keys are qualified names; omitted from the JSON when empty.
Annotations = Annotated[dict[str, str] | None, AfterValidator(_validate_annotations)]
#: ``NAME=VALUE`` entries.
EnvList = Annotated[list[str], AfterValidator(_validate_env)]


class _CdiModel(BaseModel):
    """Exact CDI JSON names; unknown fields refused. ``to_json`` omits ``None`` and the empty optional
    collections (fields with ``exclude_if=_empty``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class DeviceNode(_CdiModel):
    """A device node the container gets; only set fields are emitted."""

    path: str
    host_path: str | None = Field(default=None, alias="hostPath")
    type: Literal["b", "c", "u", "p"] | None = None
    major: int | None = Field(default=None, ge=0, le=_INT64_MAX)
    minor: int | None = Field(default=None, ge=0, le=_INT64_MAX)
    file_mode: int | None = Field(default=None, ge=0, le=_UINT32_MAX, alias="fileMode")
    permissions: str | None = None
    uid: int | None = Field(default=None, ge=0, le=_UINT32_MAX)
    gid: int | None = Field(default=None, ge=0, le=_UINT32_MAX)

    @field_validator("path", "host_path")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"device node path {v!r} must be absolute")
        return v

    @field_validator("permissions")
    @classmethod
    def _perms(cls, v: str | None) -> str | None:
        if v is not None and (not v or set(v) - set("rwm") or len(set(v)) != len(v)):
            raise ValueError(f"permissions {v!r} must be a non-empty subset of 'rwm'")
        return v


class Mount(_CdiModel):
    """A bind (or other) mount into the container."""

    host_path: str = Field(alias="hostPath", min_length=1)
    container_path: str = Field(alias="containerPath", min_length=1)
    options: list[str] = Field(default_factory=list, exclude_if=_empty)
    type: str | None = None


class Hook(_CdiModel):
    """An OCI hook run by the runtime."""

    hook_name: Literal["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"] = (
        Field(alias="hookName")
    )
    path: str
    args: list[str] = Field(default_factory=list, exclude_if=_empty)
    env: EnvList = Field(default_factory=list, exclude_if=_empty)
    timeout: int | None = Field(default=None, gt=0)

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"hook path {v!r} must be absolute")
        return v


class ContainerEdits(_CdiModel):
    """Edits applied to the OCI spec; empty lists are omitted."""

    env: EnvList = Field(default_factory=list, exclude_if=_empty)
    device_nodes: list[DeviceNode] = Field(default_factory=list, alias="deviceNodes", exclude_if=_empty)
    mounts: list[Mount] = Field(default_factory=list, exclude_if=_empty)
    hooks: list[Hook] = Field(default_factory=list, exclude_if=_empty)
    additional_gids: list[int] = Field(default_factory=list, alias="additionalGids", exclude_if=_empty)

    @field_validator("additional_gids")
    @classmethod
    def _gids(cls, v: list[int]) -> list[int]:
        for gid in v:
            if not 0 <= gid <= _UINT32_MAX:
                raise ValueError(f"additional gid {gid} is not a uint32")
        return v

    def is_empty(self) -> bool:
        """True when no edit of any kind is present."""
        return not (self.env or self.device_nodes or self.mounts or self.hooks or self.additional_gids)


class Device(_CdiModel):
    """One CDI device; CDI refuses a device without edits."""

    name: str
    annotations: Annotations = Field(default=None, exclude_if=_empty)
    container_edits: ContainerEdits = Field(alias="containerEdits")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        validate_device_name(v)
        return v

    @model_validator(mode="after")
    def _edits_present(self) -> Device:
        if self.container_edits.is_empty():
            raise ValueError(f"CDI device {self.name!r} has empty containerEdits")
        return self


class Spec(_CdiModel):
    """A CDI spec file. ``cdi_version`` defaults to the baseline; ``write_spec`` sets the minimum."""

    cdi_version: str = Field(default=BASELINE_VERSION, alias="cdiVersion")
    kind: str
    annotations: Annotations = Field(default=None, exclude_if=_empty)
    devices: list[Device] = Field(min_length=1)
    container_edits: ContainerEdits | None = Field(
        default=None, alias="containerEdits", exclude_if=lambda edits: edits is None or edits.is_empty()
    )

    @field_validator("cdi_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v not in KNOWN_VERSIONS:
            raise ValueError(f"unknown cdiVersion {v!r}; known: {', '.join(KNOWN_VERSIONS)}")
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        validate_kind(v)
        return v

    @model_validator(mode="after")
    def _unique_devices(self) -> Spec:
        names = [d.name for d in self.devices]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate CDI device names: {', '.join(duplicates)}")
        return self

    def to_json(self) -> str:
        """The spec as compact CDI JSON (exact field names, unset fields omitted)."""
        return self.model_dump_json(by_alias=True, exclude_none=True) + "\n"


def _edits_list(spec: Spec) -> list[ContainerEdits]:
    edits = [d.container_edits for d in spec.devices]
    if spec.container_edits is not None:
        edits.append(spec.container_edits)
    return edits


def minimum_version(spec: Spec) -> str:
    """Lowest CDI version that supports every field ``spec`` uses (baseline 0.3.0).

    0.4.0: mount ``type``; 0.5.0: deviceNode ``hostPath`` or a device name starting with a digit;
    0.6.0: spec/device ``annotations`` or a dot in the kind's class; 0.7.0: ``additionalGids``.
    """
    edits = _edits_list(spec)
    if any(e.additional_gids for e in edits):
        return "0.7.0"
    if spec.annotations or any(d.annotations for d in spec.devices) or "." in spec.kind.partition("/")[2]:
        return "0.6.0"
    if any(n.host_path is not None for e in edits for n in e.device_nodes) or any(
        d.name[0].isdigit() for d in spec.devices
    ):
        return "0.5.0"
    if any(m.type is not None for e in edits for m in e.mounts):
        return "0.4.0"
    return BASELINE_VERSION


def with_minimum_version(spec: Spec) -> Spec:
    """A copy of ``spec`` whose ``cdiVersion`` is ``minimum_version(spec)``."""
    return spec.model_copy(update={"cdi_version": minimum_version(spec)})


# ---------------------------------------------------------------------------------------------------
# files
