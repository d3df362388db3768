"""Writes the `Ready` condition of prepared claims in the background, off the kubelet's reply path
(`ReadyReporter` decides which claims need it, `ReadyWriter` writes).

A write that fails for want of the API server (no answer, 429, 5xx: `ApiTransient`, after the client's own
retries within its budget) is delayed, not dropped: tried again after 1, 2, 4, … s (at most `MAX_DELAY_S`, at
least the wait the server asked) until it is written or the claim is unprepared (`cancel`); other failures are
final, and the next prepare of the claim writes it again, because prepare checks the condition on the claim it
has just read. Each failed try is logged and counted.
"""

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.kube_errors import ApiError, ApiTransient, UndecodableResponse
from api.kube_rest import KubeRest
from kubelet_plugin.prepare.status import Partitions, Tiers, apply_ready, is_ready

log = logging.getLogger(__name__)

#: Writes Ready=True on one claim (`kubelet_plugin.prepare.status.apply_ready` bound to the plugin's client).
Write = Callable[[dict[str, Any]], None]


MAX_DELAY_S = 30.0
"""The longest wait between two tries of one claim's write."""


def _describe(err: Exception) -> str:
    return str(err) if isinstance(err, ApiError) else f"{type(err).__name__}: {err}"


class ReadyWriter:
    """Runs `write` for submitted claims on a few threads of its own; one claim is written by one task at
    a time (a claim submitted again while its write is pending is not written twice)."""

    def __init__(self, write: Write, on_failure: Callable[[], None], *, first_delay: float = 1.0) -> None:
        self._write = write
        self._on_failure = on_failure
        self._first_delay = first_delay
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fracgpu-ready")
        self._pending: set[str] = set()
        self._changed = threading.Condition()

    def submit(self, claim: dict[str, Any]) -> None:
        """Write Ready on `claim` soon; returns at once."""
        uid = claim["metadata"]["uid"]
        with self._changed:
            if uid in self._pending:
                return
            self._pending.add(uid)
        self._pool.submit(self._run, claim, 1)

    def cancel(self, uid: str) -> None:
        """Stop retrying the write of claim `uid` (unprepared); a try in flight finishes."""
        self._done(uid)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no write is pending or being retried; False if `timeout` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending, timeout)

    def _run(self, claim: dict[str, Any], attempt: int) -> None:
        meta = claim["metadata"]
        with self._changed:
            if meta["uid"] not in self._pending:
                return  # cancelled while waiting
        try:
            self._write(claim)
        except UndecodableResponse:
            pass  # written: only the answer, the claim as it is now, could not be decoded
        except Exception as err:
            self._on_failure()
            retry = isinstance(err, ApiTransient)
            log.warning(
                "cannot set Ready on claim status" + ("; trying again" if retry else ""),
                extra={"claim": f"{meta['namespace']}/{meta['name']}", "attempt": attempt, "error": _describe(err)},
            )
            if isinstance(err, ApiTransient):
                delay = min(MAX_DELAY_S, max(self._first_delay * 2 ** (attempt - 1), err.retry_after or 0.0))
                timer = threading.Timer(delay, self._resubmit, (claim, attempt + 1))
                timer.daemon = True
                timer.start()
                return
        self._done(meta["uid"])

    def _done(self, uid: str) -> None:
        with self._changed:
            self._pending.discard(uid)
            self._changed.notify_all()

    def _resubmit(self, claim: dict[str, Any], attempt: int) -> None:
        try:
            self._pool.submit(self._run, claim, attempt)
        except RuntimeError:  # the interpreter is shutting down: the next prepare writes it
            self._done(claim["metadata"]["uid"])


class ReadyReporter:
    """The Ready and MemoryEnforcement conditions of prepared claims: the tiers each claim got, whether the
    claim as read already says so, and the background write (`ReadyWriter`) when it does not."""

    def __init__(self, rest: KubeRest, driver: str, node: str, on_failure: Callable[[], None]) -> None:
        self._driver = driver
        self._applied: dict[str, tuple[Tiers, Partitions]] = {}  # claim UID -> tier and MIG partition per share
        self._writer = ReadyWriter(
            lambda claim: self._apply(rest, claim, node),
            on_failure,
        )

    def _apply(self, rest: KubeRest, claim: dict[str, Any], node: str) -> None:
        tiers, partitions = self._applied.get(claim["metadata"]["uid"], ({}, {}))
        apply_ready(rest, claim, self._driver, node, tiers, partitions=partitions)

    def prepared(self, claim: dict[str, Any], tiers: Tiers, partitions: Partitions | None = None) -> None:
        """`claim` (as just read) was prepared with `tiers` (and MIG `partitions`): write its conditions unless
        they are there."""
        uid = claim["metadata"]["uid"]
        self._applied[uid] = (tiers, partitions or {})
        if tiers and not is_ready(claim, self._driver, tiers, partitions):
            self._writer.submit(claim)

    def forget(self, claim_uid: str) -> None:
        """The claim was unprepared: its write, if still pending, is not tried again."""
        self._applied.pop(claim_uid, None)
        self._writer.cancel(claim_uid)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the submitted writes are done (or given up); False on timeout."""
        return self._writer.wait_idle(timeout)
