"""The cluster harness never leaves processes behind (harness/cluster/processes.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from harness.cluster.processes import ProcessGroup, stop_recorded


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_dead(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_stop_all_ends_every_child_and_forgets_them(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path, detached=False)
    group.start("one", ["sleep", "300"])
    group.start("two", ["sh", "-c", "trap '' TERM; sleep 300"])  # ignores SIGTERM: must get SIGKILL
    pids = [p.pid for p in group.procs.values()]
    group.stop_all(timeout=1)
    assert all(_wait_dead(pid) for pid in pids)
    assert not (tmp_path / "pids.json").exists()


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from harness.cluster.processes import ProcessGroup
        group = ProcessGroup(Path({str(tmp_path)!r}), detached=False)
        group.start("sleeper", ["sleep", "300"])
        print(group.procs["sleeper"].pid, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_dead(child), "a child of a SIGKILLed harness must not outlive it"


def test_detached_children_are_stopped_from_the_pid_file(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path, detached=True)
    group.start("sleeper", ["sleep", "300"])
    pid = group.procs["sleeper"].pid
    assert stop_recorded(tmp_path, timeout=2) == ["sleeper"]
    group.procs["sleeper"].wait(5)
    assert not _alive(pid)
    assert stop_recorded(tmp_path) == []
