"""A fake kube-apiserver on 127.0.0.1 for unit tests: plain HTTP/JSON, raw bytes, requests it never answers.

It serves objects as the exact bytes it holds (so bodies Python's `json` cannot decode reach the real
`KubeRest`), answers a missing object with a 404 Status, accepts every write with `{}`, and can hold a
request open without answering, as a stopped API server does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeApiServer:
    """Claims by path as raw bytes; `hang` holds requests to those paths open until `release` is set."""

    objects: dict[str, bytes] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    hang_once: set[str] = field(default_factory=set)
    release: threading.Event = field(default_factory=threading.Event)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # (event, method, path), in order
    pending: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, event: str, method: str, path: str) -> None:
        with self.lock:
            self.log.append((event, method, path))
            (self.pending.add if event == "start" else self.pending.discard)(path)

    def answered(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for e in self.log if e == ("answer", method, path))


def handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            api.record("start", self.command, path)
            with api.lock:
                hang = path in api.hang or path in api.hang_once
                api.hang_once.discard(path)
            if hang and not api.release.wait(60):  # a stopped API server: no answer at all
                return
            if self.command == "GET":
                body = api.objects.get(path)
                status = 200 if body is not None else 404
                if body is None:
                    body = json.dumps(
                        {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
                    ).encode()
            else:  # status apply, Events: accepted
                status, body = 200, b"{}"
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                return  # the client gave up on this request
            api.record("answer", self.command, path)

        do_GET = do_PATCH = do_POST = _serve  # noqa: N815  # http.server dispatches on these names

    return Handler


@contextmanager
def serve() -> Iterator[tuple[FakeApiServer, str]]:
    """A running fake API server and its URL; held requests are let go and the server stopped on exit."""
    api = FakeApiServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(api))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        api.release.set()
        server.shutdown()
        server.server_close()
