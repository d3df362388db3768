"""What a container is told about its fracgpu devices, in names that never collide (pure, plus the file writer).

The kubelet gives a container the CDI devices of exactly the claims/requests it references; the runtime merges
their env (the last device wins a name) and keeps one mount per container path. So every value here is true for
each container that gets the device, and nothing is an aggregate over "all GPUs of the container":

- per-device env ``FRACGPU_DEV_<KEY>_{UUID,MEMORY_LIMIT_MIB,CLAIM,REQUEST,ENFORCEMENT,SHARE_ID}`` (and
  ``ACTIVE_THREAD_PERCENTAGE`` for an mps share with a compute ceiling (reserved compute or computeLimitPercent),
  ``MIG_DEVICE`` and ``MIG_PROFILE`` for a
  MIG partition: its MIG UUID and profile; its ``UUID`` is the physical GPU's as for any device; ``ADMIN_ACCESS=true``
  for an adminAccess allocation, whose ``MEMORY_LIMIT_MIB`` is the whole GPU's, none of it reserved), ``<KEY>`` being
  the CDI device name (``<claimUID>-<device>[-<shareID>]``) upper-cased with ``-`` as ``_``: unique per device,
  stable;
- per request one JSON file, ``/run/fracgpu/<claimUID>_<request>.json`` in the container, mounted read-only by
  each of the request's devices (a request's devices always reach a container together): the claim, the
  request, and its GPUs in CUDA order (PCI bus ID, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) with grant and share
  ID. Listing ``/run/fracgpu`` shows exactly the container's fracgpu requests.

On the host the files live under ``<plugin data dir>/claim-info/<claimUID>/<request>.json``.
"""

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kubelet_plugin.core.settings import Settings
from kubelet_plugin.state import cdi

DIR_IN_CONTAINER = "/run/fracgpu"
ENV_PREFIX = "FRACGPU_DEV_"
ENV_SUFFIXES = (
    "UUID",
    "MEMORY_LIMIT_MIB",
    "CLAIM",
    "REQUEST",
    "ENFORCEMENT",
    "SHARE_ID",
    "ACTIVE_THREAD_PERCENTAGE",
    "MIG_DEVICE",
    "MIG_PROFILE",
    "ADMIN_ACCESS",
)  # none is a suffix of another
INFO_FILE_MODE = 0o644  # readable by any container user
INFO_SCHEMA_VERSION = 3  # the newest `version` of a request's file; fracgpu 0.1.0 wrote none (schema 1)
MIG_INFO_SCHEMA_VERSION = 2
"""The schema that added a device's `mig`: a file is written in the lowest schema its contents need (1 without a
MIG device), so a reader of schema 1 reads every file that has none."""
ADMIN_INFO_SCHEMA_VERSION = 3
"""The schema that added a device's `adminAccess` (written only when true)."""
INFO_SUFFIX = ".json"
"""An info file's name: ``<request>.json`` (the device metadata beside it is ``<request>.metadata``)."""
KEYABLE_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")  # claim UIDs, DNS-label device names, share UUIDs
_REQUEST_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a DNS label, as Kubernetes validates it
VOID = "NVIDIA_VISIBLE_DEVICES=void"
"""With driver edits: no legacy hook or image env can widen the container's GPUs."""
_LIBRARY_RE = re.compile(r"/lib(cuda|nvidia-ml)\.so\.[0-9][^/]*$")
_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "rbind", "rprivate")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class ClaimName(_Model):
    """The claim a file describes."""

    namespace: str
    name: str
    uid: str


class MigInfo(_Model):
    """The MIG partition a device is (schema 2)."""

    uuid: str = Field(description="the MIG device's UUID (MIG-...): what CUDA and nvidia-smi -L name")
    profile: str = Field(description="its GPU-instance profile, e.g. 1g.10gb")
    gpu_instance: int = Field(alias="gpuInstance")
    compute_instance: int = Field(alias="computeInstance")
    placement_start: int = Field(alias="placementStart")
    memory_slices: int = Field(alias="memorySlices")
    multiprocessors: int = Field(0, description="its streaming multiprocessors")


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
    active_thread_percentage: int | None = Field(
        None,
        alias="activeThreadPercentage",
        description="mps tier: the client's active thread percentage (its compute ceiling: the reserved compute, or "
        "computeLimitPercent when no larger; None: the GPU's default)",
    )
    mig: MigInfo | None = Field(None, description="a MIG partition: which (memoryMiB is then its memory)")
    admin_access: bool = Field(
        False,
        alias="adminAccess",
        description="schema 3: an adminAccess allocation (monitoring): memoryMiB is the whole GPU's, none of it "
        "reserved, and no tier limits it",
    )


