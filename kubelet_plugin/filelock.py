"""File-system primitives of the node plugin: the cross-process serialize lock and atomic file replace.

``serialize_lock`` serialises NodePrepareResources / NodeUnprepareResources across the plugin instances
that share one plugin data dir during a rolling update (``<pluginDataDir>/serialize.lock``, the file Go DRA drivers share for the same purpose).
``atomic_write`` is the one way the plugin writes files others read (CDI specs, the checkpoint);
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SERIALIZE_LOCK_NAME = "serialize.lock"
#: statfs(2) f_type of the file systems whose content is gone after a reboot (linux/magic.h).
_POLL_INTERVAL_S = 0.05


def serialize_lock_path(plugin_data_dir: Path) -> Path:
    """Path of the shared lock file inside the plugin data dir."""
    return plugin_data_dir / SERIALIZE_LOCK_NAME


@contextlib.contextmanager
def serialize_lock(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the duration of the block.

    Blocks until the lock is free: across processes, and across threads of one process too, because every
    call opens its own file description. With ``timeout`` (seconds) raises ``TimeoutError`` instead of
    waiting longer. The lock file itself is never deleted (deleting it would let two holders coexist).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:  # the directory is missing (first use): create it, not a mkdir per call
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            _flock_with_timeout(fd, path, timeout)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _flock_with_timeout(fd: int, path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"could not lock {path} within {timeout}s: another instance holds it") from None
            time.sleep(min(_POLL_INTERVAL_S, remaining))


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that a rename inside it survives a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int, *, durable: bool = True, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically: readers see the old or the new content, never a mix.

    Writes a temp file in the same directory whose name starts with ``.`` (so CDI runtimes, which load
    only ``*.json``/``*.yaml``, and directory listings of our own files ignore it), flushes it, sets
    ``mode`` and renames it over ``path``; ``durable`` also fsyncs the file before and (with ``sync_dir``) the
    directory after the rename, so the new content survives a power loss (a process crash never loses written
    data). Without ``sync_dir`` a power loss may undo the rename (old content or no file), never leave a torn
    file. The
    parent directory is created (0755) if missing. On any error the temp file is removed and the old file is
    left intact.
    """
    directory = path.parent
    try:
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except FileNotFoundError:  # the parent is missing (rare): create it; a mkdir per write would cost a syscall
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if durable and sync_dir:
        fsync_dir(directory)


def remove_temp_files(directory: Path, name_prefix: str) -> list[Path]:
    """Delete temp files `atomic_write` left behind for targets named `<name_prefix>*` (after a crash)."""
    removed = []
    for tmp in directory.glob(f".{name_prefix}*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed
