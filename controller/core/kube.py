"""The controller's writes to the API server (blocking calls; run them in threads).

Reads come from kopf's watches and indexes; everything written goes through here: server-side apply of
claim status and GPU objects, GPU deletion, and Events on claims. Plain JSON through `api.kube_rest`
(the generated per-method client layer costs tens of MiB of memory).
"""

import datetime
import hashlib
import json
import logging
import os
import socket
from typing import Any

import kopf
from kubernetes import client, config

from api import bounded_json
from api.gpu import GPU_PLURAL, GPU_VERSION
from api.heartbeat import HEARTBEAT_LABEL, leases_path
from api.kube_rest import APPLY, ApiError, KubeConnection, KubeRest, claim_path
from api.names import API_GROUP
from controller.core.model import ClaimView
from controller.core.settings import COMPONENT, FIELD_MANAGER, Settings

log = logging.getLogger(__name__)


def configuration(settings: Settings) -> client.Configuration:
    """Client configuration from `--kubeconfig`, else the in-cluster service account."""
    cfg = client.Configuration()
    if settings.kubeconfig is not None:
        config.load_kube_config(config_file=str(settings.kubeconfig), client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, settings.workers + settings.ledger_workers + 8)
    return cfg


def api_client(settings: Settings) -> client.ApiClient:
    """An ApiClient for the controller's own writes."""
    return client.ApiClient(configuration(settings))


def connection_info(settings: Settings) -> kopf.ConnectionInfo:
    """kopf credentials equal to those of `api_client` (the same kubeconfig or service account)."""
    cfg = configuration(settings)
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def gpu_path(name: str, *, status: bool = False) -> str:
    """API path of a GPU object (or of its status subresource)."""
    return f"/apis/{API_GROUP}/{GPU_VERSION}/{GPU_PLURAL}/{name}" + ("/status" if status else "")


def apply_claim_status(rest: "BoundedRest", namespace: str, name: str, body: dict[str, Any]) -> None:
    """Server-side apply `body` to `resourceclaims/status` (the answer, the whole claim, is not decoded)."""
    rest.apply_unread(claim_path(namespace, name) + "/status", body, FIELD_MANAGER)


def apply_gpu(rest: "BoundedRest", body: dict[str, Any], *, status: bool) -> None:
    """Server-side apply a GPU object (main resource, or its status subresource); the answer is not decoded."""
    rest.apply_unread(gpu_path(body["metadata"]["name"], status=status), body, FIELD_MANAGER)


def delete_gpu(rest: KubeRest, name: str) -> None:
    """Delete a GPU object; already gone is fine."""
    try:
        rest.delete(gpu_path(name))
    except ApiError as err:
        if err.status != 404:
            raise


_INSTANCE = os.environ.get("POD_NAME") or socket.gethostname()


def event_name(claim: ClaimView, key: tuple[str, ...]) -> str:
    """Deterministic name of the Event about `key` (reason first) on `claim`: `<claim>.<hash>`.

    The same claim (uid) and key always give the same name, so a retried or restarted post meets
    AlreadyExists instead of duplicating the Event.
    """
    digest = hashlib.sha256("\x00".join((claim.uid, *key)).encode()).hexdigest()[:16]
    return f"{claim.name[: 253 - 17].rstrip('-.')}.{digest}"


def post_claim_event(
    rest: KubeRest, claim: ClaimView, key: tuple[str, ...], *, reason: str, message: str, type_: str = "Warning"
) -> bool:
    """Post a core/v1 Event about a ResourceClaim, named after (claim uid, key); never raises.

    True when the Event exists now (created, or AlreadyExists from an earlier post) or can never be
    created (namespace terminating); False when a later retry may succeed.
    """
    now = datetime.datetime.now(datetime.UTC)
    namespace, name = claim.namespace, claim.name
    body = {
        "metadata": {"name": event_name(claim, key), "namespace": namespace},
        "involvedObject": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "name": name,
            "namespace": namespace,
            "uid": claim.uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": _INSTANCE[:128],
        "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "count": 1,
    }
    try:
        rest.create(f"/api/v1/namespaces/{namespace}/events", body)
    except ApiError as err:
        if err.status == 409:
            return True  # posted before (by this process or an earlier one)
        extra = {"reason": reason, "claim": f"{namespace}/{name}", "status": err.status}
        if err.status == 403 and "terminat" in str(err.body):
            # a namespace being deleted refuses new Events: expected, not worth a warning or a retry
            log.debug("could not post Event", extra=extra)
            return True
        log.warning("could not post Event", extra=extra)
        return False
    except Exception as err:  # connection errors and the like: retry later
        log.warning("could not post Event", extra={"reason": reason, "claim": f"{namespace}/{name}", "error": str(err)})
        return False
    return True


class BoundedRest(KubeRest):
    """`KubeRest` decoding answers with `api.bounded_json`: the answer to a claim status apply is the whole
    claim, which may be nested as deep as the API server stores (json.loads raises RecursionError)."""

    def decode(self, data: bytes, status: int) -> dict[str, Any]:
        decoded: dict[str, Any] = bounded_json.loads(data) if data else {}
        return decoded

    def apply_unread(self, path: str, body: dict[str, Any], field_manager: str) -> None:
        """Server-side apply (forced) whose answer is not decoded: the writes that only need to know they
        succeeded skip decoding the whole object the API server sends back. Raises as `request`."""
        query = {"fieldManager": field_manager, "force": "true"}
        resp = self._call("PATCH", path, query, body=json.dumps(body), content_type=APPLY)
        if not 200 <= resp.status < 300:
            raise ApiError(status=resp.status, reason=resp.reason or "", body=resp.data.decode(errors="replace"))


class KubeWriter:
    """The controller's `Writer` (controller/reconciler.py) against the API server."""

    def __init__(self, api: client.ApiClient, driver: str) -> None:
        self.rest = BoundedRest(KubeConnection.of(api))
        self.driver = driver

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        apply_claim_status(self.rest, namespace, name, body)

    def apply_gpu(self, body: dict[str, Any], *, status: bool) -> None:
        apply_gpu(self.rest, body, status=status)

    def delete_gpu(self, name: str) -> None:
        delete_gpu(self.rest, name)

    def post_claim_event(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        return post_claim_event(self.rest, claim, key, reason=reason, message=message)

    def list_heartbeats(self, namespace: str) -> list[dict[str, Any]]:
        selector = f"{HEARTBEAT_LABEL}={self.driver}"
        items: list[dict[str, Any]] = self.rest.get(leases_path(namespace), labelSelector=selector)["items"]
        return items
