"""Plain-JSON Kubernetes requests on urllib3: the API client of both components (kopf watches on its own).

The kubernetes package's client imports about a thousand generated model modules (~32 MiB of memory in a
process that needs none of them); the node plugin sends a handful of JSON requests by API path, so this is
all it uses. Objects are dicts exactly as the API server sends them (no model drops a field).

`KubeConnection` holds one process's TLS context, credentials (`api.kube_config`) and connection pool
(thread-safe; shared by every `KubeRest` on it). `KubeRest` sends requests on it with its own per-attempt
timeout and retries.

Errors: every request raises only `ApiError` (`api.kube_errors`), of the subclass that names what happened,
parsed once from the answer by `api_error`; `UndecodableResponse` when an answer cannot be decoded.
"""

import json
import os
import ssl
import tempfile
from collections.abc import Generator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3

from api.kube_config import KubeConfig, from_client_configuration
from api.kube_errors import (
    ApiError,
    ApiTimeout,
    ApiUnreachable,
    UndecodableResponse,
    api_error,
)

JSON = "application/json"
APPLY = "application/apply-patch+yaml"


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


def decode_json(data: bytes, status: int = 200) -> Any:
    """`data` decoded as JSON; raises `UndecodableResponse` saying what is wrong, and nothing else."""
    try:
        return json.loads(data)
    except RecursionError:
        problem = "it is nested deeper than the JSON decoder's limit of about 1000 levels"
    except UnicodeDecodeError as err:
        problem = f"it is not valid UTF-8 ({err.reason} at byte {err.start})"
    except json.JSONDecodeError as err:
        problem = f"it is not valid JSON ({err.msg} at byte {err.pos})"
    except ValueError as err:  # e.g. an integer past sys.get_int_max_str_digits()
        problem = f"it holds a value Python cannot represent ({err})"
    raise UndecodableResponse(status=status, reason=f"cannot decode the API server's answer: {problem}")


def _is_timeout(err: object) -> bool:
    # urllib3 derives NewConnectionError (refused, unreachable) from ConnectTimeoutError for old callers
    return isinstance(err, urllib3.exceptions.TimeoutError) and not isinstance(
        err, urllib3.exceptions.NewConnectionError
    )


def _unreachable(err: urllib3.exceptions.HTTPError, timeout: float) -> ApiUnreachable:
    if _is_timeout(err) or _is_timeout(getattr(err, "reason", None)):  # MaxRetryError wraps the last try's error
        return ApiTimeout(f"the API server did not answer (waited {timeout:g} s per attempt): {err}")
    return ApiUnreachable(f"cannot reach the API server: {err}")


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

    def __init__(self, config: KubeConfig) -> None:
        """Raises ApiError (status 0) when the certificates cannot be loaded."""
        self.config = config
        url = urlsplit(config.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ApiError(reason=f"the API server address {config.server!r} is not an http(s) URL")
        self.prefix = url.path.rstrip("/")
        pool_args: dict[str, Any] = {"maxsize": config.pool_size, "block": False, "retries": False}
        if url.scheme == "https":
            pool_args |= {"ssl_context": ssl_context(config), "server_hostname": config.tls_server_name}
            if config.insecure:
                pool_args |= {"cert_reqs": "CERT_NONE", "assert_hostname": False}
            self.pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(url.hostname, url.port, **pool_args)
        else:
            self.pool = urllib3.HTTPConnectionPool(url.hostname, url.port, **pool_args)

    @classmethod
    def of(cls, api_client: Any) -> "KubeConnection":
        """A connection with the credentials of a `kubernetes.client.ApiClient` (code that also uses the
        kubernetes package, such as the controller and tests)."""
        return cls(from_client_configuration(api_client.configuration))

    def authorization(self) -> str | None:
        return self.config.authorization()


def retries(attempts: int) -> urllib3.Retry:
    """`attempts` tries in all: a retry only after a connection error or a timeout (answers, even 5xx, are
    final; a timed-out POST or PATCH is not sent again, as urllib3 retries reads of idempotent methods only).
    An answer with `Retry-After` is final too: it reaches the caller as `ApiThrottled` / `ApiUnavailable`
    (urllib3 would otherwise count it against `status=0` and report the server unreachable)."""
    return urllib3.Retry(
        total=attempts - 1,
        redirect=0,
        status=0,
        backoff_factor=0,
        raise_on_redirect=False,
        respect_retry_after_header=False,
    )


class KubeRest:
    """GET/POST/PUT/PATCH/DELETE and watch by API path, e.g. `/apis/resource.k8s.io/v1/resourceslices`.

    `timeout` (seconds) bounds each attempt of a request: connecting and waiting for the answer; there are
    `attempts` tries (see `retries`). `bounded` sets both for a total budget.
    """

    def __init__(self, connection: KubeConnection, timeout: float = 30.0, attempts: int = 4) -> None:
        self.connection = connection
        self.timeout = timeout
        self._retries = retries(attempts)

    @classmethod
    def bounded(cls, connection: KubeConnection, budget: float, attempts: int = 2) -> "KubeRest":
        """A KubeRest on `connection` whose requests take at most about `budget` seconds, retries included:
        `attempts` tries of `budget / attempts` seconds each."""
        return cls(connection, timeout=budget / attempts, attempts=attempts)

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
    ) -> urllib3.BaseHTTPResponse:
        timeout = self.timeout if timeout is None else timeout
        headers = {"Accept": JSON, "Content-Type": content_type}
        authorization = self.connection.authorization()
        if authorization:
            headers["Authorization"] = authorization
        params = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.connection.prefix + path + (f"?{urlencode(params)}" if params else "")
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode() if body is not None else None
        try:
            return self.connection.pool.urlopen(
                method,
                url,
                body=data,
                headers=headers,
                retries=self._retries,
                redirect=False,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
                preload_content=not stream,
            )
        except urllib3.exceptions.HTTPError as err:  # refused, reset, TLS failures, timeouts, a cut-off answer
            raise _unreachable(err, timeout) from err

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
        resp = self._call(method, path, query, body=body, content_type=content_type)
        if not 200 <= resp.status < 300:
            raise _answer_error(resp, resp.data, uid_precondition=uid_precondition)
        return resp

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

        Raises only ApiError, as `request` does; an event that cannot be decoded ends the watch with
        `UndecodableResponse`."""
        query = {**query, "watch": "true", "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "false"}
        timeout = timeout_seconds + 10
        resp = self._call("GET", path, query, timeout=timeout, stream=True)
        buffer, complete = b"", False
        try:
            if resp.status != 200:
                data, complete = resp.read(), True
                raise _answer_error(resp, data)
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
            raise _unreachable(err, timeout) from err
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
