"""The plugin's HTTP endpoint: Prometheus ``/metrics`` and the pod's readiness ``/readyz``.

``/readyz`` answers 200 while ``ready()`` is true (registered with the kubelet, serving, not terminating),
else 503. The port is bound in the background, retried while it is in use: with host networking the
instance being replaced holds it until its SIGTERM, and a busy port must not crash the replacement.
"""

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

BIND_RETRY_S = 1.0


class QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe on stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # the base class's parameter name
        pass


def make_app(registry: CollectorRegistry, ready: Callable[[], bool]) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: ``/readyz`` from ``ready()``, every other path the metrics of ``registry``."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/readyz":
            ok = ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"not registered with the kubelet, or terminating\n"]
        result: Iterable[bytes] = metrics(environ, start_response)
        return result

    return app


class HttpEndpoint:
    """Serves :func:`make_app` on ``address:port`` from a daemon thread until :meth:`close`."""

    def __init__(self, address: str, port: int, registry: CollectorRegistry, ready: Callable[[], bool]) -> None:
        self._address, self._port = address, port
        self._app = make_app(registry, ready)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self.bound = threading.Event()

    def start(self) -> None:
        """Bind and serve in the background; a port in use is retried every second until it is free."""
        threading.Thread(target=self._run, name="http-endpoint", daemon=True).start()

    def _run(self) -> None:
        warned = False
        while not self._closed.is_set():
            try:
                server = make_server(
                    self._address, self._port, self._app, ThreadingWSGIServer, handler_class=QuietHandler
                )
            except OSError as err:
                if not warned:
                    log.warning("metrics port busy; retrying", extra={"port": self._port, "error": str(err)})
                    warned = True
                self._closed.wait(BIND_RETRY_S)
                continue
            with self._lock:
                if self._closed.is_set():
                    server.server_close()
                    return
                self._server = server
            self.bound.set()
            server.serve_forever(poll_interval=0.2)
            return

    def close(self) -> None:
        """Stop serving and free the port (the replacement may bind it); idempotent."""
        self._closed.set()
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
