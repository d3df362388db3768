"""Plain-JSON Kubernetes requests on urllib3: the API client of both components (kopf watches on its own).

The kubernetes package's client imports about a thousand generated model modules (~32 MiB of memory in a
process that needs none of them); the node plugin sends a handful of JSON requests by API path, so this is
all it uses. Objects are dicts exactly as the API server sends them (no model drops a field).

`KubeConnection` holds one process's TLS context, credentials (`api.kube_config`), connection pool
(thread-safe; shared by every `KubeRest` on it) and API counters (`api.kube_metrics`). `KubeRest` sends
requests on it, each attempt bounded by its `timeout`, each call by its `budget`.

Retries (`api.kube_retry`, client-go's rules): a request the API server throttled (429) or could not take
(503), or that never left (no connection), is sent again after the wait the server asked (`Retry-After`, else
1 s); a GET also after any other transient failure. At most 10 times, and a wait is waited only when it fits in
the call's time (`kube_retry.CallTime`): its own `budget` for attempts and the waits it chooses, which a wait the
server asked for (429 or 503 with `Retry-After`) moves on, up to `asked_budget` or the caller's deadline
(`until`). So a hung or unreachable server costs a call at most `budget`, a throttled one may wait as told up to
its hard end. Otherwise the last error is raised at once, its message naming the wait asked, how often it was
tried, how many tries were throttled and that no time was left. urllib3's own retries are off: every answer
reaches this code, typed.

Errors: every request raises only `ApiError` (`api.kube_errors`), of the subclass that names what happened,
parsed once from the answer by `api_error`; `UndecodableResponse` when an answer cannot be decoded.
"""

import copy
import errno
import http.client
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Generator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3

from api.bounded_json import nesting_depth
from api.kube_config import KubeConfig, from_client_configuration
from api.kube_errors import (
    ApiError,
    ApiNoConnection,
    ApiThrottled,
    ApiTimeout,
    ApiTransient,
    ApiUnreachable,
    UndecodableResponse,
    api_error,
)
from api.kube_metrics import ApiMetrics, resource_of
from api.kube_retry import CallTime, asked_wait, failure_kind, retry_wait

JSON = "application/json"
APPLY = "application/apply-patch+yaml"
MIN_ATTEMPT_S = 0.05
"""A retry is sent only when at least this much of the budget is left after its wait."""


def _answer_error(resp: urllib3.BaseHTTPResponse, data: bytes, *, uid_precondition: bool = False) -> ApiError:
    return api_error(
        resp.status,
        resp.reason or "",
        data.decode(errors="replace"),
        resp.headers.get("Retry-After"),
        uid_precondition=uid_precondition,
    )


def _names_uid(body: Any) -> bool:
    """Whether an apply body names `metadata.uid` (a precondition the API server checks)."""
    return isinstance(body, dict) and bool((body.get("metadata") or {}).get("uid"))


MAX_DECODED_DEPTH = 500
"""Deepest nesting `decode_json` hands to the JSON decoder. Deeper documents are refused before decoding: the
decoder recurses once per level, and at a thousand levels a finalizer that the garbage collector runs meanwhile
fails with `RecursionError` too (an unraisable exception, anywhere in the process)."""


def decode_json(data: bytes, status: int = 200) -> Any:
    """`data` decoded as JSON; raises `UndecodableResponse` saying what is wrong, and nothing else."""
    try:
        if data.count(b"[") + data.count(b"{") > MAX_DECODED_DEPTH and (
            nesting_depth(data.decode()) > MAX_DECODED_DEPTH
        ):
            raise RecursionError
        return json.loads(data)
    except RecursionError:
        problem = f"it is nested deeper than the JSON decoder's limit of {MAX_DECODED_DEPTH} levels"
    except UnicodeDecodeError as err:
        problem = f"it is not valid UTF-8 ({err.reason} at byte {err.start})"
    except json.JSONDecodeError as err:
        problem = f"it is not valid JSON ({err.msg} at byte {err.pos})"
    except ValueError as err:  # e.g. an integer past sys.get_int_max_str_digits()
        problem = f"it holds a value Python cannot represent ({err})"
    raise UndecodableResponse(status=status, reason=f"cannot decode the API server's answer: {problem}")


