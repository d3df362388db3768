"""Plain-JSON Kubernetes requests on top of `kubernetes.client.ApiClient`.

The ApiClient still does configuration, authentication, TLS and retries; this skips the generated
per-method layer, whose pydantic validators cost ~25 MiB of memory on first use — more than the whole rest
of the node plugin. Objects are dicts exactly as the API server sends them (no model drops a field).
"""

import json
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
APPLY = "application/apply-patch+yaml"


class KubeRest:
    """GET/POST/PUT/PATCH/DELETE and watch by API path, e.g. `/apis/resource.k8s.io/v1/resourceslices`."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def _call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = 30.0,
    ) -> Any:
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
            raise ApiException(status=0, reason=f"cannot reach the API server: {err}") from err

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        body: Any = None,
        content_type: str = JSON,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer. Raises ApiException on HTTP errors and, with status 0, when
        the API server cannot be reached."""
        resp = self._call(method, path, query, body=body, content_type=content_type)
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
        decoded: dict[str, Any] = json.loads(data) if data else {}
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
        """Watch events (`{"type", "object"}`) of a collection until the server closes after `timeout_seconds`."""
        query = {**query, "watch": "true", "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "false"}
        resp = self._call("GET", path, query, timeout=timeout_seconds + 10)
        if resp.status != 200:
            raise ApiException(status=resp.status, reason=resp.reason, body=resp.read().decode(errors="replace"))
        buffer = b""
        try:
            for chunk in resp.response.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.response.release_conn()


RESOURCE_V1 = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE_V1}/resourceslices"


def claim_path(namespace: str, name: str) -> str:
    """Path of one ResourceClaim (append `/status` for its status subresource)."""
    return f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}"


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"
