"""An MPS GPU's compute mode: EXCLUSIVE_PROCESS through NVML while it has a daemon, so that no process can use it
outside MPS, and the mode it had before, kept in ``<gpu dir>/compute-mode-before-mps`` until it is restored.

`exclusive` records the mode before once (a restarted supervisor keeps the first record) and sets
EXCLUSIVE_PROCESS, raising NVMLError; `restore_mode` sets the recorded mode back and removes the record, or logs
why it could not and keeps the record for the next try. Both need NVML initialised.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml

from kubelet_plugin.core.filelock import atomic_write
from kubelet_plugin.state import mps_files as mps

#: The supervisor's logger: its records name one logger, whichever of its modules writes them.
log = logging.getLogger("kubelet_plugin.mps_supervisor.supervisor")

COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
}
MODE_BEFORE_FILE = "compute-mode-before-mps"


def mode_before_path(mps_root: Path, uuid: str) -> Path:
    """Where the GPU's mode before MPS is kept; it exists while the mode is still to be restored."""
    return mps.gpu_dir(mps_root, uuid) / MODE_BEFORE_FILE


def exclusive(mps_root: Path, uuid: str) -> str:
    """Set the GPU to EXCLUSIVE_PROCESS (keeping the mode it had, once); its mode's name."""
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    mode = pynvml.nvmlDeviceGetComputeMode(handle)
    before = mode_before_path(mps_root, uuid)
    if not before.exists():
        before.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(before, f"{mode}\n".encode(), 0o644)
    if mode != pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
        pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    return COMPUTE_MODES[pynvml.nvmlDeviceGetComputeMode(handle)]


def restore_mode(mps_root: Path, uuid: str) -> None:
    """Set the GPU back to the mode it had before MPS, if one is recorded, and forget the record."""
    before = mode_before_path(mps_root, uuid)
    try:
        mode = int(before.read_text().strip())
        pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid), mode)
    except FileNotFoundError:
        return
    except (ValueError, pynvml.NVMLError) as err:
        log.error("cannot restore the compute mode", extra={"uuid": uuid, "error": str(err)})
        return
    before.unlink()
    log.info("compute mode restored", extra={"uuid": uuid, "mode": COMPUTE_MODES.get(mode, str(mode))})
