"""NodePrepareResources / NodeUnprepareResources for fracgpu: claims in, CDI specs and a checkpoint out.

The Preparer is thin: it reads the claims (``reader``), holds the node lock and loads and saves the
checkpoint (``journal``), runs each claim's transaction over its kinds (``transaction``: MIG partitions, the plan,
MPS admission, the files) and reports Ready (``ready``); unprepare is ``release``'s, recovery at start ``recovery``'s.

Contract (the kubelet's): every claim in a call gets an answer; a problem with one claim is that claim's
error, never an exception for the call. Prepare is idempotent (a repeat gives the same answer and re-writes
the CDI spec, which a reboot may have wiped); unprepare of an unknown claim succeeds. All checkpoint and
spec changes happen under one lock shared by every plugin instance on the node.

MPS trust-domain switches. A claim whose MPS GPU's daemon serves another trust domain (or none) is not prepared
in one pass: under the node lock its transaction asks the MPS supervisor for a daemon of its domain and stops
(``ClaimWaitingError``), and the call saves its checkpoint entry as waiting (``PrepareStarted`` with
``mpsSwitchUntil``: no files, its domain holding the GPU, so that no other domain's claim is admitted there
meanwhile; a claim prepared before keeps its own entry). The call then lets go of the lock and waits for the
supervisor's status (``MpsShares.wait_served``), so that other prepares and unprepares go on, and takes the lock
again to prepare the claim anew: only if its entry still has the devices it waited with (not unprepared, not
dropped by another instance's recovery), with every admission check repeated against the checkpoint of that moment
(another domain's claims, the daemon's status); a failure then gives the waiting entry back if it is still the one
this call saved. The kubelet's retry of a waiting claim finds its entry: it asks for nothing new (the tenant
request already names the domain), waits too while the daemon does not serve the domain yet, and prepares the
claim under the lock (the second call to get there repeats an idempotent prepare). No call answers a claim
prepared before its daemon serves its domain.

Crash safety. Each call writes the checkpoint at most once, durably (twice when a claim waits for an MPS switch), and
orders its steps so that a crash anywhere leaves a state ``recovery`` repairs:
- prepare writes the claims' files and specs first (after making their MIG partitions), then saves the checkpoint
  with their ``PrepareCompleted`` entries; a spec without an entry is an orphan that recovery deletes, and the
  kubelet's retry of the prepare writes it again. A save that fails undoes every claim's transaction. A waiting
  entry has no files: recovery drops it (so does the waiting call, when the switch fails), and after its
  ``mpsSwitchUntil`` (the switch timeout, the lock timeout and a margin) it holds its GPU no more.
- unprepare destroys the claims' MIG partitions, saves the checkpoint without the claims, then deletes their files
  and lowers their MPS GPUs' ceilings; recovery deletes a spec without entry (an orphan), and the kubelet's retry of
  the now unknown claim succeeds.
A checkpoint of a newer schema is never touched: recovery posts a ``CheckpointTooNew`` Event and changes nothing,
and prepare/unprepare fail every claim with what to do, while the plugin keeps running.

Deadlines: the kubelet gives a call 45 s; its waits share ``MAX_WAIT_S`` (40 s) from the call's start
(``CallWindow``), the rest being left for the local work and the answer. The time spent reading is taken off what
is left for the lock. In order:
- the reads (concurrent): a server that hangs or cannot be reached costs each at most the API budget
  (``api_timeout_seconds``, 10 s, retries included); a wait the server asked for (429 or 503 with ``Retry-After``:
  the request was not applied) is waited out past it, as client-go does within the kubelet's deadline, until
  ``reads_end``: the window's end less the MPS switch's share (``mps_domain_switch_timeout_seconds``, on a node
  with MPS GPUs) and the lock's share (``READ_LOCK_SHARE_S``, 5 s, at most ``node_lock_timeout_seconds``);
- the node lock: at most ``node_lock_timeout_seconds`` and no later than the window's end less the switch's share
  (at least the lock's share after throttled reads; the whole timeout after reads within the API budget, since the
  settings keep API + lock + switch timeouts within ``MAX_WAIT_S``);
- an MPS switch: at most ``mps_domain_switch_timeout_seconds``, then the lock again at most
  ``node_lock_timeout_seconds`` and no later than the window's end;
and the claims' Ready condition is written after answering.
"""

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from api.kube_rest import KubeConnection, KubeRest
from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot, snapshot
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import ClaimRef, GpuInfo, MigGpu, PrepareResult
from kubelet_plugin.core.settings import MAX_WAIT_S, READ_LOCK_SHARE_S, Settings
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
from kubelet_plugin.prepare.transaction import CallFacts, ClaimSteps, ClaimWaitingError, PreparedClaim
from kubelet_plugin.state.cdi import ContainerEdits
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointStore, ClaimEntry, NewerSchemaError
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


