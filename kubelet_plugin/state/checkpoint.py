"""Versioned, atomically written checkpoint of the claims this node plugin has prepared.

The kubelet does not re-prepare claims after a plugin restart and sends only namespace/name/UID on
Unprepare, so the plugin persists what it prepared. A claim is recorded as
``PrepareCompleted`` once its CDI spec is written. ``PrepareStarted`` is a claim without files: one that plugins
before that order wrote first, or (with ``mpsSwitchUntil``) one waiting for its MPS GPU's daemon to serve its trust
domain, which holds that GPU for its domain until then; recovery drops such entries. The node boot ID tells whether
CDI specs (on tmpfs under /var/run/cdi) died with a reboot and must be rewritten.

Schema: ``version`` is the schema version (``SCHEMA_VERSION``). Anything a reader must understand bumps it,
with a migration from the previous version in ``MIGRATIONS``; an older file is migrated on load and written
back in the current schema by the next save. A field this plugin does not know, in a schema it reads, is
an addition that needed no bump: it is kept (and written back, at the place it was found) and reported in
``LoadResult.unknown_fields``, because dropping it would silently lose what another fracgpu recorded. A
file of a newer schema is never moved, rewritten or rebuilt: ``LoadResult.too_new`` says why, and the
caller refuses to prepare or unprepare until the plugin is upgraded back.

A corrupt file never crash-loops the plugin: it is moved aside and an empty checkpoint is returned with
a description of what was wrong, for the caller to rebuild from the CDI specs, log and post as an Event.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from kubelet_plugin.core.filelock import atomic_write
from kubelet_plugin.core.model import MigRecord, PreparedDevice

SCHEMA_VERSION = 1
OLDEST_SCHEMA_VERSION = 1
Migration = Callable[[dict[str, Any]], dict[str, Any]]
#: ``n -> f``: ``f`` turns a schema-``n`` document into a schema-``n + 1`` one. Schema 1 is the first, so none
#: exists yet; the next format change adds ``1: <migration>`` and bumps ``SCHEMA_VERSION``. (Staying at 1 keeps a
#: rollback to plugins from before schema handling working: they take any other version for corruption.)
MIGRATIONS: Mapping[int, Migration] = {}
CHECKPOINT_FILE_MODE = 0o600
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]


def boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot ID (changes on every boot). Raises ``OSError`` if unreadable."""
    return path.read_text().strip()


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True, populate_by_name=True)


class CheckpointDevice(_Model):
    """One prepared device, with what NodePrepareResources returned for it."""

    request_names: list[str] = Field(alias="requestNames")
    pool_name: str = Field(alias="poolName")
    device_name: str = Field(alias="deviceName")
    cdi_device_ids: list[str] = Field(alias="cdiDeviceIDs")
    share_id: str | None = Field(default=None, alias="shareID")
    uuid: str | None = Field(default=None, description="the physical GPU the device was when prepared")
    mig: MigRecord | None = Field(default=None, description="the MIG partition created for it (a MIG device)")

    @classmethod
    def from_prepared(
        cls, device: PreparedDevice, uuid: str | None = None, mig: MigRecord | None = None
    ) -> CheckpointDevice:
        """Record a device as returned to the kubelet, which physical GPU it was and its MIG partition."""
        return cls(
            request_names=list(device.request_names),
            pool_name=device.pool_name,
            device_name=device.device_name,
            cdi_device_ids=list(device.cdi_device_ids),
            share_id=device.share_id,
            uuid=uuid,
            mig=mig,
        )


