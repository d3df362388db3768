"""The MPS trust-domain manager: the verdict of each MPS GPU, what the status writers write for the shares the
scheduler waits on (`entries`), and why a pending claim waits (`waiting`); each GPU's DeviceTaintRule is kept by
`controller/mps/taint_rules.py`, a loop of its own, which this manager tells what changed.

The domain an MPS GPU serves is a fact in the API with one writer: its DeviceTaintRule's annotation
(`controller/mps/plan.py` `recorded_domain`), read from kopf's index of DeviceTaintRules. A verdict is derived from
that rule and the claims on the GPU (the shared claim index, `controller/devices/claim_index.py`) with their
written conditions, nothing else: a waiting share is admitted only when the rule records its domain, refused when it
records another, and waits while the GPU has no rule (the loop creates it). So every status writer, a restarted
controller and a newly elected one derive the same decisions from the API alone, and this manager remembers none.
With scope ``cluster`` every claim is of one domain: no rule, every waiting tenant is admitted. An admin-access share
(monitoring) is no tenant: it has no domain, takes no part in a verdict, and is admitted. Inactive without ``--mps``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from api.compute import TOTAL
from api.mig import TYPE_GPU
from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION, TrustDomain, trust_domain
from controller.core.claims import ClaimView, GpuRequest, Share
from controller.core.context import ClaimKey, Context
from controller.core.slices import DeviceKey, DeviceRecord, TaintRuleView
from controller.devices.catalogue import DeviceCatalogue
from controller.devices.claim_index import ClaimIndex
from controller.mps.plan import (
    DeviceVerdict,
    MpsShare,
    Room,
    ShareState,
    admin_message,
    admitted_message,
    plan_device,
    recorded_domain,
    rule_name,
    waiting_message,
)
from controller.mps.taint_rules import MpsTaintRules

CONFLICT_REASON = "MpsTrustDomainConflict"
WAITING_REASON = "MpsTrustDomainWaiting"
_FROM_INDEX: Any = object()


@dataclass(frozen=True)
class MpsEntry:
    """What the status plan adds to the entry of one share on an MPS GPU."""

    domain: str | None
    """The claim's trust domain id (``data.mpsTrustDomain``); None for admin access (no domain)."""
    condition: dict[str, Any] | None = None
    """The binding condition decided (admitted or conflict), None when the share waits on nothing (or still
    waits for the GPU's rule)."""
    refused: str | None = None
    """The conflict's message when this share is refused (an Event is posted about it)."""


