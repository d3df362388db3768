"""NodePrepareResources / NodeUnprepareResources for fracgpu: claims in, CDI specs and a checkpoint out.

The Preparer is thin: it reads the claims (``reader``), holds the node lock and loads and saves the
checkpoint (``journal``), runs each claim's transaction over its kinds (``transaction``: MIG partitions, the plan,
MPS admission, the files) and reports Ready (``ready``); unprepare is ``release``'s, recovery at start ``recovery``'s.

Contract (the kubelet's): every claim in a call gets an answer; a problem with one claim is that claim's
error, never an exception for the call. Prepare is idempotent (a repeat gives the same answer and re-writes
the CDI spec, which a reboot may have wiped); unprepare of an unknown claim succeeds. All checkpoint and
spec changes happen under one lock shared by every plugin instance on the node.

Crash safety. Each call writes the checkpoint once, durably, and orders its steps so that a crash anywhere leaves a
state ``recovery`` repairs:
- prepare writes the claims' files and specs first (after making their MIG partitions), then saves the checkpoint
  with their ``PrepareCompleted`` entries; a spec without an entry is an orphan that recovery deletes, and the
  kubelet's retry of the prepare writes it again. A save that fails undoes every claim's transaction.
- unprepare destroys the claims' MIG partitions, saves the checkpoint without the claims, then deletes their files
  and lowers their MPS GPUs' ceilings; recovery deletes a spec without entry (an orphan), and the kubelet's retry of
  the now unknown claim succeeds.
A checkpoint of a newer schema is never touched: recovery posts a ``CheckpointTooNew`` Event and changes nothing,
and prepare/unprepare fail every claim with what to do, while the plugin keeps running.

Deadlines: the kubelet gives a call 45 s. A prepare reads its claims concurrently, each within the API
budget (`api_timeout_seconds`, retries included), waits at most `node_lock_timeout_seconds` for the lock,
and writes the claims' Ready condition after answering.
"""

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial

from api.kube_rest import KubeConnection, KubeRest
from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot, snapshot
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import ClaimRef, GpuInfo, MigGpu, PrepareResult
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.kinds.mig.nvml import MigManager, NvmlMig
from kubelet_plugin.kinds.mig.partitions import Partitioner
from kubelet_plugin.kinds.mps.shares import MpsShares
from kubelet_plugin.prepare.driver_edits import DriverEdits, current_driver_edits
from kubelet_plugin.prepare.journal import ClaimJournal, NodeLock, NodeLockTimeoutError
from kubelet_plugin.prepare.reader import ClaimReader, show
from kubelet_plugin.prepare.ready import ReadyReporter
from kubelet_plugin.prepare.recovery import Recovery
from kubelet_plugin.prepare.release import ClaimRelease, count_error
from kubelet_plugin.prepare.transaction import CallFacts, ClaimSteps, PreparedClaim
from kubelet_plugin.state.cdi import ContainerEdits
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointStore, NewerSchemaError
from kubelet_plugin.state.claim_files import ClaimStore

log = logging.getLogger(__name__)

#: ``() -> the device nodes as they are now`` (``devicenodes.snapshot`` of this node's GPUs by default).
DeviceNodes = Callable[[], DeviceNodeSnapshot]


def _no_driver_edits() -> None:
    """``--driver-edits=none``: the specs carry no driver edits."""
    return


