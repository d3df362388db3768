"""Supervised child processes of a local cluster, recorded in a pid file so another process can stop them."""

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded before any fork: the child only calls prctl


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """preexec_fn: SIGKILL this child when the process that started it dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ProcessGroup:
    """Starts named processes with logs under `state_dir/logs` and pids in `state_dir/pids.json`.

    `detached=False` (pytest): children die with this process even on SIGKILL.
    `detached=True` (command line): children outlive this process; `stop_recorded()` ends them later.
    """

    def __init__(self, state_dir: Path, *, detached: bool, prefix: Sequence[str] = ()) -> None:
        self.state_dir = state_dir
        self.detached = detached
        self.prefix = list(prefix)  # e.g. nsenter into the cluster's network namespace
        self.logs = state_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "pids.json"

    def start(self, name: str, argv: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> None:
        """Start `argv` as `name`; its output goes to logs/<name>.log."""
        log = (self.logs / f"{name}.log").open("ab")
        preexec: Callable[[], None] | None = None if self.detached else _die_with_parent
        proc = subprocess.Popen(
            [*self.prefix, *(str(a) for a in argv)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509 - only an async-signal-safe prctl call
        )
        log.close()
        self.procs[name] = proc
        self._record()

    def check_alive(self, name: str) -> None:
        """Raise with the tail of its log if `name` has exited."""
        code = self.procs[name].poll()
        if code is not None:
            raise RuntimeError(f"{name} exited with {code}; last log lines:\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self, name: str, timeout: float = 15.0) -> None:
        """SIGTERM `name`, SIGKILL after `timeout`; forget it."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            _terminate([proc.pid], timeout)
            proc.wait()
        self._record()

    def stop_all(self, timeout: float = 15.0) -> None:
        """Stop every process, newest first."""
        for name in reversed(list(self.procs)):
            self.stop(name, timeout)
        self.pid_file.unlink(missing_ok=True)

    def _record(self) -> None:
        self.pid_file.write_text(json.dumps({n: p.pid for n, p in self.procs.items()}))


def stop_recorded(state_dir: Path, timeout: float = 15.0) -> list[str]:
    """Stop the processes recorded in `state_dir/pids.json` by an earlier run; return their names."""
    pid_file = state_dir / "pids.json"
    if not pid_file.exists():
        return []
    recorded: dict[str, int] = json.loads(pid_file.read_text() or "{}")
    _terminate(list(reversed(recorded.values())), timeout)
    pid_file.unlink(missing_ok=True)
    return list(recorded)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _terminate(pids: list[int], timeout: float) -> None:
    """SIGTERM each process group, then SIGKILL whatever is left after `timeout` seconds."""
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