class ClaimEntry(_Model):
    """One claim known to the plugin."""

    namespace: str
    name: str
    state: ClaimState
    devices: list[CheckpointDevice] = Field(default_factory=list)
    mps_trust_domain: str | None = Field(
        default=None,
        alias="mpsTrustDomain",
        description="the trust domain (api/mps_trust.py id) of a claim with MPS shares; left out without one",
    )
    mps_switch_until: float | None = Field(
        default=None,
        alias="mpsSwitchUntil",
        description="a PrepareStarted claim waiting for its MPS GPU's daemon to serve its trust domain: until when "
        "(seconds since the epoch) it holds the GPU for that domain; left out otherwise",
    )

    @model_serializer(mode="wrap")
    def _without_absent_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("mpsTrustDomain", "mps_trust_domain", "mpsSwitchUntil", "mps_switch_until"):
            if key in data and data[key] is None:
                del data[key]
        return data

    def waiting_until(self, until: float) -> ClaimEntry:
        """This claim (as it would be prepared) waiting for its MPS GPU's domain switch until `until` (seconds since
        the epoch): ``PrepareStarted``, with no files."""
        return self.model_copy(update={"state": "PrepareStarted", "mps_switch_until": until})

    def holds_domain(self, now: float) -> bool:
        """Whether the entry's `mps_trust_domain` holds its GPUs at `now`: a prepared claim's always, a waiting
        claim's until its `mps_switch_until` (after that its prepare has given up or is gone)."""
        return self.mps_trust_domain is not None and (self.mps_switch_until is None or now <= self.mps_switch_until)


class Checkpoint(_Model):
    """The whole checkpoint: claims keyed by claim UID, plus the boot ID of the node that wrote it."""

    version: int = Field(default_factory=lambda: SCHEMA_VERSION, description="SCHEMA_VERSION: load migrates first")
    node_boot_id: str = Field(alias="nodeBootID")
    claims: dict[str, ClaimEntry] = Field(default_factory=dict)

    @field_validator("version")
    @classmethod
    def _current_schema(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"must be {SCHEMA_VERSION} (older schemas are migrated before validation)")
        return v

    @classmethod
    def empty(cls, node_boot_id: str) -> Checkpoint:
        """A checkpoint with no claims."""
        return cls(node_boot_id=node_boot_id)

    def mig_records(self) -> list[tuple[str, MigRecord]]:
        """(claim UID, partition) of every MIG partition the checkpoint's claims own."""
        return [(uid, d.mig) for uid, e in self.claims.items() for d in e.devices if d.mig is not None]

    def prepared_count(self) -> int:
        """How many claims are prepared (``PrepareCompleted``)."""
        return sum(entry.state == "PrepareCompleted" for entry in self.claims.values())

    def claims_on(self, uuid: str) -> list[str]:
        """UIDs of the claims with a device on GPU `uuid`."""
        return [uid for uid, entry in self.claims.items() if any(d.uuid == uuid for d in entry.devices)]

    def with_claim(self, claim_uid: str, entry: ClaimEntry) -> Checkpoint:
        """A copy with ``claim_uid`` set to ``entry`` (added or replaced)."""
        return self.model_copy(update={"claims": {**self.claims, claim_uid: entry}})

    def without_claim(self, claim_uid: str) -> Checkpoint:
        """A copy without ``claim_uid`` (this checkpoint itself if it has no such claim)."""
        if claim_uid not in self.claims:
            return self
        return self.model_copy(update={"claims": {k: v for k, v in self.claims.items() if k != claim_uid}})

    def with_boot_id(self, node_boot_id: str) -> Checkpoint:
        """A copy stamped with ``node_boot_id`` (after CDI specs of a previous boot were rewritten)."""
        return self.model_copy(update={"node_boot_id": node_boot_id})

    def to_json(self) -> str:
        """Wire form (camelCase) in the current schema, stable key order of claims; unknown fields kept."""
        data = self.model_dump(by_alias=True, mode="json")
        data["claims"] = dict(sorted(data["claims"].items()))
        for entry in data["claims"].values():
            for device in entry.get("devices") or []:
                if device.get("mig", ...) is None:
                    del device["mig"]  # only a MIG device has one: other entries stay as older plugins wrote them
        return json.dumps(data, separators=(",", ":")) + "\n"  # compact: the C encoder, not the indenting one


