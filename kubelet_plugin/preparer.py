"""NodePrepareResources / NodeUnprepareResources for fracgpu: claims in, CDI specs and a checkpoint out.

Contract (dra-facts §3): every claim in a call gets an answer; a problem with one claim is that claim's
error, never an exception for the call. Prepare is idempotent (a repeat gives the same answer and re-writes
the CDI spec, which a reboot may have wiped); unprepare of an unknown claim succeeds. All checkpoint and
spec changes happen under one lock shared by every plugin instance on the node.

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

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from api.kube_rest import ApiTimeout, KubeRest, UndecodableResponse, claim_path
from kubelet_plugin import cdi
from kubelet_plugin.checkpoint import Checkpoint, CheckpointDevice, CheckpointStore, ClaimEntry
from kubelet_plugin.claim_spec import PrepareError, hami_cache_dir, hami_preload_file, plan_claim
from kubelet_plugin.claim_status import apply_ready, is_ready
from kubelet_plugin.devicenodes import ensure_char_links
from kubelet_plugin.events import post_node_event
from kubelet_plugin.filelock import atomic_write, remove_temp_files, serialize_lock
from kubelet_plugin.metrics import PluginMetrics
from kubelet_plugin.model import ClaimRef, GpuInfo, PreparedDevice, PrepareResult
from kubelet_plugin.ready_writer import ReadyWriter
from kubelet_plugin.settings import Settings

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
        api: client.ApiClient,
        settings: Settings,
        gpus: list[GpuInfo],
        store: CheckpointStore,
        metrics: PluginMetrics,
    ) -> None:
        self._rest = KubeRest.bounded(api, settings.api_timeout_seconds)
        self._settings = settings
        self._gpus = {g.device_name: g for g in gpus}
        self._store = store
        self._metrics = metrics
        self._lock = threading.Lock()
        self._fetch_pool = ThreadPoolExecutor(max_workers=FETCH_WORKERS, thread_name_prefix="fracgpu-fetch")
        self._ready = ReadyWriter(
            lambda claim: apply_ready(self._rest, claim, settings.driver_name, settings.node_name),
            lambda: metrics.errors.labels("prepare", "status_update").inc(),
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    def recover(self) -> None:
        """At start: load the checkpoint (reporting and replacing a corrupt one), drop claims whose prepare
        never completed together with their specs, delete specs no completed claim owns, and re-write the
        specs of completed claims if the node rebooted."""
        with self._locked():
            checkpoint = self._load()
            result_rebooted = checkpoint.node_boot_id != self._store.current_boot_id
            for uid, entry in list(checkpoint.claims.items()):
                if entry.state != "PrepareCompleted":
                    log.warning("dropping half-prepared claim", extra={"claim": uid, "claim_name": entry.name})
                    cdi.remove_spec(self._settings.cdi_dir, self._settings.driver_name, uid)
                    checkpoint = checkpoint.without_claim(uid)
            for uid in cdi.list_spec_claim_uids(self._settings.cdi_dir, self._settings.driver_name):
                if uid not in checkpoint.claims:
                    log.warning("removing orphaned CDI spec", extra={"claim": uid})
                    cdi.remove_spec(self._settings.cdi_dir, self._settings.driver_name, uid)
            for directory, prefix in (
                (self._settings.cdi_dir, cdi.spec_file_prefix(self._settings.driver_name)),
                (self._store.path.parent, self._store.path.name),
            ):
                for tmp in remove_temp_files(directory, prefix):
                    log.warning("removed a temp file of an interrupted write", extra={"path": str(tmp)})
            if result_rebooted:
                checkpoint = self._rewrite_after_reboot(checkpoint)
            self._store.save(checkpoint)
            self._metrics.prepared_claims.set(len(checkpoint.claims))

    def _rewrite_after_reboot(self, checkpoint: Checkpoint) -> Checkpoint:
        for uid, entry in list(checkpoint.claims.items()):
            try:
                claim = self._fetch(ClaimRef(namespace=entry.namespace, name=entry.name, uid=uid))
                self._write(claim, entry)
            except PrepareError as err:
                if err.kind in ("claim_not_found", "uid_mismatch"):  # the claim is gone: nothing to restore
                    log.warning("claim gone after reboot; dropping it", extra={"claim": uid, "error": str(err)})
                    checkpoint = checkpoint.without_claim(uid)
                else:  # keep it: the kubelet re-prepares its claims after its own restart, re-writing the spec
                    log.warning("cannot restore claim after reboot yet", extra={"claim": uid, "error": str(err)})
        return checkpoint.with_boot_id(self._store.current_boot_id)

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
                        if devices and not is_ready(claim, self._settings.driver_name):
                            ready.append(claim)
                    if completed != started:  # `started` is what the file holds now
                        self._store.save(completed)
                    self._metrics.prepared_claims.set(len(completed.claims))
            except NodeLockTimeoutError as err:  # nothing was written; a claim that could not be read keeps that error
                for ref in claims:
                    own = fetched[ref.uid]
                    self._fail(results, ref, own if isinstance(own, PrepareError) else err)
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
        """Remove each claim's CDI spec and checkpoint entry; unknown claims are fine."""
        with self._measure("unprepare"), self._locked():
            checkpoint = self._load()
            updated = checkpoint
            errors: dict[str, str] = {}
            for ref in claims:
                try:
                    cdi.remove_spec(self._settings.cdi_dir, self._settings.driver_name, ref.uid)
                    shutil.rmtree(hami_cache_dir(self._settings, ref.uid), ignore_errors=True)
                except OSError as err:
                    self._count_error("unprepare", "internal")
                    errors[ref.uid] = f"cannot remove CDI spec of claim {_show(ref)}: {err}"
                    continue
                updated = updated.without_claim(ref.uid)
                errors[ref.uid] = ""
                self._metrics.requests.labels("unprepare", "ok").inc()
            if updated != checkpoint:
                self._store.save(updated)
            self._metrics.prepared_claims.set(len(updated.claims))
            return errors

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
        except ApiException as err:
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
        """Write the claim's CDI spec (and HAMi-core files); return the devices for the kubelet.

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
        plan = plan_claim(claim, self._settings, self._gpus)
        if plan.spec is None:
            return ()
        uid = claim["metadata"]["uid"]
        try:
            if any(d.container_edits.mounts for d in plan.spec.devices):
                self._prepare_hami_files(uid)
            cdi.write_spec(self._settings.cdi_dir, uid, plan.spec, self._settings.driver_name)
        except OSError as err:
            raise PrepareError("internal", f"cannot write CDI spec for claim {uid}: {err}") from None
        ensure_char_links(self._settings.dev_char_dir, list(plan.nodes))
        return plan.devices

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
        """The checkpoint on disk; a corrupt one is reported and rebuilt from the CDI specs present, so the
        claims of running pods stay known (and their specs are not taken for orphans)."""
        result = self._store.load()
        if not result.corruption:
            return result.checkpoint
        checkpoint = result.checkpoint
        for uid in sorted(cdi.list_spec_claim_uids(self._settings.cdi_dir, self._settings.driver_name)):
            owner = cdi.spec_claim(self._settings.cdi_dir, self._settings.driver_name, uid)
            if owner is not None:
                entry = ClaimEntry(namespace=owner[0], name=owner[1], state="PrepareCompleted")
                checkpoint = checkpoint.with_claim(uid, entry)
        self._store.save(checkpoint)
        message = f"{result.corruption}; recovered {len(checkpoint.claims)} prepared claims from their CDI specs"
        self._metrics.checkpoint_corruptions.inc()
        log.error("checkpoint was corrupt and has been rebuilt", extra={"problem": message})
        post_node_event(self._rest, self._settings.node_name, "CheckpointCorrupt", message)
        return checkpoint

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold this process's lock and the node-wide file lock; raises NodeLockTimeoutError (counted) when
        both are not ours within `node_lock_timeout_seconds`."""
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
