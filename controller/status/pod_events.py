"""Which pods hear a claim's Event, and how often a pod may hear a new one (pure: no I/O, time passed in).

Users look at the pod (`kubectl describe pod`), where the scheduler says only that it cannot allocate all claims;
the controller's reason for a claim (`controller.status.events`) is therefore also told, once, on each pod it is
true for (`plan_pod_events`): a claim not allocated yet holds up the pods that use it and are not bound to a node;
an allocated one concerns the pods that hold it (`status.reservedFor`) and its owner pod. `PodRateLimit` keeps a
pod's Events few. Imports only `controller.core.claims` and pydantic.
"""

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from controller.core.claims import ClaimView, PodRef

POD_EVENTS_PER_WINDOW = 5
"""At most this many new Events per pod within `POD_EVENT_WINDOW` seconds (see `PodRateLimit`)."""
POD_EVENT_WINDOW = 60.0


class PodView(BaseModel):
    """The part of a Pod that says which claims it uses and whether it still waits for them."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str
    uid: str
    node: str = ""
    """`spec.nodeName`: empty while the pod is not bound to a node (it waits for the scheduler)."""
    finished: bool = False
    """Being deleted, or in phase Succeeded or Failed: nothing to tell it."""
    claims: Mapping[str, str] = {}
    """The ResourceClaims it uses, by claim name: the pod's own name for each (`spec.resourceClaims[].name`;
    empty for the scheduler's claim for its extended resources)."""

    @property
    def ref(self) -> PodRef:
        return PodRef(name=self.name, uid=self.uid)


class PodEvent(BaseModel):
    """One Event to post about a pod: a claim's Event `key` told to it."""

    model_config = ConfigDict(frozen=True)

    pod: PodView
    key: tuple[str, ...]
    reason: str
    message: str


def pod_view(body: Mapping[str, Any]) -> PodView | None:
    """The view of a Pod as the API server answers it; None for a body not shaped like one."""
    meta, spec, status = (body.get(k) for k in ("metadata", "spec", "status"))
    if not isinstance(meta, Mapping) or not meta.get("name") or not meta.get("uid"):
        return None
    spec = spec if isinstance(spec, Mapping) else {}
    status = status if isinstance(status, Mapping) else {}
    claims: dict[str, str] = {}
    for entry in (*(spec.get("resourceClaims") or ()), *(status.get("resourceClaimStatuses") or ())):
        if isinstance(entry, Mapping) and entry.get("resourceClaimName") and entry.get("name"):
            claims[str(entry["resourceClaimName"])] = str(entry["name"])  # named, or made from its template
    extended = status.get("extendedResourceClaimStatus")
    if isinstance(extended, Mapping) and extended.get("resourceClaimName"):
        claims.setdefault(str(extended["resourceClaimName"]), "")
    return PodView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        node=str(spec.get("nodeName") or ""),
        finished=bool(meta.get("deletionTimestamp")) or status.get("phase") in {"Succeeded", "Failed"},
        claims=claims,
    )


def claim_pods(claim: ClaimView) -> tuple[PodRef, ...] | None:
    """The pods a claim's Event may concern that the claim itself names (its owner; when allocated, also the pods
    that hold it); None when only a list of its namespace's pods can tell (a claim pods name, not allocated)."""
    owner = (PodRef(name=claim.pod, uid=claim.pod_uid),) if claim.pod else ()
    if claim.allocated:
        return tuple(dict.fromkeys((*owner, *claim.reserved)))
    return owner or None


def _concerned(claim: ClaimView, pod: PodView) -> bool:
    """Whether the claim's Event is true for `pod`: it uses the claim and waits for it (not allocated: the pod is
    not bound yet) or holds it (allocated: reserved for the pod, or the pod owns it)."""
    if pod.finished or pod.namespace != claim.namespace:
        return False
    owner = bool(claim.pod) and (pod.name, pod.uid) == (claim.pod, claim.pod_uid)
    if claim.allocated:
        return owner or pod.ref in claim.reserved
    return not pod.node and (owner or claim.name in pod.claims)


def pod_message(claim: ClaimView, pod: PodView, message: str) -> str:
    """The claim's Event `message` as told on `pod`: prefixed with the claim, under the pod's own name for it."""
    own = pod.claims.get(claim.name)
    if not own and claim.pod and (pod.name, pod.uid) == (claim.pod, claim.pod_uid):
        own = claim.pod_claim_name  # a template's claim: named before the pod's status lists it
    about = f"claim {own!r} (ResourceClaim {claim.name})" if own else f"ResourceClaim {claim.name}"
    return f"{about}: {message}"


def plan_pod_events(
    claim: ClaimView, key: tuple[str, ...], reason: str, message: str, pods: Iterable[PodView]
) -> list[PodEvent]:
    """The Events that tell the claim's Event (`key`, `reason`, `message`) to each of `pods` it concerns."""
    return [
        PodEvent(pod=pod, key=key, reason=reason, message=pod_message(claim, pod, message))
        for pod in pods
        if _concerned(claim, pod)
    ]


class PodRateLimit:
    """At most `limit` new Events per pod in any `window` seconds.

    A pending pod has a few reasons at a time (one per request and kind of reason), all told within the first
    slots; what would flood it is a reason told again each time the GPUs change (`MigPlacementsFragmented`, an
    `UnsatisfiableGpuRequest` whose figures change). An Event over the limit waits for the wait `take` returns,
    and is then told if it is still true (`controller.status.pod_notices`).
    """

    def __init__(self, limit: int = POD_EVENTS_PER_WINDOW, window: float = POD_EVENT_WINDOW) -> None:
        self.limit = limit
        self.window = window
        self._sent: dict[str, deque[float]] = {}  # pod uid -> times of its Events within the window, oldest first

    def take(self, pod: str, now: float) -> float:
        """0 when `pod` may have a new Event at `now` (counted); else the seconds until it may."""
        self._prune(now)
        sent = self._sent.setdefault(pod, deque())
        if len(sent) >= self.limit:
            return sent[0] + self.window - now
        sent.append(now)
        return 0.0

    def _prune(self, now: float) -> None:
        for pod, sent in list(self._sent.items()):
            while sent and sent[0] <= now - self.window:
                sent.popleft()
            if not sent:
                del self._sent[pod]