class MpsDomains:
    """MPS trust domains at scheduling, over the context's indexes, the claim index and the device catalogue."""

    def __init__(self, context: Context, catalogue: DeviceCatalogue, claims: ClaimIndex) -> None:
        self._context = context
        self._catalogue = catalogue
        self._claims = claims
        self.enabled = context.settings.mps
        self.rules = MpsTaintRules(context, self._mps_devices, self.verdict)
        """The loop that keeps each MPS GPU's DeviceTaintRule."""
        self._rule_names: tuple[object, dict[str, DeviceKey]] = (None, {})  # (devices, rule name -> MPS GPU)

    def start(self) -> None:
        if self.enabled:
            self.rules.start()

    async def stop(self) -> None:
        await self.rules.stop()

    def resync(self) -> None:
        """Look at every MPS GPU's rule (start of leadership, resync, the published devices changed)."""
        self.rules.resync()

    # ----- events ------------------------------------------------------------------------------------------

    def claims_moved(self, devices: frozenset[DeviceKey]) -> None:
        """A claim on `devices` changed (the claim index is updated): their rules may need a change."""
        if self.enabled:
            self.rules.mark(d for d in devices if self.is_mps(d))

    def rule_changed(self, name: str, *, deleted: bool, recorded: str | None) -> frozenset[ClaimKey]:
        """The DeviceTaintRule `name` changed (its index entry is updated); `recorded`: the domain annotation of a
        deleted one. Returns the claims on its MPS GPU, whose waiting shares its verdict may now decide."""
        if not self.enabled:
            return frozenset()
        devices = self._catalogue.devices()
        if self._rule_names[0] is not devices:  # the published devices changed (the catalogue's mapping is new)
            self._rule_names = (devices, {rule_name(self._context.driver, *d): d for d in self._mps_devices()})
        device = self._rule_names[1].get(name)
        if device is None:
            return frozenset()
        if deleted:
            self.rules.deleted(name, device, recorded)
        else:
            self.rules.mark([device])
        return self._claims.claims_on(device)

    # ----- what the indexes say ------------------------------------------------------------------------------

    def is_mps(self, key: DeviceKey) -> bool:
        device = self._catalogue.devices().get(key)
        return bool(device is not None and device.attributes.get(self._context.driver, {}).get("mps"))

    def _mps_devices(self) -> list[DeviceKey]:
        """The published MPS GPUs (none without ``--mps``: nothing to keep)."""
        return [k for k in self._catalogue.devices() if self.is_mps(k)] if self.enabled else []

    def domain_of(self, claim: ClaimView) -> TrustDomain:
        settings = self._context.settings
        labels = (
            self._context.namespace_labels(claim.namespace) if settings.mps_trust_scope == "namespaceLabel" else None
        )
        return trust_domain(settings.mps_trust_scope, settings.mps_trust_label, claim.namespace, labels)

    def recorded(self, device: DeviceKey, rule: TaintRuleView | None) -> TrustDomain | None:
        """The domain `rule` records for `device` (`recorded_domain`). One left by a controller of another scope
        records a domain no claim belongs to now: it is stale, and deleted."""
        return recorded_domain(rule, self._context.driver, *device)

    def verdict(self, device: DeviceKey, rule: TaintRuleView | None = _FROM_INDEX) -> DeviceVerdict:
        """The verdict of one MPS GPU over its rule (default: as kopf's index shows it)."""
        if rule is _FROM_INDEX:
            rule = self._context.taint_rule(rule_name(self._context.driver, *device))
        shares = []
        for key in sorted(self._claims.claims_on(device)):
            claim = self._context.claim(key)
            if claim is None:
                continue
            domain = self.domain_of(claim)
            shares += [_tenant(claim, s, domain) for s in claim.shares if s.device_key == device and not s.admin_access]
        return plan_device(device[0], device[1], shares, self.recorded(device, rule))

    def serving(self, device: DeviceKey) -> TrustDomain | None:
        """The domain an MPS GPU serves: the one its rule records (scope ``cluster``: ``cluster`` while tenants
        hold or wait for it); None for a GPU that serves none, or that is not an MPS GPU."""
        if not self.enabled or not self.is_mps(device):
            return None
        if self._context.settings.mps_trust_scope != "cluster":
            return self.recorded(device, self._context.taint_rule(rule_name(self._context.driver, *device)))
        return self.verdict(device).serves if self._claims.claims_on(device) else None

    def serving_id(self, device: DeviceKey) -> str | None:
        """`serving` as its id (for the ledger's `mpsTrustDomain`)."""
        domain = self.serving(device)
        return domain.id if domain is not None else None

    # ----- what the status writers write ---------------------------------------------------------------------

    def entries(self, claim: ClaimView, now: datetime.datetime) -> dict[tuple[str, str, str], MpsEntry]:
        """Entry key -> what the status plan adds, for each share of `claim` on an MPS GPU. A condition written
        stands; a waiting share gets what its GPU's verdict decides (nothing while the GPU has no rule)."""
        if not self.enabled or not claim.allocated:
            return {}
        out: dict[tuple[str, str, str], MpsEntry] = {}
        domain = self.domain_of(claim)
        verdicts: dict[DeviceKey, DeviceVerdict] = {}
        for share in claim.shares:
            if not self.is_mps(share.device_key):
                continue
            existing = claim.status_mps.get(share.entry_key)
            written = existing if existing is not None and existing.get("status") == "True" else None
            if share.admin_access:
                message = admin_message(share.pool, share.device)
                admitted = written or _condition(ADMITTED_CONDITION, message, now, "AdminAccess")
                out[share.entry_key] = MpsEntry(None, admitted if share.mps_binding else None)
            elif not share.mps_binding:
                out[share.entry_key] = MpsEntry(domain.id)
            elif written is not None:
                refused = str(written.get("message", "")) if written.get("type") == CONFLICT_CONDITION else None
                out[share.entry_key] = MpsEntry(domain.id, written, refused)
            else:
                if share.device_key not in verdicts:
                    verdicts[share.device_key] = self.verdict(share.device_key)
                out[share.entry_key] = _decided(
                    verdicts[share.device_key], claim=claim, share=share, domain=domain, existing=existing, now=now
                )
        return out

    def waiting(
        self, claim: ClaimView, selected: Callable[[GpuRequest, DeviceRecord], bool] = lambda *_: True
    ) -> list[tuple[str, str]]:
        """(request, message) for each request of a pending `claim` that waits only because the GPUs with room
        for it are MPS GPUs of other trust domains (free memory, and on a shared GPU free compute, as the ledger has
        them: `DeviceCatalogue.free`; domains as the GPUs' rules record them). `selected`: whether the request's
        selectors leave it a device (of its DeviceClass: the MPS class only MPS GPUs); only those count."""
        if not self.enabled or claim.allocated or not claim.memory_requests:
            return []
        known = []
        for key, device in self._catalogue.devices().items():
            if (free := self._catalogue.free(key)) is not None:
                mps = self.is_mps(key)
                shared = device.kind == TYPE_GPU and device.allow_multiple  # a partition's figures are its GPU's
                owner = self.serving(key) if mps else None
                known.append((device, Room(key[0], key[1], free[0], mps, owner, free[1] if shared else TOTAL)))
        domain = self.domain_of(claim)
        out = []
        for alternatives in claim.memory_requests:
            asks = [(m, m.memory or 0, m.compute or 0) for m in alternatives]  # memory_requests: every memory is set
            usable = (
                (m, d) for m, memory, compute in asks for d, r in known
                if r.holds(memory, compute) and (not r.mps or r.owner in (None, domain))
            )  # fmt: skip
            if any(selected(m, d) for m, d in usable):  # the cheap answer first: most claims have room
                continue
            for m, memory, compute in asks:
                held = [r for d, r in known if r.mps and r.owner not in (None, domain) and selected(m, d)]
                if (message := waiting_message(domain, memory, held, compute)) is not None:
                    out.append((m.request, message))
                    break
        return out


