"""Turns a stream of "something changed" notices into few flushes: at most one per ``window`` seconds.

The first notice after a quiet period is flushed ``window`` seconds later (so a burst lands in one flush), and
while notices keep coming, one flush per window follows: a flood of 10,000 notices in a second is two flushes.
"""

import threading
import time
from collections.abc import Callable


class Coalescer:
    """``notify()`` from any thread; ``due_in(now)`` tells the flushing thread when to flush (pure given a clock)."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        if window < 0:
            raise ValueError(f"coalescing window must be >= 0 seconds, got {window}")
        self._window = window
        self._clock = clock
        self._pending_since: float | None = None
        self._last_flush = float("-inf")
        self._cond = threading.Condition()

    def notify(self) -> None:
        """Something changed: a flush is due within ``window`` seconds."""
        with self._cond:
            if self._pending_since is None:
                self._pending_since = self._clock()
            self._cond.notify_all()

    def due_in(self, now: float) -> float | None:
        """Seconds until the next flush (0: now), or None when nothing is pending."""
        with self._cond:
            if self._pending_since is None:
                return None
            at = max(self._pending_since + self._window, self._last_flush + self._window)
            return max(0.0, at - now)

    def flushed(self, now: float | None = None) -> None:
        """The flushing thread flushes at ``now`` (default: the clock's now): later notices need another flush."""
        with self._cond:
            self._pending_since = None
            self._last_flush = self._clock() if now is None else now

    def wait_due(self, stop: threading.Event, idle: float = 1.0) -> bool:
        """Block until a flush is due (True) or ``stop`` is set (False); re-checks ``stop`` every ``idle`` s."""
        while not stop.is_set():
            delay = self.due_in(self._clock())
            if delay == 0:
                return True
            with self._cond:
                self._cond.wait(timeout=idle if delay is None else min(delay, idle))
        return False
