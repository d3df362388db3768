"""One claim's prepare as a transaction over its kinds: acquire in order, write, and on any failure undo in reverse.

``ClaimSteps.prepare`` runs, for one claim: the device check against its checkpoint entry; the MIG kind's acquire
(its partitions, ``kinds/mig/partitions.py``: each one made is an acquisition); the pure plan
(``prepare/plan.py``); the MPS kind's admission (``kinds/mps/shares.py``: trust domain, daemon, ceiling); the
claim's files (``state/claim_files.py``: a new claim's files are an acquisition, removed on undo); the
``/dev/char`` links. A step that fails undoes every acquisition of the claim in reverse order and raises its
PrepareError; the caller (``preparer``) keeps the ``ClaimTransaction`` of a claim it prepared so that a failed
checkpoint save undoes it too. A claim whose MPS GPU's daemon was asked to switch to its trust domain raises
``ClaimWaitingError`` (a PrepareError) after undoing its acquisitions, carrying the entry that holds the GPU for its
domain meanwhile; a caller that does not wait answers with that error. Callers hold the node lock.

May import: ``prepare/plan.py``, ``kinds``, ``enforcement``, ``state``, ``core``, ``api``.
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot, ensure_char_links
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import GpuInfo, MigRecord, PreparedDevice
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.tiers import GpuTiers
from kubelet_plugin.kinds.mig.partitions import Partitioner
from kubelet_plugin.kinds.mps.shares import DomainSwitchPendingError, MpsShares
from kubelet_plugin.prepare.plan import ClaimPlan, HostFacts, plan_claim
from kubelet_plugin.state import cdi
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointDevice, ClaimEntry
from kubelet_plugin.state.claim_files import ClaimStore

log = logging.getLogger(__name__)


@dataclass
class ClaimTransaction:
    """A claim's acquisitions on the host, each with its undo, in the order they were made."""

    claim_uid: str
    _undo: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def acquired(self, what: str, undo: Callable[[], None]) -> None:
        """Record an acquisition (`what`, for the log) and how to give it back."""
        self._undo.append((what, undo))

    def undo(self) -> bool:
        """Give back every acquisition, the last first; a failure is logged (recovery removes what remains).
        Whether there was anything to give back."""
        had = bool(self._undo)
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as err:
                log.error(
                    "cannot undo a step of a failed prepare",
                    extra={"claim": self.claim_uid, "what": what, "error": str(err)},
                )
        return had


@dataclass(frozen=True)
class CallFacts:
    """What every claim of one call reads of the node once: the device nodes and the tiers each GPU offers; and how
    to get the driver edits (None with ``--driver-edits=none``; raises PrepareError, that claim's error)."""

    nodes: DeviceNodeSnapshot
    tiers: Mapping[str, GpuTiers]
    driver_edits: Callable[[], cdi.ContainerEdits | None]


class ClaimWaitingError(PrepareError):
    """The claim waits for its MPS GPU's daemon to serve its trust domain (`switch`); `entry`: its checkpoint entry
    meanwhile, which holds the GPU for its domain: a claim prepared before keeps its entry (its files and containers
    stay), a new one's is ``PrepareStarted`` with no files until the switch's `until`."""

    def __init__(self, switch: DomainSwitchPendingError, entry: ClaimEntry) -> None:
        super().__init__(switch.kind, str(switch))
        self.switch, self.entry = switch, entry


@dataclass(frozen=True)
class PreparedClaim:
    """A claim prepared: the API object, its plan, its completed checkpoint entry and the transaction that wrote
    it."""

    claim: dict[str, Any]
    plan: ClaimPlan
    entry: ClaimEntry
    partitions: Mapping[str, MigRecord]
    transaction: ClaimTransaction

    @property
    def claim_uid(self) -> str:
        return str(self.claim["metadata"]["uid"])

    @property
    def devices(self) -> tuple[PreparedDevice, ...]:
        return self.plan.devices

    def tiers(self) -> dict[tuple[str, str, str | None], str]:
        """The tier of each (pool, device, shareID), for the claim's status."""
        return {(pool, device, share): tier for pool, device, share, tier in self.plan.tiers}

    def admin_on_mps(self) -> frozenset[tuple[str, str, str | None]]:
        """The (pool, device, shareID) of its adminAccess results on MPS GPUs, for the claim's status."""
        return self.plan.admin_on_mps

    def partitions_by_key(self) -> dict[tuple[str, str, str | None], MigRecord]:
        """The MIG partition of each (pool, device, shareID) that is one, for the claim's status."""
        return {
            (d.pool_name, d.device_name, d.share_id): self.partitions[d.device_name]
            for d in self.plan.devices
            if d.device_name in self.partitions
        }


