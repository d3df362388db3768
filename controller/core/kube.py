"""The controller's writes to the API server (blocking calls; run them in threads).

Reads come from kopf's watches and indexes (but for a DeviceTaintRule read back by name after a create met
AlreadyExists, and the pods a claim's Event concerns: read by name, or a namespace's pods not bound to a node);
everything written goes through here: server-side apply of claim status and GPU objects, GPU deletion, the MPS
GPUs' DeviceTaintRules, and Events on claims, on the pods that use them and on those rules. Plain JSON through
`api.kube_rest` (the generated per-method client layer costs tens of MiB of memory).
"""

import contextlib
import dataclasses
import hashlib
import os
import socket
from typing import Any

import kopf

from api import bounded_json, kube_config
from api.events import event_body, involved_object, post_event
from api.gpu import GPU_PLURAL, GPU_VERSION
from api.heartbeat import HEARTBEAT_LABEL, leases_path
from api.kube_config import KubeConfig
from api.kube_errors import ApiError, ApiNotFound
from api.kube_rest import KubeConnection, KubeRest, claim_path
from api.mps_trust import TAINT_RULES_PATH as TAINT_RULES
from api.names import API_GROUP
from controller.core.claims import ClaimView, PodRef
from controller.core.settings import COMPONENT, FIELD_MANAGER, Settings


def credentials(settings: Settings) -> KubeConfig:
    """The cluster and credentials of `--kubeconfig`, else the in-cluster service account (`api.kube_config`;
    raises its ConfigError), with a connection pool for every writer thread."""
    config = (
        kube_config.from_kubeconfig([settings.kubeconfig])
        if settings.kubeconfig is not None
        else kube_config.in_cluster()
    )
    return dataclasses.replace(config, pool_size=max(config.pool_size, settings.workers + settings.ledger_workers + 8))


def connection_info(config: KubeConfig) -> kopf.ConnectionInfo:
    """kopf credentials equal to `config` (the same server, CA, client certificate or token)."""
    header = config.authorization()
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=config.server,
        ca_path=config.ca_file,
        ca_data=config.ca_data,
        insecure=config.insecure,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        certificate_data=config.cert_data,
        private_key_path=config.key_file,
        private_key_data=config.key_data,
    )


def describe(err: BaseException) -> str:
    """A one-line reason for a failed API call: its kind's message (`api.kube_errors`), with the API server's own
    when it sent one."""
    if isinstance(err, ApiError):
        return str(err)[:500]
    return f"{type(err).__name__}: {err}"[:500]


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
    with contextlib.suppress(ApiNotFound):
        rest.delete(gpu_path(name))


_INSTANCE = os.environ.get("POD_NAME") or socket.gethostname()


def event_name(claim: ClaimView, key: tuple[str, ...]) -> str:
    """Deterministic name of the Event about `key` (reason first) on `claim`: `<claim>.<hash>`.

    The same claim (uid) and key always give the same name, so a retried or restarted post meets
    AlreadyExists instead of duplicating the Event.
    """
    return _derived_name(claim.name, (claim.uid, *key))


def _derived_name(name: str, parts: tuple[str, ...]) -> str:
    """`<name>.<hash of parts>`, at most 253 characters."""
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]
    return f"{name[: 253 - 17].rstrip('-.')}.{digest}"


def pod_event_name(pod: PodRef, about: tuple[str, ...]) -> str:
    """Deterministic name of the Event `about` (a claim uid and its Event's key) on `pod`: `<pod>.<hash>` of the
    pod's uid and `about`, so a repeated post meets AlreadyExists."""
    return _derived_name(pod.name, (pod.uid, *about))


def post_claim_event(
    rest: KubeRest, claim: ClaimView, key: tuple[str, ...], *, reason: str, message: str, type_: str = "Warning"
) -> bool:
    """Post a core/v1 Event about a ResourceClaim, named after (claim uid, key); never raises.

    True when the Event exists now (created, or AlreadyExists from an earlier post) or can never be
    created (namespace terminating); False when a later retry may succeed (`api.events.post_event`).
    """
    involved = involved_object(
        "resource.k8s.io/v1", "ResourceClaim", claim.name, namespace=claim.namespace, uid=claim.uid
    )
    body = event_body(
        involved, reason, message, component=COMPONENT, instance=_INSTANCE, type_=type_, name=event_name(claim, key)
    )
    return post_event(rest, body)