def _cause(err: BaseException) -> str:
    """What happened to a connection, in words (never the transport library's own text)."""
    inner: BaseException | None = err
    while isinstance(inner, urllib3.exceptions.HTTPError):  # urllib3 wraps the socket's error, once or twice
        nested = inner.__cause__ or next((a for a in inner.args if isinstance(a, BaseException)), None)
        if nested is None:
            break
        inner = nested
    if isinstance(inner, http.client.RemoteDisconnected):
        return "the server closed the connection without an answer"
    if isinstance(inner, http.client.IncompleteRead | urllib3.exceptions.IncompleteRead):
        return "the answer was cut off"
    if isinstance(inner, ssl.SSLCertVerificationError):
        return f"TLS: the server's certificate is not trusted ({inner.verify_message})"
    if isinstance(inner, ssl.SSLError):
        return f"TLS failed ({inner.reason or inner.strerror or type(inner).__name__})"
    if isinstance(inner, OSError) and inner.errno is not None:
        return os.strerror(inner.errno).lower() if inner.errno != errno.ECONNRESET else "connection reset by the server"
    if isinstance(inner, OSError) and inner.strerror:
        return str(inner.strerror).lower()
    return f"the connection failed ({type(inner).__name__})"


def _unreachable(err: urllib3.exceptions.HTTPError, where: str, timeout: float) -> ApiError:
    """The error for a request that got no answer: `where` is the server's host:port. A server certificate
    that is not trusted is not transient (a plain ApiError): trying again cannot help."""
    if isinstance(err, urllib3.exceptions.SSLError) and isinstance(
        err.__cause__ or err.args[0], ssl.SSLCertVerificationError
    ):
        return ApiError(reason=f"cannot talk to the API server at {where}: {_cause(err)}")
    if isinstance(err, urllib3.exceptions.NameResolutionError):
        return ApiNoConnection(f"cannot resolve the API server's host name in {where}")
    if isinstance(err, urllib3.exceptions.NewConnectionError):  # before its base class ConnectTimeoutError
        return ApiNoConnection(f"cannot connect to {where}: {_cause(err)}")
    if isinstance(err, urllib3.exceptions.ConnectTimeoutError):
        return ApiNoConnection(f"cannot connect to {where}: no connection within {round(timeout, 1):g} s")
    if isinstance(err, urllib3.exceptions.TimeoutError):
        return ApiTimeout(f"the API server at {where} did not answer within {round(timeout, 1):g} s")
    return ApiUnreachable(f"the connection to {where} was lost before an answer: {_cause(err)}")


def _load_client_cert(context: ssl.SSLContext, config: KubeConfig) -> None:
    """Load the client certificate and key; inline PEM goes through private temporary files (the ssl module
    reads key material only from files), removed as soon as it is loaded."""
    if not (config.cert_file or config.cert_data):
        return
    with ExitStack() as cleanup:

        def as_file(data: str | None, path: str | None) -> str | None:
            if data is None:
                return path
            fd, name = tempfile.mkstemp(prefix="fracgpu-kube-")  # mode 0600
            cleanup.callback(os.unlink, name)
            with os.fdopen(fd, "w") as out:
                out.write(data)
            return name

        cert = as_file(config.cert_data, config.cert_file)
        key = as_file(config.key_data, config.key_file)
        assert cert is not None
        context.load_cert_chain(cert, key)


def ssl_context(config: KubeConfig) -> ssl.SSLContext:
    """The TLS context for `config`'s server: its CA (else the system's), client certificate, verification."""
    try:
        context = ssl.create_default_context(cafile=config.ca_file, cadata=config.ca_data)
        if config.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        _load_client_cert(context, config)
    except (OSError, ssl.SSLError) as err:
        raise ApiError(reason=f"cannot load the TLS certificates of {config.server}: {err}") from None
    return context


