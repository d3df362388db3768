"""What the driver reported about this node's GPUs that only a reset or an operator clears (``health.json`` in the
plugin's data directory): each GPU's XID and the XIDs remembered on memory slices of a MIG GPU, so that a plugin
restart does not forget them. Written after every health change; read once at start.

``version`` is ``SCHEMA_VERSION``; a file of a newer one is not read (logged: its faults are this release's to
keep only if it understands them) and not overwritten until the plugin has something of its own to record. A
missing file is no record; an unreadable or invalid one is logged and moved aside (``.corrupt-<time>``), as a
record nobody can read protects nothing. A GPU's record names its UUID: one now at another index, or gone, is
not restored.
"""

import logging
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubelet_plugin.core.filelock import atomic_write

HEALTH_FILE_NAME = "health.json"
SCHEMA_VERSION = 1
log = logging.getLogger(__name__)


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class SliceRecord(_Model):
    """An XID the driver reported on a GPU instance, remembered on the memory slices of its placement."""

    xid: int
    xid_class: str = Field(alias="xidClass")
    slices: list[int] = Field(alias="memorySlices")
    gpu_instance: int = Field(alias="gpuInstance")
    partition: str = ""
    since: str


class GpuRecord(_Model):
    """One GPU's remembered faults. ``reset_observable``: the driver asked for a recovery action (or lost the GPU)
    since the last fault, so that action back to none is its word of a reset."""

    uuid: str
    xid: int | None = None
    xid_class: str = Field(default="ignore", alias="xidClass")
    recovery_action: int = Field(default=0, alias="recoveryAction")
    reset_observable: bool = Field(default=False, alias="resetObservable")
    since: str = ""
    slices: list[SliceRecord] = Field(default_factory=list, alias="memorySliceFaults")


class HealthFile(_Model):
    """The file: device name -> its GPU's record."""

    version: int = SCHEMA_VERSION
    gpus: dict[str, GpuRecord] = Field(default_factory=dict)


def load(path: Path) -> HealthFile:
    """The records at ``path``; an empty one when there is none this release can read (logged)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return HealthFile()
    except OSError as err:
        log.error("cannot read the GPU health record", extra={"path": str(path), "error": str(err)})
        return HealthFile()
    try:
        record = HealthFile.model_validate_json(data)
    except ValidationError as err:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        log.error("moving an invalid GPU health record aside", extra={"path": str(aside), "error": str(err)})
        try:
            path.rename(aside)
        except OSError as moved:
            log.error("cannot move the invalid GPU health record aside", extra={"error": str(moved)})
        return HealthFile()
    if record.version > SCHEMA_VERSION:
        log.error("the GPU health record is of a newer release; not read", extra={"version": record.version})
        return HealthFile()
    return record


def save(path: Path, record: HealthFile) -> None:
    """Write ``record`` at ``path`` atomically (fsynced: a fault must survive a crash); a failure is logged."""
    try:
        atomic_write(path, record.model_dump_json(by_alias=True, exclude_defaults=False).encode(), 0o644)
    except OSError as err:
        log.error("could not write the GPU health record", extra={"path": str(path), "error": str(err)})
