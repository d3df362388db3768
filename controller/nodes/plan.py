"""Node lifecycle (pure planning; the status manager and `heartbeats` read the inputs and write the results).

A deleted Node: its ResourceSlices and GPU objects go by owner reference (the Node owns both; the garbage
collector deletes them, and the controller deletes a GPU object whose device is no longer published), and every
claim allocated on it gets the condition `AllocatedDeviceGone` on its entries (`plan_node_gone`) plus one Event.
The condition stays: the claim names a device that went with its node; only a new claim gets a GPU again.

A silent node plugin (its pod deleted, its node agent down): its slices stay published (the plugin never
deletes them on shutdown), and its GPU objects say `PluginReporting=False` once its heartbeat Lease
(`api/heartbeat.py`) has not been renewed for the controller's `--plugin-heartbeat-timeout`
(`plan_plugin_reporting`). A renewal is timed by when the controller saw it (the first time by the Lease's own
renewTime, if older), so the plugin's clock matters only at the controller's start.
"""

import datetime
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from api.gpu import DEVICE_GONE_CONDITION, PLUGIN_REPORTING_CONDITION, GpuCondition
from api.heartbeat import heartbeat_of, lease_name, parse_time
from controller.core.claims import ClaimView, Share

REASON_NODE_DELETED = "NodeDeleted"
REASON_HEARTBEAT = "PluginHeartbeat"
REASON_HEARTBEAT_EXPIRED = "PluginHeartbeatExpired"
REASON_NO_HEARTBEAT = "NoPluginHeartbeat"
REASON_NOT_CHECKED = "HeartbeatNotChecked"

Entry = dict[str, Any]


def _time(at: datetime.datetime) -> str:
    """A metav1.Time (seconds, UTC)."""
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeGonePlan(BaseModel):
    """What a claim's status gets because the node it is allocated on was deleted."""

    model_config = ConfigDict(frozen=True)

    entries: tuple[Entry, ...]
    """The status entries to apply: the given ones, those of the gone node's shares with the condition."""
    changed: bool = False
    """Some share lacks the condition on the claim: a write is needed."""
    node: str | None = None
    """The deleted node the claim is allocated on (None: its node exists, or nodes are not known yet)."""
    shares: tuple[Share, ...] = ()
    """The claim's shares on that node."""


def gone_condition(share: Share, node: str, now: datetime.datetime) -> dict[str, str]:
    """The `AllocatedDeviceGone` condition of `share`, whose node `node` was deleted at about `now`."""
    return {
        "type": DEVICE_GONE_CONDITION,
        "status": "True",
        "reason": REASON_NODE_DELETED,
        "message": f"node {node} was deleted, and device {share.device} of pool {share.pool} with it: request "
        f"{share.request!r} has no GPU any more; delete the pod and its claim to get another GPU",
        "lastTransitionTime": _time(now),
    }


def plan_node_gone(
    claim: ClaimView,
    nodes: Collection[str] | None,
    entries: Iterable[Entry],
    driver: str,
    now: datetime.datetime,
) -> NodeGonePlan:
    """`entries` (`controller.status.plan.plan_status`'s, for `claim`) plus the `AllocatedDeviceGone` condition on the entry of
    every share of `claim` when the node it is allocated on is not among `nodes` (the Nodes that exist; None: not
    known yet, nothing is concluded). A condition the claim already has is kept as it is (its time included); a
    share without an entry gets one with the condition only."""
    entries = tuple(entries)
    node = claim.node
    if nodes is None or node is None or node in nodes or not claim.shares:
        return NodeGonePlan(entries=entries)
    by_key = {(str(e["pool"]), str(e["device"]), str(e.get("shareID") or "")): dict(e) for e in entries}
    changed = False
    for share in claim.shares:
        existing = claim.status_gone.get(share.entry_key)
        changed = changed or existing is None
        entry = by_key.setdefault(
            share.entry_key,
            {"driver": driver, "pool": share.pool, "device": share.device}
            | ({"shareID": share.share_id} if share.share_id else {}),
        )
        others = [c for c in entry.get("conditions") or [] if c.get("type") != DEVICE_GONE_CONDITION]
        entry["conditions"] = [*others, existing if existing is not None else gone_condition(share, node, now)]
    return NodeGonePlan(entries=tuple(by_key.values()), changed=changed, node=node, shares=claim.shares)


