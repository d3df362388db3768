"""A work queue of keys for a pool of asyncio workers (the shape of client-go's rate-limited work queue).

Contract, for keys of any hashable type:
- a key is queued at most once: `add` of a queued key does nothing;
- a key is processed by at most one worker at a time: `add` of a key being processed queues it again once that
  worker calls `done` (a change seen while processing is never lost, and never processed concurrently);
- `retry` queues a failed key again after an exponential backoff (at least `at_least`), up to `max_attempts` times
  in a row (without limit when `limited` is False: a failure that says "not now", such as a throttled write);
  `forget` (or a `retry` past the limit) resets its count;
- `shutdown` wakes every waiting `get` with `QueueShutDownError` and cancels pending delayed adds;
- `on_wait`, when given, is told how long each key waited from being queued until a `get` took it.

Single-threaded: call it from the event loop that runs the workers.
"""

import asyncio
import collections
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class QueueShutDownError(Exception):
    """The queue was shut down: the worker calling `get` should return."""


class WorkQueue(Generic[K]):
    """Deduplicating FIFO of keys with per-key exclusive processing and retries with backoff."""

    def __init__(
        self,
        *,
        base_delay: float = 0.25,
        max_delay: float = 30.0,
        max_attempts: int = 8,
        on_depth: Callable[[int], None] | None = None,
        on_wait: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_depth` is called with the number of queued keys whenever it changes (e.g. a gauge); `on_wait` with
        the seconds a key waited in the queue, at each `get` (e.g. a histogram)."""
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_attempts = max_attempts
        self._on_depth = on_depth
        self._on_wait = on_wait
        self._clock = clock
        self._order: collections.deque[K] = collections.deque()
        self._queued: dict[K, float] = {}  # key -> monotonic time it was queued
        self._processing: set[K] = set()
        self._again: set[K] = set()
        self._attempts: dict[K, int] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._wakeup = asyncio.Event()
        self._shut = False

    def __len__(self) -> int:
        """Keys queued (not counting those being processed)."""
        return len(self._queued)

    def queued(self) -> frozenset[K]:
        """The keys waiting for a worker."""
        return frozenset(self._queued)

    def processing(self) -> frozenset[K]:
        """The keys a worker holds (between `get` and `done`)."""
        return frozenset(self._processing)

    @property
    def is_shut_down(self) -> bool:
        return self._shut

    def add(self, key: K) -> None:
        """Queue `key` unless it is queued already; a key being processed is queued again at its `done`."""
        if self._shut:
            return
        if key in self._processing:
            self._again.add(key)
        elif key not in self._queued:
            self._queued[key] = self._clock()
            self._order.append(key)
            self._wakeup.set()
            self._depth()

    def add_after(self, key: K, delay: float) -> None:
        """`add(key)` after `delay` seconds (dropped if the queue shuts down first)."""
        if self._shut:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.discard(handle)
            self.add(key)

        handle = loop.call_later(delay, fire)
        self._timers.add(handle)

    async def get(self) -> K:
        """The next key, which the caller now holds until `done`; raises `QueueShutDownError` once shut down."""
        while not self._order:
            if self._shut:
                raise QueueShutDownError
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._shut:
            raise QueueShutDownError
        key = self._order.popleft()
        since = self._queued.pop(key)
        self._processing.add(key)
        self._depth()
        if self._on_wait is not None:
            self._on_wait(self._clock() - since)
        return key

    def done(self, key: K) -> None:
        """The holder of `key` finished with it; queue it again if it was added meanwhile."""
        self._processing.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    def retry(self, key: K, *, at_least: float = 0.0, limited: bool = True) -> float | None:
        """Queue `key` again after its backoff (`base_delay` doubled per failure in a row, at most `max_delay`, at
        least `at_least`); the delay, or None when it failed `max_attempts` times in a row (its count is then
        reset) and `limited`."""
        attempt = self._attempts.get(key, 0) + 1
        if attempt > self.max_attempts and limited:
            self._attempts.pop(key, None)
            return None
        self._attempts[key] = attempt
        delay = max(at_least, min(self.max_delay, self.base_delay * 2.0 ** min(attempt, 16)))
        self.add_after(key, delay)
        return delay

    def attempts(self, key: K) -> int:
        """Failures of `key` in a row so far."""
        return self._attempts.get(key, 0)

    def forget(self, key: K) -> None:
        """`key` succeeded (or is given up): its next failure starts the backoff afresh."""
        self._attempts.pop(key, None)

    def shutdown(self) -> None:
        """Stop handing out keys: waiting and later `get`s raise `QueueShutDownError`; delayed adds are cancelled."""
        self._shut = True
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        self._wakeup.set()

    def _depth(self) -> None:
        if self._on_depth is not None:
            self._on_depth(len(self._queued))
