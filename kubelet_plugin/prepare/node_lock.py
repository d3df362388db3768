"""The node-wide lock every checkpoint and claim-file change happens under: this process's lock, then the
``serialize.lock`` file lock shared with every plugin instance on the node (``filelock.serialize_lock``)."""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from kubelet_plugin.core.filelock import serialize_lock
from kubelet_plugin.prepare.errors import ErrorKind, PrepareError


class NodeLockTimeoutError(PrepareError):
    """The node-wide lock was not free within the timeout."""


class NodeLock:
    """Holds both locks; bounded by `timeout_s` for kubelet calls, `on_timeout` called at each timeout."""

    def __init__(self, path: Path, timeout_s: float, on_timeout: Callable[[], None] = lambda: None) -> None:
        self._path = path
        self._timeout = timeout_s
        self._on_timeout = on_timeout
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, *, bounded: bool = True) -> Iterator[None]:
        """Hold both locks for the block; raises NodeLockTimeoutError when they are not ours within the
        timeout. Unbounded (`bounded=False`) at start, when no kubelet call is waiting."""
        if not bounded:
            with self._lock, serialize_lock(self._path):
                yield
            return
        deadline = time.monotonic() + self._timeout
        with ExitStack() as held:
            if not self._lock.acquire(timeout=self._timeout):
                raise self._timed_out("another call of this fracgpu plugin")
            held.callback(self._lock.release)
            try:
                held.enter_context(serialize_lock(self._path, timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                raise self._timed_out("another fracgpu plugin instance") from None
            yield

    def _timed_out(self, holder: str) -> NodeLockTimeoutError:
        self._on_timeout()
        return NodeLockTimeoutError(
            ErrorKind.LOCK_TIMEOUT, f"{holder} held the node lock for {self._timeout:g} s; the kubelet retries"
        )