def node_gone_message(claim: ClaimView, node: str, driver: str) -> str:
    """The Event about a claim whose node was deleted."""
    devices = ", ".join(sorted({f"{s.pool}/{s.device}" for s in claim.shares}))
    return (
        f"node {node} was deleted: the {driver} devices allocated to this claim ({devices}) are gone with it "
        f"(condition {DEVICE_GONE_CONDITION} on its status.devices); delete the pod and its claim to get another GPU"
    )


class Heartbeat(BaseModel):
    """The last renewal of a node's heartbeat Lease the controller saw, and when it saw it."""

    model_config = ConfigDict(frozen=True)

    renew_time: str
    seen_at: datetime.datetime


def observe(
    previous: Mapping[str, Heartbeat], leases: Iterable[Mapping[str, Any]], now: datetime.datetime
) -> dict[str, Heartbeat]:
    """The heartbeats after listing `leases` at `now`: a renewal not seen before is dated `now`, except the first
    one of a node, dated by its renewTime when that is older (a controller that starts after the plugin went
    silent must not call it reporting). Nodes without a Lease any more are dropped."""
    out: dict[str, Heartbeat] = {}
    for lease in leases:
        found = heartbeat_of(lease)
        if found is None:
            continue
        node, renewed = found
        before = previous.get(node)
        if before is not None and before.renew_time == renewed:
            out[node] = before
            continue
        written = parse_time(renewed) or now
        out[node] = Heartbeat(renew_time=renewed, seen_at=now if before is not None else min(now, written))
    return out


def unchecked_reporting(node: str, namespace: str) -> dict[str, Any]:
    """`PluginReporting` Unknown for a node whose heartbeat Lease the controller could not list yet (a GPU object
    written while the listings since the controller's start or since the node's GPUs were published failed), so
    that `kubectl get gpus` shows a value from the start; the next listing that succeeds replaces it."""
    condition = GpuCondition(
        type=PLUGIN_REPORTING_CONDITION,
        status="Unknown",
        reason=REASON_NOT_CHECKED,
        message=f"the controller has not checked the heartbeat Lease {namespace}/{lease_name(node)} yet",
    )
    return condition.model_dump(by_alias=True, exclude_none=True)


def plan_plugin_reporting(
    nodes: Iterable[str],
    heartbeats: Mapping[str, Heartbeat],
    previous: Mapping[str, Mapping[str, Any]],
    *,
    now: datetime.datetime,
    timeout_s: float,
    namespace: str,
) -> dict[str, dict[str, Any]]:
    """The `PluginReporting` condition of every node in `nodes` at `now`: True while its last heartbeat is at
    most `timeout_s` old, False after, Unknown without one. `previous`: the conditions written before, whose
    lastTransitionTime is kept while the status is the same (so an unchanged node writes nothing)."""
    out: dict[str, dict[str, Any]] = {}
    for node in sorted(set(nodes)):
        lease = f"{namespace}/{lease_name(node)}"
        beat = heartbeats.get(node)
        since: datetime.datetime | None
        if beat is None:
            status, reason, since = "Unknown", REASON_NO_HEARTBEAT, None
            message = f"no heartbeat Lease {lease} from the node plugin yet (not started, or without heartbeats)"
        elif (now - beat.seen_at).total_seconds() <= timeout_s:
            status, reason, since = "True", REASON_HEARTBEAT, now
            message = f"the node plugin renews its heartbeat Lease {lease}"
        else:
            status, reason = "False", REASON_HEARTBEAT_EXPIRED
            since = beat.seen_at + datetime.timedelta(seconds=timeout_s)
            message = (
                f"the node plugin has not renewed its heartbeat Lease {lease} for more than {timeout_s:g} s (last "
                f"{beat.renew_time}): its pod is gone or cannot reach the API server. The node's ResourceSlices "
                "stay published and running pods keep their GPUs; new pods on this node wait until it is back"
            )
        before = previous.get(node) or {}
        if before.get("status") == status and before.get("reason") == reason:
            transition = before.get("lastTransitionTime")
        else:
            transition = _time(since) if since is not None else None
        condition = GpuCondition(
            type=PLUGIN_REPORTING_CONDITION,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=transition,
        )
        out[node] = condition.model_dump(by_alias=True, exclude_none=True)
    return out
