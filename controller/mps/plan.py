"""MPS trust domains at scheduling, pure: which claims an MPS GPU admits, and the DeviceTaintRule that records the
domain it serves and keeps other domains off it.

A GPU's MPS daemon serves one trust domain (``api/mps_trust.py``) at a time. Three things keep domains apart
before the node plugin's prepare has to refuse anyone (its safety net):

- **Tolerations.** Admission gives every request of a new claim for the driver's DeviceClasses the toleration of
  its domain (``controller/admission/mps_tolerations.py``).
- **The rule.** An MPS GPU that serves a domain has a DeviceTaintRule of its own (`taint_rule`): its annotation
  records the domain (the fact, written by the controller alone; `recorded_domain` reads it back) and its taint
  keeps the other domains' claims off the GPU at scheduling. Scope ``cluster`` has one domain: no rule, no fact to
  record.
- **Binding conditions.** The node plugin publishes MPS GPUs with the binding condition
  ``MpsTrustDomainAdmitted`` (and the failure condition ``MpsTrustDomainConflict``): the scheduler waits before
  binding a pod until the controller has set one of them on the claim's device entry (`plan_device`). A waiting
  share is admitted only once the GPU's rule records its domain, refused when it records another that claims there
  hold or wait for; a GPU without a rule gets one for the domain of the claims that hold it, else of the earliest
  allocated waiting share, and a rule whose domain has no claim there any more is stale and deleted. So two
  claims of two domains allocated to a free GPU at once (before its taint existed) are decided by one write of
  the rule, and the one refused is allocated again, elsewhere now that the taint exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from api.compute import TOTAL
from api.mps_trust import RULE_LABEL, TrustDomain, TrustDomainError
from controller.core.slices import MPS_DOMAIN_ANNOTATION, TaintRuleView

ShareState = Literal["waiting", "admitted", "refused", "holding"]
"""waiting: its result carries the binding condition and neither condition is set yet; admitted / refused: the
controller's condition is written; holding: allocated without the binding condition (an older slice, or a cluster
without binding conditions): it holds the GPU whatever is decided."""
Decision = Literal["admitted", "refused"]
RULE_LABELS = {RULE_LABEL: "true", "app.kubernetes.io/managed-by": "fracgpu-controller"}
"""The labels of every MPS GPU's DeviceTaintRule."""


@dataclass(frozen=True)
class MpsShare:
    """One allocation result of a tenant (not admin access) of a claim on an MPS GPU."""

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
    """One MPS GPU: the domain its rule must record, the domain the rule records now, and what to set on its
    waiting shares (nothing until the two agree)."""

    pool: str
    device: str
    owner: TrustDomain | None
    """The domain the GPU's rule must record: the recorded one while a claim of it holds the GPU or, with none
    holding it, waits for it; else that of the earliest allocated claim holding it, else of the earliest allocated
    waiting share. None: nothing holds or waits for the GPU."""
    recorded: TrustDomain | None = None
    """The domain the GPU's DeviceTaintRule records (None: no rule, or one not as the controller writes it)."""
    stale: bool = False
    """The rule records a domain none of whose claims holds or waits for the GPU: it is deleted (and a rule for
    the owner, if any, created after)."""
    admit: tuple[MpsShare, ...] = ()
    refuse: tuple[tuple[MpsShare, str], ...] = ()
    mixed: tuple[TrustDomain, ...] = ()
    """Domains beyond the owner among the shares already on the GPU (allocated without binding conditions):
    nothing here can undo that; the node plugin refuses those claims at prepare."""

    @property
    def settled(self) -> bool:
        """Whether waiting shares are decided now: the rule records the owner (or the owner, ``cluster``, needs
        no rule)."""
        return self.owner is not None and (self.owner.taint() is None or self.recorded == self.owner)

    @property
    def serves(self) -> TrustDomain | None:
        """The domain the GPU serves: the one its rule records; ``cluster`` while it holds or admits claims."""
        if self.recorded is not None:
            return self.recorded
        return self.owner if self.owner is not None and self.owner.taint() is None else None

    def decision(self, key: tuple[str, str, str | None]) -> Decision | None:
        """What this verdict sets on the waiting share `key` (None: it waits for the GPU's rule)."""
        if any(s.key == key for s in self.admit):
            return "admitted"
        return "refused" if any(s.key == key for s, _ in self.refuse) else None


