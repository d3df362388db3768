"""Kubernetes Events the node plugin posts: about its Node, or about another object (a claim)."""

import datetime
import logging
import uuid

from api.kube_rest import ApiError, KubeRest

log = logging.getLogger(__name__)
COMPONENT = "fracgpu-kubelet-plugin"


def post_node_event(rest: KubeRest, node_name: str, reason: str, message: str, type_: str = "Warning") -> None:
    """Post a core/v1 Event about Node `node_name`; failures are logged, never raised."""
    node = {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name}
    post_object_event(rest, node, node_name, reason, message, type_=type_)


def post_object_event(
    rest: KubeRest, involved: dict[str, str], node_name: str, reason: str, message: str, *, type_: str = "Warning"
) -> bool:
    """Post a core/v1 Event about ``involved`` (kind, name, namespace, uid, apiVersion; the Event goes to its
    namespace; a cluster-scoped object's, without one, to ``default``), reported from
    ``node_name``; failures are logged, never raised: False."""
    now = datetime.datetime.now(datetime.UTC).isoformat()
    namespace = involved.get("namespace", "default")
    body = {
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT, "host": node_name},
        "reportingComponent": COMPONENT,
        "reportingInstance": node_name,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        rest.create(f"/api/v1/namespaces/{namespace}/events", body)
    except ApiError as err:
        log.warning("could not post Event", extra={"reason": reason, "status": err.status})
        return False
    return True
