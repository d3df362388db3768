"""The controller's work loops: claim status writers, the ledger, Events, periodic resync.

kopf feeds the indexes (slices, claims, GPU objects) and calls the `*_changed` methods from its event
handlers; this module decides what to write and retries failed writes. All decisions are recomputed
from the indexes, never from what this process did before, so a restart converges to the same state.

Claims wait in a `WorkQueue` for `workers` concurrent status writers (64: at the API server's latency under a
burst, fewer writers leave claims queued behind writes in flight). The ledger is recomputed per GPU: a
claim event marks the GPUs its shares were and are on, a GPU event (our own write's echo included) marks that
GPU; each pass recomputes only the marked GPUs and writes those whose content differs (an echo compares equal
and costs one GPU's recompute), at most `ledger_workers` at a time. A slice change that alters the published
devices, a start and the periodic resync recompute the whole ledger. `controller.core.runtime` tunes the interpreter
for this mix of threads (GIL hand-over, garbage collection of the indexes' heap).
"""

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol, TypeVar

from api.gpu import GPU_CRD_NAME, PLUGIN_REPORTING_CONDITION, gpu_object_name
from api.gpu_config import MAX_PARAMETERS_DEPTH
from api.kube_rest import ApiError
from api.mig import TYPE_MIG
from controller.core import metrics, runtime
from controller.core.model import ClaimView, DeviceClassView, DeviceKey, DeviceRecord, Share, SliceView, current_devices
from controller.core.settings import FIELD_MANAGER, Settings
from controller.core.workqueue import QueueShutDownError, WorkQueue
from controller.ledger.plan import (
    ExistingGpu,
    GpuObject,
    desired_gpu,
    desired_ledger,
    family,
    identity_body,
    plan_ledger,
    shares_on,
    status_body,
)
from controller.nodes.plan import (
    Heartbeat,
    NodeGonePlan,
    node_gone_message,
    observe,
    plan_node_gone,
    plan_plugin_reporting,
    unchecked_reporting,
)
from controller.status.feasibility import plan_unsatisfiable
from controller.status.plan import apply_body, plan_status

log = logging.getLogger(__name__)
T = TypeVar("T")
ClaimKey = tuple[str, str]

REASON_DEVICE_GONE = "AllocatedDeviceGone"
REASON_UNSATISFIABLE = "UnsatisfiableGpuRequest"
REASON_SKIPPED_PARTS = "UnreadableClaimParts"
MAX_ATTEMPTS = 8


