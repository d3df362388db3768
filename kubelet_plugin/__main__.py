"""Entry point of `fracgpu-kubelet-plugin`: discover GPUs, publish them, serve the kubelet until SIGTERM."""

import logging
import signal
import sys
import threading
from collections.abc import Callable

from api import kube_config
from api.kube_errors import ApiError
from api.kube_rest import KubeConnection, KubeRest
from api.logs import configure_logging
from api.mig import state_message
from kubelet_plugin.core.coalesce import Coalescer
from kubelet_plugin.core.events import post_node_event
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import GpuInfo, MigGpu
from kubelet_plugin.core.settings import Settings, is_mps_gpu, is_selected, parse_settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.health.book import Placement
from kubelet_plugin.health.source import DeviceHealth
from kubelet_plugin.health.watch import start_gpu_health
from kubelet_plugin.kinds.mig.discovery import discover_mig
from kubelet_plugin.kinds.mig.publish import mig_catalog
from kubelet_plugin.kinds.mps.watch import MpsWatch, event_poster, mps_gpus, status_reader
from kubelet_plugin.prepare.driver_edits import DriverEdits, GeneratorConfig
from kubelet_plugin.prepare.preparer import Preparer
from kubelet_plugin.prepare.state_gate import RECHECK_SECONDS, newer_state, wait_until_readable
from kubelet_plugin.publishing.discovery import Discovery, DiscoveryError, UnknownLostGpu, discover, driver_version
from kubelet_plugin.publishing.heartbeat import Heartbeat
from kubelet_plugin.publishing.publisher import SlicePublisher
from kubelet_plugin.serving.grpc_server import PluginServer
from kubelet_plugin.serving.handover import await_replacement
from kubelet_plugin.serving.http_server import HttpEndpoint
from kubelet_plugin.state import gpu_inventory
from kubelet_plugin.state.checkpoint import CheckpointStore

log = logging.getLogger("fracgpu.kubelet_plugin")


def kube_connection(metrics: PluginMetrics | None = None) -> KubeConnection:
    """In-cluster credentials in a pod, else $KUBECONFIG / ~/.kube/config, its API requests counted in `metrics`;
    raises ConfigError or ApiError."""
    return KubeConnection(kube_config.load(), metrics.api if metrics is not None else None)


def make_driver_edits(
    settings: Settings, rest: KubeRest, metrics: PluginMetrics, version: Callable[[], str] = driver_version
) -> DriverEdits:
    """The driver-edits cache of this node: a failure is a ``DriverEditsFailed`` Node Event (once per failure)
    and counted in ``fracgpu_plugin_driver_edits_failures_total`` (every failed attempt)."""
    return DriverEdits(
        GeneratorConfig.from_settings(settings),
        settings.nvidia_cdi_hook_source,
        version,
        interval=settings.driver_edits_retry_seconds,
        on_failure=lambda message: post_node_event(rest, settings.node_name, "DriverEditsFailed", message),
        on_attempt_failed=metrics.driver_edits_failures.inc,
    )


def start_usage_sampler(
    settings: Settings, api: KubeConnection, gpus: list[GpuInfo], metrics: PluginMetrics, stop: threading.Event
) -> None:
    """With ``--usage-interval`` > 0, sample GPU memory use in a thread of its own (see `kubelet_plugin/usage/sampler.py`)."""
    if not settings.usage_interval_seconds:
        return
    # imported only when on: the sampler's modules cost 0.6 MiB of RSS in a plugin that does not sample
    from kubelet_plugin.usage.metrics import UsageMetrics
    from kubelet_plugin.usage.sampler import UsageSampler

    sampler = UsageSampler(
        node=settings.node_name,
        gpus=gpus,
        plugin_data_dir=settings.plugin_data_dir,
        proc_root=settings.proc_root,
        rest=KubeRest.bounded(api, settings.api_timeout_seconds),
        metrics=UsageMetrics(metrics.registry),
        interval_s=settings.usage_interval_seconds,
        ledger_min_interval_s=settings.usage_ledger_interval_seconds,
        ledger_threshold_bytes=settings.memory_step_bytes,
    )
    threading.Thread(target=sampler.run, args=(stop,), name="usage-sampler", daemon=True).start()


def start_heartbeat(settings: Settings, api: KubeConnection, stop: threading.Event) -> None:
    """With a namespace (the pod's), renew the node's heartbeat Lease once now, then in a thread of its own until
    `stop`. Called before the slices are published: the controller, which lists the Leases when a node's GPUs
    appear, finds the Lease fresh and their GPU objects say REPORTING True from their first write."""
    if settings.namespace is None:
        return
    rest = KubeRest.bounded(api, settings.api_timeout_seconds)
    beat = Heartbeat(
        rest,
        settings.namespace,
        settings.node_name,
        settings.driver_name,
        interval_s=settings.heartbeat_interval_seconds,
    )
    beat.renew()
    threading.Thread(target=beat.keep, args=(stop,), name="heartbeat", daemon=True).start()


