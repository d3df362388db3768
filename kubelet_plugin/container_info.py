"""What a container is told about its fracgpu devices, in names that never collide (pure, plus the file writer).

The kubelet gives a container the CDI devices of exactly the claims/requests it references; the runtime merges
their env (the last device wins a name) and keeps one mount per container path. So every value here is true for
each container that gets the device, and nothing is an aggregate over "all GPUs of the container":

- per-device env ``FRACGPU_DEV_<KEY>_{UUID,MEMORY_LIMIT_MIB,CLAIM,REQUEST,ENFORCEMENT,SHARE_ID}``, ``<KEY>`` being the CDI
  device name (``<claimUID>-<device>[-<shareID>]``) upper-cased with ``-`` as ``_``: unique per device, stable;
- per request one JSON file, ``/run/fracgpu/<claimUID>_<request>.json`` in the container, mounted read-only by
  each of the request's devices (a request's devices always reach a container together): the claim, the
  request, and its GPUs in CUDA order (PCI bus ID, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) with grant and share
  ID. Listing ``/run/fracgpu`` shows exactly the container's fracgpu requests.

On the host the files live under ``<plugin data dir>/claim-info/<claimUID>/<request>.json``.
"""

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kubelet_plugin.filelock import atomic_write, write_new

DIR_IN_CONTAINER = "/run/fracgpu"
ENV_PREFIX = "FRACGPU_DEV_"
ENV_SUFFIXES = (
    "UUID",
    "MEMORY_LIMIT_MIB",
    "CLAIM",
    "REQUEST",
    "ENFORCEMENT",
    "SHARE_ID",
)  # none is a suffix of another
INFO_FILE_MODE = 0o644  # readable by any container user
INFO_SCHEMA_VERSION = 1  # `version` of a request's file; fracgpu 0.1.0 wrote none (schema 1)
_KEYABLE_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")  # claim UIDs, DNS-label device names, share UUIDs
_REQUEST_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a DNS label, as Kubernetes validates it
_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "rbind", "rprivate")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class ClaimName(_Model):
    """The claim a file describes."""

    namespace: str
    name: str
    uid: str


class DeviceInfo(_Model):
    """One GPU share of a request, as the container sees it."""

    uuid: str
    memory_mib: int = Field(alias="memoryMiB", ge=0, description="the grant (MiB)")
    share_id: str | None = Field(alias="shareID", default=None)
    device: str = Field(description="the ResourceSlice device, e.g. gpu-0")
    pci_bus_id: str = Field(alias="pciBusID")
    minor: int = Field(ge=0, description="minor of /dev/nvidia<minor>")
    cdi_device: str = Field(alias="cdiDevice", description="fully qualified CDI device ID")
    env_prefix: str = Field(alias="envPrefix", description="prefix of this device's FRACGPU_DEV_ variables")
    enforcement: str = Field("none", description="the memory-enforcement tier applied to this share")


