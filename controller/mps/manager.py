"""The MPS trust-domain manager: which claims sit on each MPS GPU, what is decided for the ones the scheduler waits
on (`entries`, read by the status writers), and each MPS GPU's DeviceTaintRule (kept by
`controller/mps/taint_rules.py`, a loop of its own, which this manager tells what changed).

Decisions are made here, one at a time on the event loop, and remembered until the claim's status shows them: a
claim decided but not yet written is never decided again from a stale index, so two claims of two domains are
never both admitted to one GPU. A restarted (or newly elected) controller reads the decisions back from the
claims' conditions; one that was never written is made again. Inactive (no entries, no rules) without ``--mps``.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION, TrustDomain, trust_domain
from api.quantity import to_bytes
from controller.core.claims import ClaimView, Share
from controller.core.context import ClaimKey, Context
from controller.core.slices import DeviceKey
from controller.devices.catalogue import DeviceCatalogue
from controller.mps.plan import (
    DeviceVerdict,
    MpsShare,
    Room,
    ShareState,
    admitted_message,
    conflict_message,
    plan_device,
    waiting_message,
)
from controller.mps.taint_rules import MpsTaintRules

log = logging.getLogger(__name__)
CONFLICT_REASON = "MpsTrustDomainConflict"
WAITING_REASON = "MpsTrustDomainWaiting"
ShareKey = tuple[str, str, str | None]
"""(claim uid, device, share ID)."""


@dataclass(frozen=True)
class MpsEntry:
    """What the status plan adds to the entry of one share on an MPS GPU."""

    domain: str
    """The claim's trust domain id (``data.mpsTrustDomain``)."""
    condition: dict[str, Any] | None = None
    """The binding condition decided (admitted or conflict), None when the share waits on nothing."""
    refused: str | None = None
    """The conflict's message when this share is refused (an Event is posted about it)."""


