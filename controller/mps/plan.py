"""MPS trust domains at scheduling, pure: which claims an MPS GPU admits, the taints that keep other domains off it,
and the tolerations a new claim carries.

A GPU's MPS daemon serves one trust domain (``api/mps_trust.py``) at a time. Three things keep domains apart
before the node plugin's prepare has to refuse anyone (its safety net):

- **Tolerations.** Admission gives every request of a new claim for the driver's DeviceClasses the toleration of
  its domain (`tolerations_patch`).
- **Taints.** An MPS GPU that holds claims of a domain carries that domain's taint through a DeviceTaintRule of
  its own (`desired_taint_rules`), so the scheduler places only that domain's claims there.
- **Binding conditions.** The node plugin publishes MPS GPUs with the binding condition
  ``MpsTrustDomainAdmitted`` (and the failure condition ``MpsTrustDomainConflict``): the scheduler waits before
  binding a pod until the controller has set one of them on the claim's device entry (`plan_device`). Two claims of
  two domains allocated to a free GPU at once (before its taint existed) are thus decided here: the GPU's domain is
  that of the claims it already holds, else of the one allocated first; the other is refused, and the scheduler
  allocates it again, elsewhere now that the taint exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from api.mps_trust import LABEL_TAINT_KEY, NAMESPACE_TAINT_KEY, RULE_LABEL, TrustDomain

ShareState = Literal["waiting", "admitted", "refused", "holding"]
"""waiting: its result carries the binding condition and neither condition is set yet; admitted / refused: the
controller decided; holding: allocated without the binding condition (an older slice, or a cluster without
binding conditions): it holds the GPU whatever is decided."""
TAINT_KEYS = (NAMESPACE_TAINT_KEY, LABEL_TAINT_KEY)


@dataclass(frozen=True)
class MpsShare:
    """One allocation result of a claim on an MPS GPU."""

    claim: str
    namespace: str
    name: str
    pool: str
    device: str
    share_id: str | None
    domain: TrustDomain
    state: ShareState
    allocated_at: str = ""
    """The allocation's timestamp (RFC 3339), empty when the scheduler wrote none."""

    @property
    def key(self) -> tuple[str, str, str | None]:
        return self.claim, self.device, self.share_id


@dataclass(frozen=True)
class DeviceVerdict:
    """One MPS GPU: the domain it serves, and what to set on its waiting shares."""

    pool: str
    device: str
    owner: TrustDomain | None
    admit: tuple[MpsShare, ...] = ()
    refuse: tuple[tuple[MpsShare, str], ...] = ()
    mixed: tuple[TrustDomain, ...] = ()
    """Domains beyond the owner among the shares already on the GPU (allocated without binding conditions):
    nothing here can undo that; the node plugin refuses those claims at prepare."""


def plan_device(pool: str, device: str, shares: Sequence[MpsShare]) -> DeviceVerdict:
    """Decide the waiting shares of one MPS GPU (pure). The GPU's domain is that of the shares it holds (admitted or
    holding; the earliest allocated when they disagree), else that of the earliest allocated waiting share."""
    placed = sorted((s for s in shares if s.state in ("admitted", "holding")), key=_order)
    waiting = sorted((s for s in shares if s.state == "waiting"), key=_order)
    owner = placed[0].domain if placed else waiting[0].domain if waiting else None
    admit: list[MpsShare] = []
    refuse: list[tuple[MpsShare, str]] = []
    for share in waiting:
        if share.domain == owner:
            admit.append(share)
        else:
            assert owner is not None
            refuse.append((share, conflict_message(share, owner, pool, device)))
    mixed = tuple(sorted({s.domain for s in placed} - {owner} if owner else set()))
    return DeviceVerdict(pool, device, owner, tuple(admit), tuple(refuse), mixed)


def _order(share: MpsShare) -> tuple[str, str, str]:
    return share.allocated_at or "~", share.namespace, share.name


def conflict_message(share: MpsShare, owner: TrustDomain, pool: str, device: str) -> str:
    return (
        f"MPS GPU {device} of node {pool} serves {owner.describe()}, and this claim belongs to "
        f"{share.domain.describe()}: claims of two trust domains never share an MPS daemon. The scheduler places the "
        "claim again, on another GPU; widen the trust domain (chart value mps.trustDomain) only for namespaces that "
        "trust each other"
    )


def admitted_message(owner: TrustDomain, pool: str, device: str) -> str:
    return f"MPS GPU {device} of node {pool} serves {owner.describe()}, this claim's trust domain"


def rule_name(driver: str, pool: str, device: str) -> str:
    """The DeviceTaintRule of one MPS GPU (a DNS subdomain: driver, pool and device names are)."""
    return f"{driver}-mps-{pool}-{device}"


def taint_rule(driver: str, pool: str, device: str, owner: TrustDomain) -> dict[str, Any] | None:
    """The DeviceTaintRule that keeps every domain but `owner` off the GPU; None for ``cluster``."""
    taint = owner.taint()
    if taint is None:
        return None
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(driver, pool, device),
            "labels": {RULE_LABEL: "true", "app.kubernetes.io/managed-by": "fracgpu-controller"},
            "annotations": {"gpu.fracgpu.dev/mps-trust-domain": owner.id},
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": device},
            "taint": {"key": taint[0], "value": taint[1], "effect": "NoSchedule"},
        },
    }


def desired_taint_rules(driver: str, verdicts: Iterable[DeviceVerdict]) -> dict[str, dict[str, Any]]:
    """Name -> DeviceTaintRule for every MPS GPU that serves a domain (one with no claim has none)."""
    out = {}
    for verdict in verdicts:
        if verdict.owner is not None and (rule := taint_rule(driver, verdict.pool, verdict.device, verdict.owner)):
            out[rule["metadata"]["name"]] = rule
    return out


def rule_differs(desired: Mapping[str, Any], existing: Mapping[str, Any]) -> bool:
    """Whether an existing rule must be written again (its selector or taint key, value or effect differ)."""
    have = existing.get("spec") or {}
    want = desired["spec"]
    taint = {k: (have.get("taint") or {}).get(k) for k in ("key", "value", "effect")}
    return bool(have.get("deviceSelector") != want["deviceSelector"] or taint != want["taint"])


@dataclass(frozen=True)
class Room:
    """One published GPU as a pending claim sees it: its free memory and, for an MPS GPU, the domain it serves."""

    pool: str
    device: str
    free: int
    mps: bool
    owner: TrustDomain | None = None


def waiting_message(domain: TrustDomain, memory: int, rooms: Iterable[Room]) -> str | None:
    """Why a pending claim of `domain` asking for `memory` bytes waits, when only MPS GPUs of other trust domains
    have that much free (pure); None when some GPU it may use has room, or none has."""
    listed = list(rooms)
    usable = [r for r in listed if r.free >= memory and (not r.mps or r.owner in (None, domain))]
    held = [r for r in listed if r.free >= memory and r.mps and r.owner not in (None, domain)]
    if usable or not held:
        return None
    where = ", ".join(f"{r.device} of node {r.pool} ({r.owner.describe() if r.owner else ''})" for r in held)
    return (
        f"this claim of {domain.describe()} waits: the GPUs with room for it are MPS GPUs that serve other trust "
        f"domains ({where}), and claims of two trust domains never share an MPS daemon. It is placed once a GPU it "
        "may use has room (a free MPS GPU, one of its own domain, or any other GPU)"
    )