def hand_over(server: PluginServer, http: HttpEndpoint | None, settings: Settings) -> None:
    """After SIGTERM: stop reporting ready and free the metrics port, but keep serving the kubelet until
    another instance (named by its own instance id) is registered or ``handover_timeout_seconds`` passed.
    Without an instance id no other instance can overlap this one, so there is nothing to wait for."""
    server.withdraw()
    if http is not None:
        http.close()
    if settings.instance_id:
        log.info(
            "SIGTERM: serving until a replacement is registered", extra={"timeout": settings.handover_timeout_seconds}
        )
        await_replacement(server.dra_socket, settings.handover_timeout_seconds)


def discover_node_gpus(settings: Settings) -> Discovery:
    """Discover the GPUs, a lost one with the identity remembered in the GPU inventory (which is then written
    anew). Without ``--health-nvml`` nothing would taint a lost GPU, so it is left out like an unknown one."""
    inventory = settings.plugin_data_dir / gpu_inventory.INVENTORY_FILE_NAME
    found = discover(gpu_inventory.load(inventory), settings.sys_root)
    if found.lost and not settings.health_nvml:
        left_out = tuple(
            UnknownLostGpu(index=g.index, reason="lost, and --no-health-nvml cannot taint it")
            for g in found.gpus
            if g.device_name in found.lost
        )
        found = Discovery(
            gpus=[g for g in found.gpus if g.device_name not in found.lost], unknown=found.unknown + left_out
        )
    gpu_inventory.save(inventory, found.gpus)
    for device in found.lost:
        log.warning("GPU is lost; publishing it with its remembered identity, tainted", extra={"gpu": device})
    return found


def report_unknown(settings: Settings, api: KubeConnection, unknown: tuple[UnknownLostGpu, ...]) -> None:
    """A lost GPU left out of the ResourceSlice: a log line and a Warning Event ``GpuLostUnpublished`` each."""
    rest = KubeRest.bounded(api, settings.api_timeout_seconds)
    for gpu in unknown:
        message = f"GPU {gpu.index} is not published: {gpu.reason}"
        log.error("lost GPU left out of the ResourceSlice", extra={"gpu": gpu.index, "reason": gpu.reason})
        post_node_event(rest, settings.node_name, "GpuLostUnpublished", message)


class MigMpsOverlapError(ValueError):
    """A GPU is named by both --mig-gpus and --mps-gpus (by index in one and UUID in the other)."""


def discover_node_mig(settings: Settings, gpus: list[GpuInfo]) -> dict[str, MigGpu]:
    """What the GPUs ``--mig-gpus`` names offer for MIG; raises MigMpsOverlapError for a GPU that is also an MPS GPU."""
    selected = [g for g in gpus if is_selected(settings.mig_gpus, g.index, g.uuid)]
    both = [g for g in selected if is_mps_gpu(settings.mps_gpus, g.index, g.uuid)]
    if both:
        raise MigMpsOverlapError(
            f"GPUs {', '.join(f'{g.index} ({g.uuid})' for g in both)} are named both MIG GPUs (--mig-gpus, chart "
            "value mig.gpus) and MPS GPUs (--mps-gpus, chart value mps.gpus): a MIG GPU is never an MPS GPU; name "
            "each GPU in at most one of them"
        )
    unknown = sorted(
        set(filter(None, settings.mig_gpus.split(",")))
        - {"all"}
        - {str(g.index) for g in gpus}
        - {g.uuid for g in gpus}
    )
    if unknown:
        log.warning("--mig-gpus names GPUs this node does not have", extra={"unknown": unknown})
    return discover_mig(selected)


def report_mig(settings: Settings, api: KubeConnection, gpus: list[GpuInfo], mig: dict[str, MigGpu]) -> None:
    """A MIG GPU that publishes no partition (MIG mode off, pending, not capable, NVML failed): a log line and a
    Warning Event ``MigUnavailable`` on the Node; the GPU object says it too (its device's migState)."""
    rest = KubeRest.bounded(api, settings.api_timeout_seconds)
    for gpu in gpus:
        facts = mig.get(gpu.device_name)
        if facts is None:
            continue
        if facts.state == "enabled":
            log.info(
                "MIG GPU: publishing its partitions",
                extra={"gpu": gpu.device_name, "profiles": [p.name for p in facts.profiles]},
            )
            continue
        message = f"GPU {gpu.index} ({gpu.uuid}) is named in mig.gpus but {state_message(facts.state, gpu.index)}"
        if facts.detail:
            message += f" ({facts.detail})"
        log.error("MIG GPU without partitions", extra={"gpu": gpu.device_name, "state": facts.state, "why": message})
        post_node_event(rest, settings.node_name, "MigUnavailable", message)


