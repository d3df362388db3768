"""Entry point of `fracgpu-controller` (also `python -m controller`)."""

import asyncio
import logging
import sys

import kopf
from kubernetes.config import ConfigException

from api.logs import configure_logging
from controller import kopf_json, kube, metrics
from controller.handlers import operator_settings, register
from controller.reconciler import Controller
from controller.settings import parse_settings

log = logging.getLogger("controller")
_KOPF_EXTRAS = ("settings", "k8s_skip", "k8s_ref")


class KopfRecordFilter(logging.Filter):
    """Trim kopf's per-object log records: drop its settings dump; drop its echo of refused admissions
    (the controller logs those itself, and a refused claim is not a controller error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kopf"):
            return True
        if record.getMessage().startswith("Webhook ") and "failed permanently" in record.getMessage():
            return False
        ref = getattr(record, "k8s_ref", None)
        for attr in _KOPF_EXTRAS:
            record.__dict__.pop(attr, None)
        if isinstance(ref, dict):
            record.__dict__["object"] = f"{ref.get('kind')} {ref.get('namespace', '')}/{ref.get('name', '')}"
        return True


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
        api = kube.api_client(settings)
    except (ConfigException, OSError) as err:
        log.error("cannot load cluster credentials: %s", err)
        return 2
    metrics.serve(settings.metrics_port)
    controller = Controller(settings, kube.KubeWriter(api, settings.driver_name))
    kopf_json.install()  # no object the API server stores can stop a watch or the webhook
    registry = kopf.OperatorRegistry()
    register(registry, settings, controller)
    log.info(
        "starting",
        extra={"driver": settings.driver_name, "admission": settings.admission, "webhook_port": settings.webhook_port},
    )
    asyncio.run(
        kopf.operator(
            registry=registry,
            settings=operator_settings(settings, api),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=settings.liveness_endpoint,
        )
    )
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