@dataclass(frozen=True)
class CallWindow:
    """When the waits of one prepare call end, on ``time.monotonic`` (see the module doc's Deadlines): every wait by
    `end`, the first node lock wait by `lock_end`, the reads' waits asked by the API server by `reads_end`."""

    end: float
    lock_end: float
    reads_end: float

    @classmethod
    def of(cls, settings: Settings, began: float) -> "CallWindow":
        """The window of a call that began at `began`."""
        end = began + MAX_WAIT_S
        lock_end = end - (settings.mps_domain_switch_timeout_seconds if settings.mps_gpus else 0.0)
        reads_end = lock_end - min(settings.node_lock_timeout_seconds, READ_LOCK_SHARE_S)
        return cls(end=end, lock_end=lock_end, reads_end=reads_end)

    @staticmethod
    def lock_timeout(timeout: float, until: float, now: float) -> float:
        """A lock wait at `now`: at most `timeout`, and ending by `until` (0: try once, no wait)."""
        return max(0.0, min(timeout, until - now))


@dataclass
class _Call:
    """One prepare call: its claims as read (by UID, each claim or its error), the answers so far, the claims it
    prepared."""

    fetched: Mapping[str, dict[str, Any] | PrepareError]
    metrics: PluginMetrics
    results: dict[str, PrepareResult] = field(default_factory=dict)
    done: list[PreparedClaim] = field(default_factory=list)

    def fail(self, ref: ClaimRef, err: Exception) -> None:
        """Record `err` as the answer for `ref`: counted, logged, an unexpected error wrapped."""
        if not isinstance(err, PrepareError):
            log.error("unexpected error preparing a claim", exc_info=err, extra={"claim": show(ref)})
            err = PrepareError(ErrorKind.INTERNAL, f"cannot prepare claim {show(ref)}: {type(err).__name__}: {err}")
        count_error(self.metrics, "prepare", err.kind)
        log.warning("prepare failed", extra={"claim": show(ref), "error": str(err)})
        self.results[ref.uid] = PrepareResult(error=str(err))

    def refuse(self, claims: list[ClaimRef], refusal: PrepareError) -> None:
        """Nothing was written: each claim's answer is `refusal`, unless it could not be read (that error)."""
        for ref in claims:
            own = self.fetched[ref.uid]
            self.fail(ref, own if isinstance(own, PrepareError) else refusal)

    def save(
        self, journal: ClaimJournal, updated: Checkpoint, prepared: list[PreparedClaim], claims: list[ClaimRef]
    ) -> bool:
        """Save the checkpoint; when that fails, undo every `prepared` claim's transaction and fail those that
        acquired anything or were to wait (a claim prepared before, unchanged, stays prepared). False if it
        failed."""
        try:
            journal.save(updated)
            return True
        except OSError as err:  # the new specs are orphans now: remove them (or recovery does)
            message = f"cannot save the checkpoint ({err}); nothing was prepared, the kubelet retries"
            undone = {p.claim_uid for p in reversed(prepared) if p.transaction.undo()}
            for ref in claims:
                if ref.uid in undone or ref.uid not in self.results:
                    self.fail(ref, PrepareError(ErrorKind.INTERNAL, message))
            return False


