"""NodePrepareResources / NodeUnprepareResources for fracgpu: claims in, CDI specs and a checkpoint out.

The Preparer orchestrates; each step has its own module: read the claims (``reader``), hold the node lock
(``node_lock``), load and save the checkpoint (``journal``), plan each claim (``plan``, pure, from a device-node
snapshot, ``devicenodes``), admit its MPS shares to their GPU's daemon (``mps_shares``), write or remove its
files (``store``), report Ready (``ready_writer``).

Contract (the kubelet's): every claim in a call gets an answer; a problem with one claim is that claim's
error, never an exception for the call. Prepare is idempotent (a repeat gives the same answer and re-writes
the CDI spec, which a reboot may have wiped); unprepare of an unknown claim succeeds. All checkpoint and
spec changes happen under one lock shared by every plugin instance on the node.

Crash safety. Invariant after ``recover()``: every checkpoint entry is ``PrepareCompleted``, and the set of
claims with devices in the checkpoint equals the set of this driver's spec files (no temp files either).
Each call writes the checkpoint once, durably, and orders its steps so that a crash anywhere leaves a state
``recover()`` repairs:
- prepare writes the claims' files and specs first, then saves the checkpoint with their ``PrepareCompleted``
  entries; a spec without an entry is an orphan that recover deletes, and the kubelet's retry of the prepare
  writes it again. (A ``PrepareStarted`` entry, written by plugins before this order, is dropped by recover
  with its spec.)
- unprepare saves the checkpoint without the claims first, then deletes their files; recover deletes a spec
  without entry (an orphan), and the kubelet's retry of the now unknown claim succeeds;
- a ``PrepareCompleted`` entry whose spec is missing (reboot, power loss, or deleted) gets it re-written from
  the API claim; a claim that is gone or was replaced is dropped. When the spec cannot be restored (API server
  unreachable or failing, device changed, claim no longer allocated) the entry is kept and logged: the
  kubelet's next prepare of the claim re-writes the spec (or returns the reason), and so does the next
  ``recover()`` once the API server answers. Until then a container restart of a pod using it cannot find
  its CDI device.

MIG partitions (``partitions``): a claim's partitions are made before its files are written and recorded in the
same entry; unprepare destroys them before the entry goes; recovery destroys instances no entry owns and makes
again those of entries whose partitions are gone (see ``partitions``'s docstring for why every crash is
repaired).

A checkpoint of a newer schema is never touched: recover posts a ``CheckpointTooNew`` Event and changes
nothing, and prepare/unprepare fail every claim with what to do, while the plugin keeps running.

Deadlines: the kubelet gives a call 45 s. A prepare reads its claims concurrently, each within the API
budget (`api_timeout_seconds`, retries included), waits at most `node_lock_timeout_seconds` for the lock,
and writes the claims' Ready condition after answering.
"""

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from api.kube_rest import KubeConnection, KubeRest
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import ClaimRef, GpuInfo, MigGpu, MigRecord, PreparedDevice, PrepareResult
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.enforcement.tiers import GpuTiers
from kubelet_plugin.mps.control import MpsControlError
from kubelet_plugin.prepare import cdi
from kubelet_plugin.prepare.checkpoint import (
    Checkpoint,
    CheckpointDevice,
    CheckpointStore,
    ClaimEntry,
    NewerSchemaError,
)
from kubelet_plugin.prepare.devicenodes import DeviceNodeSnapshot, ensure_char_links, snapshot
from kubelet_plugin.prepare.driver_edits import DriverEdits, DriverEditsError
from kubelet_plugin.prepare.errors import ErrorKind, PrepareError
from kubelet_plugin.prepare.journal import ClaimJournal
from kubelet_plugin.prepare.mig import MigManager, NvmlMig
from kubelet_plugin.prepare.mps_shares import MpsShares
from kubelet_plugin.prepare.node_lock import NodeLock, NodeLockTimeoutError
from kubelet_plugin.prepare.partitions import Partitioner
from kubelet_plugin.prepare.plan import ClaimPlan, plan_claim
from kubelet_plugin.prepare.reader import ClaimReader, show
from kubelet_plugin.prepare.ready_writer import ReadyReporter
from kubelet_plugin.prepare.status import Partitions, Tiers
from kubelet_plugin.prepare.store import ClaimStore