def _tenant(claim: ClaimView, share: Share, domain: TrustDomain) -> MpsShare:
    state: ShareState = "holding"
    if share.mps_binding:
        condition = claim.status_mps.get(share.entry_key)
        state = "waiting"
        if condition is not None and condition.get("status") == "True":
            state = "admitted" if condition.get("type") == ADMITTED_CONDITION else "refused"
    return MpsShare(
        claim=claim.uid, namespace=claim.namespace, name=claim.name, pool=share.pool, device=share.device,
        share_id=share.share_id, domain=domain, state=state, allocated_at=claim.allocated_at,
    )  # fmt: skip


def _decided(
    verdict: DeviceVerdict,
    *,
    claim: ClaimView,
    share: Share,
    domain: TrustDomain,
    existing: dict[str, Any] | None,
    now: datetime.datetime,
) -> MpsEntry:
    """The entry of a waiting tenant share: the verdict's decision as a condition, or none while the GPU waits
    for its rule."""
    key = (claim.uid, share.device, share.share_id)
    decision = verdict.decision(key)
    if decision is None or verdict.owner is None:
        return MpsEntry(domain.id, existing)
    if decision == "admitted":
        message = admitted_message(verdict.owner, share.pool, share.device)
        return MpsEntry(domain.id, _condition(ADMITTED_CONDITION, message, now))
    refused = next(m for s, m in verdict.refuse if s.key == key)
    return MpsEntry(domain.id, _condition(CONFLICT_CONDITION, refused, now), refused)


def _condition(kind: str, message: str, now: datetime.datetime, reason: str | None = None) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason or ("Admitted" if kind == ADMITTED_CONDITION else "OtherTrustDomain"),
        "message": message[:32768],
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def refusals(entries: Mapping[tuple[str, str, str], MpsEntry]) -> list[tuple[tuple[str, str, str], str]]:
    """The refused shares among `entries`, with the conflict's message (for the claim's Event)."""
    return [(key, entry.refused) for key, entry in entries.items() if entry.refused]