class LoadResult(BaseModel):
    """Outcome of ``CheckpointStore.load``.

    ``corruption``: what was wrong with the file (it was moved to ``moved_to``; ``checkpoint`` is then
    empty). ``too_new``: the file is of a schema newer than this plugin reads; it was left untouched and
    ``checkpoint`` is empty and must not be saved. ``rebooted``: the file was written during an earlier boot;
    its entries are kept (with the old ``nodeBootID``), but every claim's CDI spec must be rewritten before
    stamping ``current_boot_id``. ``migrated_from``: the schema the file was in, when older than the current.
    ``unknown_fields``: dotted paths of fields this plugin does not know (kept in ``checkpoint``).
    """

    model_config = ConfigDict(frozen=True)

    checkpoint: Checkpoint
    current_boot_id: str
    corruption: str | None = None
    moved_to: Path | None = None
    too_new: str | None = None
    rebooted: bool = False
    migrated_from: int | None = None
    unknown_fields: tuple[str, ...] = ()


class NewerSchemaError(Exception):
    """The checkpoint's schema is newer than this plugin reads; the message says which and what to do."""


def migrate(
    data: dict[str, Any],
    migrations: Mapping[int, Migration] | None = None,
    current: int | None = None,
    oldest: int | None = None,
) -> dict[str, Any]:
    """``data`` brought to schema ``current`` by the chain of ``migrations`` (pure; ``data`` is not changed).

    Defaults: ``MIGRATIONS``, ``SCHEMA_VERSION``, ``OLDEST_SCHEMA_VERSION``. Raises ``NewerSchemaError`` for a
    version above ``current`` and ``ValueError`` for one that is not an integer, is below ``oldest`` or has no
    migration.
    """
    migrations = MIGRATIONS if migrations is None else migrations
    current = SCHEMA_VERSION if current is None else current
    oldest = OLDEST_SCHEMA_VERSION if oldest is None else oldest
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"unsupported version {json.dumps(version)}: must be an integer schema version")
    if version > current:
        raise NewerSchemaError(f"schema {version}, this plugin reads ≤ {current}")
    if version < oldest:
        raise ValueError(f"unsupported version {version}: the oldest schema this plugin reads is {oldest}")
    out = dict(data)
    for n in range(version, current):
        if n not in migrations:
            raise ValueError(f"unsupported version {version}: no migration from schema {n} to {n + 1}")
        out = {**migrations[n](out), "version": n + 1}
    return out


def unknown_fields(model: BaseModel, where: str = "") -> list[str]:
    """Dotted paths of every field of ``model`` and its nested models that the schema does not define."""
    found = [f"{where}{key}" for key in model.model_extra or {}]
    fields = type(model).model_fields
    for name, value in model.__dict__.items():  # the declared fields (pydantic keeps the others in model_extra)
        children: Iterable[tuple[object, Any]] = ()
        if isinstance(value, dict):
            children = value.items()
        elif isinstance(value, list):
            children = enumerate(value)
        elif isinstance(value, BaseModel):
            children = ((None, value),)
        for sub, child in children:
            if isinstance(child, BaseModel):
                key = fields[name].alias or name
                found += unknown_fields(child, f"{where}{key}." if sub is None else f"{where}{key}.{sub}.")
    return found


