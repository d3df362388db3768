"""Only the leader writes: the controller's work loops run while this replica leads, and every write is gated.

Every replica runs kopf's watches, indexes and admission (a follower's caches stay warm, so a takeover needs no
re-list). The gate is in one place, `Leadership`: becoming leader starts the controller's loops (which queue
every claim and recompute the whole ledger: a full resync of status and ledger), losing leadership stops them,
and `GatedWriter` refuses any write once `is_leader()` turns false, so a write already queued in a worker thread
when the lease ran out is not sent either. Without leader election (`--no-leader-elect`) the loops simply run.
"""

import asyncio
import datetime
from typing import Any

from api.events import event_body, involved_object, post_event
from api.kube_errors import ApiError
from api.kube_rest import KubeRest
from controller.core.claims import ClaimView, PodRef
from controller.core.context import Writer
from controller.core.settings import COMPONENT
from controller.leadership.election import LeaderElector
from controller.loops import Controller

REASON_LEADER = "LeaderElected"


class NotLeaderError(ApiError):
    """A write refused before it was sent: this replica does not (or no longer) lead."""

    def __init__(self) -> None:
        super().__init__(status=0, reason="not the leader: only the replica holding the leader Lease writes")


class GatedWriter:
    """A `Writer` that sends nothing unless `elector.is_leader()` (checked right before each request; nothing is
    sent before an elector is given)."""

    def __init__(self, writer: Writer, elector: LeaderElector | None) -> None:
        self.writer = writer
        self.elector = elector

    def _leading(self) -> bool:
        return self.elector is not None and self.elector.is_leader()

    def _check(self) -> None:
        if not self._leading():
            raise NotLeaderError

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._check()
        self.writer.apply_claim_status(namespace, name, body)

    def apply_gpu(self, body: dict[str, Any], *, status: bool) -> None:
        self._check()
        self.writer.apply_gpu(body, status=status)

    def delete_gpu(self, name: str) -> None:
        self._check()
        self.writer.delete_gpu(name)

    def list_heartbeats(self, namespace: str) -> list[dict[str, Any]]:
        return self.writer.list_heartbeats(namespace)  # a read: not gated

    def create_taint_rule(self, body: dict[str, Any]) -> str:
        self._check()
        return self.writer.create_taint_rule(body)

    def read_taint_rule(self, name: str) -> dict[str, Any] | None:
        return self.writer.read_taint_rule(name)  # a read: not gated

    def apply_taint_rule(self, body: dict[str, Any]) -> None:
        self._check()
        self.writer.apply_taint_rule(body)

    def delete_taint_rule(self, name: str) -> None:
        self._check()
        self.writer.delete_taint_rule(name)

    def post_taint_rule_event(self, name: str, uid: str, reason: str, message: str) -> bool:
        if not self._leading():
            return False
        return self.writer.post_taint_rule_event(name, uid, reason, message)

    def post_claim_event(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        if not self._leading():
            return False  # the next leader posts it (Event names are deterministic: no duplicate)
        return self.writer.post_claim_event(claim, key, reason, message)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.writer.read_pod(namespace, name)  # a read: not gated

    def list_unbound_pods(self, namespace: str) -> list[dict[str, Any]]:
        return self.writer.list_unbound_pods(namespace)  # a read: not gated

    def post_pod_event(self, namespace: str, pod: PodRef, about: tuple[str, ...], reason: str, message: str) -> bool:
        if not self._leading():
            return False  # as post_claim_event
        return self.writer.post_pod_event(namespace, pod, about, reason, message)


def lease_event(lease: dict[str, Any], identity: str, now: datetime.datetime) -> dict[str, Any]:
    """The core/v1 Event `<identity> became leader` on `lease` (as `kubectl describe lease` shows it)."""
    meta = lease.get("metadata") or {}
    involved = involved_object(
        "coordination.k8s.io/v1",
        "Lease",
        meta.get("name") or "lease",
        namespace=meta.get("namespace"),
        uid=meta.get("uid"),
        resource_version=meta.get("resourceVersion"),
    )
    message = f"{identity} became leader"
    return event_body(involved, REASON_LEADER, message, component=COMPONENT, instance=identity, type_="Normal", now=now)


class Leadership:
    """Runs `controller`'s loops while `elector` leads (or always, without an elector)."""

    def __init__(self, controller: Controller, elector: LeaderElector | None, events: KubeRest | None = None) -> None:
        """`events`: where the Event on the Lease is posted when this replica becomes leader (None: not posted)."""
        self.controller = controller
        self.elector = elector
        self.events = events
        self.leading = False

    async def started(self, lease: dict[str, Any]) -> None:
        """Became leader: start the loops (a full resync of claim status and ledger); post the Event."""
        self.leading = True
        await self.controller.start()
        if self.events is not None and self.elector is not None:
            body = lease_event(lease, self.elector.identity, datetime.datetime.now(datetime.UTC))
            await asyncio.to_thread(post_event, self.events, body)

    async def stopped(self) -> None:
        """Stopped leading: stop the loops (the gate already refuses their writes)."""
        self.leading = False
        await self.controller.stop()
