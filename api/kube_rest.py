"""Plain-JSON Kubernetes requests on top of `kubernetes.client.ApiClient`.

The ApiClient still does configuration, authentication, TLS and retries; this skips the generated
per-method layer, whose pydantic validators cost ~25 MiB of memory on first use — more than the whole rest
of the node plugin. Objects are dicts exactly as the API server sends them (no model drops a field).

Errors: every request raises only `ApiException` — `ApiUnreachable` (status 0) when the API server cannot
be reached, its subclass `ApiTimeout` when it did not answer in time, and `UndecodableResponse` when it
answered with a body this client cannot decode. kube-apiserver stores, and serves byte for byte, opaque
parameters (10 KiB at most) that Python's `json` cannot decode: arrays nested 5117 levels deep (objects
1706), past the decoder's recursion limit of about 1000 levels, and strings that are not valid UTF-8.
"""

import copy
import json
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
APPLY = "application/apply-patch+yaml"


class ApiUnreachable(ApiException):  # type: ignore[misc]  # the kubernetes client is untyped here
    """No answer from the API server: connection refused or reset, TLS failure (status 0)."""

    def __init__(self, reason: str) -> None:
        super().__init__(status=0, reason=reason)


class ApiTimeout(ApiUnreachable):
    """The API server did not answer within the request's time budget (status 0)."""


class UndecodableResponse(ApiException):  # type: ignore[misc]
    """The API server answered (`status` is its HTTP status) with a body this client cannot decode."""


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


def _unreachable(err: urllib3.exceptions.HTTPError, timeout: float | None) -> ApiUnreachable:
    if _is_timeout(err) or _is_timeout(getattr(err, "reason", None)):  # MaxRetryError wraps the last try's error
        return ApiTimeout(f"the API server did not answer (waited {timeout:g} s per attempt): {err}")
    return ApiUnreachable(f"cannot reach the API server: {err}")


class KubeRest:
    """GET/POST/PUT/PATCH/DELETE and watch by API path, e.g. `/apis/resource.k8s.io/v1/resourceslices`.

    `timeout` (seconds) bounds each attempt of a request: connecting and waiting for the answer. How many
    attempts there are is the ApiClient's `configuration.retries`; `bounded` sets both for a total budget.
    """

    def __init__(self, api: client.ApiClient, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout

    @classmethod
    def bounded(cls, api: client.ApiClient, budget: float, attempts: int = 2) -> "KubeRest":
        """A KubeRest on its own copy of `api` whose requests take at most about `budget` seconds, retries
        included: `attempts` tries (a retry only after a connection error or a timeout; answers, even 5xx,
        are final) of `budget / attempts` seconds each."""
        configuration = copy.deepcopy(api.configuration)
        configuration.retries = urllib3.Retry(total=attempts - 1, redirect=0, status=0, backoff_factor=0)
        return cls(client.ApiClient(configuration), timeout=budget / attempts)

    def _call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> Any:
        timeout = self.timeout if timeout is None else timeout
        headers = {"Accept": JSON, "Content-Type": content_type}
        _, url, headers, body, _ = self.api.param_serialize(
            method,
            path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=timeout)
        except urllib3.exceptions.HTTPError as err:  # connection refused, timeouts: the client passes them on raw
            raise _unreachable(err, timeout) from err
        except ApiException as err:
            if err.status == 0 and not isinstance(err, ApiUnreachable):  # the client's own wrapping of TLS errors
                raise ApiUnreachable(f"cannot reach the API server: {err.reason}") from err
            raise

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str = JSON,
    ) -> dict[str, Any]:
        """One request; the decoded JSON object. Raises only ApiException: with the HTTP status on HTTP
        errors, `ApiUnreachable` / `ApiTimeout`, and `UndecodableResponse` (see the module doc)."""
        resp = self._call(method, path, query, body=body, content_type=content_type)
        try:
            data: bytes = resp.read()
        except urllib3.exceptions.HTTPError as err:  # the answer stopped half-way
            raise _unreachable(err, self.timeout) from err
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
        decoded = decode_json(data, resp.status) if data else {}
        if not isinstance(decoded, dict):
            raise UndecodableResponse(status=resp.status, reason="the API server's answer is not a JSON object")
        return decoded

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        return self.request("GET", path, query)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PUT", path, body=body)

    def delete(self, path: str) -> dict[str, Any]:
        return self.request("DELETE", path)

    def apply(self, path: str, body: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply of `body` as `field_manager`."""
        query = {"fieldManager": field_manager, "force": "true" if force else None}
        return self.request("PATCH", path, query, body=json.dumps(body), content_type=APPLY)

    def watch(self, path: str, timeout_seconds: int, **query: Any) -> Iterator[dict[str, Any]]:
        """Watch events (`{"type", "object"}`) of a collection until the server closes after `timeout_seconds`.

        Raises only ApiException, as `request` does; an event that cannot be decoded ends the watch with
        `UndecodableResponse`."""
        query = {**query, "watch": "true", "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "false"}
        timeout = timeout_seconds + 10
        resp = self._call("GET", path, query, timeout=timeout)
        if resp.status != 200:
            raise ApiException(status=resp.status, reason=resp.reason, body=resp.read().decode(errors="replace"))
        buffer = b""
        try:
            for chunk in resp.response.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = decode_json(line)
                        if not isinstance(event, dict):
                            raise UndecodableResponse(status=200, reason="a watch event is not a JSON object")
                        yield event
        except urllib3.exceptions.HTTPError as err:
            raise _unreachable(err, timeout) from err
        finally:
            resp.response.release_conn()


RESOURCE_V1 = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE_V1}/resourceslices"


def claim_path(namespace: str, name: str) -> str:
    """Path of one ResourceClaim (append `/status` for its status subresource)."""
    return f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}"


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"
