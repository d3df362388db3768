"""The MPS daemons' host layout and status files: written by the MPS supervisor (``kubelet_plugin/mps_supervisor``),
read by the node plugin to decide whether a GPU's ``mps`` tier is up, and mounted into MPS clients.

Under the MPS root (``--mps-root``, default ``/run/fracgpu/mps``, a host directory both pods mount at that path),
per MPS GPU ``<uuid>/``:

- ``pipe/``: the GPU's control daemon's ``CUDA_MPS_PIPE_DIRECTORY``; mounted read-only into each client (a
  client only connects to the daemon's socket there, so it can neither remove nor replace it);
- ``shm/``: a tmpfs of its own (``nosuid,nodev,noexec``, sized by the supervisor's ``--shm-size``), mounted
  afresh for each trust domain the GPU serves: the daemon's and its clients' ``/dev/shm``;
- ``log/``: its ``CUDA_MPS_LOG_DIRECTORY``;
- ``tenant.json``: the trust domain the node plugin wants the daemon to serve (``TenantRequest``); the
  supervisor starts a fresh daemon, pipe directory and shm for a new domain;
- ``status.json``: the supervisor's word on that daemon (``DaemonStatus``), rewritten at least every
  ``refreshSeconds``; older than ``STALE_AFTER_REFRESHES`` times that, it counts as down (supervisor gone).

Pure path arithmetic and pydantic models, plus file reads (`read_status`, `read_tenant`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PIPE_IN_CONTAINER = "/run/fracgpu-mps/pipe"
"""Where a client sees its GPU's pipe directory (not /tmp/nvidia-mps, which nvidia-ctk may mount from the host)."""
SHM_IN_CONTAINER = "/dev/shm"
STATUS_FILE = "status.json"
TENANT_FILE = "tenant.json"
STALE_AFTER_REFRESHES = 3
DaemonState = Literal["starting", "running", "switching", "down"]
"""``switching``: stopping the daemon of one trust domain to start one for the next (not a fault)."""


def gpu_dir(mps_root: Path, uuid: str) -> Path:
    return mps_root / uuid


def pipe_dir(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / "pipe"


def log_dir(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / "log"


def status_path(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / STATUS_FILE


def tenant_path(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / TENANT_FILE


def shm_dir(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / "shm"


def control_socket(mps_root: Path, uuid: str) -> Path:
    return pipe_dir(mps_root, uuid) / "control"


class TenantRequest(BaseModel):
    """The trust domain (an ``api/mps_trust.py`` id) whose claims the node plugin prepares on the GPU."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    domain: str

    def to_json(self) -> bytes:
        return self.model_dump_json().encode() + b"\n"


def read_tenant(mps_root: Path, uuid: str) -> TenantRequest | None:
    """The GPU's tenant request, None when there is none or it cannot be read."""
    try:
        return TenantRequest.model_validate_json(tenant_path(mps_root, uuid).read_bytes())
    except (OSError, ValidationError):
        return None


class DaemonStatus(BaseModel):
    """One GPU's control daemon as its supervisor last saw it."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    uuid: str
    state: DaemonState
    reason: str = Field("", description="why it is not running (state starting or down)")
    pid: int | None = Field(None, description="the daemon's pid in the supervisor's PID namespace")
    multi_user: bool = Field(False, alias="multiUser", description="started with -multiuser-server")
    compute_mode: str = Field("", alias="computeMode", description="the GPU's compute mode as NVML reported it")
    restarts: int = Field(0, ge=0, description="daemon restarts since the supervisor started")
    trust_domains: bool = Field(
        False, alias="trustDomains", description="the supervisor serves one trust domain at a time (tenant.json)"
    )
    trust_domain: str | None = Field(
        None,
        alias="trustDomain",
        description="the trust domain (api/mps_trust.py id) its clients belong to; None: none yet",
    )
    servers: list[int] = Field(default_factory=list, description="the daemon's MPS servers at the last look")
    server_exits: int = Field(
        0, ge=0, alias="serverExits", description="servers of this daemon gone between two looks (their clients too)"
    )
    socket_replacements: int = Field(
        0,
        ge=0,
        alias="socketReplacements",
        description="times the daemon's control socket was found removed or replaced (the daemon was restarted)",
    )
    updated: float = Field(description="when written (seconds since the epoch)")
    refresh_seconds: float = Field(alias="refreshSeconds", gt=0)

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode() + b"\n"


def is_fresh(status: DaemonStatus, now: float | None = None) -> bool:
    """Whether the supervisor wrote `status` recently enough to be alive."""
    age = (time.time() if now is None else now) - status.updated
    return age <= STALE_AFTER_REFRESHES * status.refresh_seconds


def read_status(mps_root: Path, uuid: str, now: float | None = None) -> tuple[DaemonStatus | None, str | None]:
    """(the GPU's daemon status, None) when it is running and fresh, else (what was read or None, why not)."""
    path = status_path(mps_root, uuid)
    try:
        status = DaemonStatus.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None, (
            f"its MPS control daemon has no status file {path}: the fracgpu-mps DaemonSet's pod is not running on "
            "this node, or has not started this GPU's daemon yet"
        )
    except (OSError, ValidationError) as err:
        return None, f"its MPS status file {path} cannot be read: {err}"
    if not is_fresh(status, now):
        age = (time.time() if now is None else now) - status.updated
        last_said = f"its MPS control daemon is {status.state}: {status.reason}; " if status.reason else ""
        return status, (
            f"{last_said}its MPS supervisor last wrote {path} {age:.0f} s ago (every {status.refresh_seconds:g} s "
            "when alive): the fracgpu-mps pod on this node is not running"
        )
    if status.state == "switching":
        return status, f"its MPS control daemon is being replaced for another trust domain: {status.reason}"
    if status.state != "running":
        return status, f"its MPS control daemon is {status.state}: {status.reason or 'no reason given'}"
    return status, None
