"""The driver's MPS control client, ``nvidia-cuda-mps-control``: commands to one GPU's daemon, and its replies.

A set command prints nothing when the daemon takes it and ``Error: ...`` when it does not. The client's exit
status says only whether a daemon answered (NVIDIA documents no more, and the mock driver's client exits 0
after an ``Error:`` line), so every reply is read, and a command the daemon refused raises MpsControlError
quoting the daemon's words. Limits are read back as the daemon prints them (``20480M``, possibly ``20G``:
NVIDIA's format for the replies is not documented), and compared as printed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubelet_plugin.state import mps_files as layout

CONTROL_IN_DRIVER_ROOT = Path("usr/bin/nvidia-cuda-mps-control")
TIMEOUT_S = 5.0


class MpsControlError(RuntimeError):
    """The GPU's daemon did not take a command or did not answer; the message says which and what it said."""


@dataclass(frozen=True, order=True)
class Limits:
    """What no client of an MPS GPU's daemon may exceed: pinned device memory and active thread percentage."""

    memory_mib: int
    percentage: int

    def describe(self) -> str:
        return f"{self.memory_mib} MiB / {self.percentage} %"


@dataclass(frozen=True)
class Reading:
    """One set of limits as the daemon printed them (its defaults, or one server's)."""

    memory: str
    percentage: str

    def describe(self) -> str:
        return f"pinned memory {self.memory}, active threads {self.percentage} %"


@dataclass(frozen=True)
class DaemonReading:
    """The daemon's defaults and each running server's limits (by server pid), as printed."""

    defaults: Reading
    servers: Mapping[int, Reading]


def run_control(
    binary: Path, commands: list[str], env: Mapping[str, str], timeout: float = TIMEOUT_S
) -> tuple[int, str]:
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
    """Commands to the MPS GPUs' daemons through the driver's control client `binary`."""

    def __init__(self, binary: Path, mps_root: Path) -> None:
        self.binary = binary
        self._mps_root = mps_root

    def env(self, uuid: str) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(layout.pipe_dir(self._mps_root, uuid)), "PATH": "/usr/bin:/bin"}

    def run(self, uuid: str, commands: list[str]) -> list[str]:
        """The reply lines of `commands` to GPU `uuid`'s daemon; raises MpsControlError when no daemon answered or
        it refused one of them (an ``Error`` line)."""
        code, output = run_control(self.binary, commands, self.env(uuid))
        if code != 0:
            raise MpsControlError(f"{self.binary} answered {commands[0]!r} with status {code}: {output.strip()[:300]}")
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        refused = [line for line in lines if line.lower().startswith("error")]
        if refused:
            raise MpsControlError(
                f"the MPS control daemon of GPU {uuid} refused {' / '.join(commands)!r}: {' / '.join(refused)[:300]}"
            )
        return lines

    def servers(self, uuid: str) -> list[int]:
        """The pids of the daemon's MPS servers."""
        return [int(line) for line in self.run(uuid, ["get_server_list"]) if line.isdigit()]

    def apply(self, uuid: str, limits: Limits) -> None:
        """Make `limits` the daemon's defaults (for servers started later) and every running server's values (for
        its clients that attach later). Raises MpsControlError."""
        memory = f"{limits.memory_mib}M"
        self.run(
            uuid,
            [
                f"set_default_device_pinned_mem_limit 0 {memory}",
                f"set_default_active_thread_percentage {limits.percentage}",
            ],
        )
        commands = [
            command
            for pid in self.servers(uuid)
            for command in (
                f"set_device_pinned_mem_limit {pid} 0 {memory}",
                f"set_active_thread_percentage {pid} {limits.percentage}",
            )
        ]
        if commands:
            self.run(uuid, commands)

    def read(self, uuid: str) -> DaemonReading:
        """The daemon's defaults and its running servers' limits. Raises MpsControlError."""
        servers = self.servers(uuid)
        commands = ["get_default_device_pinned_mem_limit 0", "get_default_active_thread_percentage"]
        for pid in servers:
            commands += [f"get_device_pinned_mem_limit {pid} 0", f"get_active_thread_percentage {pid}"]
        lines = self.run(uuid, commands)
        if len(lines) != len(commands):
            raise MpsControlError(
                f"the MPS control daemon of GPU {uuid} answered {len(commands)} reads with {len(lines)} lines: {lines}"
            )
        readings = [Reading(lines[i], lines[i + 1]) for i in range(0, len(lines), 2)]
        return DaemonReading(defaults=readings[0], servers=dict(zip(servers, readings[1:], strict=True)))