class CheckpointStore:
    """Reads and atomically writes one checkpoint file. Callers serialise access (``serialize_lock``).

    The file is read on every load (another plugin instance on the node may have replaced it), but it is parsed
    only when its bytes differ from those this store last read or wrote: the same bytes give the same result
    (the models are frozen), so the hot path skips JSON decoding and validation of an unchanged checkpoint.
    """

    def __init__(self, path: Path, current_boot_id: str | None = None) -> None:
        """``current_boot_id`` defaults to ``boot_id()`` of this node."""
        self.path = path
        self.current_boot_id = current_boot_id if current_boot_id is not None else boot_id()
        self._last: tuple[bytes, LoadResult] | None = None  # bytes last read or written, and their result

    def load(self) -> LoadResult:
        """Load the checkpoint; a missing file is an empty checkpoint. Never raises for a bad file.

        A file of a newer schema is left as it is (``too_new``). An unreadable, non-JSON, unversioned or
        invalid file is moved to ``<path>.corrupt-<UTC time>`` and an empty checkpoint is returned with
        ``corruption`` set. An older schema is migrated; unknown fields are kept and listed.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return LoadResult(checkpoint=self._empty(), current_boot_id=self.current_boot_id)
        except OSError as e:
            return self._corrupt(f"cannot read checkpoint {self.path}: {e.strerror or e}")
        if self._last is not None and self._last[0] == raw:
            return self._last[1]
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            return self._corrupt(f"checkpoint {self.path} is not valid JSON (not UTF-8 text: {e.reason})")
        except json.JSONDecodeError as e:
            what = "is empty" if not raw.strip() else f"is not valid JSON ({e})"
            return self._corrupt(f"checkpoint {self.path} {what}")
        if not isinstance(data, dict):
            return self._corrupt(f"checkpoint {self.path} is not a JSON object")
        try:
            current = migrate(data)
        except NewerSchemaError as e:
            return LoadResult(
                checkpoint=self._empty(),
                current_boot_id=self.current_boot_id,
                too_new=(
                    f"checkpoint {self.path} was written by a newer fracgpu ({e}): upgrade the plugin back to "
                    "that version; or, to start this node's claims over, delete the pods using fracgpu claims "
                    "on this node, remove the file and restart the plugin. It is left untouched until then"
                ),
            )
        except ValueError as e:
            return self._corrupt(f"checkpoint {self.path} has {e}")
        try:
            checkpoint = Checkpoint.model_validate(current)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()
            )
            return self._corrupt(f"checkpoint {self.path} is invalid: {problems}")
        version = data["version"]
        result = self._result(checkpoint, migrated_from=version if version != SCHEMA_VERSION else None)
        self._last = (raw, result)
        return result

    def save(self, checkpoint: Checkpoint) -> None:
        """Atomically replace the file (temp + fsync + rename + dir fsync); old content survives failures."""
        raw = checkpoint.to_json().encode()
        self._last = None  # a failed write may or may not have replaced the file
        atomic_write(self.path, raw, CHECKPOINT_FILE_MODE)
        self._last = (raw, self._result(checkpoint))

    def _result(self, checkpoint: Checkpoint, migrated_from: int | None = None) -> LoadResult:
        return LoadResult(
            checkpoint=checkpoint,
            current_boot_id=self.current_boot_id,
            rebooted=checkpoint.node_boot_id != self.current_boot_id,
            migrated_from=migrated_from,
            unknown_fields=tuple(unknown_fields(checkpoint)),
        )

    def _empty(self) -> Checkpoint:
        return Checkpoint.empty(self.current_boot_id)

    def _corrupt(self, problem: str) -> LoadResult:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        moved_to: Path | None = target
        try:
            os.rename(self.path, target)
            message = f"{problem}; moved it to {target} and started with an empty checkpoint"
        except OSError as e:
            moved_to = None
            message = f"{problem}; could not move it aside ({e.strerror or e}), starting with an empty checkpoint"
        return LoadResult(
            checkpoint=self._empty(),
            current_boot_id=self.current_boot_id,
            corruption=message,
            moved_to=moved_to,
        )


def read_claims_on(checkpoint_path: Path, device: str) -> list[tuple[str, str, str]]:
    """(namespace, name, uid) of the claims the checkpoint file lists with a device on GPU ``device`` (its MIG
    partitions' too, ``<device>-mig-...``); none when the checkpoint is missing or unreadable (read only, for the
    health Events: the preparer owns the file)."""
    try:
        checkpoint = Checkpoint.model_validate_json(checkpoint_path.read_bytes())
    except (OSError, ValidationError):
        return []
    return sorted(
        (entry.namespace, entry.name, uid)
        for uid, entry in checkpoint.claims.items()
        if any(d.device_name == device or d.device_name.startswith(f"{device}-mig-") for d in entry.devices)
    )