@contextmanager
def measure(metrics: PluginMetrics, operation: str) -> Iterator[None]:
    """Count `operation` in flight and observe its duration."""
    gauge = metrics.in_flight.labels(operation)
    gauge.inc()
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics.duration.labels(operation).observe(time.perf_counter() - start)
        gauge.dec()


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
        self._metrics = metrics
        self._driver_edits = driver_edits
        self._enforcement = enforcement or EnforcementDetector.without_nvml(settings, gpus, "nvml was not detected")
        minors = sorted(g.minor for g in gpus)
        self.device_nodes: DeviceNodes = device_nodes or (lambda: snapshot(settings.driver_root, minors))
        """Where this preparer reads the device nodes from (health.source.DeviceHealth reads the same)."""
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
        self._steps = ClaimSteps(settings, {g.device_name: g for g in gpus}, self._partitions, self._mps, self._files)
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
        self._release = ClaimRelease(
            self._journal, self._files, partitions=self._partitions, mps=self._mps, enforcement=self._enforcement,
            metrics=metrics, forget=self._ready.forget,
        )  # fmt: skip
        self._recovery = Recovery(
            self._journal,
            self._files,
            partitions=self._partitions,
            reader=self._reader,
            steps=self._steps,
            facts=self._facts,
        )

    def _facts(self) -> CallFacts:
        """The node as this call sees it, read once: each read costs a stat."""
        edits: Callable[[], ContainerEdits | None] = _no_driver_edits
        if self._settings.driver_edits == "toolkit":
            edits = partial(current_driver_edits, self._settings, self._driver_edits)
        return CallFacts(nodes=self.device_nodes(), tiers=self._enforcement.tiers(), driver_edits=edits)

    def recover(self) -> None:
        """At start, establish the invariant of ``recovery``; a checkpoint of a newer schema is reported and left
        alone, as are the specs."""
        with self.node_lock.hold(bounded=False):
            try:
                checkpoint = self._journal.load()
            except NewerSchemaError:
                return  # reported by load; prepare and unprepare refuse until the plugin is upgraded back
            checkpoint = self._recovery.recover(checkpoint)
            self._journal.save(checkpoint)
            self._metrics.prepared_claims.set(len(checkpoint.claims))

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare each claim; see the module contract and its deadlines."""
        with measure(self._metrics, "prepare"):
            fetched = self._reader.read_all(claims)  # outside the lock: API round trips must not serialise calls
            results: dict[str, PrepareResult] = {}
            done: list[PreparedClaim] = []
            try:
                with self.node_lock.hold():
                    checkpoint = self._journal.load()
                    updated, facts = checkpoint, self._facts()
                    for ref in claims:
                        claim, before = fetched[ref.uid], checkpoint.claims.get(ref.uid)
                        try:
                            if isinstance(claim, PrepareError):
                                raise claim
                            prepared = self._steps.prepare(claim, before, facts, updated)
                        except Exception as err:  # one claim's failure must not abort the batch
                            self._fail(results, ref, err)
                            continue
                        if prepared.entry != before:
                            updated = updated.with_claim(ref.uid, prepared.entry)
                        results[ref.uid] = PrepareResult(devices=prepared.devices)
                        done.append(prepared)
                    if updated is not checkpoint and not self._save(updated, done, results, claims):
                        updated = checkpoint
                        done = [p for p in done if results[p.claim_uid].error is None]
                    self._metrics.prepared_claims.set(len(updated.claims))
            except (NodeLockTimeoutError, NewerSchemaError) as err:  # nothing was written
                refusal = err if isinstance(err, PrepareError) else PrepareError(ErrorKind.CHECKPOINT_TOO_NEW, str(err))
                for ref in claims:  # a claim that could not be read keeps that error
                    own = fetched[ref.uid]
                    self._fail(results, ref, own if isinstance(own, PrepareError) else refusal)
            for prepared in done:
                self._metrics.requests.labels("prepare", "ok").inc()
                self._ready.prepared(
                    prepared.claim, prepared.tiers(), prepared.partitions_by_key(), admin_on_mps=prepared.admin_on_mps()
                )
            return results

    def _save(
        self, updated: Checkpoint, done: list[PreparedClaim], results: dict[str, PrepareResult], claims: list[ClaimRef]
    ) -> bool:
        """Save the checkpoint; when that fails, undo every claim's transaction and fail those that acquired
        anything (a claim prepared before, unchanged, stays prepared). False if it failed."""
        try:
            self._journal.save(updated)
            return True
        except OSError as err:  # the new specs are orphans now: remove them (or recovery does)
            message = f"cannot save the checkpoint ({err}); nothing was prepared, the kubelet retries"
            undone = {p.claim_uid for p in reversed(done) if p.transaction.undo()}
            for ref in claims:
                if ref.uid in undone:
                    self._fail(results, ref, PrepareError(ErrorKind.INTERNAL, message))
            return False

    def _fail(self, results: dict[str, PrepareResult], ref: ClaimRef, err: Exception) -> None:
        """Record `err` as the answer for `ref`: counted, logged, an unexpected error wrapped."""
        if not isinstance(err, PrepareError):
            log.error("unexpected error preparing a claim", exc_info=err, extra={"claim": show(ref)})
            err = PrepareError(ErrorKind.INTERNAL, f"cannot prepare claim {show(ref)}: {type(err).__name__}: {err}")
        count_error(self._metrics, "prepare", err.kind)
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
        with measure(self._metrics, "unprepare"):
            try:
                with self.node_lock.hold():
                    return self._release.unprepare(claims)
            except NodeLockTimeoutError as err:
                return self._release.refuse(claims, err.kind, str(err))
            except NewerSchemaError as err:
                return self._release.refuse(claims, ErrorKind.CHECKPOINT_TOO_NEW, str(err))

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
