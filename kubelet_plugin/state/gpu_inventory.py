"""What NVML said about this node's GPUs when the plugin last discovered them (``gpus.json`` in the plugin's
data directory): the identity of a GPU that is lost at the next start, when NVML can no longer say it.

A missing file is no record; an unreadable or invalid one is logged and treated as none (it is only a memory:
the GPUs that answer are discovered again, and the file is written anew after discovery).
"""

import logging
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from kubelet_plugin.core.filelock import atomic_write
from kubelet_plugin.core.model import GpuInfo

INVENTORY_FILE_NAME = "gpus.json"
_GPUS = TypeAdapter(list[GpuInfo])
log = logging.getLogger(__name__)


def load(path: Path) -> list[GpuInfo]:
    """The GPUs recorded at ``path``; [] when there is no readable, valid record (logged)."""
    try:
        return _GPUS.validate_json(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValidationError) as err:
        log.warning("ignoring the GPU inventory", extra={"path": str(path), "error": str(err)})
        return []


def save(path: Path, gpus: list[GpuInfo]) -> None:
    """Record ``gpus`` at ``path`` (atomically); a failure is logged: the plugin serves on without it."""
    try:
        atomic_write(path, _GPUS.dump_json(gpus, indent=1), 0o644)
    except OSError as err:
        log.warning("could not write the GPU inventory", extra={"path": str(path), "error": str(err)})
