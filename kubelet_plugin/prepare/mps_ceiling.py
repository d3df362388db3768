"""The ceiling of an MPS GPU: what no client of its daemon can exceed, whatever its own environment.

CUDA lets an MPS client lower its pinned device memory limit and active thread percentage through its
environment, never raise them above what its daemon and server set. The node plugin therefore keeps each MPS
GPU's daemon defaults, and its running servers' values, at the largest grant and the largest percentage among
the MPS shares prepared on that GPU (100 % when one has none): a share's own environment then gives it its
grant, and a workload that rewrites that environment gets at most the largest grant on its GPU. Set before a new
share's files are written (so its client starts under a ceiling that admits its grant), lowered after an
unprepare, and set again when the daemon comes back (it starts without one).

Commands go through the driver's own control client, ``nvidia-cuda-mps-control``, with the GPU's pipe directory.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import ValidationError

from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement import mps
from kubelet_plugin.prepare import container_info as info

CONTROL_IN_DRIVER_ROOT = Path("usr/bin/nvidia-cuda-mps-control")
TIMEOUT_S = 5.0
Grant = tuple[int, int | None]
"""(MiB, active thread percentage or None) of one MPS share."""


class MpsControlError(RuntimeError):
    """The GPU's daemon did not take a command; the message says which and what it answered."""


def ceiling(grants: Iterable[Grant]) -> tuple[int, int] | None:
    """(largest MiB, largest percentage; 100 when a share has none) of the shares, None for no share (pure)."""
    listed = list(grants)
    if not listed:
        return None
    percentages = [p for _, p in listed]
    return max(m for m, _ in listed), 100 if None in percentages else max(p for p in percentages if p is not None)


def grants_in(plugin_data_dir: Path, claim_uids: Iterable[str], uuid: str) -> list[Grant]:
    """The MPS shares on GPU `uuid` of the given prepared claims, from their request files (unreadable ones are
    skipped: a file being rewritten belongs to a claim whose own prepare sets the ceiling)."""
    found: list[Grant] = []
    for uid in claim_uids:
        for path in sorted(info.claim_info_dir(plugin_data_dir, uid).glob("*.json")):
            try:
                request = info.RequestInfo.model_validate_json(path.read_bytes())
            except (OSError, ValidationError):
                continue
            found += [
                (d.memory_mib, d.active_thread_percentage)
                for d in request.devices
                if d.uuid == uuid and d.enforcement == "mps"
            ]
    return found


def run_control(binary: Path, commands: list[str], env: Mapping[str, str], timeout: float = 5.0) -> tuple[int, str]:
    """Feed `commands` (one a line) to the driver's control client `binary` (``nvidia-cuda-mps-control`` without
    ``-d``/``-f``), whose `env` names the daemon's ``CUDA_MPS_PIPE_DIRECTORY``; (exit status, stdout and
    stderr). A client that cannot run or does not finish in `timeout` seconds is status 255 with why."""
    try:
        done = subprocess.run(
            [str(binary)],
            input="".join(f"{c}\n" for c in commands).encode(),
            env=dict(env),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return 255, f"cannot run {binary}: {err}"
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


class MpsControl:
    """Sends ceilings to the MPS GPUs' daemons."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        root = settings.toolkit_driver_root or settings.driver_root
        self.binary = settings.mps_control or root / CONTROL_IN_DRIVER_ROOT

    def apply(self, uuid: str, memory_mib: int, percentage: int) -> None:
        """Make (`memory_mib`, `percentage`) the ceiling of GPU `uuid`: its daemon's defaults (new servers) and
        every running server's values (their new clients). Raises MpsControlError."""
        listing = self._run(
            uuid,
            [
                f"set_default_device_pinned_mem_limit 0 {memory_mib}M",
                f"set_default_active_thread_percentage {percentage}",
                "get_server_list",
            ],
        )
        servers = [line.strip() for line in listing.splitlines() if line.strip().isdigit()]
        if servers:
            self._run(
                uuid,
                [
                    command
                    for pid in servers
                    for command in (
                        f"set_device_pinned_mem_limit {pid} 0 {memory_mib}M",
                        f"set_active_thread_percentage {pid} {percentage}",
                    )
                ],
            )

    def _run(self, uuid: str, commands: list[str]) -> str:
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir(self._settings.mps_root, uuid)), "PATH": "/usr/bin:/bin"}
        code, output = run_control(self.binary, commands, env, TIMEOUT_S)
        if code != 0:
            raise MpsControlError(f"{self.binary} answered {commands[0]!r} with status {code}: {output.strip()[:300]}")
        return output
