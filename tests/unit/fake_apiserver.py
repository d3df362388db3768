"""A fake kube-apiserver on 127.0.0.1 for unit tests: plain HTTP/JSON, raw bytes, requests it never answers.

It serves objects as the exact bytes it holds (a watch, `?watch=true`, as those bytes' lines, one chunk each,
held open for `timeoutSeconds` as the real server holds it) (so bodies Python's `json` cannot decode reach the real
`KubeRest`), answers a missing object with a 404 Status, accepts every write with `{}` (or answers a path as told: `answers`), and can hold a
request open without answering, as a stopped API server does. `script` answers a path's next requests, one each,
with what an API server under pressure sends: 429 with `Retry-After` (`throttled`), 503, or a connection reset
after the request was read (`RESET`: the server may have applied it). Over TLS (`serve(tls=...)`) it asks for a
client certificate and takes requests without one too, as kube-apiserver does (a token may authenticate).
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from api.kube_config import KubeConfig
from api.kube_metrics import ApiMetrics
from api.kube_rest import KubeConnection

NOT_FOUND = json.dumps({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}).encode()
RESET = "reset"
"""A scripted step: read the request, then reset the connection (TCP RST) without answering."""
Answer = tuple[int, bytes, dict[str, str]]


def throttled(retry_after: str = "1") -> Answer:
    """What API Priority and Fairness answers a request it rejects (plain text, as kube-apiserver's `http.Error`)."""
    return 429, b"Too many requests, please try again later.\n", {"Retry-After": retry_after}


def unavailable(retry_after_seconds: int | None = None) -> Answer:
    """A 503 `Status` (with `details.retryAfterSeconds`, and so the header, when given)."""
    body: dict[str, Any] = {"kind": "Status", "status": "Failure", "reason": "ServiceUnavailable", "code": 503}
    body["message"] = "the server is currently unable to handle the request"
    if retry_after_seconds is None:
        return 503, json.dumps(body).encode(), {}
    body["details"] = {"retryAfterSeconds": retry_after_seconds}
    return 503, json.dumps(body).encode(), {"Retry-After": str(retry_after_seconds)}


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
    #: (Authorization header or None, client certificate's common name or None) of each request, in order
    credentials: list[tuple[str | None, str | None]] = field(default_factory=list)
    connections: int = 0  # connections accepted
    #: path -> (HTTP status, body, headers) answered to any method on that path (an error the API server sends)
    answers: dict[str, tuple[int, bytes, dict[str, str]]] = field(default_factory=dict)
    #: path -> the next requests' answers, one per request (an Answer, or RESET); then the usual answer
    script: dict[str, list[Answer | str]] = field(default_factory=dict)
    #: path -> what a watch of it streams (else `objects[path]`)
    streams: dict[str, bytes] = field(default_factory=dict)
    #: (method, path, query string) of every request, in order
    queries: list[tuple[str, str, str]] = field(default_factory=list)

    def record(self, event: str, method: str, path: str) -> None:
        with self.lock:
            self.log.append((event, method, path))
            (self.pending.add if event == "start" else self.pending.discard)(path)

    def withdraw_answer(self, method: str, path: str) -> None:
        """Drop the last recorded answer to `method path` (its bytes never reached the client)."""
        with self.lock:
            for i in range(len(self.log) - 1, -1, -1):
                if self.log[i] == ("answer", method, path):
                    del self.log[i]
                    return

    def answered(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for e in self.log if e == ("answer", method, path))


def handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            with api.lock:
                api.connections += 1

        def _client_name(self) -> str | None:
            peer: Any = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            names = [attr[1] for rdn in (peer or {}).get("subject", ()) for attr in rdn if attr[0] == "commonName"]
            return str(names[0]) if names else None

        def _serve(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            with api.lock:
                api.credentials.append((self.headers.get("Authorization"), self._client_name()))
                api.queries.append((self.command, path, self.path.partition("?")[2]))
            api.record("start", self.command, path)
            with api.lock:
                hang = path in api.hang or path in api.hang_once
                api.hang_once.discard(path)
            if hang and not api.release.wait(60):  # a stopped API server: no answer at all
                return
            with api.lock:
                steps = api.script.get(path)
                step = steps.pop(0) if steps else None
            if step == RESET:
                api.record("reset", self.command, path)
                self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.request.close()  # RST: the client sees its connection reset, no answer
                self.close_connection = True
                return
            headers: dict[str, str] = {}
            if isinstance(step, tuple):
                status, body, headers = step
            elif path in api.answers:
                status, body, headers = api.answers[path]
            elif self.command == "GET":
                found = api.objects.get(path)
                status = 200 if found is not None else 404
                body = found if found is not None else NOT_FOUND
            else:  # status apply, Events: accepted
                status, body = 200, b"{}"
            if status == 200 and "watch=true" in self.path:
                self._stream(api.streams.get(path, body), path)
                return
            # recorded before the bytes go out: a client holding the answer always finds it recorded
            api.record("answer", self.command, path)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up on this request: not answered after all
                api.withdraw_answer(self.command, path)

        def _stream(self, events: bytes, path: str) -> None:
            """A watch as kube-apiserver sends it: chunked, one event per chunk, open until `timeoutSeconds`."""
            query = dict(p.split("=", 1) for p in self.path.partition("?")[2].split("&") if "=" in p)
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for line in events.splitlines(keepends=True):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                api.release.wait(float(query.get("timeoutSeconds", "60")))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                return
            api.record("answer", self.command, path)

        do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815  # http.server dispatches on these names

    return Handler


@dataclass(frozen=True)
class ServerTls:
    """The fake's serving certificate and key, and the CA its clients' certificates are checked against."""

    cert: Path
    key: Path
    client_ca: Path


@contextmanager
def serve(tls: ServerTls | None = None) -> Iterator[tuple[FakeApiServer, str]]:
    """A running fake API server and its URL (https with `tls`); held requests are let go and the server
    stopped on exit."""
    api = FakeApiServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(api))
    server.daemon_threads = True
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        context.load_verify_locations(tls.client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        api.release.set()
        server.shutdown()
        server.server_close()


def connection(url: str, metrics: ApiMetrics | None = None) -> KubeConnection:
    """A plain-HTTP connection to `url` (a fake API server, or `refused_url()`), no credentials, its requests
    counted in `metrics`."""
    return KubeConnection(KubeConfig(server=url), metrics)


def refused_url() -> str:
    """The URL of a port on 127.0.0.1 nothing listens on: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"
