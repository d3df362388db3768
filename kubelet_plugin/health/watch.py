"""Wires GPU health together: NVML watcher -> HealthBook -> slice taints (coalesced), health stream, Events,
metrics, the health record on disk (``kubelet_plugin/state/health_faults.py``) and the operator's clears (Node
annotations ``CLEAR_PREFIX<device>``). ``start_gpu_health`` starts its threads; ``__main__`` hands its parts to
the publisher and the server."""

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from api.kube_errors import ApiError
from api.kube_rest import KubeConnection, KubeRest, node_path
from kubelet_plugin.core.coalesce import Coalescer
from kubelet_plugin.core.model import TAINT_DOMAIN, GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.health.book import Effects, GpuHealth, HealthBook, Placement, SliceFault, Transition, plan_taints
from kubelet_plugin.health.events import HealthEventPoster
from kubelet_plugin.health.metrics import HealthMetrics
from kubelet_plugin.health.nvml_watcher import NvmlHealthWatcher
from kubelet_plugin.health.source import HealthSource, with_reported_health
from kubelet_plugin.state import health_faults
from kubelet_plugin.state.checkpoint import Checkpoint

log = logging.getLogger(__name__)
CLEAR_PREFIX = f"{TAINT_DOMAIN}/clear-faults-"
"""A Node annotation ``<CLEAR_PREFIX><device>: <RFC 3339 time>`` clears what was remembered about GPU ``<device>``
(and its memory slices) until that time."""


@dataclass(frozen=True)
class GpuHealthParts:
    """What the publisher and the kubelet server take from GPU health (None: ``--no-health-nvml``)."""

    book: HealthBook | None
    effects: Effects
    changes: Coalescer | None
    metrics: HealthMetrics
    partitions: Mapping[str, Placement] = field(default_factory=dict)

    def taints(self) -> dict[str, list[dict[str, str]]]:
        """Device name -> its taints now (the published MIG partitions' included)."""
        return plan_taints(self.book.snapshot(), self.effects, self.partitions) if self.book is not None else {}

    def health_source(self, source: HealthSource) -> HealthSource:
        """The kubelet's health stream: ``source`` and what the driver reported (a MIG partition: its GPU's and
        its memory slices')."""
        return with_reported_health(source, self.book, self.partitions) if self.book is not None else source


def to_record(health: Mapping[str, GpuHealth], gpus: list[GpuInfo]) -> health_faults.HealthFile:
    """What of ``health`` must outlive the process: each GPU's XID and slice faults (lost and the recovery
    action the driver reports again), with whether a reset is observable."""
    uuids = {g.device_name: g.uuid for g in gpus}
    records = {}
    for device, h in sorted(health.items()):
        if device not in uuids or (h.xid is None and not h.slice_faults):
            continue
        slices = [
            health_faults.SliceRecord(xid=f.xid, xid_class=f.xid_class, slices=list(f.slices),
                                      gpu_instance=f.instance, partition=f.partition, since=f.since)
            for f in h.slice_faults
        ]  # fmt: skip
        records[device] = health_faults.GpuRecord(
            uuid=uuids[device], xid=h.xid, xid_class=h.xid_class, recovery_action=h.recovery_action,
            reset_observable=h.reset_seen, since=h.since, slices=slices,
        )  # fmt: skip
    return health_faults.HealthFile(gpus=records)


def from_record(record: health_faults.HealthFile, gpus: list[GpuInfo]) -> dict[str, GpuHealth]:
    """The remembered health of ``gpus`` (a record of another UUID at that device name, or of a class this
    release does not know, is logged and left out)."""
    uuids = {g.device_name: g.uuid for g in gpus}
    out = {}
    for device, r in record.gpus.items():
        classes = {r.xid_class, *(f.xid_class for f in r.slices)}
        if uuids.get(device) != r.uuid or not classes <= {"ignore", "degraded", "fatal"}:
            log.warning("not restoring a GPU health record", extra={"gpu": device, "uuid": r.uuid})
            continue
        faults = tuple(
            SliceFault(xid=f.xid, xid_class=f.xid_class, slices=tuple(f.slices), instance=f.gpu_instance,
                       partition=f.partition, since=f.since)
            for f in r.slices
        )  # fmt: skip
        out[device] = GpuHealth(
            xid=r.xid, xid_class=r.xid_class, recovery_action=r.recovery_action,
            reset_seen=r.reset_observable, since=r.since, slice_faults=faults,
        )  # fmt: skip
    return out


