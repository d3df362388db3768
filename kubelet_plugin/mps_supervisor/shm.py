"""Each MPS GPU's /dev/shm: a tmpfs of its own per trust domain, mounted on the host under the MPS root, which the
GPU's daemon (and so its servers) and its clients' containers share; never the host's /run.

Through util-linux (``mount``, ``umount``, ``unshare``), which the image carries. The supervisor's pod mounts the
MPS root with Bidirectional propagation, so a tmpfs mounted here reaches the host, where the runtime bind-mounts
it into client containers (the CDI specs name its host path). The daemon runs in a mount namespace of its own
whose /dev/shm is that tmpfs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

OPTIONS = "nosuid,nodev,noexec,mode=1777"
SOURCE = "fracgpu-mps-shm"


class ShmError(RuntimeError):
    """A tmpfs could not be mounted or unmounted; the message says which and why."""


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ShmError(f"cannot run {' '.join(argv)}: {err}") from None
    if done.returncode != 0:
        raise ShmError(f"{' '.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[:300]}")


def mounted(path: Path) -> bool:
    return os.path.ismount(path)


def mount_fresh(path: Path, size_bytes: int) -> None:
    """A new, empty tmpfs at `path` of at most `size_bytes`; one mounted there before is detached first (a
    container that bind-mounted it keeps it until it ends). Raises ShmError."""
    unmount(path)
    path.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "tmpfs", "-o", f"{OPTIONS},size={size_bytes}", SOURCE, str(path)])


def unmount(path: Path) -> None:
    """Detach the tmpfs at `path`, if one is mounted there (lazily: users keep it). Raises ShmError."""
    while mounted(path):
        _run(["umount", "-l", str(path)])


def in_namespace(shm: Path, argv: list[str]) -> list[str]:
    """`argv` run in a mount namespace of its own whose /dev/shm is `shm` (nothing mounted there leaks out)."""
    bind = 'mount --bind "$0" /dev/shm && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", bind, str(shm), *argv]