def _merge(*taints: dict[str, list[dict[str, str]]]) -> dict[str, list[dict[str, str]]]:
    """Device name -> every taint the sources give it."""
    merged: dict[str, list[dict[str, str]]] = {}
    for source in taints:
        for device, entries in source.items():
            merged.setdefault(device, []).extend(entries)
    return merged


def main(argv: list[str] | None = None) -> int:
    """Run the node plugin; returns the process exit code."""
    settings = parse_settings(argv)
    configure_logging(settings.log_level, settings.log_format)
    try:
        found = discover_node_gpus(settings)
    except DiscoveryError as err:
        log.error("GPU discovery failed", extra={"error": str(err)})
        return 1
    gpus = found.gpus
    log.info(
        "discovered GPUs",
        extra={"node": settings.node_name, "gpus": [f"{g.device_name}={g.uuid} {g.product_name}" for g in gpus]},
    )
    metrics = PluginMetrics()
    try:
        api = kube_connection(metrics)
    except (kube_config.ConfigError, ApiError) as err:
        log.error("cannot load cluster credentials", extra={"error": str(err)})
        return 2
    report_unknown(settings, api, found.unknown)
    try:
        mig = discover_node_mig(settings, gpus)
    except MigMpsOverlapError as err:
        log.error("bad MIG and MPS GPU lists", extra={"error": str(err)})
        return 2
    report_mig(settings, api, gpus, mig)
    stop = threading.Event()
    driver_edits = None
    if settings.driver_edits == "toolkit":
        driver_edits = make_driver_edits(settings, KubeRest.bounded(api, settings.api_timeout_seconds), metrics)
        driver_edits.refresh()  # before recover(): restored specs carry the edits too
        threading.Thread(target=driver_edits.run, args=(stop,), name="driver-edits", daemon=True).start()
    enforcement = EnforcementDetector.detect(settings, gpus)
    store = CheckpointStore(settings.checkpoint_path)
    preparer = Preparer(
        api, settings, gpus, store, metrics, driver_edits=driver_edits, enforcement=enforcement, mig=mig
    )
    preparer.recover()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    gate = wait_until_readable(lambda: newer_state(store), stop, RECHECK_SECONDS)  # a newer state: not registered
    if gate == "stopped":
        return 0
    if gate == "waited":
        preparer.recover()
    partitions = mig_catalog(gpus, mig)
    placements = {
        n: Placement(d.gpu.device_name, frozenset(range(d.start, d.start + d.profile.memory_slices)))
        for n, d in partitions.items()
    }
    health = start_gpu_health(settings, api, gpus, metrics.registry, stop, lost=found.lost, partitions=placements)
    changes = health.changes or Coalescer(settings.health_coalesce_seconds)
    mps_health = MpsWatch(
        mps_gpus(settings, gpus), status_reader(settings), metrics.registry, changes=changes,
        post=event_poster(KubeRest.bounded(api, settings.api_timeout_seconds), settings.node_name,
                          settings.checkpoint_path),
        interval=settings.health_probe_interval_seconds, on_up=preparer.refresh_mps_ceiling,
        repair=preparer.repair_mps_limits,
    )  # fmt: skip
    threading.Thread(target=mps_health.run, args=(stop,), name="mps-health", daemon=True).start()
    start_heartbeat(settings, api, stop)  # the Lease before the slices (see start_heartbeat)
    publisher = SlicePublisher(
        api, settings, gpus, enforcement, taints=lambda: _merge(health.taints(), mps_health.taints()),
        changes=changes, on_write=health.metrics.slice_writes.inc, mig=mig,
    )  # fmt: skip
    publishing = threading.Thread(target=publisher.run, args=(stop,), name="slice-publisher", daemon=True)
    publishing.start()
    server = PluginServer(
        settings.driver_name,
        preparer,
        health.health_source(
            DeviceHealth(settings.node_name, gpus, preparer.device_nodes, {n: d.gpu for n, d in partitions.items()})
        ),
        kubelet_dir=settings.kubelet_dir,
        instance_id=settings.instance_id,
        health_interval=settings.health_interval_seconds,
    )
    server.start()
    start_usage_sampler(settings, api, gpus, metrics, stop)
    http = None
    if settings.metrics_port:  # /metrics, and /readyz: the chart's readiness probe
        http = HttpEndpoint(settings.metrics_address, settings.metrics_port, metrics.registry, lambda: server.ready)
        http.start()
    log.info(
        "serving the kubelet", extra={"registration": str(server.registration_socket), "dra": str(server.dra_socket)}
    )
    stop.wait()
    hand_over(server, http, settings)
    log.info("shutting down; ResourceSlices stay published")
    server.stop(grace=5)
    if not preparer.wait_ready_writes(timeout=5):  # a lost one is written again by the next prepare
        log.warning("exiting with Ready conditions not yet written")
    publishing.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
