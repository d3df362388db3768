"""The node plugin's heartbeat: one `coordination.k8s.io` Lease per node, renewed by that node's plugin.

The plugin renews `fracgpu-plugin-<node>` in its own namespace (the release's) every `--heartbeat-interval`;
the controller reads those Leases and says in the ledger whether each node's plugin is reporting
(`controller/nodes/plan.py`). The chart's admission policy lets a plugin write only its own node's Lease.
"""

import datetime
from collections.abc import Mapping
from typing import Any, Final

from api.names import API_GROUP

LEASE_PREFIX: Final = "fracgpu-plugin-"
"""Name prefix of the heartbeat Leases (the chart's admission policy spells it too)."""
HEARTBEAT_LABEL: Final = f"{API_GROUP}/plugin-heartbeat"
"""Label on every heartbeat Lease; its value is the driver name (the controller lists its driver's only)."""
LEASES: Final = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def lease_name(node: str) -> str:
    """The heartbeat Lease of `node`'s plugin."""
    return f"{LEASE_PREFIX}{node}"


def leases_path(namespace: str) -> str:
    """API path of the Leases of `namespace`."""
    return LEASES.format(namespace=namespace)


def micro_time(at: datetime.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime.datetime | None:
    """A Time or MicroTime as the API server writes it (`...Z`), or None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


def lease_body(
    node: str, driver: str, *, renewed: datetime.datetime, acquired: datetime.datetime, duration_seconds: int
) -> dict[str, Any]:
    """The server-side-apply body of `node`'s heartbeat Lease: held by the node (its name), renewed `renewed`,
    held since this plugin process started (`acquired`)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease_name(node), "labels": {HEARTBEAT_LABEL: driver}},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration_seconds,
            "acquireTime": micro_time(acquired),
            "renewTime": micro_time(renewed),
        },
    }


def heartbeat_of(lease: Mapping[str, Any]) -> tuple[str, str] | None:
    """(node, renewTime) of a heartbeat Lease as listed; None when it names no node or was never renewed."""
    spec = lease.get("spec") or {}
    node, renewed = spec.get("holderIdentity"), spec.get("renewTime")
    if not isinstance(node, str) or not node or not isinstance(renewed, str) or parse_time(renewed) is None:
        return None
    if (lease.get("metadata") or {}).get("name") != lease_name(node):
        return None  # a Lease naming another node than its own name says: not a heartbeat
    return node, renewed