def plan_device(
    pool: str, device: str, shares: Sequence[MpsShare], recorded: TrustDomain | None = None
) -> DeviceVerdict:
    """Decide the waiting shares of one MPS GPU (pure) from its tenants' shares and the domain its DeviceTaintRule
    records (`recorded_domain`; None: no rule, or scope ``cluster``). The owner: see `DeviceVerdict.owner`. Waiting
    shares are decided only when the rule records the owner: those of the owner admitted, the others refused; while
    it records another (a stale rule, one to rewrite) or none, they wait for the rule to be written."""
    placed = sorted((s for s in shares if s.state in ("admitted", "holding")), key=_order)
    waiting = sorted((s for s in shares if s.state == "waiting"), key=_order)
    present = {s.domain for s in (*placed, *waiting)}
    owner: TrustDomain | None = None
    if placed:
        owner = recorded if recorded in {s.domain for s in placed} else placed[0].domain
    elif waiting:
        owner = recorded if recorded in present else waiting[0].domain
    stale = recorded is not None and recorded not in present
    verdict = DeviceVerdict(pool, device, owner, recorded, stale)
    admit: list[MpsShare] = []
    refuse: list[tuple[MpsShare, str]] = []
    if verdict.settled:
        assert owner is not None
        for share in waiting:
            if share.domain == owner:
                admit.append(share)
            else:
                refuse.append((share, conflict_message(share, owner, pool, device)))
    mixed = tuple(sorted({s.domain for s in placed} - {owner} if owner else set()))
    return DeviceVerdict(pool, device, owner, recorded, stale, tuple(admit), tuple(refuse), mixed)


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


def admin_message(pool: str, device: str) -> str:
    """The binding condition's message of an admin-access request on an MPS GPU."""
    return (
        f"this request has admin access to MPS GPU {device} of node {pool} (monitoring): it is not a tenant of the "
        "GPU's MPS daemon, belongs to no trust domain, and neither sets nor changes the domain the GPU serves"
    )


def rule_name(driver: str, pool: str, device: str) -> str:
    """The DeviceTaintRule of one MPS GPU (a DNS subdomain: driver, pool and device names are)."""
    return f"{driver}-mps-{pool}-{device}"


def taint_rule(driver: str, pool: str, device: str, owner: TrustDomain) -> dict[str, Any] | None:
    """The DeviceTaintRule that records `owner` as the domain the GPU serves and keeps every other domain off it;
    None for ``cluster`` (one domain: nothing to keep off, nothing to record)."""
    taint = owner.taint()
    if taint is None:
        return None
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(driver, pool, device),
            "labels": dict(RULE_LABELS),
            "annotations": {MPS_DOMAIN_ANNOTATION: owner.id},
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": device},
            "taint": {"key": taint[0], "value": taint[1], "effect": "NoSchedule"},
        },
    }


def rule_findings(desired: Mapping[str, Any], rule: TaintRuleView) -> list[str]:
    """How `rule` (the GPU's DeviceTaintRule as the API has it) differs from `desired` (`taint_rule`), in words;
    empty when it is as the controller writes it (the server's `timeAdded` is no difference)."""
    found = []
    want = desired["spec"]["deviceSelector"]
    if not rule.has_selector:
        found.append("it has no deviceSelector")
    elif (rule.driver, rule.pool, rule.device) != (want["driver"], want["pool"], want["device"]):
        fields = (
            f"{k}={v if v is not None else '<any>'}"
            for k, v in zip(want, (rule.driver, rule.pool, rule.device), strict=True)
        )
        found.append(f"its deviceSelector selects {', '.join(fields)}")
    taint = desired["spec"]["taint"]
    if (rule.taint.key, rule.taint.value, rule.taint.effect) != (taint["key"], taint["value"], taint["effect"]):
        found.append(f"its taint is {rule.taint.key}={rule.taint.value}:{rule.taint.effect}")
    domain = desired["metadata"]["annotations"][MPS_DOMAIN_ANNOTATION]
    if rule.mps_domain != domain:
        found.append(
            f"its annotation {MPS_DOMAIN_ANNOTATION} is missing"
            if rule.mps_domain is None
            else f"its annotation {MPS_DOMAIN_ANNOTATION} is {rule.mps_domain!r}"
        )
    for key, value in desired["metadata"]["labels"].items():
        if rule.labels.get(key) != value:
            have = rule.labels.get(key)
            found.append(f"its label {key} is missing" if have is None else f"its label {key} is {have!r}")
    return found


