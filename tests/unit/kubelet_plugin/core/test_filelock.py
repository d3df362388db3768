"""Unit tests of the cross-process serialize lock and atomic writes (kubelet_plugin/core/filelock.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kubelet_plugin.core.filelock import atomic_write, serialize_lock
from kubelet_plugin.core.settings import serialize_lock_path
from tests.unit.fs_calls import record_renames

REPO_ROOT = Path(__file__).resolve().parents[4]

CHILD = """
import sys, time
from pathlib import Path
from kubelet_plugin.core.filelock import serialize_lock
print("waiting", flush=True)
with serialize_lock(Path(sys.argv[1])):
    print("acquired", time.time(), flush=True)
"""


def test_second_process_waits_for_the_lock(tmp_path: Path) -> None:
    lock = serialize_lock_path(tmp_path / "plugin-data")
    assert lock.name == "serialize.lock"
    with serialize_lock(lock):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(lock)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        assert child.poll() is None, "the child got the lock while we held it"
        released_at = time.time()
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    word, stamp = out.split()
    assert word == "acquired"
    assert float(stamp) >= released_at
    assert lock.exists()  # never deleted


def test_timeout_while_held_then_free(tmp_path: Path) -> None:
    lock = tmp_path / "serialize.lock"
    # a second holder in this process opens its own file description, so it blocks too
    with (
        serialize_lock(lock),
        pytest.raises(TimeoutError, match="another instance holds it"),
        serialize_lock(lock, timeout=0.1),
    ):
        pass
    with serialize_lock(lock, timeout=0.1):
        pass


def test_threads_are_serialised(tmp_path: Path) -> None:
    lock = tmp_path / "serialize.lock"
    inside = 0
    overlaps = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, overlaps
        with serialize_lock(lock):
            with guard:
                inside += 1
                overlaps += inside > 1
            time.sleep(0.01)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert overlaps == 0


@pytest.mark.parametrize(("durable", "fsyncs"), [(True, 2), (False, 0)])
def test_atomic_write_fsyncs_only_when_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool, fsyncs: int
) -> None:
    """Durable: the file and then its directory are fsynced; not durable: no fsync, the same atomic replace."""
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    target = tmp_path / "f.json"
    target.write_bytes(b"old")
    atomic_write(target, b"new", 0o640, durable=durable)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert len(calls) == fsyncs
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left


def test_atomic_write_creates_missing_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "file.json"
    atomic_write(target, b"{}\n", 0o640)
    assert target.read_bytes() == b"{}\n"
    assert target.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o755 & ~current_umask()
    assert [p.name for p in target.parent.iterdir()] == ["file.json"], "no temp file left behind"
    atomic_write(target, b"[]\n", 0o640)
    assert target.read_bytes() == b"[]\n"


def test_atomic_write_skips_a_temp_name_left_by_an_earlier_process_and_writes_all_of_a_short_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temp names are per process and call; one that exists (a crashed process of the same pid) is passed
    over, not opened; ``os.write`` writing less than asked is continued until all is written."""
    target = tmp_path / "spec.json"
    renames = record_renames(monkeypatch)
    atomic_write(target, b"first", 0o644)
    pid, last = renames[0][0].removeprefix(".spec.json.").removesuffix(".tmp").split("-")
    assert pid == str(os.getpid())
    stale = [tmp_path / f".spec.json.{pid}-{int(last) + n}.tmp" for n in range(1, 6)]
    for path in stale:  # the next five names are taken
        path.write_bytes(b"stale")
    real_write = os.write

    def short_write(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", short_write)
    atomic_write(target, b"0123456789", 0o644)
    assert target.read_bytes() == b"0123456789"
    assert all(p.read_bytes() == b"stale" for p in stale)
    assert len(list(tmp_path.iterdir())) == len(stale) + 1
    assert renames[1] == (f".spec.json.{pid}-{int(last) + 6}.tmp", "spec.json")


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_serialize_lock_creates_its_missing_directory(tmp_path: Path) -> None:
    lock = serialize_lock_path(tmp_path / "not" / "yet")
    with serialize_lock(lock, timeout=1):
        assert lock.exists()
    with serialize_lock(lock, timeout=1):
        pass