def post_pod_event(
    rest: KubeRest, namespace: str, pod: PodRef, about: tuple[str, ...], *, reason: str, message: str
) -> bool:
    """Post a Warning core/v1 Event about a Pod (what `kubectl describe pod` shows), named after (pod uid,
    `about`); never raises. True and False as `post_claim_event`."""
    involved = involved_object("v1", "Pod", pod.name, namespace=namespace, uid=pod.uid)
    name = pod_event_name(pod, about)
    body = event_body(involved, reason, message, component=COMPONENT, instance=_INSTANCE, name=name)
    return post_event(rest, body)


def post_taint_rule_event(rest: KubeRest, name: str, uid: str, *, reason: str, message: str) -> bool:
    """Post a Warning core/v1 Event about the DeviceTaintRule `name` (cluster-scoped: in namespace `default`, where
    `kubectl describe devicetaintrule` finds it); never raises. True when posted (see `api.events.post_event`)."""
    involved = involved_object("resource.k8s.io/v1", "DeviceTaintRule", name, uid=uid or None)
    body = event_body(involved, reason, message, component=COMPONENT, instance=_INSTANCE)
    return post_event(rest, body)


class BoundedRest(KubeRest):
    """`KubeRest` decoding answers with `api.bounded_json`: the answer to a claim status apply is the whole
    claim, which may be nested as deep as the API server stores (json.loads raises RecursionError)."""

    def decode(self, data: bytes, status: int) -> dict[str, Any]:
        decoded: dict[str, Any] = bounded_json.loads(data) if data else {}
        return decoded


class KubeWriter:
    """The controller's `Writer` (controller/core/context.py) against the API server."""

    def __init__(self, connection: KubeConnection, driver: str) -> None:
        self.rest = BoundedRest(connection)
        self.driver = driver

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        apply_claim_status(self.rest, namespace, name, body)

    def apply_gpu(self, body: dict[str, Any], *, status: bool) -> None:
        apply_gpu(self.rest, body, status=status)

    def delete_gpu(self, name: str) -> None:
        delete_gpu(self.rest, name)

    def post_claim_event(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        return post_claim_event(self.rest, claim, key, reason=reason, message=message)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiNotFound:
            return None

    def list_unbound_pods(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query: dict[str, Any] = {"fieldSelector": "spec.nodeName=", "limit": 500}
        while True:
            page = self.rest.get(f"/api/v1/namespaces/{namespace}/pods", **query)
            items += page.get("items") or []
            query["continue"] = (page.get("metadata") or {}).get("continue")
            if not query["continue"]:
                return items

    def post_pod_event(self, namespace: str, pod: PodRef, about: tuple[str, ...], reason: str, message: str) -> bool:
        return post_pod_event(self.rest, namespace, pod, about, reason=reason, message=message)

    def list_heartbeats(self, namespace: str) -> list[dict[str, Any]]:
        selector = f"{HEARTBEAT_LABEL}={self.driver}"
        items: list[dict[str, Any]] = self.rest.get(leases_path(namespace), labelSelector=selector)["items"]
        return items

    def create_taint_rule(self, body: dict[str, Any]) -> str:
        made = self.rest.create(TAINT_RULES, body)
        return str((made.get("metadata") or {}).get("uid") or "")

    def read_taint_rule(self, name: str) -> dict[str, Any] | None:
        # a list by name: the ClusterRole lets the controller list and watch DeviceTaintRules, not get them
        items: list[dict[str, Any]] = self.rest.get(TAINT_RULES, fieldSelector=f"metadata.name={name}")["items"]
        return items[0] if items else None

    def post_taint_rule_event(self, name: str, uid: str, reason: str, message: str) -> bool:
        return post_taint_rule_event(self.rest, name, uid, reason=reason, message=message)

    def apply_taint_rule(self, body: dict[str, Any]) -> None:
        self.rest.apply_unread(f"{TAINT_RULES}/{body['metadata']['name']}", body, FIELD_MANAGER)

    def delete_taint_rule(self, name: str) -> None:
        with contextlib.suppress(ApiNotFound):
            self.rest.delete(f"{TAINT_RULES}/{name}")