def recorded_domain(rule: TaintRuleView | None, driver: str, pool: str, device: str) -> TrustDomain | None:
    """The trust domain the GPU's DeviceTaintRule records: its annotation's, when the rule is exactly the one the
    controller writes for that domain; None without a rule, or for one that was changed (then the controller
    derives the domain again from the claims and writes the rule back)."""
    if rule is None or rule.mps_domain is None:
        return None
    try:
        domain = TrustDomain.parse(rule.mps_domain)
    except TrustDomainError:
        return None
    desired = taint_rule(driver, pool, device, domain)
    return domain if desired is not None and not rule_findings(desired, rule) else None


def _where(name: str, pool: str, device: str) -> str:
    return f"DeviceTaintRule {name} of MPS GPU {device} of node {pool}"


def _written(owner: TrustDomain) -> str:
    key, value = owner.taint() or ("", "")
    return f"taint {key}={value}:NoSchedule and annotation {MPS_DOMAIN_ANNOTATION}={owner.id}"


def edited_message(name: str, pool: str, device: str, owner: TrustDomain, findings: Sequence[str]) -> str:
    """The Event of a rule found edited and written back for `owner`."""
    return (
        f"{_where(name, pool, device)} was edited: {'; '.join(findings)}. It records the trust domain the GPU "
        f"serves and keeps other domains' claims off it, so the controller rewrote it for {owner.describe()} "
        f"({_written(owner)})"
    )


def deleted_message(name: str, pool: str, device: str, owner: TrustDomain) -> str:
    """The Event of a rule found deleted and created again for `owner`, the domain it recorded."""
    return (
        f"{_where(name, pool, device)} was deleted while it recorded {owner.describe()}. It keeps other domains' "
        f"claims off the GPU, so the controller created it again ({_written(owner)})"
    )


def rewritten_message(name: str, pool: str, device: str, recorded: TrustDomain, owner: TrustDomain) -> str:
    """The Event of a rule that records a domain no claim holding the GPU belongs to, rewritten for `owner`."""
    return (
        f"{_where(name, pool, device)} recorded {recorded.describe()}, a domain none of the claims that hold the GPU "
        f"belongs to. The controller rewrote it for {owner.describe()}, the domain of the earliest allocated of "
        f"them ({_written(owner)})"
    )


@dataclass(frozen=True)
class Room:
    """One published GPU as a pending claim sees it: its free memory and compute and, for an MPS GPU, the domain it
    serves."""

    pool: str
    device: str
    free: int
    mps: bool
    owner: TrustDomain | None = None
    compute: int = TOTAL
    """Its free compute in percent (the default, all of it: a device whose compute is not counted)."""

    def holds(self, memory: int, compute: int) -> bool:
        """Whether it has `memory` bytes and `compute` percent free."""
        return self.free >= memory and self.compute >= compute


def waiting_message(domain: TrustDomain, memory: int, rooms: Iterable[Room], compute: int = 0) -> str | None:
    """Why a pending claim of `domain` asking for `memory` bytes (and `compute` percent) waits, when only MPS GPUs of
    other trust domains have that much free among `rooms`, the GPUs it may use (pure); None when some GPU it may use
    has room, or none has."""
    listed = list(rooms)
    usable = [r for r in listed if r.holds(memory, compute) and (not r.mps or r.owner in (None, domain))]
    held = [r for r in listed if r.holds(memory, compute) and r.mps and r.owner not in (None, domain)]
    if usable or not held:
        return None
    where = ", ".join(f"{r.device} of node {r.pool} ({r.owner.describe() if r.owner else ''})" for r in held)
    return (
        f"this claim of {domain.describe()} waits: the GPUs with room for it are MPS GPUs that serve other trust "
        f"domains ({where}), and claims of two trust domains never share an MPS daemon. It is placed once a GPU it "
        "may use has room: an MPS GPU that is free or serves its domain, or, where its request allows one, a GPU "
        "that is no MPS GPU"
    )