class RequestInfo(_Model):
    """The contents of one request's file."""

    version: int = Field(INFO_SCHEMA_VERSION, description="schema of the file (absent: 1)")
    claim: ClaimName
    request: str
    enforcement: str = Field(description="the weakest tier among the request's devices")
    devices: list[DeviceInfo] = Field(description="CUDA order: by PCI bus ID")

    @field_validator("version")
    @classmethod
    def _readable_schema(cls, v: int) -> int:
        if not 1 <= v <= INFO_SCHEMA_VERSION:
            newer = "was written by a newer fracgpu" if v > INFO_SCHEMA_VERSION else "is not a schema"
            raise ValueError(f"info file of schema {v} {newer}: this plugin reads schemas 1 to {INFO_SCHEMA_VERSION}")
        return v

    def to_json(self) -> bytes:
        """One line of JSON with the documented (camelCase) names."""
        return (json.dumps(self.model_dump(by_alias=True, mode="json"), separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class InfoFile:
    """A request's file: where it lives on the host, where the container sees it, and what it says."""

    host_path: Path
    container_path: str
    info: RequestInfo


class InfoNameError(ValueError):
    """A name cannot be turned into a collision-free env name or file name."""


def env_prefix(cdi_device_name: str) -> str:
    """``FRACGPU_DEV_<KEY>_`` for a CDI device name; injective because our names are ``[a-z0-9-]`` only."""
    if not _KEYABLE_RE.fullmatch(cdi_device_name):
        raise InfoNameError(
            f"CDI device name {cdi_device_name!r} has characters other than a-z, 0-9 and '-': it cannot be "
            "turned into a unique environment variable name"
        )
    return f"{ENV_PREFIX}{cdi_device_name.upper().replace('-', '_')}_"


def device_env(prefix: str, info: DeviceInfo, claim: ClaimName, request: str) -> dict[str, str]:
    """The per-device variables (SHARE_ID only for a share)."""
    env = {
        f"{prefix}UUID": info.uuid,
        f"{prefix}MEMORY_LIMIT_MIB": str(info.memory_mib),
        f"{prefix}CLAIM": f"{claim.namespace}/{claim.name}",
        f"{prefix}REQUEST": request,
        f"{prefix}ENFORCEMENT": info.enforcement,
    }
    if info.share_id:
        env[f"{prefix}SHARE_ID"] = info.share_id
    return env


def claim_info_root(plugin_data_dir: Path) -> Path:
    """``<plugin data dir>/claim-info``: one directory per prepared claim."""
    return plugin_data_dir / "claim-info"


def claim_info_dir(plugin_data_dir: Path, claim_uid: str) -> Path:
    """The host directory holding one claim's request files."""
    if not _KEYABLE_RE.fullmatch(claim_uid):
        raise InfoNameError(f"claim UID {claim_uid!r} is not of the form Kubernetes generates")
    return claim_info_root(plugin_data_dir) / claim_uid


def info_file(plugin_data_dir: Path, info: RequestInfo) -> InfoFile:
    """Where a request's file goes, on the host and in the container."""
    if not _REQUEST_RE.fullmatch(info.request):
        raise InfoNameError(f"request name {info.request!r} is not a DNS label")
    return InfoFile(
        host_path=claim_info_dir(plugin_data_dir, info.claim.uid) / f"{info.request}.json",
        container_path=f"{DIR_IN_CONTAINER}/{info.claim.uid}_{info.request}.json",
        info=info,
    )


def mount_options() -> list[str]:
    """Read-only bind mount options of an info file."""
    return list(_MOUNT_OPTIONS)


def write_claim_files(directory: Path, files: list[InfoFile]) -> None:
    """Write each file whose content changed and delete files of requests the claim no longer has. All files
    must be in `directory`. Raises OSError.

    In an existing directory a changed file is replaced atomically (a bind-mounted inode stays put). In a
    directory this call created (the common case, a claim prepared anew) nothing can read the files yet, so
    they are written in place, without a temp file: a crash in the middle leaves a torn file only in the
    directory of a claim whose prepare did not complete, and the checkpoint saved after the files decides.
    A claim new to the checkpoint is an orphan that recovery removes; a claim already completed (its directory
    deleted meanwhile) is prepared again by the kubelet's retry, which finds the file differs and replaces it.
    Not durable: after a power loss every claim's files are written again (``claim_store``)."""
    wanted = {f.host_path.name for f in files}
    try:
        directory.mkdir(mode=0o755, parents=True)
        created = True  # empty: nothing to compare with or delete
    except FileExistsError:
        created = False
    for f in files:
        if f.host_path.parent != directory:
            raise ValueError(f"{f.host_path} is not in {directory}")
        content = f.info.to_json()
        if created:
            write_new(f.host_path, content, INFO_FILE_MODE)
            continue
        try:
            if f.host_path.read_bytes() == content:
                continue
        except FileNotFoundError:
            pass
        atomic_write(f.host_path, content, INFO_FILE_MODE, durable=False)
    for existing in () if created else directory.iterdir():
        if existing.suffix == ".json" and existing.name not in wanted:
            existing.unlink()


def remove_claim_files(plugin_data_dir: Path, claim_uid: str) -> bool:
    """Delete a claim's directory of files; False if there was none. Raises OSError on other failures.

    The directory holds only the files ``write_claim_files`` wrote (and temp files of its writes): they are
    unlinked and the directory removed, a third cheaper than ``shutil.rmtree``'s descriptor walk; anything else
    found there (a subdirectory) is left to ``shutil.rmtree``."""
    directory = claim_info_dir(plugin_data_dir, claim_uid)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return False
    try:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError:  # not only files: remove it all
        shutil.rmtree(directory)
    return True


def remove_orphan_claim_files(plugin_data_dir: Path, keep: set[str]) -> list[str]:
    """Delete the file directories of claims not in `keep` (recovery); return their UIDs. Entries that are
    not claim directories are left alone."""
    root = claim_info_root(plugin_data_dir)
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        if entry.name in keep or not _KEYABLE_RE.fullmatch(entry.name) or not entry.is_dir():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return removed
