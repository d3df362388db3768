"""The ledger's manager: which GPU objects need recomputing, the ledger loop, and its writes.

The entry marks the GPUs a claim's shares were and are on at each claim event (from the shared claim index,
`controller/devices/claim_index.py`), a GPU event marks that GPU, the echo of our own write included
(`LedgerMarks.name`); a pass, at most every `--ledger-delay` while marks arrive, recomputes only the marked GPUs
with `desired_gpu` (their claims read from the claim index) and writes those whose content differs (`plan_ledger`:
an echo compares equal and costs one GPU's recompute), at most `--ledger-workers` at a time. A change of the
published devices, a start and the periodic resync mark every GPU (`LedgerMarks.all`): that pass recomputes the
whole ledger with `desired_ledger` and deletes objects of our driver whose device is gone. A DeviceTaintRule event
marks the GPUs its selector matched before and matches now (`rule_changed`). A pass whose writes failed keeps its
GPUs marked for the next one.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any

from api.gpu import GPU_CRD_NAME
from api.kube_errors import ApiError, ApiNotFound
from controller.core import metrics, runtime
from controller.core.context import Context, Tasks
from controller.core.kube import describe
from controller.core.settings import FIELD_MANAGER
from controller.core.slices import DeviceKey, TaintRuleView
from controller.devices.catalogue import DeviceCatalogue
from controller.devices.claim_index import ClaimIndex
from controller.ledger.plan import (
    ExistingGpu,
    GpuObject,
    LedgerPlan,
    desired_gpu,
    desired_ledger,
    device_taints,
    family,
    identity_body,
    plan_ledger,
    shares_on,
    status_body,
)
from controller.nodes.heartbeats import Reporting

log = logging.getLogger(__name__)


class LedgerMarks:
    """Which GPU objects the next pass recomputes: some by name, or all; and the wake-up of the ledger loop."""

    def __init__(self, catalogue: DeviceCatalogue) -> None:
        self._catalogue = catalogue
        self._names: set[str] = set()
        self._all = True
        self.wake = asyncio.Event()

    def devices(self, devices: Iterable[DeviceKey]) -> None:
        """Mark the GPUs of these devices (a device not published has no object to recompute)."""
        names = [n for d in devices if (n := self._catalogue.object_name(d)) is not None]
        if names:
            self._names.update(names)
            self.wake.set()

    def name(self, name: str) -> None:
        self._names.add(name)
        self.wake.set()

    def nodes(self, nodes: set[str]) -> None:
        """Mark the GPUs of `nodes` (their plugins' reporting changed)."""
        self.devices(k for k, d in self._catalogue.devices().items() if d.node in nodes)

    def all(self) -> None:
        self._all = True
        self.wake.set()

    def pending(self) -> bool:
        """Whether some GPU awaits a pass (marked by a change since the last pass began)."""
        return self._all or bool(self._names)

    def take(self) -> tuple[bool, set[str]]:
        """(all, names) marked until now; the marks start empty again."""
        taken = self._all, self._names
        self._all, self._names = False, set()
        return taken

    def keep(self, everything: bool, names: set[str]) -> None:
        """Mark again what a failed pass took."""
        self._all = self._all or everything
        self._names |= names


class LedgerManager:
    """The ledger loop over the marks, reading each GPU's claims from the shared claim index."""

    def __init__(
        self,
        context: Context,
        catalogue: DeviceCatalogue,
        marks: LedgerMarks,
        *,
        claims: ClaimIndex,
        reporting: Callable[[Collection[str]], Awaitable[Reporting]],
        trust_domain: Callable[[DeviceKey], str | None] = lambda _: None,
    ) -> None:
        """`claims`: the claim index the entry keeps; `reporting`: each node's `PluginReporting` condition for one
        pass over the GPUs of the given nodes (`NodeReporting.reporting`, which lists the heartbeats first when
        some node was not covered yet); `trust_domain`: the trust domain an MPS GPU serves
        (`MpsDomains.serving_id`)."""
        self._context = context
        self._catalogue = catalogue
        self.marks = marks
        self._claims = claims
        self._reporting = reporting
        self._trust_domain = trust_domain
        self._rules: dict[str, TaintRuleView] = {}  # DeviceTaintRules at their last event
        self._compact_due = False  # a full pass succeeded: compact the heap once a pass has nothing to write
        self._tasks = Tasks()

    def reset(self) -> None:
        """New indexes bound: recompute everything."""
        self._rules.clear()
        self.marks.all()

    def rule_changed(self, name: str) -> None:
        """A DeviceTaintRule changed or went (its index entry is updated): mark the GPUs it selected and selects."""
        now = self._context.taint_rule(name)
        before = self._rules.pop(name, None)
        if now is not None:
            self._rules[name] = now
        rules = [r for r in (before, now) if r is not None]
        driver = self._context.driver
        self.marks.devices(
            k for k, d in self._catalogue.devices().items() if any(r.matches(driver, d.pool, d.device) for r in rules)
        )

    # ----- the loop -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.marks.all()
        self._tasks.spawn(self._loop(), "ledger")

    async def stop(self) -> None:
        await self._tasks.cancel()

    async def _loop(self) -> None:
        failures = 0
        while True:
            await self.marks.wake.wait()
            await asyncio.sleep(self._context.settings.ledger_delay_seconds)  # batch the changes of this window
            self.marks.wake.clear()
            if await self.run_pass():
                failures = 0
                continue
            failures += 1
            await asyncio.sleep(min(30.0, 0.5 * 2**failures))
            self.marks.wake.set()

    async def run_pass(self) -> bool:
        """Recompute and write what was marked since the last pass (every GPU, or the marked ones); False when
        some write failed, and then its GPUs stay marked for the next pass."""
        full, names = self.marks.take()
        started = time.monotonic()
        try:
            ok = await self.reconcile(None if full else names)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ledger reconcile failed")
            ok = False
        metrics.LEDGER_PASS_SECONDS.observe(time.monotonic() - started)
        self._compact_due = self._compact_due or (ok and full)
        if not ok:
            self.marks.keep(full, names)
        return ok

    def _nodes(self, names: Collection[str] | None) -> set[str]:
        """The nodes of the GPUs a pass recomputes (every published one's, or those of `names`)."""
        if names is None:
            return set(self._catalogue.nodes())
        devices = self._catalogue.devices()
        return {devices[k].node for n in names if (k := self._catalogue.device_of(n)) is not None and k in devices}

    def _desired(self, names: Collection[str] | None, reporting: Reporting) -> dict[str, GpuObject]:
        devices = self._catalogue.devices()
        driver = self._context.driver
        if names is None:
            by_node = {n: c for n in self._catalogue.nodes() if (c := reporting(n)) is not None}
            return desired_ledger(
                devices,
                self._context.claims(),
                driver,
                FIELD_MANAGER,
                by_node,
                trust_domain=self._trust_domain,
                rules=self._context.taint_rules(),
            )
        out: dict[str, GpuObject] = {}
        rules = self._context.taint_rules()
        for name in names:
            key = self._catalogue.device_of(name)
            if key is None or key not in devices:
                continue
            keys = family(key, devices)  # the GPU and, for a MIG GPU, its partitions
            claim_keys = {c for k in keys for c in self._claims.claims_on(k)}
            views = [v for c in claim_keys if (v := self._context.claim(c)) is not None]
            device = devices[key]
            partitions = {k: devices[k] for k in keys[1:]}
            out[name] = desired_gpu(
                device,
                shares_on(key, views, partitions),
                driver,
                FIELD_MANAGER,
                reporting(device.node),
                partitions=partitions,
                mps_trust_domain=self._trust_domain(key),
                taints=device_taints(driver, [devices[k] for k in keys], rules),
            )
        return out

    async def reconcile(self, names: Collection[str] | None = None) -> bool:
        """Bring GPU objects in line with devices and claims, all of them or only the objects `names`; False
        if some write failed. An object of our driver whose device is not published is deleted."""
        desired = self._desired(names, await self._reporting(self._nodes(names)))
        if names is None:
            existing: dict[str, ExistingGpu] = {v.name: v for v in self._context.gpus()}
        else:
            existing = {n: v for n in names if (v := self._context.gpu(n)) is not None}
        plan = plan_ledger(desired, existing, self._context.driver)
        metrics.LEDGER_OBJECTS.set(len(self._catalogue.devices()))
        if plan.empty:
            if self._compact_due:  # quiet after a start or resync: the heap now is the steady one
                self._compact_due = False
                metrics.GC_FROZEN.set(runtime.compact())
            return True
        return await write_ledger(self._context, plan)


async def write_ledger(context: Context, plan: LedgerPlan) -> bool:
    """Make the writes of `plan`, at most `--ledger-workers` at a time (an object's identity before its status);
    False if some write failed (each failure counted, the first logged)."""
    writer = context.writer
    identity = {o.name for o in plan.apply_identity}
    status = {o.name for o in plan.apply_status}
    objects = {o.name: o for o in (*plan.apply_identity, *plan.apply_status)}
    limit = asyncio.Semaphore(context.settings.ledger_workers)
    failures: list[ApiError] = []
    kinds: list[str] = []

    async def write(kind: str, fn: Callable[..., None], *args: Any, **kwargs: Any) -> bool:
        async with limit:
            started = time.monotonic()
            try:
                await context.run(fn, *args, **kwargs)
            except ApiError as err:
                metrics.LEDGER_WRITES.labels(kind, "error").inc()
                failures.append(err)
                kinds.append(kind)
                return False
            metrics.LEDGER_WRITES.labels(kind, "ok").inc()
            metrics.LEDGER_WRITE_SECONDS.labels(kind).observe(time.monotonic() - started)
            return True

    async def upsert(name: str) -> bool:
        obj = objects[name]
        if name in identity and not await write("apply", writer.apply_gpu, identity_body(obj), status=False):
            return False  # the status of an object that could not be created cannot be applied
        if name in status:
            return await write("status", writer.apply_gpu, status_body(obj), status=True)
        return True

    results = await asyncio.gather(
        *(upsert(name) for name in sorted(objects)),
        *(write("delete", writer.delete_gpu, name) for name in plan.delete),
    )
    if failures:
        hint = f" (is the CRD {GPU_CRD_NAME} installed?)" if any(isinstance(e, ApiNotFound) for e in failures) else ""
        first = f"{kinds[0]}: {describe(failures[0])}"
        log.warning("%d GPU object writes failed%s; first: %s", len(failures), hint, first)
    return all(results)
