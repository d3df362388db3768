"""A claim's Events told on the pods that use it (`ClaimEvents` forwards each Event it posts about a claim here).

Which pods: those the claim names (its owner; when allocated, the pods of `status.reservedFor`), each read by name,
else (a claim pods name, not allocated) the pods of its namespace not bound to a node, one paged list, listed again
(`RELIST_SECONDS`) while the reason holds (nothing on the claim changes when a pod that names it is made): no
watch of every pod in the cluster. `controller.status.pod_events` plans whom to tell; a pod gone is skipped. Each pod is told
each (claim, key) once: the Event's name is derived from (claim uid, key, pod uid), so a post repeated after a
restart meets AlreadyExists. A pod over its `PodRateLimit` is told later, once the limit allows and if the reason
still holds (the claim is reconciled again then).
"""

import dataclasses
import logging
import math
import time
from collections.abc import Callable

from controller.core import metrics
from controller.core.claims import ClaimView
from controller.core.context import ClaimKey, Context
from controller.core.kube import describe
from controller.status.pod_events import PodRateLimit, PodView, claim_pods, plan_pod_events, pod_view

log = logging.getLogger(__name__)
RELIST_SECONDS = (5.0, 30.0)
"""When the unbound pods of a namespace are listed again for a claim they may name that still has a reason to tell:
the first time after this long (pods applied with their claim are made just after it), then every so long (a pod
made later hears the reason within that)."""


@dataclasses.dataclass
class _Told:
    """Where telling one (claim, key) to its pods stands."""

    pods: set[str] = dataclasses.field(default_factory=set)
    """Uids of the pods told (or read by name and found gone or not concerned)."""
    lists: int = 0
    """How many times the namespace's unbound pods were listed for it (a claim pods name, not allocated)."""
    due: float = -math.inf
    """When to list them again (monotonic)."""
    complete: bool = False
    """Every pod planned at the last list was told (a pod read by name stays unread until it is told)."""


class PodNotices:
    """What has been told to which pods, per claim uid and Event key; the per-pod rate limit."""

    def __init__(self, context: Context, recheck: Callable[[ClaimKey, float], None]) -> None:
        """`recheck(key, seconds)`: reconcile the claim again after that long (a pod over its rate limit)."""
        self._context = context
        self._recheck = recheck
        self._told: dict[str, dict[tuple[str, ...], _Told]] = {}
        self.limit = PodRateLimit()
        self.relist = RELIST_SECONDS

    def forget(self, uid: str) -> None:
        """The claim is deleted."""
        self._told.pop(uid, None)

    async def tell(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        """Tell the claim's Event `key` to the pods it concerns that were not told yet; False when reading the pods
        or a post failed (a later try may succeed)."""
        told = self._told.setdefault(claim.uid, {}).setdefault(key, _Told())
        named = claim_pods(claim)
        now = time.monotonic()
        if named is not None:
            unread = [p for p in named if p.uid not in told.pods]
            if not unread:
                return True
        elif told.complete and now < told.due:
            return True
        try:
            pods = await self._read(claim, [p.name for p in unread] if named is not None else None)
        except Exception as err:
            log.warning(
                "could not read the pods of a claim", extra={"claim": "/".join(claim.key), "error": describe(err)}
            )
            return False
        if named is None:  # pods made since: no claim event will say so
            told.lists += 1
            delay = self.relist[min(told.lists, len(self.relist)) - 1]
            told.due = now + delay
            self._recheck(claim.key, delay)
        planned = {e.pod.uid: e for e in plan_pod_events(claim, key, reason, message, pods)}
        if named is not None:  # read by name and gone, or not concerned: nothing to tell
            told.pods |= {p.uid for p in unread if p.uid not in planned}
        ok = complete = True
        for uid, event in planned.items():
            if uid in told.pods:
                continue
            wait = self.limit.take(uid, now)
            if wait > 0:
                metrics.POD_EVENTS_DEFERRED.labels(reason).inc()
                self._recheck(claim.key, wait + 0.05)
                complete = False
                continue
            post = self._context.writer.post_pod_event
            pod = event.pod
            if not await self._context.run(post, pod.namespace, pod.ref, (claim.uid, *key), reason, event.message):
                ok = complete = False
                continue
            told.pods.add(uid)
            metrics.POD_EVENTS.labels(reason).inc()
        told.complete = complete
        return ok

    async def _read(self, claim: ClaimView, names: list[str] | None) -> list[PodView]:
        """The pods `names` of the claim's namespace (one gone is left out), or with None, its pods that are not
        bound to a node."""
        writer = self._context.writer
        if names is None:
            bodies = await self._context.run(writer.list_unbound_pods, claim.namespace)
        else:
            bodies = [b for n in names if (b := await self._context.run(writer.read_pod, claim.namespace, n))]
        return [v for b in bodies if (v := pod_view(b)) is not None]