class MpsDomains:
    """MPS trust domains at scheduling, over the context's claim index and the device catalogue."""

    def __init__(self, context: Context, catalogue: DeviceCatalogue) -> None:
        self._context = context
        self._catalogue = catalogue
        self.enabled = context.settings.mps
        self._on: dict[DeviceKey, set[ClaimKey]] = {}
        self._of: dict[ClaimKey, tuple[str, set[DeviceKey]]] = {}  # claim -> (its uid, its MPS GPUs)
        self._decided: dict[ShareKey, ShareState] = {}
        self._taint_rules = MpsTaintRules(context, lambda: self._on, self._held_verdict)

    # ----- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self.enabled:
            self._taint_rules.start()

    async def stop(self) -> None:
        await self._taint_rules.stop()

    def reset(self) -> None:
        """New indexes bound: forget what was indexed (rebuilt from the claims as they are seen)."""
        self._on, self._of, self._decided = {}, {}, {}

    def resync(self) -> None:
        self._taint_rules.resync()

    # ----- what the indexes say ------------------------------------------------------------------------

    def is_mps(self, key: DeviceKey) -> bool:
        device = self._catalogue.devices().get(key)
        return bool(device is not None and device.attributes.get(self._context.driver, {}).get("mps"))

    def domain_of(self, claim: ClaimView) -> TrustDomain:
        settings = self._context.settings
        labels = (
            self._context.namespace_labels(claim.namespace) if settings.mps_trust_scope == "namespaceLabel" else None
        )
        return trust_domain(settings.mps_trust_scope, settings.mps_trust_label, claim.namespace, labels)

    def claim_changed(self, key: ClaimKey) -> None:
        """A claim was added, changed or removed (None in the index): re-index its MPS GPUs, mark them."""
        if not self.enabled:
            return
        claim = self._context.claim(key)
        now = (
            {s.device_key for s in claim.shares if self.is_mps(s.device_key)}
            if claim is not None and claim.allocated
            else set()
        )
        uid, before = self._of.pop(key, ("", set()))
        for device in before - now:
            self._on.get(device, set()).discard(key)
        for device in now:
            self._on.setdefault(device, set()).add(key)
        if now and claim is not None:
            self._of[key] = (claim.uid, now)
        gone = {uid} if uid and (claim is None or claim.uid != uid or not now) else set()
        if gone:  # deallocated, deleted or replaced: its decisions go with it
            self._decided = {k: v for k, v in self._decided.items() if k[0] not in gone}
        self._taint_rules.mark(before | now)

    def devices_changed(self) -> None:
        """The published devices changed (a GPU may have become an MPS GPU): re-index every claim."""
        if self.enabled:
            for key in self._context.claim_keys():
                self.claim_changed(key)
            self.resync()

    # ----- decisions -----------------------------------------------------------------------------------

    def _shares(self, device: DeviceKey) -> list[MpsShare]:
        out = []
        for key in sorted(self._on.get(device, ())):
            claim = self._context.claim(key)
            if claim is None:
                continue
            domain = self.domain_of(claim)
            for share in claim.shares:
                if share.device_key == device:
                    out.append(self._share(claim, share, domain))
        return out

    def _share(self, claim: ClaimView, share: Share, domain: TrustDomain) -> MpsShare:
        state: ShareState
        if not share.mps_binding:
            state = "holding"
        else:
            condition = claim.status_mps.get(share.entry_key)
            written: ShareState | None = None
            if condition is not None and condition.get("status") == "True":
                written = "admitted" if condition.get("type") == ADMITTED_CONDITION else "refused"
            state = written or self._decided.get((claim.uid, share.device, share.share_id), "waiting")
        return MpsShare(
            claim=claim.uid, namespace=claim.namespace, name=claim.name, pool=share.pool, device=share.device,
            share_id=share.share_id, domain=domain, state=state, allocated_at=claim.allocated_at,
        )  # fmt: skip

    def decide(self, device: DeviceKey) -> DeviceVerdict:
        """The verdict of one MPS GPU; its admissions and refusals are remembered until written."""
        verdict = plan_device(device[0], device[1], self._shares(device))
        for share in verdict.admit:
            self._decided[share.key] = "admitted"
        for share, _ in verdict.refuse:
            self._decided[share.key] = "refused"
        if verdict.mixed:
            log.error(
                "an MPS GPU holds claims of several trust domains (allocated without binding conditions): the node "
                "plugin refuses those of the other domains at prepare",
                extra={"device": "/".join(device), "serves": verdict.owner.id if verdict.owner else None,
                       "also": [d.id for d in verdict.mixed]},
            )  # fmt: skip
        return verdict

    def entries(self, claim: ClaimView, now: datetime.datetime) -> dict[tuple[str, str, str], MpsEntry]:
        """Entry key -> what the status plan adds, for each share of `claim` on an MPS GPU (deciding the ones the
        scheduler waits on)."""
        if not self.enabled or not claim.allocated:
            return {}
        out: dict[tuple[str, str, str], MpsEntry] = {}
        domain = self.domain_of(claim)
        verdicts: dict[DeviceKey, DeviceVerdict] = {}
        for share in claim.shares:
            if not self.is_mps(share.device_key):
                continue
            if not share.mps_binding:
                out[share.entry_key] = MpsEntry(domain.id)
                continue
            if share.device_key not in verdicts:
                verdicts[share.device_key] = self.decide(share.device_key)
            owner = verdicts[share.device_key].owner
            existing = claim.status_mps.get(share.entry_key)
            state = self._decided.get((claim.uid, share.device, share.share_id))
            if state is None or owner is None:  # decided and written before (by this leader or another): kept
                out[share.entry_key] = MpsEntry(domain.id, existing)
                continue
            kind = CONFLICT_CONDITION if state == "refused" else ADMITTED_CONDITION
            refused = (
                conflict_message(self._share(claim, share, domain), owner, share.pool, share.device)
                if state == "refused"
                else None
            )
            if existing is not None and existing.get("type") == kind:
                out[share.entry_key] = MpsEntry(domain.id, existing, refused)
                continue
            message = refused or admitted_message(owner, share.pool, share.device)
            out[share.entry_key] = MpsEntry(domain.id, _condition(kind, message, now), refused)
        return out

    def waiting(self, claim: ClaimView) -> list[tuple[str, str]]:
        """(request, message) for each request of a pending `claim` that waits only because the GPUs with room
        for it are MPS GPUs of other trust domains (free memory as the ledger has it)."""
        if not self.enabled or claim.allocated or not claim.memory_requests:
            return []
        rooms = []
        for key in self._catalogue.devices():
            name = self._catalogue.object_name(key)
            existing = self._context.gpu(name) if name else None
            free = (existing.status or {}).get("freeMemory") if existing is not None else None
            if free is not None:
                mps = self.is_mps(key)
                rooms.append(Room(key[0], key[1], to_bytes(free), mps, self.owner(key) if mps else None))
        domain = self.domain_of(claim)
        out = []
        for alternatives in claim.memory_requests:
            smallest = min(alternatives, key=lambda m: m.memory or 0)  # memory_requests: every memory is set
            if (message := waiting_message(domain, smallest.memory or 0, rooms)) is not None:
                out.append((smallest.request, message))
        return out

    def owner(self, device: DeviceKey) -> TrustDomain | None:
        """The trust domain an MPS GPU serves (None: no claim, or not an MPS GPU)."""
        if not self.enabled or not self._on.get(device):
            return None
        return plan_device(device[0], device[1], self._shares(device)).owner

    def owner_id(self, device: DeviceKey) -> str | None:
        """`owner` as its id (for the ledger)."""
        owner = self.owner(device)
        return owner.id if owner is not None else None

    def _held_verdict(self, device: DeviceKey) -> DeviceVerdict | None:
        """The verdict of an MPS GPU that holds claims (for its DeviceTaintRule); None when it holds none."""
        return plan_device(device[0], device[1], self._shares(device)) if self._on.get(device) else None


def _condition(kind: str, message: str, now: datetime.datetime) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": "Admitted" if kind == ADMITTED_CONDITION else "OtherTrustDomain",
        "message": message[:32768],
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def refusals(entries: Mapping[tuple[str, str, str], MpsEntry]) -> list[tuple[tuple[str, str, str], str]]:
    """The refused shares among `entries`, with the conflict's message (for the claim's Event)."""
    return [(key, entry.refused) for key, entry in entries.items() if entry.refused]
