"""What the controller writes into a claim's `status.devices` (pure functions).

For each allocation result of our driver there is one entry keyed by (driver, pool, device, shareID)
whose `data` tells which physical GPU it is. The controller owns `data` and its own conditions (server-side apply,
field manager `fracgpu-controller`): on an MPS GPU the trust-domain condition the scheduler waits on
(`controller.mps`), and `AllocatedDeviceGone` (`controller.nodes.plan`); the node plugin owns the `Ready` and
`MemoryEnforcement` conditions of the same entries, and other drivers' entries are never part of the apply body, so
never touched.
"""

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from api.gpu import AllocatedGpuData, gpu_object_name
from api.mig import TYPE_MIG
from api.quantity import MiB, format_bytes
from controller.core.claims import ClaimView, Share
from controller.core.slices import DeviceKey, DeviceRecord


class MpsPart(Protocol):
    """What an MPS GPU adds to a share's entry (`controller.mps.manager.MpsEntry`)."""

    @property
    def domain(self) -> str | None: ...
    @property
    def condition(self) -> dict[str, Any] | None: ...


class StatusPlan(BaseModel):
    """The desired entries of one claim and what could not be resolved."""

    model_config = ConfigDict(frozen=True)

    entries: tuple[dict[str, Any], ...]
    """Apply-body entries: driver, pool, device, [shareID], data."""
    missing: tuple[Share, ...]
    """Results whose device is not published (any more)."""
    changed: bool
    """True when some entry's `data` differs from what the claim holds: a write is needed."""


def share_data(
    share: Share,
    device: DeviceRecord,
    enforcement: str | None = None,
    mps_domain: str | None = None,
    mig_uuid: str | None = None,
) -> dict[str, object]:
    """The `data` of the entry of `share`, allocated from `device` (admin access: memory "0", adminAccess);
    `enforcement`: the tier the node plugin reported for it (its `MemoryEnforcement` condition); `mps_domain`: on
    an MPS GPU, the claim's trust domain; a MIG partition also names its profile, placement and memory and
    `mig_uuid`, what the plugin reported it made (its `MigPartition` condition); `gpu` is then its GPU's object."""
    granted = 0 if share.admin_access else share.memory if share.memory is not None else device.memory_total
    partition = device.kind == TYPE_MIG
    return AllocatedGpuData(
        gpu=gpu_object_name(device.node, device.ledger_device),
        node=device.node,
        device=device.device,
        index=device.index,
        uuid=device.uuid,
        product_name=device.product_name,
        request=share.request,
        memory=format_bytes(granted),
        memory_total=format_bytes(device.memory_total),
        admin_access=True if share.admin_access else None,
        enforcement=enforcement,
        profile=device.profile if partition else None,
        placement=device.placement if partition else None,
        partition_memory=format_bytes(device.partition_memory_mib * MiB)
        if partition and device.partition_memory_mib
        else None,
        mig_uuid=mig_uuid if partition else None,
        mps_trust_domain=mps_domain,
    ).to_data()


def plan_status(
    claim: ClaimView,
    lookup: Callable[[DeviceKey], DeviceRecord | None],
    driver: str,
    mps: Mapping[tuple[str, str, str], MpsPart] | None = None,
) -> StatusPlan:
    """Desired entries for every result of `driver` in `claim`; `mps`: by entry key, what an MPS GPU adds (the
    claim's trust domain into `data`, the binding condition decided).

    A result whose device is no longer published keeps the data it already has (so the apply does not
    drop it); without prior data it gets no entry and is reported in `missing`.
    """
    entries: list[dict[str, Any]] = []
    missing: list[Share] = []
    changed = False
    for share in claim.shares:
        existing = claim.status_data.get(share.entry_key)
        device = lookup(share.device_key)
        part = (mps or {}).get(share.entry_key)
        if device is None:
            missing.append(share)
            data = existing
        else:
            enforcement = claim.status_enforcement.get(share.entry_key)
            data = share_data(
                share,
                device,
                enforcement,
                part.domain if part is not None else None,
                claim.status_mig.get(share.entry_key),
            )
            changed = changed or data != existing
        condition = part.condition if part is not None else None
        if data is None and condition is None:
            continue
        entry: dict[str, Any] = {"driver": driver, "pool": share.pool, "device": share.device}
        if share.share_id:
            entry["shareID"] = share.share_id
        if data is not None:
            entry["data"] = data
        if condition is not None:
            entry["conditions"] = [condition]
            changed = changed or claim.status_mps.get(share.entry_key) != condition
        entries.append(entry)
    return StatusPlan(entries=tuple(entries), missing=tuple(missing), changed=changed)


def apply_body(claim: ClaimView, entries: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The server-side-apply body for `resourceclaims/status` carrying only our entries.

    `metadata.uid` makes the API server refuse the apply if the claim was replaced meanwhile.
    """
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": list(entries)},
    }
