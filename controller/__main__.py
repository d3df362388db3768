"""Entry point of `fracgpu-controller` (also `python -m controller`)."""

import asyncio
import logging
import signal
import sys
import threading
import uuid

import kopf

from api.kube_config import ConfigError
from api.kube_errors import ApiError
from api.kube_rest import KubeConnection, KubeRest
from api.logs import configure_logging
from controller.admission.certificate import SharedCertificate
from controller.admission.webhook import is_refusal_echo
from controller.core import kopf_json, kube, metrics
from controller.core.settings import parse_settings
from controller.handlers import operator_settings, register, shared_certificate
from controller.leadership.election import LeaderElector, LeaseTimings
from controller.leadership.gate import GatedWriter, Leadership
from controller.loops import Controller

log = logging.getLogger("controller")
_KOPF_EXTRAS = ("settings", "k8s_skip", "k8s_ref")


class KopfRecordFilter(logging.Filter):
    """Trim kopf's per-object log records: drop its settings dump; drop its echo of refused admissions
    (the controller logs those itself, and a refused claim is not a controller error; `is_refusal_echo`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kopf"):
            return True
        if is_refusal_echo(record):
            return False
        ref = getattr(record, "k8s_ref", None)
        for attr in _KOPF_EXTRAS:
            record.__dict__.pop(attr, None)
        if isinstance(ref, dict):
            record.__dict__["object"] = f"{ref.get('kind')} {ref.get('namespace', '')}/{ref.get('name', '')}"
        return True


def _obtain(shared: SharedCertificate) -> bool:
    """Get the shared webhook certificate, retrying (logging why) until it works; False on SIGTERM/SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    delay = 1.0
    try:
        while not stop.is_set():
            try:
                shared.sync()
                return True
            except ApiError as err:
                log.error(
                    "cannot get the shared webhook certificate; retrying (not ready until then)",
                    extra={"secret": f"{shared.namespace}/{shared.name}", "error": str(err)},
                )
            stop.wait(delay)
            delay = min(delay * 2, 30.0)
        return False
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """Run the controller until SIGTERM/SIGINT; 0 on a clean exit, 2 when it cannot reach the cluster."""
    settings = parse_settings(argv)
    configure_logging(settings.log_level, settings.log_format)
    for handler in logging.getLogger().handlers:
        handler.addFilter(KopfRecordFilter())
    if settings.log_level != "debug":
        logging.getLogger("kopf").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        connection = KubeConnection(kube.credentials(settings), metrics.API)
    except (ConfigError, ApiError) as err:
        log.error("cannot load cluster credentials: %s", err)
        return 2
    shared = shared_certificate(settings, connection)
    if shared is not None and not _obtain(shared):
        return 0  # stopped while waiting for the certificate
    metrics.serve(settings.metrics_port)
    writer = kube.KubeWriter(connection, settings.driver_name)
    leadership = None
    gated = GatedWriter(writer, None) if settings.leader_elect else None  # its elector is given below
    controller = Controller(settings, gated or writer)
    if gated is not None:
        leadership = Leadership(controller, None, writer.rest)
        elector = LeaderElector(
            KubeRest(
                writer.rest.connection, timeout=settings.retry_period_seconds, budget=settings.retry_period_seconds
            ),
            str(settings.namespace),
            settings.lease_name,
            f"{settings.replica}_{uuid.uuid4().hex[:8]}",  # a restarted container is a new candidate
            LeaseTimings(
                settings.lease_duration_seconds, settings.renew_deadline_seconds, settings.retry_period_seconds
            ),
            on_started=leadership.started,
            on_stopped=leadership.stopped,
        )
        leadership.elector = gated.elector = elector
    kopf_json.install()  # no object the API server stores can stop a watch or the webhook
    registry = kopf.OperatorRegistry()
    register(registry, settings, controller, leadership)
    log.info(
        "starting",
        extra={"driver": settings.driver_name, "admission": settings.admission, "webhook_port": settings.webhook_port},
    )
    asyncio.run(
        kopf.operator(
            registry=registry,
            settings=operator_settings(settings, connection, shared),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=settings.liveness_endpoint,
        )
    )
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
