"""NodePrepareResources / NodeUnprepareResources for fracgpu: claims in, CDI specs and a checkpoint out.

Contract (the kubelet's): every claim in a call gets an answer; a problem with one claim is that claim's
error, never an exception for the call. Prepare is idempotent (a repeat gives the same answer and re-writes
the CDI spec, which a reboot may have wiped); unprepare of an unknown claim succeeds. All checkpoint and
spec changes happen under one lock shared by every plugin instance on the node.

Crash safety. Invariant after ``recover()``: every checkpoint entry is ``PrepareCompleted``, and the set of
claims with devices in the checkpoint equals the set of this driver's spec files (no temp files either).
Every step is ordered so that a crash anywhere leaves a state ``recover()`` repairs:
- prepare records ``PrepareStarted``, writes the spec, then records ``PrepareCompleted``; recover drops a
  ``PrepareStarted`` entry with its spec (the kubelet retries the prepare);
- unprepare saves the checkpoint without the claims first, then deletes their specs; recover deletes a spec
  without entry (an orphan), and the kubelet's retry of the now unknown claim succeeds;
- a ``PrepareCompleted`` entry whose spec is missing (reboot, or deleted) gets it re-written from the API
  claim; a claim that is gone or was replaced is dropped. When the spec cannot be restored (API server
  unreachable or failing, device changed, claim no longer allocated) the entry is kept and logged: the
  kubelet's next prepare of the claim re-writes the spec (or returns the reason), and so does the next
  ``recover()`` once the API server answers. Until then a container restart of a pod using it cannot find
  its CDI device.

A checkpoint of a newer schema is never touched: recover posts a ``CheckpointTooNew`` Event and changes
nothing, and prepare/unprepare fail every claim with what to do, while the plugin keeps running.

Deadlines: the kubelet gives a call 45 s. A prepare reads its claims concurrently, each within the API
budget (`api_timeout_seconds`, retries included), waits at most `node_lock_timeout_seconds` for the lock,
and writes the claims' Ready condition after answering.
"""

import logging
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from typing import Any

from api.kube_rest import ApiError, ApiTimeout, KubeConnection, KubeRest, UndecodableResponse, claim_path
from kubelet_plugin import cdi, container_info
from kubelet_plugin.checkpoint import Checkpoint, CheckpointDevice, CheckpointStore, ClaimEntry, NewerSchemaError
from kubelet_plugin.claim_spec import PrepareError, hami_cache_dir, hami_preload_file, plan_claim
from kubelet_plugin.claim_status import apply_ready, is_ready
from kubelet_plugin.devicenodes import ensure_char_links
from kubelet_plugin.driver_edits import DriverEdits, DriverEditsError
from kubelet_plugin.enforcement_probe import EnforcementDetector
from kubelet_plugin.events import post_node_event
from kubelet_plugin.filelock import atomic_write, remove_temp_files, serialize_lock
from kubelet_plugin.metrics import PluginMetrics
from kubelet_plugin.model import ClaimRef, GpuInfo, PreparedDevice, PrepareResult
from kubelet_plugin.ready_writer import ReadyWriter
from kubelet_plugin.settings import Settings
from kubelet_plugin.spec_rebuild import entry_from_spec

log = logging.getLogger(__name__)

#: Claims of one call read at once; more wait for a free reader (within the same API budget).
FETCH_WORKERS = 16
#: Past the API budget, how long a prepare still waits for a read to report its own error.
FETCH_GRACE_S = 0.5


