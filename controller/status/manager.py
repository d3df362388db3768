"""The claim-status manager: claims wait in a `WorkQueue` for `--workers` concurrent writers; each plans the claim's
`status.devices` entries (`plan_status`, with `plan_node_gone` for a deleted node, and what MPS GPUs add from
`controller.mps`: the trust domain and the binding condition decided) from the indexes, applies them when they
differ, and posts the Events the claim needs (`ClaimEvents`, and `MpsTrustDomainConflict` for a refused share,
`MpsTrustDomainWaiting` for a pending claim that only other trust domains' MPS GPUs have room for, among the GPUs
its selectors leave it: `controller.status.feasibility.selected_by`, in place of `GpuRoomWaiting`; each told to the
claim's pods too). A write the
API server refuses because it would change the allocation (`ApiAllocationImmutable`: it refuses every status write to
that claim) is told once as `ClaimStatusUnwritable` and not retried; the claim's other Events are posted as usual.

A failed write or Event post is retried with the queue's backoff, up to `MAX_ATTEMPTS` times; a write the API server
could not take now (`ApiTransient`: throttled, unavailable, no answer) is delayed, not dropped: retried without
limit, never sooner than the wait the server asked; a claim that is gone or was replaced (`ApiNotFound`,
`ApiUidMismatch`) is not retried. 64 writers by default: at the API server's latency under
a burst, fewer leave claims queued behind writes in flight.
"""

import asyncio
import datetime
import logging
import time

from api.kube_errors import ApiAllocationImmutable, ApiNotFound, ApiTransient, ApiUidMismatch
from controller.core import metrics
from controller.core.context import ClaimKey, Context, Tasks
from controller.core.kube import describe
from controller.core.workqueue import QueueShutDownError, WorkQueue
from controller.devices.catalogue import DeviceCatalogue
from controller.mps.manager import CONFLICT_REASON, WAITING_REASON, MpsDomains, refusals
from controller.nodes.plan import plan_node_gone
from controller.status.events import ClaimEvents
from controller.status.feasibility import selected_by
from controller.status.plan import apply_body, plan_status

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 8


class StatusManager:
    """The queue of claims and the writers that reconcile their status and Events."""

    def __init__(self, context: Context, catalogue: DeviceCatalogue, mps: MpsDomains) -> None:
        self._context = context
        self._catalogue = catalogue
        self._mps = mps
        self.events = ClaimEvents(context, catalogue, self._recheck)
        self.queue = self._new_queue()
        """Claims waiting for a status writer."""
        self._tasks = Tasks()

    @staticmethod
    def _new_queue() -> WorkQueue[ClaimKey]:
        return WorkQueue(
            max_attempts=MAX_ATTEMPTS, on_depth=metrics.RECONCILE_QUEUE.set, on_wait=metrics.QUEUE_WAIT_SECONDS.observe
        )

    def start(self) -> None:
        """Queue every indexed claim; start the writers (after a `stop`, on a new queue: a full resync)."""
        if self.queue.is_shut_down:
            self.queue = self._new_queue()
        for key in self._context.claim_keys():
            self.queue.add(key)
        for i in range(self._context.settings.workers):
            self._tasks.spawn(self._worker(), f"claim-worker-{i}")

    async def stop(self) -> None:
        """Stop the writers; the queue takes nothing more until the next `start`."""
        self.queue.shutdown()
        await self._tasks.cancel()

    def enqueue(self, key: ClaimKey) -> None:
        """Schedule a reconcile of one claim (deduplicated; see `WorkQueue`)."""
        self.queue.add(key)

    def enqueue_all(self) -> None:
        for key in self._context.claim_keys():
            self.queue.add(key)

    def _recheck(self, key: ClaimKey, seconds: float) -> None:
        self.queue.add_after(key, seconds)

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDownError:
                return
            try:
                done = await self.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._retry(key, err)
            else:
                if done:
                    self.queue.forget(key)
                else:
                    self._retry(key, None)
            finally:
                self.queue.done(key)

    def _retry(self, key: ClaimKey, err: Exception | None) -> None:
        """Retry the claim after its backoff (`err`: the failed write; None: an Event could not be posted)."""
        claim = "/".join(key)
        if isinstance(err, ApiNotFound | ApiUidMismatch):
            log.info("claim gone or replaced; not retrying", extra={"claim": claim, "status": err.status})
            self.queue.forget(key)
            return
        why = describe(err) if err is not None else "an Event about the claim could not be posted"
        if isinstance(err, ApiTransient):
            delay = self.queue.retry(key, at_least=err.retry_after or 0.0, limited=False)
        else:
            delay = self.queue.retry(key)
        if delay is None:
            log.error("giving up on claim status after %d attempts: %s", MAX_ATTEMPTS, why, extra={"claim": claim})
            return
        log.warning("claim status write failed; retrying", extra={"claim": claim, "error": why, "retry_in": delay})

    async def reconcile(self, key: ClaimKey) -> bool:
        """Write the claim's status entries if they differ; post the Events it needs. False when some Event could
        not be posted (a later try may succeed); raises on a failed write."""
        claim = self._context.claim(key)
        if claim is None:
            return True
        metrics.RECONCILES.inc()
        told = await self.events.skipped_parts(claim)  # before the write: the API server may refuse that one
        driver = self._context.driver
        now = datetime.datetime.now(datetime.UTC)
        mps = self._mps.entries(claim, now)
        plan = plan_status(claim, self._catalogue.devices().get, driver, mps)
        gone = plan_node_gone(claim, self._context.node_names(), plan.entries, driver, now)
        if plan.changed or gone.changed:
            started = time.monotonic()
            try:
                body = apply_body(claim, gone.entries)
                await self._context.run(self._context.writer.apply_claim_status, claim.namespace, claim.name, body)
            except ApiAllocationImmutable:
                metrics.STATUS_WRITES.labels("error").inc()
                told = await self.events.status_unwritable(claim) and told
            except Exception:
                metrics.STATUS_WRITES.labels("error").inc()
                raise
            else:
                metrics.STATUS_WRITES.labels("ok").inc()
                metrics.STATUS_WRITE_SECONDS.observe(time.monotonic() - started)
        missing = tuple(s for s in plan.missing if s not in gone.shares)
        waiting = []
        if self._mps.enabled and not claim.allocated:
            waiting = self._mps.waiting(claim, selected_by(self._context.claim_classes(), driver))
        posted = await self.events.post(claim, missing, gone, frozenset(r for r, _ in waiting)) and told
        notices: list[tuple[tuple[str, ...], str, str]] = [
            ((CONFLICT_REASON, pool, device, share), CONFLICT_REASON, message)
            for (pool, device, share), message in refusals(mps)
        ]
        notices += [((WAITING_REASON, r, m), WAITING_REASON, m) for r, m in waiting]
        for about, reason, message in notices:
            posted = await self.events.tell(claim, about, reason, message) and posted
        return posted