def plan_clears(annotations: Mapping[str, str], devices: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """The operator's clears among a Node's ``annotations``: device -> until when, and the annotations that name
    no GPU of ``devices`` (to log)."""
    known = set(devices)
    clears, unknown = {}, []
    for key, value in sorted(annotations.items()):
        if key.startswith(CLEAR_PREFIX):
            device = key.removeprefix(CLEAR_PREFIX)
            if device in known:
                clears[device] = value
            else:
                unknown.append(key)
    return clears, unknown


class OperatorClears:
    """``run(stop)``: while the book remembers a fault, reads the Node's clear annotations every ``interval``
    seconds and applies them (each a Transition when it changed something)."""

    def __init__(
        self, rest: KubeRest, node: str, book: HealthBook, on_transition: Callable[[Transition], None],
        interval: float,
    ) -> None:  # fmt: skip
        self._rest, self._node, self._book = rest, node, book
        self._on_transition, self._interval = on_transition, interval

    def apply(self, annotations: Mapping[str, str]) -> None:
        """Apply the clears of ``annotations``; one naming no GPU is logged."""
        clears, unknown = plan_clears(annotations, self._book.snapshot())
        for key in unknown:
            log.warning("a clear-faults annotation names no GPU of this node", extra={"annotation": key})
        for device, until in clears.items():
            by = f"Node annotation {CLEAR_PREFIX}{device}={until}"
            if (transition := self._book.clear(device, until, by)) is not None:
                log.warning("GPU faults cleared by an operator", extra={"gpu": device, "what": transition.what})
                self._on_transition(transition)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval):
            if not self._book.remembers():
                continue
            try:
                node = self._rest.get(node_path(self._node))
            except ApiError as err:
                log.warning("cannot read the Node for clear-faults annotations", extra={"error": str(err)})
                continue
            self.apply(node.get("metadata", {}).get("annotations") or {})


def checkpoint_partitions(
    checkpoint_path: Path, gpus: list[GpuInfo]
) -> Callable[[str, int], tuple[str, tuple[int, ...]] | None]:
    """From the checkpoint (read only, at each call): which partition device a GPU instance of a GPU is, and its
    memory slices."""
    uuids = {g.device_name: g.uuid for g in gpus}

    def read() -> Checkpoint | None:
        try:
            return Checkpoint.model_validate_json(checkpoint_path.read_bytes())
        except (OSError, ValidationError):
            return None

    def partition_of(gpu: str, instance: int) -> tuple[str, tuple[int, ...]] | None:
        checkpoint = read()
        for _, entry in sorted(checkpoint.claims.items()) if checkpoint else []:
            for d in entry.devices:
                if d.mig is not None and d.mig.parent_uuid == uuids.get(gpu) and d.mig.gpu_instance == instance:
                    start = d.mig.placement_start
                    return d.device_name, tuple(range(start, start + d.mig.memory_slices))
        return None

    return partition_of


def start_gpu_health(
    settings: Settings,
    api: KubeConnection,
    gpus: list[GpuInfo],
    registry: CollectorRegistry,
    stop: threading.Event,
    *,
    lost: Sequence[str] = (),
    partitions: Mapping[str, Placement] | None = None,
) -> GpuHealthParts:
    """Start the NVML watcher, the Event poster and the operator's clears (with ``--health-nvml``), after
    restoring what the health record remembers; ``lost``: devices discovery found lost, recorded so before
    anything is published (with their Event); ``partitions``: the published MIG partitions' placements."""
    metrics = HealthMetrics(registry)
    effects = Effects(degraded=settings.health_degraded_effect, fatal=settings.health_fatal_effect)
    placements = dict(partitions or {})
    if not settings.health_nvml:
        return GpuHealthParts(None, effects, None, metrics, placements)
    book = HealthBook(g.device_name for g in gpus)
    record_path = settings.plugin_data_dir / health_faults.HEALTH_FILE_NAME
    book.restore(from_record(health_faults.load(record_path), gpus))
    metrics.set_health(book.snapshot())
    saving = threading.Lock()
    changes = Coalescer(settings.health_coalesce_seconds)
    poster = HealthEventPoster(
        KubeRest.bounded(api, settings.api_timeout_seconds), settings.node_name, settings.checkpoint_path
    )

    def on_transition(transition: Transition) -> None:
        with saving:  # one writer of the record at a time (watcher and clears threads)
            health_faults.save(record_path, to_record(book.snapshot(), gpus))
        metrics.set_health(book.snapshot())
        changes.notify()
        poster.submit(transition)

    for device in lost:
        if (transition := book.record_lost(device)) is not None:
            on_transition(transition)
    clears = OperatorClears(
        KubeRest.bounded(api, settings.api_timeout_seconds), settings.node_name, book, on_transition,
        settings.health_probe_interval_seconds,
    )  # fmt: skip
    watcher = NvmlHealthWatcher(
        gpus,
        book,
        ignored_xids=settings.ignored_xids,
        on_transition=on_transition,
        metrics=metrics,
        probe_interval=settings.health_probe_interval_seconds,
        partition_of=checkpoint_partitions(settings.checkpoint_path, gpus),
    )
    threading.Thread(target=poster.run, args=(stop,), name="health-events", daemon=True).start()
    threading.Thread(target=watcher.run, args=(stop,), name="nvml-health", daemon=True).start()
    threading.Thread(target=clears.run, args=(stop,), name="health-clears", daemon=True).start()
    return GpuHealthParts(book, effects, changes, metrics, placements)
