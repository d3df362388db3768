"""The controller's entry to its work: one `Context` (settings, writer, API threads, kopf's indexes, the ready flag)
shared by one manager per concern, started and stopped together, with kopf's events fanned out to them.

- `devices.DeviceCatalogue`: the published devices and the admission facts;
- `devices.ClaimIndex`: the one claim -> devices index (and back), updated here once per claim event and read by
  the ledger and the MPS trust domains;
- `status.StatusManager`: the claim-status writers and the Events about claims;
- `ledger.LedgerManager` over `ledger.LedgerMarks`: the `GPU` ledger;
- `nodes.NodeReporting`: the node plugins' heartbeats;
- `mps.MpsDomains`: the MPS GPUs' trust domains (the verdicts the status writers write, from each GPU's
  DeviceTaintRule, which it keeps).

kopf's handlers (controller/handlers.py) only call the `*_changed`/`*_event` methods here; every decision is made
by a manager from the indexes, never from what this process did before, so a restart converges to the same state.
A walk reads one way: this entry -> a manager -> its pure plan -> the writer. A manager reads the cluster only
through the context, and another manager only through the accessor it was given.
"""

import asyncio

from api.mig import TYPE_GPU, TYPE_MIG
from controller.core import metrics, runtime
from controller.core.context import ClaimKey, Context, Index, Indexes, Tasks, Writer
from controller.core.settings import Settings
from controller.core.slices import DeviceKey
from controller.devices.catalogue import DeviceCatalogue
from controller.devices.claim_index import ClaimIndex
from controller.devices.facts import AdmissionFacts
from controller.ledger.manager import LedgerManager, LedgerMarks
from controller.mps.manager import MpsDomains
from controller.nodes.heartbeats import NodeReporting
from controller.status.manager import StatusManager


