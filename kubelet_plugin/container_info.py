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

On the host the files live side by side under the same names, ``<plugin data dir>/claim-info/<claimUID>_<request>.json``
(a file per request, no directory per claim: creating and removing one cost more than the files).
"""

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kubelet_plugin.filelock import atomic_write

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

    claim: ClaimName
    request: str
    enforcement: str = Field(description="the weakest tier among the request's devices")
    devices: list[DeviceInfo] = Field(description="CUDA order: by PCI bus ID")

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
    """``<plugin data dir>/claim-info``: the request files of every prepared claim, side by side."""
    return plugin_data_dir / "claim-info"


def legacy_claim_info_dir(plugin_data_dir: Path, claim_uid: str) -> Path:
    """``claim-info/<claimUID>/``: where plugins before the flat layout kept a claim's files (their specs, still
    in place after an upgrade, mount them from there until the claim is prepared again or unprepared)."""
    return claim_info_root(plugin_data_dir) / claim_uid


def _claim_prefix(claim_uid: str) -> str:
    if not _KEYABLE_RE.fullmatch(claim_uid):
        raise InfoNameError(f"claim UID {claim_uid!r} is not of the form Kubernetes generates")
    return f"{claim_uid}_"


def info_file(plugin_data_dir: Path, info: RequestInfo) -> InfoFile:
    """Where a request's file goes, on the host and in the container: the same name, ``<claimUID>_<request>.json``
    (unambiguous: neither a UID nor a DNS label has a ``_``)."""
    if not _REQUEST_RE.fullmatch(info.request):
        raise InfoNameError(f"request name {info.request!r} is not a DNS label")
    name = f"{_claim_prefix(info.claim.uid)}{info.request}.json"
    return InfoFile(
        host_path=claim_info_root(plugin_data_dir) / name,
        container_path=f"{DIR_IN_CONTAINER}/{name}",
        info=info,
    )


def mount_options() -> list[str]:
    """Read-only bind mount options of an info file."""
    return list(_MOUNT_OPTIONS)


def write_claim_files(plugin_data_dir: Path, claim_uid: str, files: list[InfoFile]) -> None:
    """Atomically write each file of the claim whose content changed (a bind-mounted inode stays put) and delete
    the claim's files of requests it no longer has. All files must be the claim's. Raises OSError."""
    root = claim_info_root(plugin_data_dir)
    prefix = _claim_prefix(claim_uid)
    for f in files:
        if f.host_path.parent != root or not f.host_path.name.startswith(prefix):
            raise ValueError(f"{f.host_path} is not a file of claim {claim_uid} in {root}")
        content = f.info.to_json()
        try:
            if f.host_path.read_bytes() == content:
                continue
        except FileNotFoundError:
            pass
        # not durable: a power loss also loses the CDI specs (tmpfs), and after the reboot every claim's
        # spec and files are written again; a crash of the plugin loses nothing written
        atomic_write(f.host_path, content, INFO_FILE_MODE, durable=False)
    wanted = {f.host_path.name for f in files}
    for name in _names_of(root, prefix):
        if name not in wanted:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(root / name)


def _names_of(root: Path, prefix: str) -> list[str]:
    """Names of the request files in `root` of the claim whose names start with `prefix` (``<claimUID>_``)."""
    try:
        return [n for n in os.listdir(root) if n.startswith(prefix) and n.endswith(".json")]
    except FileNotFoundError:
        return []


def remove_claim_files(plugin_data_dir: Path, claim_uid: str) -> bool:
    """Delete a claim's request files (and its directory of the layout before, if any); False if it had none.
    Raises OSError on failures other than absence."""
    root = claim_info_root(plugin_data_dir)
    names = _names_of(root, _claim_prefix(claim_uid))
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / name)
    legacy = legacy_claim_info_dir(plugin_data_dir, claim_uid)
    try:
        shutil.rmtree(legacy)
    except FileNotFoundError:
        return bool(names)
    return True


def claim_files(plugin_data_dir: Path) -> dict[str, list[Path]]:
    """By claim UID, the request files of every claim that has some, each list sorted: its flat files, or, for
    a claim prepared before the flat layout and not since, those in its directory of the layout before."""
    root = claim_info_root(plugin_data_dir)
    flat: dict[str, list[Path]] = {}
    legacy: dict[str, list[Path]] = {}
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return {}
    for entry in entries:
        uid, sep, _ = entry.name.partition("_")
        if not _KEYABLE_RE.fullmatch(uid):
            continue  # temp files (".…"), anything not ours
        if sep and entry.name.endswith(".json"):
            flat.setdefault(uid, []).append(root / entry.name)
        elif not sep and entry.is_dir():
            legacy[uid] = list((root / uid).glob("*.json"))
    found = legacy | flat
    return {uid: sorted(found[uid]) for uid in sorted(found) if found[uid]}


def remove_orphan_claim_files(plugin_data_dir: Path, keep: set[str]) -> list[str]:
    """Delete the request files (and directories of the layout before) of claims not in `keep` (recovery); return
    the UIDs of the claims whose files were removed. Entries that are not a claim's are left alone."""
    root = claim_info_root(plugin_data_dir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    removed: set[str] = set()
    for name in names:
        uid, sep, _ = name.partition("_")
        if uid in keep or not _KEYABLE_RE.fullmatch(uid):
            continue
        path = root / name
        if sep and name.endswith(".json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        elif not sep and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            continue
        removed.add(uid)
    return sorted(removed)
