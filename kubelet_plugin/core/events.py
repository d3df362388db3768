"""Kubernetes Events the node plugin posts: about its Node, or about another object (a claim); built and posted
by `api.events`."""

import uuid
from collections.abc import Mapping

from api.events import event_body, involved_object, post_event
from api.kube_rest import KubeRest

COMPONENT = "fracgpu-kubelet-plugin"


def post_node_event(rest: KubeRest, node_name: str, reason: str, message: str, type_: str = "Warning") -> None:
    """Post a core/v1 Event about Node `node_name`; failures are logged, never raised."""
    node = involved_object("v1", "Node", node_name, uid=node_name)
    post_object_event(rest, node, node_name, reason, message, type_=type_)


def post_object_event(
    rest: KubeRest, involved: Mapping[str, str], node_name: str, reason: str, message: str, *, type_: str = "Warning"
) -> bool:
    """Post a core/v1 Event about ``involved`` (kind, name, namespace, uid, apiVersion; the Event goes to its
    namespace; a cluster-scoped object's, without one, to ``default``), reported from
    ``node_name``; failures are logged, never raised: False."""
    name = f"{involved['name']}.{uuid.uuid4().hex[:12]}"
    body = event_body(
        involved, reason, message, component=COMPONENT, instance=node_name, type_=type_, name=name, host=node_name
    )
    return post_event(rest, body)
