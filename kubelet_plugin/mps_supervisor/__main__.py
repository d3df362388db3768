"""Entry point of the MPS supervisor: start one control daemon per MPS GPU, supervise them until SIGTERM."""

import logging
import signal
import sys
import threading

import prometheus_client

from api.logs import configure_logging
from kubelet_plugin.mps_supervisor.settings import MpsSettings, parse_mps_settings
from kubelet_plugin.mps_supervisor.supervisor import Supervisor

log = logging.getLogger("kubelet_plugin.mps_supervisor")


def main(argv: list[str] | None = None) -> int:
    settings: MpsSettings = parse_mps_settings(argv)
    configure_logging(settings.log_level, settings.log_format)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    supervisor = Supervisor(settings)
    if settings.metrics_port:
        prometheus_client.start_http_server(settings.metrics_port, settings.metrics_address, supervisor.registry)
    try:
        supervisor.run(stop)
    finally:
        supervisor.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
