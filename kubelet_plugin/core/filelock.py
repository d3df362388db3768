"""File-system primitives of the node plugin: the cross-process serialize lock and atomic file replace.

``serialize_lock`` serialises NodePrepareResources / NodeUnprepareResources across the plugin instances
that share one plugin data dir during a rolling update (``<pluginDataDir>/serialize.lock``, the file Go DRA
drivers share for the same purpose). ``atomic_write`` is how the plugin replaces files others read (CDI specs,
the checkpoint, changed info files), ``write_new`` how it creates files nothing reads yet (a claim's info files
in its new directory); both use plain ``os`` calls, which cost a third less CPU than ``tempfile`` and buffered
file objects on this path.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

_POLL_INTERVAL_S = 0.05


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
    only ``*.json``/``*.yaml``, and directory listings of our own files ignore it), sets ``mode`` and renames
    it over ``path``; ``durable`` also fsyncs the file before and (with ``sync_dir``) the directory after the
    rename, so the new content survives a power loss (a process crash never loses written data). Without
    ``sync_dir`` a power loss may undo the rename (old content or no file), never leave a torn file. The
    parent directory is created (0755) if missing. On any error the temp file is removed and the old file is
    left intact.
    """
    directory, name = os.path.split(path)
    tmp, fd = _create_temp(directory, name, mode)
    try:
        _fill_and_close(fd, data, mode, fsync=durable)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable and sync_dir:
        fsync_dir(Path(directory))


def write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` (it must not exist: ``FileExistsError``) holding ``data`` with ``mode`` whatever the
    umask; not atomic and not fsynced, for files nothing reads before they are complete."""
    _fill_and_close(os.open(path, _NEW_FILE_FLAGS, mode), data, mode, fsync=False)


_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_temp_names = itertools.count()


def _create_temp(directory: str, name: str, mode: int) -> tuple[str, int]:
    """A new file ``<directory>/.<name>.<pid>-<n>.tmp`` (unique per process and call; a name left by an earlier
    process of the same pid is skipped), open for writing; the directory is created when missing."""
    while True:
        tmp = os.path.join(directory, f".{name}.{os.getpid()}-{next(_temp_names)}.tmp")
        try:
            return tmp, os.open(tmp, _NEW_FILE_FLAGS, mode)
        except FileExistsError:
            continue
        except FileNotFoundError:  # the parent is missing (rare): create it; a mkdir per write would cost a syscall
            os.makedirs(directory, mode=0o755, exist_ok=True)
            return tmp, os.open(tmp, _NEW_FILE_FLAGS, mode)


def _fill_and_close(fd: int, data: bytes, mode: int, *, fsync: bool) -> None:
    """Write all of ``data`` to the new file ``fd`` (``os.write`` may write less than asked), set ``mode`` (the
    umask may have narrowed the one given at creation), optionally fsync, and close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(directory: Path, name_prefix: str) -> list[Path]:
    """Delete temp files `atomic_write` left behind for targets named `<name_prefix>*` (after a crash)."""
    removed = []
    for tmp in directory.glob(f".{name_prefix}*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed
