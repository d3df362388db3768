"""Wires GPU health together: NVML watcher -> HealthBook -> slice taints (coalesced), health stream, Events,
metrics. ``start_gpu_health`` starts its threads; ``__main__`` hands its parts to the publisher and the server."""

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from api.kube_rest import KubeConnection, KubeRest
from kubelet_plugin.core.coalesce import Coalescer
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.health.book import Effects, HealthBook, Transition, plan_taints
from kubelet_plugin.health.events import HealthEventPoster
from kubelet_plugin.health.metrics import HealthMetrics
from kubelet_plugin.health.nvml_watcher import NvmlHealthWatcher
from kubelet_plugin.health.source import HealthSource, with_reported_health


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

    def health_source(self, source: HealthSource) -> HealthSource:
        """The kubelet's health stream: ``source`` and what the driver reported."""
        return with_reported_health(source, self.book) if self.book is not None else source


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
    watcher = NvmlHealthWatcher(
        gpus,
        book,
        ignored_xids=settings.ignored_xids,
        on_transition=on_transition,
        metrics=metrics,
        probe_interval=settings.health_probe_interval_seconds,
    )
    threading.Thread(target=poster.run, args=(stop,), name="health-events", daemon=True).start()
    threading.Thread(target=watcher.run, args=(stop,), name="nvml-health", daemon=True).start()
    return GpuHealthParts(book, effects, changes, metrics)
