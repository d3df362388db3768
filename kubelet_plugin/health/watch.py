"""Wires GPU health together: NVML watcher -> HealthBook -> slice taints (coalesced), health stream, Events,
metrics. ``start_gpu_health`` starts its threads; ``__main__`` hands its parts to the publisher and the server."""

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from api.kube_rest import KubeConnection, KubeRest
from kubelet_plugin.core.coalesce import Coalescer
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.health.book import Effects, HealthBook, Transition, plan_taints
from kubelet_plugin.health.events import HealthEventPoster
from kubelet_plugin.health.metrics import HealthMetrics
from kubelet_plugin.health.nvml_watcher import NvmlHealthWatcher
from kubelet_plugin.health.source import HealthSource, with_reported_health
from kubelet_plugin.state.checkpoint import Checkpoint


@dataclass(frozen=True)
class GpuHealthParts:
    """What the publisher and the kubelet server take from GPU health (None: ``--no-health-nvml``)."""

    book: HealthBook | None
    effects: Effects
    changes: Coalescer | None
    metrics: HealthMetrics

    def taints(self) -> dict[str, list[dict[str, str]]]:
        """Device name -> its taints now."""
        return plan_taints(self.book.snapshot(), self.effects) if self.book is not None else {}

    def health_source(self, source: HealthSource, parents: dict[str, str] | None = None) -> HealthSource:
        """The kubelet's health stream: ``source`` and what the driver reported (``parents``: MIG partition ->
        its GPU, whose health it shares)."""
        return with_reported_health(source, self.book, parents) if self.book is not None else source


def checkpoint_partitions(
    checkpoint_path: Path, gpus: list[GpuInfo]
) -> tuple[Callable[[str, int], str | None], Callable[[], set[str]]]:
    """From the checkpoint (read only, at each call): which partition device a GPU instance of a GPU is, and the
    partition devices prepared now."""
    uuids = {g.device_name: g.uuid for g in gpus}

    def read() -> Checkpoint | None:
        try:
            return Checkpoint.model_validate_json(checkpoint_path.read_bytes())
        except (OSError, ValidationError):
            return None

    def partition_of(gpu: str, instance: int) -> str | None:
        checkpoint = read()
        for _, entry in sorted(checkpoint.claims.items()) if checkpoint else []:
            for d in entry.devices:
                if d.mig is not None and d.mig.parent_uuid == uuids.get(gpu) and d.mig.gpu_instance == instance:
                    return d.device_name
        return None

    def partitions() -> set[str]:
        checkpoint = read()
        return {d.device_name for e in checkpoint.claims.values() for d in e.devices if d.mig} if checkpoint else set()

    return partition_of, partitions


def start_gpu_health(
    settings: Settings,
    api: KubeConnection,
    gpus: list[GpuInfo],
    registry: CollectorRegistry,
    stop: threading.Event,
    *,
    lost: Sequence[str] = (),
) -> GpuHealthParts:
    """Start the NVML watcher and the Event poster (with ``--health-nvml``); ``lost``: devices discovery found
    lost, recorded so before anything is published (with their Event)."""
    metrics = HealthMetrics(registry)
    effects = Effects(degraded=settings.health_degraded_effect, fatal=settings.health_fatal_effect)
    if not settings.health_nvml:
        return GpuHealthParts(None, effects, None, metrics)
    book = HealthBook(g.device_name for g in gpus)
    metrics.set_health(book.snapshot())
    changes = Coalescer(settings.health_coalesce_seconds)
    poster = HealthEventPoster(
        KubeRest.bounded(api, settings.api_timeout_seconds), settings.node_name, settings.checkpoint_path
    )

    def on_transition(transition: Transition) -> None:
        metrics.set_health(book.snapshot())
        changes.notify()
        poster.submit(transition)

    for device in lost:
        if (transition := book.record_lost(device)) is not None:
            on_transition(transition)
    partition_of, partitions = checkpoint_partitions(settings.checkpoint_path, gpus)
    watcher = NvmlHealthWatcher(
        gpus,
        book,
        ignored_xids=settings.ignored_xids,
        on_transition=on_transition,
        metrics=metrics,
        probe_interval=settings.health_probe_interval_seconds,
        partition_of=partition_of,
        partitions=partitions,
    )
    threading.Thread(target=poster.run, args=(stop,), name="health-events", daemon=True).start()
    threading.Thread(target=watcher.run, args=(stop,), name="nvml-health", daemon=True).start()
    return GpuHealthParts(book, effects, changes, metrics)