class ClaimSteps:
    """The steps of one claim's prepare over this node's kinds (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        gpus: Mapping[str, GpuInfo],
        partitions: Partitioner,
        mps: MpsShares,
        files: ClaimStore,
    ) -> None:
        self._settings = settings
        self._gpus = gpus
        self._partitions = partitions
        self._mps = mps
        self._files = files

    def prepare(
        self, claim: dict[str, Any], prepared: ClaimEntry | None, facts: CallFacts, checkpoint: Checkpoint
    ) -> PreparedClaim:
        """Prepare `claim` (`prepared`: its checkpoint entry, `checkpoint`: the other claims prepared); raises
        PrepareError after undoing what it acquired. A device that is now another physical GPU than when it was
        prepared (NVML indices shift when a GPU disappears) is refused rather than handed out."""
        uid: str = claim["metadata"]["uid"]
        self._check_devices(prepared)
        txn = ClaimTransaction(uid)
        try:
            partitions, made = self._partitions.make(claim, prepared) if self._partitions.devices else ({}, [])
            for record in made:
                txn.acquired(f"MIG partition {record.uuid}", partial(self._partitions.undo, [record]))
            host = HostFacts(
                gpus=self._gpus,
                nodes=self._partitions.with_cap_nodes(facts.nodes, partitions) if partitions else facts.nodes,
                tiers=facts.tiers,
                driver_edits=facts.driver_edits(),
                mig_devices=self._partitions.devices,
                partitions=partitions,
                hami_core_installed=self._settings.hami_core_library.is_file(),  # as the publisher says
            )
            plan = plan_claim(claim, self._settings, host)
            records = {name: p.record for name, p in partitions.items()}
            try:
                for uuid, grants in (plan.mps_grants or {}).items():
                    assert plan.mps_domain is not None
                    self._mps.admit(uuid, plan.mps_domain, list(grants), uid, checkpoint)
            except DomainSwitchPendingError as switch:
                holding = prepared if prepared is not None and prepared.state == "PrepareCompleted" else None
                entry = holding or self._entry(claim, plan, records).waiting_until(switch.until)
                raise ClaimWaitingError(switch, entry) from None
            self._write(uid, plan, new=prepared is None or prepared.state != "PrepareCompleted", txn=txn)
        except Exception:
            txn.undo()
            raise
        if plan.spec is not None:
            ensure_char_links(self._settings.dev_char_dir, list(plan.nodes))
        return PreparedClaim(claim, plan, self._entry(claim, plan, records), records, txn)

    def _entry(self, claim: dict[str, Any], plan: ClaimPlan, records: Mapping[str, MigRecord]) -> ClaimEntry:
        """The claim's checkpoint entry once prepared as `plan` says, with its MIG partitions `records`."""
        return ClaimEntry(
            namespace=claim["metadata"]["namespace"],
            name=claim["metadata"]["name"],
            state="PrepareCompleted",
            devices=[
                CheckpointDevice.from_prepared(d, self._gpu_uuid(d.device_name), records.get(d.device_name))
                for d in plan.devices
            ],
            mps_trust_domain=plan.mps_domain.id if plan.mps_domain is not None else None,
        )

    def _check_devices(self, prepared: ClaimEntry | None) -> None:
        for device in prepared.devices if prepared else []:
            now = self._gpus.get(device.device_name)
            if device.mig is None and device.uuid and now is not None and now.uuid != device.uuid:
                raise PrepareError(
                    ErrorKind.DEVICE_CHANGED,
                    f"{device.device_name} was GPU {device.uuid} when this claim was prepared and is now "
                    f"{now.uuid}: the node's GPUs changed; delete the pod so its claim is allocated again",
                )

    def _write(self, uid: str, plan: ClaimPlan, *, new: bool, txn: ClaimTransaction) -> None:
        """Write the claim's files; a new claim's are an acquisition (an orphan until its entry is saved)."""
        if plan.spec is None:
            return
        try:
            self._files.write(uid, plan.spec, plan.claim_files(), hami_core=plan.hami_core)
        except OSError as err:
            raise PrepareError(
                ErrorKind.INTERNAL, f"cannot write CDI spec or info files for claim {uid}: {err}"
            ) from None
        finally:
            if new:
                txn.acquired("the claim's files", lambda: self._files.remove(uid))

    def _gpu_uuid(self, device: str) -> str:
        """The physical GPU of a device: a GPU's own UUID, a partition's GPU's."""
        partition = self._partitions.devices.get(device)
        return partition.gpu.uuid if partition is not None else self._gpus[device].uuid