class RequestInfo(_Model):
    """The contents of one request's file."""

    version: int = Field(1, description="schema of the file (absent: 1); written as the lowest that holds it")
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
        """One line of JSON with the documented (camelCase) names, in the lowest schema that holds it."""
        data = self.model_dump(by_alias=True, mode="json")
        for device in data["devices"]:
            if device["activeThreadPercentage"] is None:
                del device["activeThreadPercentage"]  # only an mps share with computeLimitPercent has one
            if device["mig"] is None:
                del device["mig"]  # only a MIG partition has one
            if not device["adminAccess"]:
                del device["adminAccess"]  # only an adminAccess allocation has one
        data["version"] = (
            ADMIN_INFO_SCHEMA_VERSION
            if any(d.admin_access for d in self.devices)
            else MIG_INFO_SCHEMA_VERSION
            if any(d.mig for d in self.devices)
            else 1
        )
        return (json.dumps(data, separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class InfoFile:
    """A request's file: where it lives on the host, where the container sees it, and what it says."""

    host_path: Path
    container_path: str
    info: RequestInfo

    def content(self) -> bytes:
        return self.info.to_json()


class InfoNameError(ValueError):
    """A name cannot be turned into a collision-free env name or file name."""


def env_prefix(cdi_device_name: str) -> str:
    """``FRACGPU_DEV_<KEY>_`` for a CDI device name; injective because our names are ``[a-z0-9-]`` only."""
    if not KEYABLE_RE.fullmatch(cdi_device_name):
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
    if info.active_thread_percentage is not None:
        env[f"{prefix}ACTIVE_THREAD_PERCENTAGE"] = str(info.active_thread_percentage)
    if info.mig is not None:
        env[f"{prefix}MIG_DEVICE"] = info.mig.uuid
        env[f"{prefix}MIG_PROFILE"] = info.mig.profile
    if info.admin_access:
        env[f"{prefix}ADMIN_ACCESS"] = "true"
    return env


@lru_cache(maxsize=8)
def claim_info_root(plugin_data_dir: Path) -> Path:
    """``<plugin data dir>/claim-info``: one directory per prepared claim."""
    return plugin_data_dir / "claim-info"


def claim_info_dir(plugin_data_dir: Path, claim_uid: str) -> Path:
    """The host directory holding one claim's request files."""
    if not KEYABLE_RE.fullmatch(claim_uid):
        raise InfoNameError(f"claim UID {claim_uid!r} is not of the form Kubernetes generates")
    return claim_info_root(plugin_data_dir) / claim_uid


def info_file(plugin_data_dir: Path, info: RequestInfo) -> InfoFile:
    """Where a request's file goes, on the host and in the container."""
    if not _REQUEST_RE.fullmatch(info.request):
        raise InfoNameError(f"request name {info.request!r} is not a DNS label")
    return InfoFile(
        host_path=claim_info_dir(plugin_data_dir, info.claim.uid) / f"{info.request}{INFO_SUFFIX}",
        container_path=f"{DIR_IN_CONTAINER}/{info.claim.uid}_{info.request}.json",
        info=info,
    )


def mount_options() -> list[str]:
    """Read-only bind mount options of an info file."""
    return list(_MOUNT_OPTIONS)


def library_problem(edits: cdi.ContainerEdits) -> str | None:
    """None when the edits mount ``libcuda.so.<ver>`` or ``libnvidia-ml.so.<ver>``; else what is wrong."""
    if any(_LIBRARY_RE.search(m.container_path) for m in edits.mounts):
        return None
    return "the generated edits mount neither libcuda.so.<version> nor libnvidia-ml.so.<version>"


def hami_preload_file(settings: Settings) -> Path:
    """Host file mounted as the container's /etc/ld.so.preload in HAMi-core mode."""
    return _hami_paths(settings.plugin_data_dir)[0]


def hami_cache_root(settings: Settings) -> Path:
    """Host directory of the per-claim HAMi-core caches."""
    return _hami_paths(settings.plugin_data_dir)[1]


@lru_cache(maxsize=8)
def _hami_paths(plugin_data_dir: Path) -> tuple[Path, Path]:
    """HAMi-core's preload file and cache root under `plugin_data_dir`."""
    hami = plugin_data_dir / "hami"
    return hami / "ld.so.preload", hami / "claims"


def hami_cache_dir(settings: Settings, claim_uid: str) -> Path:
    """Per-claim host directory for HAMi-core's shared memory-accounting cache."""
    return hami_cache_root(settings) / claim_uid
