"""Leader election on a `coordination.k8s.io/v1` Lease (the gate on the controller's writes: controller/leadership/gate.py).

Why not `kubernetes.leaderelection`: its loop blocks a thread, decides by the wall clock (`time.time()`), runs
requests without a timeout (a hung renew can outlive the lease), ends for good after one loss, exits the process
on a bad setting, and never releases the lease on shutdown (a rolling restart then waits a whole lease duration).

The rules (those of client-go's leaderelection):
- a candidate takes the Lease when it does not exist (create), when nobody holds it (released), or when its
  record (holder, renewTime, resourceVersion) has not changed for the record's `leaseDurationSeconds` as this
  process's *monotonic* clock measures it since it first saw that record; every take and renew is a PUT with
  the Lease's resourceVersion, so of two candidates exactly one wins (the other gets 409 Conflict);
- the leader renews every `retry_period`; it leads until `renew_deadline` after the *start* of its last
  successful renew. Another candidate cannot take the Lease before `lease_duration` after that start, so
  `lease_duration - renew_deadline` is the margin for clock rate differences and a write in flight;
- `is_leader()` is false from that instant on, whatever the loop is doing (a renew stuck on a slow API server
  cannot extend it); losing (deadline passed, or another holder seen) calls `on_stopped` at once;
- on shutdown the leader stops its work first, then releases the Lease (holder cleared), so a follower takes
  over at its next retry instead of after a lease duration.
"""

import asyncio
import datetime
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from api.kube_errors import ApiConflict, ApiError, ApiNotFound

log = logging.getLogger(__name__)
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


class LeaseApi(Protocol):
    """The requests the elector sends (`api.kube_rest.KubeRest`; blocking, run in a thread)."""

    def get(self, path: str) -> dict[str, Any]: ...
    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LeaseTimings:
    """Seconds: how long a Lease is valid unrenewed, how long the leader leads after a renew, how often to try."""

    duration: float
    renew_deadline: float
    retry_period: float

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                f"lease timings must satisfy 0 < retry period ({self.retry_period:g}) < renew deadline "
                f"({self.renew_deadline:g}) < lease duration ({self.duration:g})"
            )


def micro_time(at: datetime.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _wall() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    """Campaigns for the Lease `namespace/name` as `identity` (the pod name) until `run` is cancelled."""

    def __init__(
        self,
        api: LeaseApi,
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings,
        *,
        on_started: Callable[[dict[str, Any]], Awaitable[None]],
        on_stopped: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _wall,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`on_started(lease)` runs when this candidate becomes leader (with the Lease it wrote), `on_stopped()`
        when it stops leading (loss or shutdown); both on the event loop of `run`, never concurrently."""
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._leading = False
        self._valid_until = 0.0  # clock() value at which leadership ends unless renewed
        self._observed: tuple[str, Any, Any] | None = None  # (holder, renewTime, resourceVersion) last seen
        self._observed_at = 0.0  # clock() when that record was first seen
        self.holder: str | None = None
        """The holder of the Lease as last seen (None: nobody, or not read yet)."""

    @property
    def path(self) -> str:
        return f"{LEASES.format(namespace=self.namespace)}/{self.name}"

    def is_leader(self) -> bool:
        """True while this process leads: it renewed the Lease less than `renew_deadline` ago."""
        return self._leading and self._clock() < self._valid_until

    async def run(self) -> None:
        """Campaign and renew every `retry_period` until cancelled; then stop leading and release the Lease."""
        try:
            while True:
                await self.step()
                await self._sleep(self.timings.retry_period)
        finally:
            if self._leading:
                valid = self.is_leader()
                await self._lose("shutdown")
                if valid:
                    await self._release()

    async def step(self) -> None:
        """One attempt to take or renew the Lease; starts or stops leading as its outcome says."""
        started = self._clock()
        try:
            lease = await self._try(started)
        except ApiConflict:
            lease = None  # a lost race is expected
        except ApiError as err:
            lease = None
            log.warning("cannot read or write the leader Lease", extra={"lease": self.path, "error": str(err)})
        if lease is not None:
            self._valid_until = started + self.timings.renew_deadline
            if not self._leading:
                self._leading = True
                log.info("became leader", extra={"lease": self.path, "identity": self.identity})
                await self._on_started(lease)
        elif self._leading and (self.holder not in (None, self.identity) or not self.is_leader()):
            await self._lose("another holder" if self.holder not in (None, self.identity) else "renew deadline")

    async def _try(self, now: float) -> dict[str, Any] | None:
        """The Lease as written when this candidate holds it now; None when another does. Raises ApiError."""
        try:
            lease = await asyncio.to_thread(self.api.get, self.path)
        except ApiNotFound:
            return await asyncio.to_thread(self.api.create, LEASES.format(namespace=self.namespace), self._new())
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        self.holder = holder or None
        record = (holder, spec.get("renewTime"), (lease.get("metadata") or {}).get("resourceVersion"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.timings.duration)
            if now < self._observed_at + duration:
                return None
        at = micro_time(self._wall())
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, math.ceil(self.timings.duration)),
            renewTime=at,
        )
        if holder != self.identity:
            spec.update(acquireTime=at, leaseTransitions=int(spec.get("leaseTransitions") or 0) + (1 if holder else 0))
        written = await asyncio.to_thread(self.api.replace, self.path, {**lease, "spec": spec})
        self.holder = self.identity
        return written

    def _new(self) -> dict[str, Any]:
        at = micro_time(self._wall())
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(self.timings.duration)),
                "acquireTime": at,
                "renewTime": at,
                "leaseTransitions": 0,
            },
        }

    async def _lose(self, why: str) -> None:
        self._leading = False
        self._valid_until = 0.0
        log.warning("stopped leading", extra={"lease": self.path, "identity": self.identity, "reason": why})
        await self._on_stopped()

    async def _release(self) -> None:
        """Clear the holder (as client-go does: duration 1 s), so that a follower takes over at once; never raises."""
        try:
            lease = await asyncio.to_thread(self.api.get, self.path)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            at = micro_time(self._wall())
            spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=at, acquireTime=at)
            await asyncio.to_thread(self.api.replace, self.path, {**lease, "spec": spec})
        except ApiError as err:
            log.warning("cannot release the leader Lease", extra={"lease": self.path, "error": str(err)})
            return
        log.info("released the leader Lease", extra={"lease": self.path, "identity": self.identity})