class KubeConnection:
    """The connection pool to one API server with `config`'s credentials; thread-safe, one per process."""

    def __init__(self, config: KubeConfig, metrics: ApiMetrics | None = None) -> None:
        """Raises ApiError (status 0) when the certificates cannot be loaded. `metrics`: where the requests that
        were throttled, sent again or given up are counted (None: not counted)."""
        self.config = config
        self.metrics = metrics
        url = urlsplit(config.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ApiError(reason=f"the API server address {config.server!r} is not an http(s) URL")
        self.prefix = url.path.rstrip("/")
        self.where = url.netloc
        pool_args: dict[str, Any] = {"maxsize": config.pool_size, "block": False, "retries": False}
        if url.scheme == "https":
            pool_args |= {"ssl_context": ssl_context(config), "server_hostname": config.tls_server_name}
            if config.insecure:
                pool_args |= {"cert_reqs": "CERT_NONE", "assert_hostname": False}
            self.pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(url.hostname, url.port, **pool_args)
        else:
            self.pool = urllib3.HTTPConnectionPool(url.hostname, url.port, **pool_args)

    @classmethod
    def of(cls, api_client: Any, metrics: ApiMetrics | None = None) -> "KubeConnection":
        """A connection with the credentials of a `kubernetes.client.ApiClient` (code that also uses the
        kubernetes package, such as tests)."""
        return cls(from_client_configuration(api_client.configuration), metrics)

    def authorization(self) -> str | None:
        return self.config.authorization()


def _given_up(failure: ApiError, tries: int, seconds: float, throttled: int, longest: float) -> None:
    """Record on `failure` how the call went: its tries, its time, and the earlier throttled tries (named only when
    `failure` is of another kind, whose message does not say it)."""
    failure.tries = tries
    failure.seconds = seconds
    if asked_wait(failure) is None and throttled:
        failure.throttled_tries, failure.longest_asked = throttled, longest


class KubeRest:
    """GET/POST/PUT/PATCH/DELETE and watch by API path, e.g. `/apis/resource.k8s.io/v1/resourceslices`.

    `timeout` (seconds) bounds each attempt of a request: connecting and waiting for the answer. `budget`
    (default: twice `timeout`) bounds a call's own time, its retries and the waits it chooses included;
    `asked_budget` (default: `budget`) bounds the whole call when the server asks it to wait (see the module
    doc); `bounded` sets them from budgets, `until` gives a copy a deadline instead of `asked_budget`.
    `resend_if`, when set, is asked before each retry: False ends the call with the last error (the
    controller's leader gate: a write is not sent again once the Lease ran out).
    """

    def __init__(
        self,
        connection: KubeConnection,
        timeout: float = 30.0,
        budget: float | None = None,
        *,
        asked_budget: float | None = None,
        resend_if: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.connection = connection
        self.timeout = timeout
        self.budget = 2 * timeout if budget is None else budget
        self.asked_budget = self.budget if asked_budget is None else asked_budget
        self.deadline: float | None = None
        """When set (`until`): the clock time by which every call ends, in place of `asked_budget`."""
        self.resend_if = resend_if
        self._clock = clock
        self._sleep = sleep

    @classmethod
    def bounded(
        cls, connection: KubeConnection, budget: float, attempts: int = 2, *, asked_budget: float | None = None
    ) -> "KubeRest":
        """A KubeRest on `connection` whose calls take at most about `budget` seconds of their own, retries and
        their waits included, each attempt at most `budget / attempts` (so a read that hangs is tried `attempts`
        times); waits the server asks for may stretch a call to `asked_budget` (default: `budget`)."""
        return cls(connection, timeout=budget / attempts, budget=budget, asked_budget=asked_budget)

    def until(self, deadline: float) -> "KubeRest":
        """A copy (same connection) whose calls wait what the server asks until `deadline` (on its clock) and end
        by then whatever happens; their own time is still at most `budget`."""
        bounded = copy.copy(self)
        bounded.deadline = deadline
        return bounded

    def _call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
        stream: bool = False,
        uid_precondition: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """Send the request until it gets a successful answer (2xx), retried as the module doc says; raises the
        last attempt's ApiError. `timeout`: each attempt's, fixed (a watch's); default: `self.timeout`, cut to
        what is left of the budget."""
        headers = {"Accept": JSON, "Content-Type": content_type}
        params = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.connection.prefix + path + (f"?{urlencode(params)}" if params else "")
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode() if body is not None else None
        metrics = self.connection.metrics
        started = self._clock()
        ends = CallTime.start(started, self.budget, self.asked_budget, self.deadline)
        retries = throttled = 0
        longest = 0.0
        while True:
            attempt_timeout = (
                timeout if timeout is not None else ends.attempt_timeout(self._clock(), self.timeout, MIN_ATTEMPT_S)
            )
            authorization = self.connection.authorization()  # re-read: a rotated token is used by the retry
            if authorization:
                headers["Authorization"] = authorization
            try:
                resp = self.connection.pool.urlopen(
                    method,
                    url,
                    body=data,
                    headers=headers,
                    retries=False,
                    redirect=False,
                    timeout=urllib3.Timeout(connect=attempt_timeout, read=attempt_timeout),
                    preload_content=not stream,
                )
            except urllib3.exceptions.HTTPError as err:  # refused, reset, TLS failures, timeouts, a cut-off answer
                failure: ApiError = _unreachable(err, self.connection.where, attempt_timeout)
            else:
                if 200 <= resp.status < 300:
                    return resp
                failure = _answer_error(
                    resp, resp.data if not stream else resp.read(), uid_precondition=uid_precondition
                )
                resp.release_conn()
            if metrics is not None and isinstance(failure, ApiThrottled):
                metrics.throttled.labels(resource_of(path), method).inc()
            wait = retry_wait(method, failure, retries)
            asked = asked_wait(failure) is not None
            fits = wait is not None and ends.fits(self._clock(), wait, asked, MIN_ATTEMPT_S)
            if wait is None or not fits or (self.resend_if is not None and not self.resend_if()):
                if asked and wait is not None and not fits:  # say why a wait the server asked was not waited
                    end = ends.hard if ends.end_after(wait, asked) == ends.hard else ends.own
                    failure.out_of_time_after = end - started
                _given_up(failure, retries + 1, self._clock() - started, throttled, longest)
                if metrics is not None and isinstance(failure, ApiTransient):
                    metrics.gave_up.labels(failure_kind(failure), method).inc()
                raise failure
            if metrics is not None:
                metrics.retries.labels(failure_kind(failure), method).inc()
            self._sleep(wait)
            ends.waited(wait, asked)
            retries += 1
            if asked:
                throttled, longest = throttled + 1, max(longest, wait)
            if self.resend_if is not None and not self.resend_if():
                _given_up(failure, retries, self._clock() - started, throttled - asked, longest)
                raise failure

    def decode(self, data: bytes, status: int) -> dict[str, Any]:
        """A successful answer's body as a JSON object; raises UndecodableResponse."""
        decoded = decode_json(data, status) if data else {}
        if not isinstance(decoded, dict):
            raise UndecodableResponse(status=status, reason="the API server's answer is not a JSON object")
        return decoded

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str = JSON,
        uid_precondition: bool = False,
    ) -> dict[str, Any]:
        """One request (`body`: JSON-encoded unless already a str); the decoded JSON object. Raises only
        ApiError, of the subclass that names the failure (see the module doc); `uid_precondition` as `api_error`."""
        resp = self.send(method, path, query, body=body, content_type=content_type, uid_precondition=uid_precondition)
        return self.decode(resp.data, resp.status)

    def send(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str = JSON,
        uid_precondition: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """One request whose successful answer is returned undecoded (for writes that only need to know they
        succeeded); raises as `request`."""
        return self._call(method, path, query, body=body, content_type=content_type, uid_precondition=uid_precondition)

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        return self.request("GET", path, query)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PUT", path, body=body)

    def delete(self, path: str) -> dict[str, Any]:
        return self.request("DELETE", path)

    def apply(self, path: str, body: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply of `body` as `field_manager`; a `metadata.uid` in `body` is a precondition
        (`ApiUidMismatch`)."""
        query = {"fieldManager": field_manager, "force": "true" if force else None}
        return self.request(
            "PATCH", path, query, body=json.dumps(body), content_type=APPLY, uid_precondition=_names_uid(body)
        )

    def apply_unread(self, path: str, body: dict[str, Any], field_manager: str) -> None:
        """Server-side apply (forced) whose answer is not decoded: the writes that only need to know they
        succeeded skip decoding the whole object the API server sends back. Raises as `apply`."""
        query = {"fieldManager": field_manager, "force": "true"}
        self.send("PATCH", path, query, body=json.dumps(body), content_type=APPLY, uid_precondition=_names_uid(body))

    def watch(self, path: str, timeout_seconds: int, **query: Any) -> Generator[dict[str, Any]]:
        """Watch events (`{"type", "object"}`) of a collection until the server closes after `timeout_seconds`.

        The watch request is retried as any GET (a 429 is waited out within the budget); once it streams, an
        `ERROR` event (e.g. 410 Gone: the resourceVersion is too old) is yielded like any other, and the caller
        lists again, as client-go's reflector does. Raises only ApiError, as `request` does; an event that
        cannot be decoded ends the watch with `UndecodableResponse`."""
        query = {**query, "watch": "true", "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "false"}
        timeout = timeout_seconds + 10
        resp = self._call("GET", path, query, timeout=timeout, stream=True)
        yield from _watch_events(resp, self.connection.where, timeout)


def _watch_events(resp: urllib3.BaseHTTPResponse, where: str, timeout: float) -> Generator[dict[str, Any]]:
    """The events of a streaming watch answer, one JSON object per line; the connection released at the end, closed
    first when the caller stops early."""
    buffer, complete = b"", False
    try:
        for chunk in resp.stream(None, decode_content=False):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    event = decode_json(line)
                    if not isinstance(event, dict):
                        raise UndecodableResponse(status=200, reason="a watch event is not a JSON object")
                    yield event
        complete = True
    except urllib3.exceptions.HTTPError as err:
        raise _unreachable(err, where, timeout) from None
    finally:
        if not complete:  # left early: the rest of the stream must not reach the connection's next user
            resp.close()
        resp.release_conn()


RESOURCE_V1 = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE_V1}/resourceslices"


def claim_path(namespace: str, name: str) -> str:
    """Path of one ResourceClaim (append `/status` for its status subresource)."""
    return f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}"


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"