log = logging.getLogger(__name__)

#: ``() -> the device nodes as they are now`` (``devicenodes.snapshot`` of this node's GPUs by default).
DeviceNodes = Callable[[], DeviceNodeSnapshot]


class Preparer:
    """Implements the gRPC server's ClaimPreparer for the GPUs of this node."""

    def __init__(
        self,
        api: KubeConnection,
        settings: Settings,
        gpus: list[GpuInfo],
        store: CheckpointStore,
        metrics: PluginMetrics,
        *,
        driver_edits: DriverEdits | None = None,
        enforcement: EnforcementDetector | None = None,
        device_nodes: DeviceNodes | None = None,
        mps: MpsShares | None = None,
        mig: Mapping[str, MigGpu] | None = None,
        mig_manager: MigManager | None = None,
    ) -> None:
        """``driver_edits``: required with ``settings.driver_edits == "toolkit"``, read (never generated) per
        prepare. ``enforcement``: the tiers each GPU offers (default: HAMi-core where its library is, no nvml).
        ``device_nodes``: where the device nodes are read from (default: stat-ed under the driver root).
        ``mps``: the MPS GPUs' daemons (default: through the driver's control client).
        ``mig``: the MIG GPUs (``--mig-gpus``) by device name, as discovered; ``mig_manager``: makes and
        destroys their partitions (default: through NVML)."""
        rest = KubeRest.bounded(api, settings.api_timeout_seconds)
        self._settings = settings
        self._gpus = {g.device_name: g for g in gpus}
        self._metrics = metrics
        self._driver_edits = driver_edits
        self._enforcement = enforcement or EnforcementDetector.without_nvml(settings, gpus, "nvml was not detected")
        minors = sorted(g.minor for g in gpus)
        self._device_nodes = device_nodes or (lambda: snapshot(settings.driver_root, minors))
        self._reader = ClaimReader(rest, settings.api_timeout_seconds)
        self._files = ClaimStore(settings)
        self._mps = mps or MpsShares(settings)
        self._partitions = Partitioner(
            gpus,
            mig or {},
            mig_manager or (NvmlMig() if mig else None),
            node=settings.node_name,
            driver=settings.driver_name,
            driver_root=settings.driver_root,
            minors_file=settings.mig_minors_file,
            proc_devices=settings.proc_devices_file,
        )
        self._journal = ClaimJournal(
            store, self._files, rest=rest, node_name=settings.node_name, driver=settings.driver_name, metrics=metrics
        )
        self._ready = ReadyReporter(
            rest,
            settings.driver_name,
            settings.node_name,
            lambda: metrics.errors.labels("prepare", ErrorKind.STATUS_UPDATE).inc(),
        )
        self.node_lock = NodeLock(settings.lock_path, settings.node_lock_timeout_seconds, metrics.lock_timeouts.inc)
        """The node-wide lock every call holds while it changes files (public for tests that hold it)."""
        self.device_nodes = self._device_nodes
        """Where this preparer reads the device nodes from (health.source.DeviceHealth reads the same)."""

    # -- lifecycle ---------------------------------------------------------------------------------

    def recover(self) -> None:
        """At start, establish the module's invariant: load the checkpoint (a corrupt one is reported and
        rebuilt), drop claims whose prepare never completed together with their specs, delete files no entry
        owns and temp files of interrupted writes, and re-write missing specs of completed claims (every
        spec after a reboot). A checkpoint of a newer schema is reported and left alone, as are the specs."""
        with self.node_lock.hold(bounded=False):
            try:
                checkpoint = self._journal.load()
            except NewerSchemaError:
                return  # reported by load; prepare and unprepare refuse until the plugin is upgraded back
            for uid, entry in list(checkpoint.claims.items()):
                if entry.state != "PrepareCompleted":
                    log.warning("dropping half-prepared claim", extra={"claim": uid, "claim_name": entry.name})
                    checkpoint = checkpoint.without_claim(uid)
            partitions_gone = self._partitions.sweep(checkpoint)
            specs = self._files.spec_uids()
            for what, which in self._files.remove_orphans(set(checkpoint.claims)):
                log.warning("removed an orphaned file of a claim", extra={"what": what, "claim": which})
            for tmp in self._journal.remove_temp_files():
                log.warning("removed a temp file of an interrupted write", extra={"path": tmp})
            if checkpoint.node_boot_id != self._journal.boot_id:
                restored = self._restore_specs(checkpoint, list(checkpoint.claims), "the node rebooted")
                checkpoint = restored.with_boot_id(self._journal.boot_id)
            else:
                missing = [uid for uid, e in checkpoint.claims.items() if e.devices and uid not in specs]
                checkpoint = self._restore_specs(checkpoint, missing, "its CDI spec is missing")
                gone = [uid for uid in partitions_gone if uid not in missing]
                checkpoint = self._restore_specs(checkpoint, gone, "its MIG partition is gone")
            self._journal.save(checkpoint)
            self._metrics.prepared_claims.set(len(checkpoint.claims))

    def _restore_specs(self, checkpoint: Checkpoint, uids: list[str], why: str) -> Checkpoint:
        """Re-write the specs of completed claims ``uids`` from their API objects; drop claims that are gone.

        A claim that cannot be restored now keeps its entry (see the module docstring). After the first API
        error the remaining claims are not fetched: the server is unreachable or refusing, and each attempt
        could take the client's full timeout while the plugin is not yet serving the kubelet.
        """
        api_failure: PrepareError | None = None
        nodes, offered = self._device_nodes(), self._enforcement.tiers()
        for uid in sorted(uids):
            entry = checkpoint.claims[uid]
            what = {"claim": uid, "claim_name": f"{entry.namespace}/{entry.name}", "why": why}
            if api_failure is not None:
                log.warning(
                    "cannot restore the CDI spec of a claim now: not fetched after an API failure",
                    extra={**what, "error": str(api_failure)},
                )
                continue
            try:
                claim = self._reader.read(ClaimRef(namespace=entry.namespace, name=entry.name, uid=uid))
                devices, _, partitions, _, domain = self._write(claim, entry, nodes, offered, checkpoint)
                restored = self._entry(entry.namespace, entry.name, devices, partitions, domain)
                checkpoint = checkpoint.with_claim(uid, restored)
            except PrepareError as err:
                if err.kind.claim_gone:  # nothing to restore
                    log.warning("claim gone; dropping it", extra={**what, "error": str(err)})
                    self._files.remove(uid)
                    checkpoint = checkpoint.without_claim(uid)
                    continue
                if err.kind.api_unavailable:
                    api_failure = err
                log.warning(
                    "cannot restore the CDI spec of a claim now; the kubelet's next prepare of it re-writes it",
                    extra={**what, "error": str(err)},
                )
            except Exception as err:  # a restart must not crash-loop on one claim
                log.exception("cannot restore the CDI spec of a claim", extra={**what, "error": str(err)})
            else:
                log.info("restored the CDI spec of a claim", extra=what)
        return checkpoint

    # -- ClaimPreparer -----------------------------------------------------------------------------

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare each claim; see the module contract and its deadlines."""
        with self._measure("prepare"):
            fetched = self._reader.read_all(claims)  # outside the lock: API round trips must not serialise calls
            results: dict[str, PrepareResult] = {}
            ready: list[tuple[dict[str, Any], Tiers, Partitions]] = []
            made: list[MigRecord] = []
            try:
                with self.node_lock.hold():
                    checkpoint = self._journal.load()
                    updated, written = self._prepare_locked(claims, fetched, checkpoint, results, ready, made=made)
                    if updated is not checkpoint:
                        try:
                            self._journal.save(updated)
                        except OSError as err:  # the new specs are orphans now: remove them (or recover does)
                            updated = checkpoint
                            self._unwrite(written)
                            self._partitions.undo(made)
                            message = f"cannot save the checkpoint ({err}); nothing was prepared, the kubelet retries"
                            for ref in claims:
                                if ref.uid in written:
                                    self._fail(results, ref, PrepareError(ErrorKind.INTERNAL, message))
                            ready = [r for r in ready if r[0]["metadata"]["uid"] not in written]
                    self._metrics.prepared_claims.set(len(updated.claims))
            except (NodeLockTimeoutError, NewerSchemaError) as err:  # nothing was written
                refusal = err if isinstance(err, PrepareError) else PrepareError(ErrorKind.CHECKPOINT_TOO_NEW, str(err))
                for ref in claims:  # a claim that could not be read keeps that error
                    own = fetched[ref.uid]
                    self._fail(results, ref, own if isinstance(own, PrepareError) else refusal)
            for claim, tiers, partitions in ready:
                self._metrics.requests.labels("prepare", "ok").inc()
                self._ready.prepared(claim, tiers, partitions)
            return results

    def _prepare_locked(
        self,
        claims: list[ClaimRef],
        fetched: dict[str, dict[str, Any] | PrepareError],
        checkpoint: Checkpoint,
        results: dict[str, PrepareResult],
        ready: list[tuple[dict[str, Any], Tiers, Partitions]],
        *,
        made: list[MigRecord],
    ) -> tuple[Checkpoint, set[str]]:
        """Write each readable claim's files; the checkpoint with their completed entries and the UIDs of the
        claims it did not hold completed before (whose files are orphans until it is saved). `made`: gets the MIG
        partitions created (owned by nothing until the checkpoint is saved)."""
        updated = checkpoint
        written: set[str] = set()
        nodes, offered = self._device_nodes(), self._enforcement.tiers()  # once per call: each costs a stat
        for ref in claims:
            claim = fetched[ref.uid]
            before = checkpoint.claims.get(ref.uid)
            try:
                if isinstance(claim, PrepareError):
                    raise claim
                devices, tiers, partitions, created, domain = self._write(claim, before, nodes, offered, updated)
            except Exception as err:  # one claim's failure must not abort the batch
                self._fail(results, ref, err)
                continue
            made += created
            entry = self._entry(ref.namespace, ref.name, devices, partitions, domain)
            if entry != before:
                updated = updated.with_claim(ref.uid, entry)
                if before is None or before.state != "PrepareCompleted":
                    written.add(ref.uid)
            results[ref.uid] = PrepareResult(devices=devices)
            by_key = {
                (d.pool_name, d.device_name, d.share_id): partitions[d.device_name]
                for d in devices
                if d.device_name in partitions
            }
            ready.append((claim, tiers, by_key))
        return updated, written

    def _entry(
        self,
        namespace: str,
        name: str,
        devices: tuple[PreparedDevice, ...],
        partitions: Mapping[str, MigRecord],
        mps_trust_domain: str | None,
    ) -> ClaimEntry:
        """The completed checkpoint entry of a claim prepared as `devices`, recording its physical GPUs, MIG
        partitions and MPS trust domain."""
        return ClaimEntry(
            namespace=namespace,
            name=name,
            state="PrepareCompleted",
            devices=[
                CheckpointDevice.from_prepared(d, self._gpu_uuid(d.device_name), partitions.get(d.device_name))
                for d in devices
            ],
            mps_trust_domain=mps_trust_domain,
        )

    def _gpu_uuid(self, device: str) -> str:
        """The physical GPU of a device: a GPU's own UUID, a partition's GPU's."""
        partition = self._partitions.devices.get(device)
        return partition.gpu.uuid if partition is not None else self._gpus[device].uuid

    def _unwrite(self, uids: set[str]) -> None:
        for uid in uids:
            try:
                self._files.remove(uid)
            except OSError as err:
                log.warning("cannot remove the files of a claim not prepared", extra={"claim": uid, "error": str(err)})

    def _fail(self, results: dict[str, PrepareResult], ref: ClaimRef, err: Exception) -> None:
        """Record `err` as the answer for `ref`: counted, logged, an unexpected error wrapped."""
        if not isinstance(err, PrepareError):
            log.error("unexpected error preparing a claim", exc_info=err, extra={"claim": show(ref)})
            err = PrepareError(ErrorKind.INTERNAL, f"cannot prepare claim {show(ref)}: {type(err).__name__}: {err}")
        self._count_error("prepare", err.kind)
        log.warning("prepare failed", extra={"claim": show(ref), "error": str(err)})
        results[ref.uid] = PrepareResult(error=str(err))

    def wait_ready_writes(self, timeout: float | None = None) -> bool:
        """Wait until the Ready conditions of prepared claims are written (or given up); False on timeout."""
        return self._ready.wait_idle(timeout)

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        """Drop each claim's checkpoint entry, then remove its files; unknown claims are fine.

        Entries go first (see the module docstring); a spec that cannot be removed is that claim's error,
        and the kubelet's retry removes it.
        """
        with self._measure("unprepare"):
            try:
                with self.node_lock.hold():
                    return self._unprepare_locked(claims)
            except NodeLockTimeoutError as err:
                return self._fail_unprepare(claims, err.kind, str(err))
            except NewerSchemaError as err:
                return self._fail_unprepare(claims, ErrorKind.CHECKPOINT_TOO_NEW, str(err))

    def _unprepare_locked(self, claims: list[ClaimRef]) -> dict[str, str]:
        checkpoint = self._journal.load()
        kept: dict[str, str] = {}  # claims whose MIG partitions could not be destroyed: they stay prepared
        for ref in claims:
            entry = checkpoint.claims.get(ref.uid)
            if entry is None:
                continue
            try:
                self._partitions.destroy(ref.uid, entry)
            except PrepareError as err:
                self._count_error("unprepare", err.kind)
                log.warning("unprepare failed", extra={"claim": show(ref), "error": str(err)})
                kept[ref.uid] = str(err)
        claims, failed = [r for r in claims if r.uid not in kept], claims
        updated = checkpoint
        mps_gpus = {
            d.uuid
            for ref in claims
            if ref.uid in checkpoint.claims
            for d in checkpoint.claims[ref.uid].devices
            if d.uuid is not None and self._enforcement.is_mps(d.uuid)
        }
        for ref in claims:
            updated = updated.without_claim(ref.uid)
        if updated != checkpoint:
            try:
                self._journal.save(updated)
            except OSError as err:
                return self._fail_unprepare(
                    claims,
                    ErrorKind.INTERNAL,
                    f"cannot save the checkpoint without these claims ({err}); nothing was removed, retry the unprepare",
                )
        errors: dict[str, str] = {r.uid: kept[r.uid] for r in failed if r.uid in kept}
        for ref in claims:
            try:
                self._files.remove(ref.uid)
            except OSError as err:
                self._count_error("unprepare", ErrorKind.INTERNAL)
                errors[ref.uid] = f"cannot remove CDI spec of claim {show(ref)}: {err}"
                continue
            errors[ref.uid] = ""
            self._ready.forget(ref.uid)
            self._metrics.requests.labels("unprepare", "ok").inc()
        self._metrics.prepared_claims.set(len(updated.claims))
        for uuid in sorted(mps_gpus):
            try:
                self._mps.lower(uuid, updated)
            except MpsControlError as err:
                log.warning("cannot lower the MPS ceiling", extra={"uuid": uuid, "error": str(err)})
        return errors

    def _fail_unprepare(self, claims: list[ClaimRef], kind: ErrorKind, message: str) -> dict[str, str]:
        for _ in claims:
            self._count_error("unprepare", kind)
        log.warning("unprepare failed", extra={"claims": [show(r) for r in claims], "error": message})
        return {ref.uid: message for ref in claims}

    # -- steps -------------------------------------------------------------------------------------

    def _write(
        self,
        claim: dict[str, Any],
        prepared: ClaimEntry | None,
        nodes: DeviceNodeSnapshot,
        offered: Mapping[str, GpuTiers],
        checkpoint: Checkpoint,
    ) -> tuple[tuple[PreparedDevice, ...], Tiers, dict[str, MigRecord], list[MigRecord], str | None]:
        """Make the claim's MIG partitions, plan it, admit its MPS shares to their GPU's daemon (`checkpoint`: the
        other claims prepared) and write its files; the devices for the kubelet, the tier of each share, the MIG
        partition of each partition device, those made now (destroyed again when a later step fails) and the
        claim's MPS trust domain. `nodes` and `offered` (the tiers each GPU offers) are read once per call.

        `prepared`: the claim's checkpoint entry; a device that is now another physical GPU than when it
        was prepared (NVML indices shift when a GPU disappears) is refused rather than handed out.
        """
        for device in prepared.devices if prepared else []:
            now = self._gpus.get(device.device_name)
            if device.mig is None and device.uuid and now is not None and now.uuid != device.uuid:
                raise PrepareError(
                    ErrorKind.DEVICE_CHANGED,
                    f"{device.device_name} was GPU {device.uuid} when this claim was prepared and is now "
                    f"{now.uuid}: the node's GPUs changed; delete the pod so its claim is allocated again",
                )
        partitions, made = self._partitions.make(claim, prepared)
        try:
            plan = plan_claim(
                claim,
                self._settings,
                self._gpus,
                self._current_driver_edits(),
                offered,
                nodes=self._partitions.with_cap_nodes(nodes, partitions),
                mig_devices=self._partitions.devices,
                partitions=partitions,
                hami_core_installed=self._settings.hami_core_library.is_file(),  # as the publisher says
            )
            uid = claim["metadata"]["uid"]
            self._admit_mps(plan, uid, checkpoint)
            try:
                self._files.write(uid, plan)
            except OSError as err:
                raise PrepareError(
                    ErrorKind.INTERNAL, f"cannot write CDI spec or info files for claim {uid}: {err}"
                ) from None
        except Exception:
            self._partitions.undo(made)
            raise
        if plan.spec is not None:
            ensure_char_links(self._settings.dev_char_dir, list(plan.nodes))
        tiers = {(pool, device, share): tier for pool, device, share, tier in plan.tiers}
        domain = plan.mps_domain.id if plan.mps_domain is not None else None
        return plan.devices, tiers, {name: p.record for name, p in partitions.items()}, made, domain

    def _admit_mps(self, plan: ClaimPlan, uid: str, checkpoint: Checkpoint) -> None:
        """Admit each MPS GPU's shares of `plan` to that GPU's daemon (mps_shares); raises PrepareError."""
        mine: dict[str, list[tuple[int, int | None]]] = {}
        for file in plan.files:
            for device in file.info.devices:
                if device.enforcement == "mps":
                    mine.setdefault(device.uuid, []).append((device.memory_mib, device.active_thread_percentage))
        for uuid, grants in mine.items():
            assert plan.mps_domain is not None
            self._mps.admit(uuid, plan.mps_domain, grants, uid, checkpoint)

    def refresh_mps_ceiling(self, uuid: str) -> None:
        """Set GPU `uuid`'s ceiling from the prepared claims again (its daemon restarted without one); logs,
        never raises."""
        try:
            with self.node_lock.hold():
                top = self._mps.refresh(uuid, self._journal.load())
            if top is not None:
                log.info("MPS ceiling set", extra={"uuid": uuid, "ceiling": top.describe()})
        except Exception as err:
            log.warning("cannot set the MPS ceiling", extra={"uuid": uuid, "error": str(err)})

    def repair_mps_limits(self, uuid: str) -> list[str]:
        """Read GPU `uuid`'s MPS limits back and set them again where a client changed them; what differed.
        Raises MpsControlError, NodeLockTimeoutError."""
        with self.node_lock.hold():
            return self._mps.repair(uuid, self._journal.load())

    def _current_driver_edits(self) -> cdi.ContainerEdits | None:
        """The driver edits for claim specs (None with ``--driver-edits=none``); raises PrepareError."""
        if self._settings.driver_edits != "toolkit":
            return None
        if self._driver_edits is None:
            raise PrepareError(
                ErrorKind.DRIVER_EDITS, "driver edits are on but this plugin was started without a generator"
            )
        try:
            return self._driver_edits.current()
        except DriverEditsError as err:
            raise PrepareError(
                ErrorKind.DRIVER_EDITS,
                f"the NVIDIA driver's libraries for the container could not be generated: {err}; the plugin "
                f"retries every {self._settings.driver_edits_retry_seconds:g} s and the kubelet retries this claim",
            ) from None

    @contextmanager
    def _measure(self, operation: str) -> Iterator[None]:
        gauge = self._metrics.in_flight.labels(operation)
        gauge.inc()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._metrics.duration.labels(operation).observe(time.perf_counter() - start)
            gauge.dec()

    def _count_error(self, operation: str, kind: ErrorKind) -> None:
        self._metrics.requests.labels(operation, "error").inc()
        self._metrics.errors.labels(operation, kind).inc()