class Controller:
    """The managers over one context; kopf's events in, `start`/`stop` for leadership."""

    def __init__(self, settings: Settings, writer: Writer) -> None:
        self.settings = settings
        self.context = Context(settings, writer)
        self.catalogue = DeviceCatalogue(self.context)
        self.claim_index = ClaimIndex(self.context)
        marks = LedgerMarks(self.catalogue)
        self.nodes = NodeReporting(self.context, self.catalogue, on_changed=marks.nodes)
        self.mps = MpsDomains(self.context, self.catalogue, self.claim_index)
        self.ledger = LedgerManager(
            self.context,
            self.catalogue,
            marks,
            claims=self.claim_index,
            reporting=self.nodes.reporting,
            trust_domain=self.mps.serving_id,
        )
        self.status = StatusManager(self.context, self.catalogue, self.mps)
        self._tasks = Tasks()  # the resync and the event loop's lag probe
        self._stopped = False

    @property
    def admission(self) -> AdmissionFacts:
        """What admission reviews read (from the webhook's thread)."""
        return self.catalogue.admission

    def bind(
        self,
        slices: Index,
        claims: Index,
        gpus: Index,
        classes: Index | None = None,
        nodes: Index | None = None,
        *,
        namespaces: Index | None = None,
        taint_rules: Index | None = None,
    ) -> None:
        """Attach kopf's live indexes (passed to startup handlers before they are populated)."""
        self.context.bind(
            Indexes(slices, claims, gpus, classes if classes is not None else {}, nodes, namespaces, taint_rules)
        )
        self.catalogue.reset()
        self.claim_index.reset()
        self.ledger.reset()
        self.mps.resync()

    async def start(self) -> None:
        """Start every manager. A start after `stop` (leadership regained, controller/leadership/gate.py) is a
        full resync: every indexed claim is queued, the whole ledger recomputed."""
        metrics.time_gc()
        runtime.tune()
        if self._stopped:
            self.context.open()
            self._stopped = False
        self.claim_index.rebuild()
        self.status.start()
        self.ledger.start()
        self.nodes.start()
        self.mps.start()
        self._tasks.spawn(self._resync_loop(), "resync")
        self._tasks.spawn(metrics.loop_lag(), "loop-lag")

    async def stop(self) -> None:
        """Stop every manager; in-flight API calls finish in their threads."""
        await asyncio.gather(
            self._tasks.cancel(), self.status.stop(), self.ledger.stop(), self.nodes.stop(), self.mps.stop()
        )
        self.context.close()
        self._stopped = True

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            self.claim_index.rebuild()
            self.status.enqueue_all()
            self.ledger.marks.all()
            self.mps.resync()

    # ----- kopf's events (event loop) -------------------------------------------------------------------

    def claim_event(self, key: ClaimKey, uid: str, *, deleted: bool, indexed: bool) -> None:
        """Any watch event of any claim; `indexed`: whether the claim is in our index after it.

        A claim can leave the index without being deleted (deallocated, and asking for another DeviceClass
        of our driver): if it was known, its shares must leave the ledger.
        """
        if deleted or (not indexed and self.claim_index.knows(key)):
            self.context.ready.set()
            self._moved(self.claim_index.remove(key))
            self.status.events.forget(uid, posted=deleted)
        elif indexed:
            self.claim_changed(key)

    def claim_changed(self, key: ClaimKey) -> None:
        """A claim of ours was added or modified (its index entry is already updated)."""
        self.context.ready.set()
        self._moved(self.claim_index.update(key))
        self.status.enqueue(key)

    def _moved(self, devices: frozenset[DeviceKey]) -> None:
        """The claims on `devices` changed (the claim index is updated): their GPU objects and MPS rules; a MIG
        partition's placement taken or freed: the pending claims of the MIG class (`MigPlacementsFragmented`); a
        share of a GPU taken or freed: the pending claims that name no memory (`WholeGpuRequested`)."""
        self.ledger.marks.devices(devices)
        self.mps.claims_moved(devices)
        published = self.catalogue.devices()
        if any((d := published.get(k)) is not None and d.kind == TYPE_GPU for k in devices):
            for key in self.status.events.waiting_whole():
                self.status.enqueue(key)
        if any((d := published.get(k)) is not None and d.kind == TYPE_MIG for k in devices):
            mig_class = self.settings.mig_device_class
            for view in self.context.claims():
                if not view.allocated and any(m.device_class == mig_class for r in view.requests for m in r):
                    self.status.enqueue(view.key)

    def slices_changed(self) -> None:
        """A slice of our driver changed: when the published devices differ, every claim and GPU is re-checked."""
        self.context.ready.set()
        if self.catalogue.refresh():
            self.mps.resync()
            self.status.enqueue_all()
            self.ledger.marks.all()

    def classes_changed(self) -> None:
        """Our DeviceClass changed: its selectors and configs apply to every claim."""
        self.context.ready.set()
        self.catalogue.publish_admission()
        self.status.enqueue_all()

    def node_deleted(self, name: str) -> None:
        """The Node `name` is gone: its claims get `AllocatedDeviceGone` (their slices and GPU objects go by owner
        reference, and with the published devices)."""
        self.context.ready.set()
        for view in self.context.claims():
            if view.node == name:
                self.status.enqueue(view.key)

    def taint_rule_changed(self, name: str, *, deleted: bool = False, recorded: str | None = None) -> None:
        """The DeviceTaintRule `name` was added, changed or `deleted` (`recorded`: the MPS trust domain its
        annotation held then): the GPUs it selects show its taint or not; an MPS GPU's rule is kept as its verdict
        wants it, and the claims waiting on that GPU are decided again."""
        self.context.ready.set()
        self.ledger.rule_changed(name)
        for key in self.mps.rule_changed(name, deleted=deleted, recorded=recorded):
            self.status.enqueue(key)

    def gpus_changed(self, name: str) -> None:
        """The GPU object `name` changed (possibly by someone else, or the echo of our own write): re-check it; the
        pending claims that the room check (`GpuRoomWaiting`) reads its figures for are looked at again soon."""
        self.context.ready.set()
        self.ledger.marks.name(name)
        self.status.events.ledger_changed()