class NodeLockTimeoutError(PrepareError):
    """The node-wide lock was not free within `node_lock_timeout_seconds`."""


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
    ) -> None:
        """``driver_edits``: required with ``settings.driver_edits == "toolkit"``, read (never generated) per
        prepare. ``enforcement``: the tiers each GPU offers (default: HAMi-core where its library is, no nvml)."""
        self._rest = KubeRest.bounded(api, settings.api_timeout_seconds)
        self._enforcement = enforcement or EnforcementDetector.without_nvml(settings, gpus, "nvml was not detected")
        self._applied: dict[str, dict[tuple[str, str, str | None], str]] = {}  # claim UID -> tier per share
        self._driver_edits = driver_edits
        self._settings = settings
        self._gpus = {g.device_name: g for g in gpus}
        self._store = store
        self._metrics = metrics
        self._lock = threading.Lock()
        self._reported: tuple[str | None, tuple[str, ...]] = (None, ())  # (too_new, unknown fields) logged last
        self._fetch_pool = ThreadPoolExecutor(max_workers=FETCH_WORKERS, thread_name_prefix="fracgpu-fetch")
        self._ready = ReadyWriter(
            lambda claim: apply_ready(
                self._rest,
                claim,
                settings.driver_name,
                settings.node_name,
                self._applied.get(claim["metadata"]["uid"]),
            ),
            lambda: metrics.errors.labels("prepare", "status_update").inc(),
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    def recover(self) -> None:
        """At start, establish the module's invariant: load the checkpoint (a corrupt one is reported and
        rebuilt), drop claims whose prepare never completed together with their specs, delete specs no entry
        owns and temp files of interrupted writes, and re-write missing specs of completed claims (every
        spec after a reboot). A checkpoint of a newer schema is reported and left alone, as are the specs."""
        with self._locked(bounded=False):
            try:
                checkpoint = self._load()
            except NewerSchemaError:
                return  # reported by _load; prepare and unprepare refuse until the plugin is upgraded back
            driver, cdi_dir = self._settings.driver_name, self._settings.cdi_dir
            for uid, entry in list(checkpoint.claims.items()):
                if entry.state != "PrepareCompleted":
                    log.warning("dropping half-prepared claim", extra={"claim": uid, "claim_name": entry.name})
                    cdi.remove_spec(cdi_dir, driver, uid)
                    checkpoint = checkpoint.without_claim(uid)
            specs = cdi.list_spec_claim_uids(cdi_dir, driver)
            for uid in specs - set(checkpoint.claims):
                log.warning("removing orphaned CDI spec", extra={"claim": uid})
                cdi.remove_spec(cdi_dir, driver, uid)
            for uid in container_info.remove_orphan_claim_files(self._settings.plugin_data_dir, set(checkpoint.claims)):
                log.warning("removed orphaned claim info files", extra={"claim": uid})
            for directory, prefix in (
                (cdi_dir, cdi.spec_file_prefix(driver)),
                (self._store.path.parent, self._store.path.name),
            ):
                for tmp in remove_temp_files(directory, prefix):
                    log.warning("removed a temp file of an interrupted write", extra={"path": str(tmp)})
            if checkpoint.node_boot_id != self._store.current_boot_id:
                checkpoint = self._rewrite_after_reboot(checkpoint)
            else:
                missing = [uid for uid, e in checkpoint.claims.items() if e.devices and uid not in specs]
                checkpoint = self._restore_specs(checkpoint, missing, "its CDI spec is missing")
            self._store.save(checkpoint)
            self._metrics.prepared_claims.set(len(checkpoint.claims))

    def _rewrite_after_reboot(self, checkpoint: Checkpoint) -> Checkpoint:
        """CDI specs of an earlier boot (tmpfs) are gone: re-write every claim's, then stamp this boot."""
        restored = self._restore_specs(checkpoint, list(checkpoint.claims), "the node rebooted")
        return restored.with_boot_id(self._store.current_boot_id)

    def _restore_specs(self, checkpoint: Checkpoint, uids: list[str], why: str) -> Checkpoint:
        """Re-write the specs of completed claims ``uids`` from their API objects; drop claims that are gone.

        A claim that cannot be restored now keeps its entry (see the module docstring). After the first API
        error the remaining claims are not fetched: the server is unreachable or refusing, and each attempt
        could take the client's full timeout while the plugin is not yet serving the kubelet.
        """
        api_failure: PrepareError | None = None
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
                self._write(self._fetch(ClaimRef(namespace=entry.namespace, name=entry.name, uid=uid)), entry)
            except PrepareError as err:
                if err.kind in ("claim_not_found", "uid_mismatch"):  # the claim is gone: nothing to restore
                    log.warning("claim gone; dropping it", extra={**what, "error": str(err)})
                    cdi.remove_spec(self._settings.cdi_dir, self._settings.driver_name, uid)
                    checkpoint = checkpoint.without_claim(uid)
                    continue
                if err.kind in ("api_error", "api_timeout"):
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
            fetched = self._fetch_all(claims)  # outside the lock: API round trips must not serialise other calls
            results: dict[str, PrepareResult] = {}
            ready: list[dict[str, Any]] = []
            try:
                with self._locked():
                    checkpoint = self._load()
                    started = checkpoint
                    for ref in claims:
                        claim = fetched[ref.uid]
                        if isinstance(claim, dict) and ref.uid not in checkpoint.claims:
                            started = started.with_claim(
                                ref.uid, ClaimEntry(namespace=ref.namespace, name=ref.name, state="PrepareStarted")
                            )
                    if started is not checkpoint:
                        self._store.save(started)
                    completed = started
                    for ref in claims:
                        claim = fetched[ref.uid]
                        try:
                            if isinstance(claim, PrepareError):
                                raise claim
                            devices = self._write(claim, checkpoint.claims.get(ref.uid))
                        except Exception as err:  # one claim's failure must not abort the batch
                            self._fail(results, ref, err)
                            if ref.uid in completed.claims and completed.claims[ref.uid].state == "PrepareStarted":
                                completed = completed.without_claim(ref.uid)
                            continue
                        completed = completed.with_claim(
                            ref.uid,
                            ClaimEntry(
                                namespace=ref.namespace,
                                name=ref.name,
                                state="PrepareCompleted",
                                devices=[
                                    CheckpointDevice.from_prepared(d, self._gpus[d.device_name].uuid) for d in devices
                                ],
                            ),
                        )
                        results[ref.uid] = PrepareResult(devices=devices)
                        self._metrics.requests.labels("prepare", "ok").inc()
                        applied = self._applied.get(ref.uid)
                        if devices and not is_ready(claim, self._settings.driver_name, applied):
                            ready.append(claim)
                    if completed != started:  # `started` is what the file holds now
                        self._store.save(completed)
                    self._metrics.prepared_claims.set(len(completed.claims))
            except (NodeLockTimeoutError, NewerSchemaError) as err:  # nothing was written
                refusal = err if isinstance(err, PrepareError) else PrepareError("checkpoint_too_new", str(err))
                for ref in claims:  # a claim that could not be read keeps that error
                    own = fetched[ref.uid]
                    self._fail(results, ref, own if isinstance(own, PrepareError) else refusal)
            for claim in ready:
                self._mark_ready(claim)
            return results

    def _fail(self, results: dict[str, PrepareResult], ref: ClaimRef, err: Exception) -> None:
        """Record `err` as the answer for `ref`: counted, logged, an unexpected error wrapped."""
        if not isinstance(err, PrepareError):
            log.error("unexpected error preparing a claim", exc_info=err, extra={"claim": _show(ref)})
            err = PrepareError("internal", f"cannot prepare claim {_show(ref)}: {type(err).__name__}: {err}")
        self._count_error("prepare", err.kind)
        log.warning("prepare failed", extra={"claim": _show(ref), "error": str(err)})
        results[ref.uid] = PrepareResult(error=str(err))

    def wait_ready_writes(self, timeout: float | None = None) -> bool:
        """Wait until the Ready conditions of prepared claims are written (or given up); False on timeout."""
        return self._ready.wait_idle(timeout)

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        """Drop each claim's checkpoint entry, then remove its CDI spec; unknown claims are fine.

        Entries go first (see the module docstring); a spec that cannot be removed is that claim's error,
        and the kubelet's retry removes it.
        """
        with self._measure("unprepare"), ExitStack() as held:
            try:
                held.enter_context(self._locked())
                checkpoint = self._load()
            except NodeLockTimeoutError as err:
                return self._fail_unprepare(claims, err.kind, str(err))
            except NewerSchemaError as err:
                return self._fail_unprepare(claims, "checkpoint_too_new", str(err))
            updated = checkpoint
            for ref in claims:
                updated = updated.without_claim(ref.uid)
            if updated != checkpoint:
                try:
                    self._store.save(updated)
                except OSError as err:
                    return self._fail_unprepare(
                        claims,
                        "internal",
                        f"cannot save the checkpoint without these claims ({err}); nothing was removed, retry the unprepare",
                    )
            errors: dict[str, str] = {}
            for ref in claims:
                try:
                    cdi.remove_spec(self._settings.cdi_dir, self._settings.driver_name, ref.uid)
                    shutil.rmtree(hami_cache_dir(self._settings, ref.uid), ignore_errors=True)
                    container_info.remove_claim_files(self._settings.plugin_data_dir, ref.uid)
                except OSError as err:
                    self._count_error("unprepare", "internal")
                    errors[ref.uid] = f"cannot remove CDI spec of claim {_show(ref)}: {err}"
                    continue
                errors[ref.uid] = ""
                self._applied.pop(ref.uid, None)
                self._metrics.requests.labels("unprepare", "ok").inc()
            self._metrics.prepared_claims.set(len(updated.claims))
            return errors

    def _fail_unprepare(self, claims: list[ClaimRef], kind: str, message: str) -> dict[str, str]:
        for _ in claims:
            self._count_error("unprepare", kind)
        log.warning("unprepare failed", extra={"claims": [_show(r) for r in claims], "error": message})
        return {ref.uid: message for ref in claims}

    # -- steps -------------------------------------------------------------------------------------

    def _fetch_all(self, claims: list[ClaimRef]) -> dict[str, dict[str, Any] | PrepareError]:
        """Each claim read at once on the fetch pool: by UID, the claim or its error. Returns within the API
        budget: a read that has not answered by then is that claim's error and delays no other claim."""
        budget = self._settings.api_timeout_seconds
        futures = {ref.uid: self._fetch_pool.submit(self._fetch_one, ref) for ref in claims}
        wait(futures.values(), timeout=budget + FETCH_GRACE_S)
        fetched: dict[str, dict[str, Any] | PrepareError] = {}
        for ref in claims:
            future = futures[ref.uid]
            if future.done():
                fetched[ref.uid] = future.result()
            else:
                future.cancel()  # still queued behind hung reads, or hung itself: it ends by its own timeout
                fetched[ref.uid] = PrepareError("api_timeout", _no_answer(ref, budget))
        return fetched

    def _fetch_one(self, ref: ClaimRef) -> dict[str, Any] | PrepareError:
        """`_fetch`, with any error, expected or not, returned as this claim's PrepareError."""
        try:
            return self._fetch(ref)
        except PrepareError as err:
            return err
        except Exception as err:
            log.error("unexpected error reading a claim", exc_info=err, extra={"claim": _show(ref)})
            return PrepareError("internal", f"cannot read ResourceClaim {_show(ref)}: {type(err).__name__}: {err}")

    def _fetch(self, ref: ClaimRef) -> dict[str, Any]:
        """GET the claim; check it is the one the kubelet means and that it is allocated."""
        try:
            claim = self._rest.get(claim_path(ref.namespace, ref.name))
        except UndecodableResponse as err:
            raise PrepareError(
                "undecodable",
                f"ResourceClaim {_show(ref)} cannot be read: {err.reason}; delete the claim and create it "
                "again (or fix its ResourceClaimTemplate) with valid parameters",
            ) from None
        except ApiTimeout:
            raise PrepareError("api_timeout", _no_answer(ref, self._settings.api_timeout_seconds)) from None
        except ApiError as err:
            if err.status == 404:
                raise PrepareError("claim_not_found", f"ResourceClaim {_show(ref)} not found") from None
            raise PrepareError(
                "api_error", f"cannot read ResourceClaim {_show(ref)}: {err.status} {err.reason}"
            ) from None
        if claim["metadata"]["uid"] != ref.uid:
            raise PrepareError(
                "uid_mismatch",
                f"ResourceClaim {_show(ref)} has UID {claim['metadata']['uid']}, not {ref.uid}: it was replaced",
            )
        if not (claim.get("status") or {}).get("allocation"):
            raise PrepareError("not_allocated", f"ResourceClaim {_show(ref)} is not allocated")
        return claim

    def _write(self, claim: dict[str, Any], prepared: ClaimEntry | None = None) -> tuple[PreparedDevice, ...]:
        """Write the claim's info files, CDI spec (and HAMi-core files); return the devices for the kubelet.

        `prepared`: the claim's checkpoint entry; a device that is now another physical GPU than when it
        was prepared (NVML indices shift when a GPU disappears) is refused rather than handed out.
        """
        for device in prepared.devices if prepared else []:
            now = self._gpus.get(device.device_name)
            if device.uuid and now is not None and now.uuid != device.uuid:
                raise PrepareError(
                    "device_changed",
                    f"{device.device_name} was GPU {device.uuid} when this claim was prepared and is now "
                    f"{now.uuid}: the node's GPUs changed; delete the pod so its claim is allocated again",
                )
        plan = plan_claim(claim, self._settings, self._gpus, self._current_driver_edits(), self._enforcement.tiers())
        if plan.spec is None:
            return ()
        uid = claim["metadata"]["uid"]
        self._applied[uid] = {(pool, device, share): tier for pool, device, share, tier in plan.tiers}
        try:  # everything the spec mounts exists before the spec does
            container_info.write_claim_files(
                container_info.claim_info_dir(self._settings.plugin_data_dir, uid), list(plan.files)
            )
            if plan.hami_core:
                self._prepare_hami_files(uid)
            cdi.write_spec(self._settings.cdi_dir, uid, plan.spec, self._settings.driver_name)
        except OSError as err:
            raise PrepareError("internal", f"cannot write CDI spec or info files for claim {uid}: {err}") from None
        ensure_char_links(self._settings.dev_char_dir, list(plan.nodes))
        return plan.devices

    def _current_driver_edits(self) -> cdi.ContainerEdits | None:
        """The driver edits for claim specs (None with ``--driver-edits=none``); raises PrepareError."""
        if self._settings.driver_edits != "toolkit":
            return None
        if self._driver_edits is None:
            raise PrepareError("driver_edits", "driver edits are on but this plugin was started without a generator")
        try:
            return self._driver_edits.current()
        except DriverEditsError as err:
            raise PrepareError(
                "driver_edits",
                f"the NVIDIA driver's libraries for the container could not be generated: {err}; the plugin "
                f"retries every {self._settings.driver_edits_retry_seconds:g} s and the kubelet retries this claim",
            ) from None

    def _prepare_hami_files(self, uid: str) -> None:
        preload = hami_preload_file(self._settings)
        content = b"/usr/local/vgpu/libvgpu.so\n"
        if not preload.exists() or preload.read_bytes() != content:
            atomic_write(preload, content, 0o644)
        hami_cache_dir(self._settings, uid).mkdir(parents=True, exist_ok=True)
        self._settings.hami_core_lock_dir.mkdir(parents=True, exist_ok=True)

    def _mark_ready(self, claim: dict[str, Any]) -> None:
        """Write Ready=True on the claim's status in the background (see ReadyWriter)."""
        self._ready.submit(claim)

    def _load(self) -> Checkpoint:
        """The checkpoint on disk, in the current schema; a corrupt one is reported and rebuilt from the CDI
        specs present (claims, devices and, where a spec tells, GPU UUIDs), so the claims of running pods
        stay known and their specs are not taken for orphans.

        Raises ``NewerSchemaError`` (with what to do) for a file of a newer schema, which stays untouched;
        the first time in a row it is seen it is logged and posted as a Node Event.
        """
        result = self._store.load()
        self._metrics.checkpoint_too_new.set(1 if result.too_new else 0)
        reported, self._reported = self._reported, (result.too_new, result.unknown_fields)
        if result.too_new:
            if reported[0] != result.too_new:
                log.error(
                    "checkpoint is of a newer schema; refusing to prepare or unprepare",
                    extra={"problem": result.too_new},
                )
                post_node_event(self._rest, self._settings.node_name, "CheckpointTooNew", result.too_new)
            raise NewerSchemaError(result.too_new)
        if result.unknown_fields and reported[1] != result.unknown_fields:
            log.warning(
                "checkpoint has fields this plugin does not know; they are kept as they are",
                extra={"path": str(self._store.path), "fields": list(result.unknown_fields)},
            )
        if result.migrated_from is not None:
            log.info("checkpoint migrated", extra={"from_schema": result.migrated_from})
        if not result.corruption:
            return result.checkpoint
        checkpoint = result.checkpoint
        driver, cdi_dir = self._settings.driver_name, self._settings.cdi_dir
        for uid in sorted(cdi.list_spec_claim_uids(cdi_dir, driver)):
            try:
                text = cdi.spec_path(cdi_dir, driver, uid).read_text()
            except (OSError, UnicodeDecodeError):
                continue
            entry = entry_from_spec(text, uid, driver, self._settings.node_name)
            if entry is not None:
                checkpoint = checkpoint.with_claim(uid, entry)
        self._store.save(checkpoint)
        unknown_gpu = sum(d.uuid is None for e in checkpoint.claims.values() for d in e.devices)
        message = f"{result.corruption}; recovered {len(checkpoint.claims)} prepared claims from their CDI specs" + (
            f" ({unknown_gpu} devices without a known GPU UUID)" if unknown_gpu else ""
        )
        self._metrics.checkpoint_corruptions.inc()
        log.error("checkpoint was corrupt and has been rebuilt", extra={"problem": message})
        post_node_event(self._rest, self._settings.node_name, "CheckpointCorrupt", message)
        return checkpoint

    @contextmanager
    def _locked(self, *, bounded: bool = True) -> Iterator[None]:
        """Hold this process's lock and the node-wide file lock; raises NodeLockTimeoutError (counted) when
        both are not ours within `node_lock_timeout_seconds`. Unbounded (`bounded=False`) at start, when no
        kubelet call is waiting."""
        if not bounded:
            with self._lock, serialize_lock(self._settings.lock_path):
                yield
            return
        timeout = self._settings.node_lock_timeout_seconds
        deadline = time.monotonic() + timeout
        with ExitStack() as held:
            if not self._lock.acquire(timeout=timeout):
                self._metrics.lock_timeouts.inc()
                raise NodeLockTimeoutError(
                    "lock_timeout",
                    f"another call of this fracgpu plugin held the node lock for {timeout:g} s; the kubelet retries",
                )
            held.callback(self._lock.release)
            try:
                held.enter_context(
                    serialize_lock(self._settings.lock_path, timeout=max(0.0, deadline - time.monotonic()))
                )
            except TimeoutError:
                self._metrics.lock_timeouts.inc()
                raise NodeLockTimeoutError(
                    "lock_timeout",
                    f"another fracgpu plugin instance held the node lock for {timeout:g} s; the kubelet retries",
                ) from None
            yield

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

    def _count_error(self, operation: str, kind: str) -> None:
        self._metrics.requests.labels(operation, "error").inc()
        self._metrics.errors.labels(operation, kind).inc()

    def health(self) -> list[tuple[str, str, bool]]:
        """(pool, device, healthy) for every GPU: healthy while its device node is present."""
        out = []
        for name, gpu in sorted(self._gpus.items()):
            node = self._settings.driver_root / "dev" / f"nvidia{gpu.minor}"
            out.append((self._settings.node_name, name, node.exists()))
        return out


def _show(ref: ClaimRef) -> str:
    return f"{ref.namespace}/{ref.name}"


def _no_answer(ref: ClaimRef, budget: float) -> str:
    return f"the API server did not answer within {budget:g} s when reading ResourceClaim {_show(ref)}; the kubelet retries"