@dataclass(frozen=True)
class _Waited:
    """After the wait: the claims that waited for an MPS domain switch (by UID), and what each switch came to
    (``MpsShares.wait_served``)."""

    claims: Mapping[str, ClaimWaitingError]
    switched: Mapping[tuple[str, str], str | None]

    def check(self, ref: ClaimRef, entry: ClaimEntry | None) -> None:
        """Raise PrepareError unless claim `ref` may be prepared now: its checkpoint entry `entry` still has the
        devices it waited with (it was neither unprepared nor prepared again otherwise meanwhile), and its GPU's
        daemon came to serve its domain."""
        waited = self.claims[ref.uid]
        switch = waited.switch
        if entry is None or entry.devices != waited.entry.devices:
            raise PrepareError(
                ErrorKind.ENFORCEMENT_UNAVAILABLE,
                f"while this prepare waited for GPU {switch.uuid}'s MPS daemon of {switch.domain.describe()}, "
                + (
                    f"claim {show(ref)} lost its checkpoint entry (it was unprepared, or the recovery of a "
                    "starting plugin instance or the rebuild of a corrupt checkpoint dropped the entry that waited)"
                    if entry is None
                    else f"the checkpoint entry of claim {show(ref)} came to name other devices (it was unprepared "
                    "and is being prepared again)"
                )
                + "; the kubelet retries",
            )
        problem = self.switched[switch.uuid, switch.domain.id]
        if problem is not None:
            raise PrepareError(ErrorKind.ENFORCEMENT_UNAVAILABLE, problem)

    def saved(self, ref: ClaimRef, entry: ClaimEntry | None) -> bool:
        """Whether `entry` is the waiting entry this call saved for claim `ref` (dropped when the claim fails; a
        claim prepared before waited with its own entry, which stays)."""
        return entry is not None and entry.state == "PrepareStarted" and entry == self.claims[ref.uid].entry


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``driver_edits``: required with ``settings.driver_edits == "toolkit"``, read (never generated) per
        prepare. ``enforcement``: the tiers each GPU offers (default: HAMi-core where its library is, no nvml).
        ``device_nodes``: where the device nodes are read from (default: stat-ed under the driver root).
        ``mps``: the MPS GPUs' daemons (default: through the driver's control client).
        ``mig``: the MIG GPUs (``--mig-gpus``) by device name, as discovered; ``mig_manager``: makes and
        destroys their partitions (default: through NVML). ``clock``: the calls' deadlines' (``time.monotonic``, as
        the API client's)."""
        self._clock = clock
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
            self._metrics.prepared_claims.set(checkpoint.prepared_count())

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare each claim; see the module contract and its deadlines."""
        with measure(self._metrics, "prepare"):
            window = CallWindow.of(self._settings, self._clock())
            lock_s = self._settings.node_lock_timeout_seconds
            # outside the lock: API round trips must not serialise calls
            call = _Call(self._reader.read_all(claims, window.reads_end), self._metrics)
            waiting = self._round(
                call, claims, lock_timeout=window.lock_timeout(lock_s, window.lock_end, self._clock())
            )
            if waiting:  # MPS domain switches: asked for under the lock, waited for without it
                switched = self._mps.wait_served(w.switch for w in waiting.values())
                again = [ref for ref in claims if ref.uid in waiting]
                timeout = window.lock_timeout(lock_s, window.end, self._clock())
                self._round(call, again, waited=_Waited(waiting, switched), lock_timeout=timeout)
            for prepared in call.done:
                self._metrics.requests.labels("prepare", "ok").inc()
                self._ready.prepared(
                    prepared.claim, prepared.tiers(), prepared.partitions_by_key(), admin_on_mps=prepared.admin_on_mps()
                )
            return call.results

    def _round(
        self,
        call: _Call,
        claims: list[ClaimRef],
        *,
        waited: _Waited | None = None,
        lock_timeout: float | None = None,
    ) -> dict[str, ClaimWaitingError]:
        """One pass over `claims` under the node lock, with one checkpoint save. The first pass returns the claims
        that wait for an MPS domain switch, their waiting entries saved. The pass after the wait (`waited`)
        prepares each of them anew when its entry still has the devices it waited with and its switch was made,
        and otherwise fails it and drops its waiting entry if that is still the one it saved."""
        waiting: dict[str, ClaimWaitingError] = {}
        prepared_now: list[PreparedClaim] = []
        try:
            with self.node_lock.hold(timeout=lock_timeout):
                checkpoint = self._journal.load()
                updated, facts = checkpoint, self._facts()
                for ref in claims:
                    claim, before = call.fetched[ref.uid], checkpoint.claims.get(ref.uid)
                    try:
                        if isinstance(claim, PrepareError):
                            raise claim
                        if waited is not None:
                            waited.check(ref, before)
                        prepared = self._steps.prepare(claim, before, facts, updated)
                    except Exception as err:  # one claim's failure must not abort the batch
                        if isinstance(err, ClaimWaitingError) and waited is None:
                            waiting[ref.uid] = err
                            updated = updated if err.entry == before else updated.with_claim(ref.uid, err.entry)
                            continue
                        if waited is not None and waited.saved(ref, before):
                            updated = updated.without_claim(ref.uid)  # its waiting entry, given back
                        call.fail(ref, err)
                        continue
                    if prepared.entry != before:
                        updated = updated.with_claim(ref.uid, prepared.entry)
                    call.results[ref.uid] = PrepareResult(devices=prepared.devices)
                    prepared_now.append(prepared)
                if updated is not checkpoint and not call.save(self._journal, updated, prepared_now, claims):
                    updated, waiting = checkpoint, {}
                    prepared_now = [p for p in prepared_now if not call.results[p.claim_uid].error]
                self._metrics.prepared_claims.set(updated.prepared_count())
        except (NodeLockTimeoutError, NewerSchemaError) as err:  # nothing was written
            call.refuse(
                claims, err if isinstance(err, PrepareError) else PrepareError(ErrorKind.CHECKPOINT_TOO_NEW, str(err))
            )
        call.done += prepared_now
        return waiting

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