class Writer(Protocol):
    """The API writes the controller makes (blocking; called from worker threads)."""

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...
    def apply_gpu(self, body: dict[str, Any], *, status: bool) -> None: ...
    def delete_gpu(self, name: str) -> None: ...
    def post_claim_event(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        """Post the Event `key` about `claim` (idempotent per claim uid and key); never raises.

        True once it exists (or can never be posted); False when a retry may succeed.
        """
        ...

    def list_heartbeats(self, namespace: str) -> list[dict[str, Any]]:
        """The node plugins' heartbeat Leases of our driver in `namespace` (api/heartbeat.py). Raises on API errors."""
        ...


Index = Mapping[Any, Iterable[Any]]
"""kopf.Index shape: key -> collection of values."""


def describe(err: BaseException) -> str:
    """A one-line reason for a failed API call: the API server's message when it sent one."""
    if isinstance(err, ApiError):
        try:
            message = json.loads(err.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{err.status} {message or err.reason}"[:500]
    return f"{type(err).__name__}: {err}"[:500]


def _first(index: Index, key: Any) -> Any:
    values = index.get(key)
    return next(iter(values), None) if values is not None else None


class AdmissionFacts(NamedTuple):
    """What an admission review needs to know about the cluster. The event loop publishes a new one whenever it
    changes (one attribute assignment); the webhook's own thread only reads it."""

    largest: int | None = None
    """The largest memory amount any published GPU admits; None when no GPU is published."""
    hami_core: bool | None = None
    """Whether some published GPU offers HAMi-core enforcement; None when no GPU is published."""
    nvml: bool | None = None
    """Whether some published GPU offers nvml enforcement; None when no GPU is published."""
    mps: bool | None = None
    """Whether some published GPU is an MPS GPU; None when no GPU is published."""
    device_class: DeviceClassView | None = None
    """Our DeviceClass as the cluster has it; None when it is not (or not yet) seen."""


class EventPostError(Exception):
    """Some Event about a claim could not be posted; the claim's reconcile is retried."""


class Controller:
    """Reconciles claim status, the GPU ledger and claim Events from kopf's indexes."""

    def __init__(self, settings: Settings, writer: Writer) -> None:
        self.settings = settings
        self.writer = writer
        self.driver = settings.driver_name
        self._slices: Index = {}
        self._claims: Index = {}
        self._gpus: Index = {}
        self._classes: Index = {}
        self._nodes: Index | None = None  # node name -> uid; None: Nodes not watched
        self._heartbeats: dict[str, Heartbeat] = {}
        self._reporting: dict[str, dict[str, Any]] | None = None  # node -> PluginReporting; None: not computed yet
        self._devices: dict[DeviceKey, DeviceRecord] | None = None
        self._largest: int | None = None  # largest max_request of self._devices
        self._hami_core = False  # some device of self._devices offers HAMi-core
        self._nvml = False  # some device of self._devices offers nvml enforcement
        self._mps = False  # some device of self._devices is an MPS GPU
        self._names: dict[DeviceKey, str] = {}  # published device -> its GPU object's name
        self._name_keys: dict[str, DeviceKey] = {}  # and back
        # claims that were in the index at their last event -> the devices their shares were on then
        self._seen: dict[ClaimKey, frozenset[DeviceKey]] = {}
        self._on_device: dict[DeviceKey, set[ClaimKey]] = {}  # the inverse of _seen
        self.queue: WorkQueue[ClaimKey] = self._new_queue()
        """Claims waiting for a status writer."""
        self._posted: dict[str, set[tuple[str, ...]]] = {}  # claim uid -> event keys already posted
        self._missing_since: dict[tuple[str, str, str], float] = {}  # (uid, pool, device) -> monotonic
        self._dirty_gpus: set[str] = set()  # GPU object names the next ledger pass recomputes
        self._dirty_all = True  # the next ledger pass recomputes every GPU
        self._compact_due = False  # a full pass succeeded: compact the heap once a pass has nothing to write
        self._ledger_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # status writers, ledger writers and Event posts
        self._executor = self._new_executor()
        self._stopped = False
        self.ready = asyncio.Event()
        """Set once kopf delivered the first event after the indexes were populated."""
        self.admission = AdmissionFacts()
        """What admission reviews read (from the webhook's thread; see `AdmissionFacts`)."""

    # ----- wiring ---------------------------------------------------------------------------------

    def bind(
        self, slices: Index, claims: Index, gpus: Index, classes: Index | None = None, nodes: Index | None = None
    ) -> None:
        """Attach kopf's live indexes (passed to startup handlers before they are populated)."""
        self._slices, self._claims, self._gpus = slices, claims, gpus
        self._classes = classes if classes is not None else {}
        self._nodes = nodes
        self._devices = None
        self.admission = AdmissionFacts()
        self._seen.clear()
        self._on_device.clear()
        self._mark_all()

    def _new_queue(self) -> WorkQueue[ClaimKey]:
        return WorkQueue(
            max_attempts=MAX_ATTEMPTS, on_depth=metrics.RECONCILE_QUEUE.set, on_wait=metrics.QUEUE_WAIT_SECONDS.observe
        )

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            max_workers=self.settings.workers + self.settings.ledger_workers + 4, thread_name_prefix="fracgpu-api"
        )

    async def start(self) -> None:
        """Start the writers, the ledger loop and the resync loop. A start after `stop` (leadership regained,
        controller/leadership/gate.py) is a full resync: every indexed claim is queued, the whole ledger recomputed."""
        metrics.time_gc()
        runtime.tune()
        if self._stopped:
            self.queue, self._executor, self._stopped = self._new_queue(), self._new_executor(), False
        for key in list(self._claims):
            self.queue.add(key)
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"claim-worker-{i}") for i in range(self.settings.workers)
        ]
        self._mark_all()
        self._tasks.append(asyncio.create_task(self._ledger_loop(), name="ledger"))
        self._tasks.append(asyncio.create_task(self._resync_loop(), name="resync"))
        if self.settings.namespace is not None:
            self._tasks.append(asyncio.create_task(self._heartbeat_loop(self.settings.namespace), name="heartbeats"))
        self._tasks.append(asyncio.create_task(_loop_lag(), name="loop-lag"))

    async def stop(self) -> None:
        """Cancel every loop and wait for them; in-flight API calls finish in their threads."""
        self.queue.shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._stopped = True

    # ----- inputs from kopf handlers (event loop) ------------------------------------------------

    def claim_event(self, key: ClaimKey, uid: str, *, deleted: bool, indexed: bool) -> None:
        """Any watch event of any claim; `indexed`: whether the claim is in our index after it.

        A claim can leave the index without being deleted (deallocated, and asking for another DeviceClass
        of our driver): if it was known, its shares must leave the ledger.
        """
        if deleted:
            self._untrack(key)
            self.claim_deleted(uid)
        elif indexed:
            self.claim_changed(key)
        elif key in self._seen:
            self._untrack(key)
            self.ready.set()
            self._forget_missing(uid)

    def claim_changed(self, key: ClaimKey) -> None:
        """A claim of ours was added or modified (its index entry is already updated): reconcile its status,
        recompute the GPUs its shares were and are on."""
        self.ready.set()
        view: ClaimView | None = _first(self._claims, key)
        now = frozenset(s.device_key for s in view.shares) if view is not None else frozenset()
        before = self._seen.get(key, frozenset())
        self._seen[key] = now
        for device in before - now:
            self._on_device.get(device, set()).discard(key)
        for device in now:
            self._on_device.setdefault(device, set()).add(key)
        self._mark_devices(before | now)
        self.enqueue(key)

    def _untrack(self, key: ClaimKey) -> None:
        """A claim left the index: the GPUs its shares were on drop them."""
        before = self._seen.pop(key, frozenset())
        for device in before:
            self._on_device.get(device, set()).discard(key)
        self._mark_devices(before)

    def claim_deleted(self, uid: str) -> None:
        """A claim is gone: forget its Event bookkeeping (`claim_event` drops its shares from the ledger)."""
        self.ready.set()
        self._posted.pop(uid, None)
        self._forget_missing(uid)

    def _forget_missing(self, uid: str) -> None:
        for k in [k for k in self._missing_since if k[0] == uid]:
            del self._missing_since[k]

    def slices_changed(self) -> None:
        """A slice of our driver changed: devices may have appeared, changed or vanished.

        Claims and the ledger are re-checked only when the published devices differ from before (a
        re-list delivers every slice again without changing any).
        """
        self.ready.set()
        previous = self._devices
        if self._refresh_devices() == previous:
            return
        for key in list(self._claims):
            self.enqueue(key)
        self._mark_all()

    def node_deleted(self, name: str) -> None:
        """The Node `name` is gone: its claims get `AllocatedDeviceGone` (their slices and GPU objects go by owner
        reference, and with the published devices)."""
        self.ready.set()
        for view in self.claims():
            if view.node == name:
                self.enqueue(view.key)

    def node_names(self) -> Collection[str] | None:
        """The Nodes that exist; None while they are not known (not watched, or kopf's indexes not yet populated)."""
        if self._nodes is None or not self.ready.is_set():
            return None
        return self._nodes.keys()

    def classes_changed(self) -> None:
        """Our DeviceClass changed: its selectors and configs apply to every claim."""
        self.ready.set()
        self._publish_admission()
        for key in list(self._claims):
            self.enqueue(key)

    def gpus_changed(self, name: str) -> None:
        """The GPU object `name` changed (possibly by someone else, or the echo of our own write): re-check it."""
        self.ready.set()
        self._dirty_gpus.add(name)
        self._ledger_wake.set()

    def enqueue(self, key: ClaimKey) -> None:
        """Schedule a reconcile of one claim (deduplicated; see `WorkQueue`)."""
        self.queue.add(key)

    def ledger_pending(self) -> bool:
        """Whether some GPU awaits a ledger pass (marked by a change since the last pass began)."""
        return self._dirty_all or bool(self._dirty_gpus)

    def _mark_devices(self, devices: Iterable[DeviceKey]) -> None:
        names = [self._names[d] for d in devices if d in self._names]  # unpublished: no object is desired
        if names:
            self._dirty_gpus.update(names)
            self._ledger_wake.set()

    def _mark_all(self) -> None:
        self._dirty_all = True
        self._ledger_wake.set()

    # ----- derived views -------------------------------------------------------------------------

    def _refresh_devices(self) -> dict[DeviceKey, DeviceRecord]:
        views: list[SliceView] = [v for values in self._slices.values() for v in values]
        devices = current_devices(views)
        if devices != self._devices:
            self._devices = devices
            self._largest = max((d.max_request for d in devices.values()), default=None)
            self._hami_core = any(d.hami_core for d in devices.values())
            self._nvml = any(d.memory_enforcement == "nvml" for d in devices.values())
            self._mps = any(d.memory_enforcement == "mps" for d in devices.values())
            self._names = {key: gpu_object_name(d.node, d.ledger_device) for key, d in devices.items()}
            self._name_keys = {name: key for key, name in self._names.items() if devices[key].kind != TYPE_MIG}
            self._publish_admission()
        return devices

    def _publish_admission(self) -> None:
        published = bool(self._devices)
        self.admission = AdmissionFacts(
            largest=self._largest,
            hami_core=self._hami_core if published else None,
            nvml=self._nvml if published else None,
            mps=self._mps if published else None,
            device_class=self.device_class(),
        )

    def devices(self) -> dict[DeviceKey, DeviceRecord]:
        """Published devices of our driver (newest pool generations), cached until a slice changes."""
        return self._devices if self._devices is not None else self._refresh_devices()

    def largest_request(self) -> int | None:
        """The largest memory amount any published GPU admits; None when no GPU is published (cached)."""
        if self._devices is None:
            self._refresh_devices()
        return self._largest

    def hami_core_offered(self) -> bool | None:
        """Whether some published GPU offers HAMi-core enforcement; None when no GPU is published (cached)."""
        if self._devices is None:
            self._refresh_devices()
        return self._hami_core if self._devices else None

    def nvml_offered(self) -> bool | None:
        """Whether some published GPU offers nvml enforcement; None when no GPU is published (cached)."""
        if self._devices is None:
            self._refresh_devices()
        return self._nvml if self._devices else None

    def device_class(self) -> DeviceClassView | None:
        """Our DeviceClass as the cluster has it; None when it is not (or not yet) seen."""
        view: DeviceClassView | None = _first(self._classes, self.settings.device_class)
        return view

    def claims(self) -> list[ClaimView]:
        return [v for values in self._claims.values() for v in values]

    # ----- claim status --------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDownError:
                return
            try:
                await self.reconcile_claim(key)
                self.queue.forget(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._retry(key, err)
            finally:
                self.queue.done(key)

    def _retry(self, key: ClaimKey, err: Exception) -> None:
        status = err.status if isinstance(err, ApiError) else None
        body = str(err.body).lower() if isinstance(err, ApiError) else ""
        if status == 404 or (status == 409 and "uid" in body):
            log.info("claim gone or replaced; not retrying", extra={"claim": "/".join(key), "status": status})
            self.queue.forget(key)
            return
        delay = self.queue.retry(key)
        if delay is None:
            log.error(
                "giving up on claim status after %d attempts: %s",
                MAX_ATTEMPTS,
                describe(err),
                extra={"claim": "/".join(key)},
            )
            return
        log.warning(
            "claim status write failed; retrying",
            extra={"claim": "/".join(key), "error": describe(err), "retry_in": delay},
        )

    async def reconcile_claim(self, key: ClaimKey) -> None:
        """Write the claim's status entries if they differ; post Events about it. Raises on API errors."""
        claim: ClaimView | None = _first(self._claims, key)
        if claim is None:
            return
        metrics.RECONCILES.inc()
        told = await self._skipped_parts_event(claim)  # before the write: the API server may refuse that one
        devices = self.devices()
        plan = plan_status(claim, devices.get, self.driver)
        gone = plan_node_gone(claim, self.node_names(), plan.entries, self.driver, datetime.datetime.now(datetime.UTC))
        if plan.changed or gone.changed:
            started = time.monotonic()
            try:
                await self._run(
                    self.writer.apply_claim_status, claim.namespace, claim.name, apply_body(claim, gone.entries)
                )
            except Exception:
                metrics.STATUS_WRITES.labels("error").inc()
                raise
            metrics.STATUS_WRITES.labels("ok").inc()
            metrics.STATUS_WRITE_SECONDS.observe(time.monotonic() - started)
        posted = await self._device_gone_events(claim, tuple(s for s in plan.missing if s not in gone.shares))
        posted = await self._node_gone_event(claim, gone) and posted
        posted = await self._unsatisfiable_events(claim) and posted
        posted = told and posted
        if not posted:
            raise EventPostError(f"an Event about claim {claim.namespace}/{claim.name} could not be posted")

    # ----- events --------------------------------------------------------------------------------

    async def _post_once(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        """Post the Event `key` unless it was posted already; False when the post failed (retry later).

        Event names are derived from (claim uid, key), so a post repeated after a restart is answered
        AlreadyExists and counts as posted; a key is remembered only once its post succeeded.
        """
        if key in self._posted.get(claim.uid, ()):
            return True
        if not await self._run(self.writer.post_claim_event, claim, key, reason, message):
            return False
        self._posted.setdefault(claim.uid, set()).add(key)
        metrics.EVENTS.labels(reason).inc()
        log.warning(message, extra={"claim": f"{claim.namespace}/{claim.name}", "reason": reason})
        return True

    async def _device_gone_events(self, claim: ClaimView, missing: tuple[Share, ...]) -> bool:
        ok = True
        now = time.monotonic()
        gone = {(claim.uid, s.pool, s.device) for s in missing}
        for k in [k for k in self._missing_since if k[0] == claim.uid and k not in gone]:
            del self._missing_since[k]  # published again
        grace = self.settings.device_gone_grace_seconds
        for share in missing:
            since = self._missing_since.setdefault((claim.uid, share.pool, share.device), now)
            if now - since < grace:
                self.queue.add_after(claim.key, since + grace - now + 0.05)
                continue
            message = (
                f"request {share.request!r} was allocated device {share.device} of pool {share.pool} "
                f"(driver {self.driver}), which no longer exists: the GPU was removed or its node plugin "
                "stopped publishing it; delete the pod and its claim to get another GPU"
            )
            key = (REASON_DEVICE_GONE, share.pool, share.device)
            ok = await self._post_once(claim, key, REASON_DEVICE_GONE, message) and ok
        return ok

    async def _node_gone_event(self, claim: ClaimView, gone: NodeGonePlan) -> bool:
        if gone.node is None:
            return True
        message = node_gone_message(claim, gone.node, self.driver)
        return await self._post_once(claim, (REASON_DEVICE_GONE, "node", gone.node), REASON_DEVICE_GONE, message)

    async def _unsatisfiable_events(self, claim: ClaimView) -> bool:
        ok = True
        classes = {n: v for n in self.settings.claim_classes if (v := _first(self._classes, n)) is not None}
        for found in plan_unsatisfiable(claim, self.devices().values(), classes, self.driver):
            key = (REASON_UNSATISFIABLE, found.request, found.message)  # a changed reason is told again
            ok = await self._post_once(claim, key, REASON_UNSATISFIABLE, found.message) and ok
        return ok

    async def _skipped_parts_event(self, claim: ClaimView) -> bool:
        if not claim.skipped:
            return True
        message = (
            f"{self.driver}: parts of this claim cannot be decoded safely and were skipped by the controller: "
            + "; ".join(claim.skipped)
            + f". The rest of the claim is handled as usual; GpuConfig parameters may nest at most "
            f"{MAX_PARAMETERS_DEPTH} levels"
        )
        return await self._post_once(claim, (REASON_SKIPPED_PARTS, *claim.skipped), REASON_SKIPPED_PARTS, message)

    # ----- ledger --------------------------------------------------------------------------------

    async def _ledger_loop(self) -> None:
        failures = 0
        while True:
            await self._ledger_wake.wait()
            await asyncio.sleep(self.settings.ledger_delay_seconds)  # batch the changes of this window
            self._ledger_wake.clear()
            if await self.ledger_pass():
                failures = 0
                continue
            failures += 1
            await asyncio.sleep(min(30.0, 0.5 * 2**failures))
            self._ledger_wake.set()

    async def ledger_pass(self) -> bool:
        """Recompute and write what was marked since the last pass (every GPU, or the marked ones); False when
        some write failed, and then its GPUs stay marked for the next pass."""
        full, names = self._dirty_all, self._dirty_gpus
        self._dirty_all, self._dirty_gpus = False, set()
        started = time.monotonic()
        try:
            ok = await self.reconcile_ledger(None if full else names)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ledger reconcile failed")
            ok = False
        metrics.LEDGER_PASS_SECONDS.observe(time.monotonic() - started)
        self._compact_due = self._compact_due or (ok and full)
        if not ok:
            self._dirty_all = self._dirty_all or full
            self._dirty_gpus |= names
        return ok

    def _desired(self, names: Collection[str] | None) -> dict[str, GpuObject]:
        devices = self.devices()
        known = self._reporting
        if known is None and self.settings.namespace is not None:  # before the first listing: what the ledger holds
            known = self._written_reporting()
        if names is None:
            self._on_device = {}
            for view in self.claims():  # the inverse index rebuilt from the claims index: self-healing
                for share in view.shares:
                    self._on_device.setdefault(share.device_key, set()).add(view.key)
            nodes = {d.node for d in devices.values()}
            by_node = {n: c for n in nodes if (c := self._reporting_of(n, known)) is not None}
            return desired_ledger(devices, self.claims(), self.driver, FIELD_MANAGER, by_node)
        out: dict[str, GpuObject] = {}
        for name in names:
            key = self._name_keys.get(name)
            if key is None or key not in devices:
                continue
            keys = family(key, devices)  # the GPU and, for a MIG GPU, its partitions
            claim_keys = {c for k in keys for c in self._on_device.get(k, ())}
            views = [v for c in claim_keys if (v := _first(self._claims, c)) is not None]
            reporting = self._reporting_of(devices[key].node, known)
            partitions = {k: devices[k] for k in keys[1:]}
            shares = shares_on(key, views, partitions)
            out[name] = desired_gpu(devices[key], shares, self.driver, FIELD_MANAGER, reporting, partitions=partitions)
        return out

    async def reconcile_ledger(self, names: Collection[str] | None = None) -> bool:
        """Bring GPU objects in line with devices and claims, all of them or only the objects `names`; False
        if some write failed. An object of our driver whose device is not published is deleted."""
        desired = self._desired(names)
        if names is None:
            existing: dict[str, ExistingGpu] = {v.name: v for values in self._gpus.values() for v in values}
        else:
            existing = {n: v for n in names if (v := _first(self._gpus, n)) is not None}
        plan = plan_ledger(desired, existing, self.driver)
        metrics.LEDGER_OBJECTS.set(len(self.devices()))
        if plan.empty:
            if self._compact_due:  # quiet after a start or resync: the heap now is the steady one
                self._compact_due = False
                metrics.GC_FROZEN.set(runtime.compact())
            return True
        identity = {o.name for o in plan.apply_identity}
        status = {o.name for o in plan.apply_status}
        objects = {o.name: o for o in (*plan.apply_identity, *plan.apply_status)}
        limit = asyncio.Semaphore(self.settings.ledger_workers)
        failures: list[str] = []

        async def write(kind: str, fn: Callable[..., None], *args: Any, **kwargs: Any) -> bool:
            async with limit:
                started = time.monotonic()
                try:
                    await self._run(fn, *args, **kwargs)
                except ApiError as err:
                    metrics.LEDGER_WRITES.labels(kind, "error").inc()
                    failures.append(f"{kind}: {describe(err)}")
                    return False
                metrics.LEDGER_WRITES.labels(kind, "ok").inc()
                metrics.LEDGER_WRITE_SECONDS.labels(kind).observe(time.monotonic() - started)
                return True

        async def upsert(name: str) -> bool:
            obj = objects[name]
            if name in identity and not await write("apply", self.writer.apply_gpu, identity_body(obj), status=False):
                return False  # the status of an object that could not be created cannot be applied
            if name in status:
                return await write("status", self.writer.apply_gpu, status_body(obj), status=True)
            return True

        results = await asyncio.gather(
            *(upsert(name) for name in sorted(objects)),
            *(write("delete", self.writer.delete_gpu, name) for name in plan.delete),
        )
        if failures:
            hint = f" (is the CRD {GPU_CRD_NAME} installed?)" if any(": 404 " in f for f in failures) else ""
            log.warning("%d GPU object writes failed%s; first: %s", len(failures), hint, failures[0])
        return all(results)

    # ----- node plugin heartbeats ------------------------------------------------------------------

    async def _heartbeat_loop(self, namespace: str) -> None:
        """List the heartbeat Leases a few times per timeout and update each node's `PluginReporting`. A failed
        list changes nothing (the controller's own outage says nothing about the plugins)."""
        period = min(15.0, max(0.5, self.settings.plugin_heartbeat_timeout_seconds / 4))
        await self.ready.wait()  # the GPU index holds the conditions written before (their transition times)
        while True:
            try:
                leases = await self._run(self.writer.list_heartbeats, namespace)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("cannot list the node plugins' heartbeat Leases", extra={"error": describe(err)})
            else:
                self.heartbeats_listed(namespace, leases, datetime.datetime.now(datetime.UTC))
            await asyncio.sleep(period)

    def _written_reporting(self) -> dict[str, dict[str, Any]]:
        """node -> the `PluginReporting` condition its GPU objects carry now (the GPU index)."""
        return {
            str(gpu.status.get("node")): c
            for values in self._gpus.values()
            for gpu in values
            if gpu.status
            for c in gpu.status.get("conditions") or []
            if c.get("type") == PLUGIN_REPORTING_CONDITION
        }

    def _reporting_of(self, node: str, known: Mapping[str, dict[str, Any]] | None) -> dict[str, Any] | None:
        """The node's `PluginReporting` condition for its GPU objects: planned from the heartbeats (`known`), else
        Unknown until the first listing that covers it; without a namespace (heartbeats not watched) none."""
        planned = (known or {}).get(node)
        if planned is not None or self.settings.namespace is None:
            return planned
        return unchecked_reporting(node, self.settings.namespace)

    def heartbeats_listed(self, namespace: str, leases: Iterable[Mapping[str, Any]], now: datetime.datetime) -> None:
        """Record a listing of the heartbeat Leases at `now`; mark the GPUs of nodes whose condition changed."""
        self._heartbeats = observe(self._heartbeats, leases, now)
        if self._reporting is None:  # a restart keeps the transition times the ledger holds
            self._reporting = self._written_reporting()
        nodes = {d.node for d in self.devices().values()}
        before = self._reporting
        self._reporting = plan_plugin_reporting(
            nodes,
            self._heartbeats,
            before,
            now=now,
            timeout_s=self.settings.plugin_heartbeat_timeout_seconds,
            namespace=namespace,
        )
        changed = {n for n in nodes if before.get(n) != self._reporting[n]}
        self._mark_devices(d.key for d in self.devices().values() if d.node in changed)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            for key in list(self._claims):
                self.enqueue(key)
            self._mark_all()


LOOP_LAG_PERIOD = 0.25
"""Seconds between the event loop lag probe's timers."""


async def _loop_lag() -> None:
    """Observe how late the event loop runs a timer (`metrics.LOOP_LAG_SECONDS`): every status write, watch event
    and ledger pass waits behind whatever holds the loop (or the GIL) that long."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LOOP_LAG_PERIOD
        await asyncio.sleep(LOOP_LAG_PERIOD)
        metrics.LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - due))
