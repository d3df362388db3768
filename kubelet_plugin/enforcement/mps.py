"""The MPS daemons' host layout and status files: written by the MPS supervisor (``kubelet_plugin/mps``), read by
the node plugin to decide whether a GPU's ``mps`` tier is up, and mounted into MPS clients.

Under the MPS root (``--mps-root``, default ``/run/fracgpu/mps``, a host directory both pods mount at that path):

- ``<uuid>/pipe/``: the GPU's control daemon's ``CUDA_MPS_PIPE_DIRECTORY``; mounted into each client;
- ``<uuid>/log/``: its ``CUDA_MPS_LOG_DIRECTORY``;
- ``<uuid>/status.json``: the supervisor's word on that daemon (``DaemonStatus``), rewritten at least every
  ``refreshSeconds``; older than ``STALE_AFTER_REFRESHES`` times that, it counts as down (supervisor gone);
- ``shm/``: the daemons' ``/dev/shm``, which an MPS client must share with its server; mounted into each client.

Pure path arithmetic and pydantic models, plus one file read (`read_status`).
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
STALE_AFTER_REFRESHES = 3
DaemonState = Literal["starting", "running", "down"]


def gpu_dir(mps_root: Path, uuid: str) -> Path:
    return mps_root / uuid


def pipe_dir(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / "pipe"


def log_dir(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / "log"


def status_path(mps_root: Path, uuid: str) -> Path:
    return gpu_dir(mps_root, uuid) / STATUS_FILE


def shm_dir(mps_root: Path) -> Path:
    return mps_root / "shm"


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
    servers: list[int] = Field(default_factory=list, description="the daemon's MPS servers at the last look")
    server_exits: int = Field(
        0, ge=0, alias="serverExits", description="servers of this daemon gone between two looks (their clients too)"
    )
    updated: float = Field(description="when written (seconds since the epoch)")
    refresh_seconds: float = Field(alias="refreshSeconds", gt=0)

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode() + b"\n"


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
    age = (time.time() if now is None else now) - status.updated
    if age > STALE_AFTER_REFRESHES * status.refresh_seconds:
        return status, (
            f"its MPS supervisor last wrote {path} {age:.0f} s ago (every {status.refresh_seconds:g} s when alive): "
            "the fracgpu-mps pod on this node is not running"
        )
    if status.state != "running":
        return status, f"its MPS control daemon is {status.state}: {status.reason or 'no reason given'}"
    return status, None
