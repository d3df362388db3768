"""The `GPU` ledger, recomputed from published devices and allocated claims (pure functions).

Nothing is accumulated over time: the desired objects follow from the current slices and claims alone,
so a restarted controller converges to the same ledger. `desired_gpu` computes one object, so that a caller
can recompute only the GPUs whose claims changed; `desired_ledger` computes them all.

A MIG GPU is one object (its `mig-parent` device): its partitions' allocations are its claims, and `status.mig`
says its MIG state and the memory and compute slices they take. A partition device has no object of its own.

`status.taints` are the taints in effect on the object's devices (`device_taints`): those the node plugin
publishes in the slice and those of the DeviceTaintRules whose selector matches, as the scheduler applies them.
"""

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from api import mig
from api.gpu import (
    GPU_API_VERSION,
    GPU_KIND,
    NODE_LABEL,
    GpuCondition,
    GpuMigStatus,
    GpuShare,
    GpuSpec,
    GpuStatus,
    GpuTaint,
    gpu_object_name,
)
from api.quantity import format_bytes
from controller.core.claims import ClaimView, Share
from controller.core.slices import DeviceKey, DeviceRecord, DeviceTaint, TaintRuleView

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


class GpuObject(BaseModel):
    """A desired GPU object: identity (metadata + spec) and status, as wire dicts."""

    model_config = ConfigDict(frozen=True)

    name: str
    labels: dict[str, str]
    spec: dict[str, Any]
    status: dict[str, Any]
    owner_uid: str | None = None
    """The uid of the Node that owns it (its slice's owner): the garbage collector deletes it with that Node."""


class ExistingGpu(BaseModel):
    """What the API server holds for one GPU object (from the controller's index)."""

    model_config = ConfigDict(frozen=True)

    name: str
    labels: dict[str, str]
    spec: dict[str, Any]
    status: dict[str, Any] | None
    owners: tuple[str, ...] = ()
    """The uids of the Nodes its ownerReferences name."""


class LedgerPlan(BaseModel):
    """Writes that bring the API server to the desired ledger."""

    model_config = ConfigDict(frozen=True)

    apply_identity: tuple[GpuObject, ...] = ()
    """Objects to create, or whose labels/spec differ (applied to the main resource)."""
    apply_status: tuple[GpuObject, ...] = ()
    """Objects whose status differs (applied to the status subresource)."""
    delete: tuple[str, ...] = ()
    """Names of objects of our driver whose device is gone."""

    @property
    def empty(self) -> bool:
        return not (self.apply_identity or self.apply_status or self.delete)


def desired_ledger(
    devices: Mapping[DeviceKey, DeviceRecord],
    claims: Iterable[ClaimView],
    driver: str,
    manager: str,
    reporting: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    trust_domain: Callable[[DeviceKey], str | None] | None = None,
    rules: Iterable[TaintRuleView] = (),
) -> dict[str, GpuObject]:
    """One object per published GPU (a MIG GPU's partitions are its own) with the allocations of every claim on
    it; `reporting`: node -> its `PluginReporting` condition (`controller.nodes.plan.plan_plugin_reporting`);
    `trust_domain`: the trust domain an MPS GPU serves; `rules`: the DeviceTaintRules that may select our
    devices."""
    by_pool: dict[str | None, list[TaintRuleView]] = {}  # a rule matches the devices of its pool, or of any
    for rule in rules:
        by_pool.setdefault(rule.pool, []).append(rule)
    conditions = reporting or {}
    owner = {key: ledger_key(device) for key, device in devices.items()}
    shares: dict[DeviceKey, list[tuple[ClaimView, Share]]] = {key: [] for key in devices}
    for claim in claims:
        for share in claim.shares:
            if share.device_key in owner and owner[share.device_key] in shares:
                shares[owner[share.device_key]].append((claim, share))
    domain = trust_domain or (lambda _: None)
    partitions: dict[DeviceKey, list[DeviceKey]] = {key: [] for key in devices}
    for key, device in sorted(devices.items()):
        if device.kind == mig.TYPE_MIG and owner[key] in partitions and owner[key] != key:
            partitions[owner[key]].append(key)
    objects = (
        desired_gpu(
            device,
            shares[key],
            driver,
            manager,
            conditions.get(device.node),
            partitions={k: devices[k] for k in partitions[key]},
            mps_trust_domain=domain(key),
            taints=device_taints(
                driver,
                [device, *(devices[k] for k in partitions[key])],
                [*by_pool.get(None, ()), *by_pool.get(device.pool, ())],
            ),
        )
        for key, device in devices.items()
        if device.kind != mig.TYPE_MIG
    )
    return {o.name: o for o in objects}


def ledger_key(device: DeviceRecord) -> DeviceKey:
    """The device whose GPU object accounts for `device`: a partition's GPU, else itself."""
    return (device.pool, device.ledger_device)


def family(key: DeviceKey, devices: Mapping[DeviceKey, DeviceRecord]) -> list[DeviceKey]:
    """`key` and, for a MIG GPU, the keys of its partitions (those its GPU object accounts for)."""
    return [key, *sorted(k for k, d in devices.items() if d.kind == mig.TYPE_MIG and ledger_key(d) == key and k != key)]


def shares_on(
    key: DeviceKey, claims: Iterable[ClaimView], partitions: Mapping[DeviceKey, DeviceRecord] | None = None
) -> list[tuple[ClaimView, Share]]:
    """The shares of `claims` allocated on the device `key` (and on its `partitions`), each with its claim."""
    keys = {key, *(partitions or {})}
    return [(claim, share) for claim in claims for share in claim.shares if share.device_key in keys]


def desired_gpu(
    device: DeviceRecord,
    shares: Iterable[tuple[ClaimView, Share]],
    driver: str,
    manager: str,
    reporting: Mapping[str, Any] | None = None,
    *,
    partitions: Mapping[DeviceKey, DeviceRecord] | None = None,
    mps_trust_domain: str | None = None,
    taints: Iterable[DeviceTaint] = (),
) -> GpuObject:
    """The object of one published device carrying `shares` (each with its claim; any order), owned by the Node
    that owns the device's slice; `reporting`: its node's `PluginReporting` condition, if watched; `partitions`:
    a MIG GPU's partition devices (whose shares are among `shares`); `mps_trust_domain`: the trust domain an MPS
    GPU serves (`controller.mps`); `taints`: those in effect on it (`device_taints`), in order."""
    parts = partitions or {}
    claims_on = []
    allocated = 0
    compute = 0  # percent reserved by the shares of a shared GPU
    used = [0, 0]  # compute, memory slices of the allocated partitions
    for claim, share in sorted(
        shares, key=lambda cs: (cs[0].namespace, cs[0].name, cs[1].request, cs[1].share_id or "")
    ):
        part = parts.get(share.device_key)
        on = part or device
        # admin access is not counted against capacity by the scheduler: it reserves nothing
        granted = 0 if share.admin_access else share.memory if share.memory is not None else on.memory_total
        allocated += granted
        compute += share.compute
        if part is not None and not share.admin_access:
            used[0] += part.compute_slices or 0
            used[1] += part.memory_slices or 0
        claims_on.append(
            GpuShare(
                namespace=claim.namespace,
                name=claim.name,
                pod=claim.pod,
                request=share.request,
                share_id=share.share_id or "",
                memory=format_bytes(granted),
                admin_access=True if share.admin_access else None,
                enforcement=claim.status_enforcement.get(share.entry_key),
                compute=share.compute or None,
                device=part.device if part else None,
                profile=part.profile if part else None,
                placement=part.placement if part else None,
                mig_uuid=claim.status_mig.get(share.entry_key) if part else None,
            )
        )
    in_effect = [GpuTaint(key=t.key, value=t.value or None, effect=t.effect, source=t.source) for t in taints]
    status = GpuStatus(
        node=device.node,
        index=device.index,
        uuid=device.uuid or "",
        model=device.product_name or "",
        enforcement=device.memory_enforcement,
        total_memory=format_bytes(device.memory_total),
        allocated_memory=format_bytes(allocated),
        free_memory=format_bytes(max(0, device.memory_total - allocated)),
        allocated_compute=compute or None,
        shares=len(claims_on),
        claims=claims_on,
        share_enforcement=share_enforcement(claims_on),
        mps_trust_domain=mps_trust_domain,
        taints=in_effect or None,
        taint_summary=taint_summary(in_effect) or None,
        tainted_by=",".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in in_effect) or None,
        conditions=[GpuCondition.model_validate(reporting)] if reporting is not None else None,
        mig=mig_status(device, used, len(claims_on)) if device.kind == mig.TYPE_MIG_PARENT else None,
    )
    name = gpu_object_name(device.node, device.device)
    return GpuObject(
        name=name,
        labels={NODE_LABEL: device.node, MANAGED_BY_LABEL: manager},
        spec=GpuSpec(driver=driver, pool=device.pool, device=device.device, node=device.node).model_dump(by_alias=True),
        status=status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        owner_uid=device.node_uid,
    )


def mig_status(device: DeviceRecord, used: list[int], partitions: int) -> GpuMigStatus:
    """`status.mig` of a MIG GPU: its state and what its allocated partitions take (`used`: compute, memory)."""
    state = device.mig_state or "error"
    total_compute, total_memory = device.compute_slices or 0, device.memory_slices or 0
    summary = (
        f"{used[0]}/{total_compute} compute, {used[1]}/{total_memory} memory slices, {partitions} partitions"
        if state == "enabled"
        else f"MIG {state}"
    )
    return GpuMigStatus(
        state=state,
        message=mig.state_message(state, device.index),
        used_compute_slices=used[0],
        total_compute_slices=total_compute,
        used_memory_slices=used[1],
        total_memory_slices=total_memory,
        partitions=partitions,
        summary=summary,
    )


_TIER_ORDER = ("mig", "nvml", "mps", "hami-core", "none")


def share_enforcement(shares: Iterable[GpuShare]) -> str:
    """`nvml=2,none=1`: how many shares got each tier, strongest first; `unreported` for shares whose node
    plugin has not reported a tier yet."""
    counts = Counter(s.enforcement or "unreported" for s in shares)
    order = [*_TIER_ORDER, *sorted(set(counts) - set(_TIER_ORDER))]
    return ",".join(f"{tier}={counts[tier]}" for tier in order if counts[tier])


_EFFECT_ORDER = ("NoExecute", "NoSchedule", "None")
"""Strongest first: NoExecute also evicts, NoSchedule keeps new claims off, None only informs (as an unknown does)."""


def _effect_rank(effect: str) -> int:
    return _EFFECT_ORDER.index(effect) if effect in _EFFECT_ORDER else len(_EFFECT_ORDER)


def device_taints(driver: str, devices: Iterable[DeviceRecord], rules: Iterable[TaintRuleView]) -> list[DeviceTaint]:
    """The taints in effect on a GPU object's `devices` (its device and, for a MIG GPU, its partitions): those in
    their slices and the taint of each DeviceTaintRule whose selector matches one of them, each once, strongest
    effect first. A MIG GPU's own marker (`mig-parent`: only its partitions are allocated) is left out."""
    rules = tuple(rules)
    found: dict[tuple[str, str, str, str], DeviceTaint] = {}
    for device in devices:
        matched = (r.taint for r in rules if r.matches(driver, device.pool, device.device))
        for taint in (*device.taints, *matched):
            if taint.key == mig.PARENT_TAINT_KEY and device.kind == mig.TYPE_MIG_PARENT:
                continue
            found.setdefault((taint.key, taint.value, taint.effect, taint.source), taint)
    return sorted(found.values(), key=lambda t: (_effect_rank(t.effect), t.key, t.value, t.source))


def taint_summary(taints: Iterable[GpuTaint]) -> str:
    """`NoExecute=1,NoSchedule=2`: how many taints of each effect, strongest first ('' without taints)."""
    counts = Counter(t.effect for t in taints)
    return ",".join(f"{e}={counts[e]}" for e in sorted(counts, key=lambda e: (_effect_rank(e), e)))


def _normalized(value: Any) -> Any:
    """Drop empty lists/maps and None recursively: the API server may store them either way."""
    if isinstance(value, Mapping):
        return {k: _normalized(v) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


#: Status fields the node plugin owns (its own field manager): never desired here, so never compared.
PLUGIN_STATUS_FIELDS = frozenset({"usage"})


def plan_ledger(desired: Mapping[str, GpuObject], existing: Mapping[str, ExistingGpu], driver: str) -> LedgerPlan:
    """Compare desired objects with existing ones of `driver`; other drivers' objects are left alone. The
    plugin's status fields (`PLUGIN_STATUS_FIELDS`) are left out of the comparison, so a usage write never
    makes the controller apply the status again (its apply, of its own fields only, leaves them as they are)."""
    identity: list[GpuObject] = []
    status: list[GpuObject] = []
    for name, want in sorted(desired.items()):
        have = existing.get(name)
        if (
            have is None
            or any(have.labels.get(k) != v for k, v in want.labels.items())
            or _normalized(have.spec) != _normalized(want.spec)
            or (want.owner_uid is not None and have.owners != (want.owner_uid,))
        ):
            identity.append(want)
        have_status = {k: v for k, v in (have.status or {}).items() if k not in PLUGIN_STATUS_FIELDS} if have else {}
        if have is None or _normalized(have_status) != _normalized(want.status):
            status.append(want)
    delete = tuple(
        sorted(name for name, have in existing.items() if name not in desired and have.spec.get("driver") == driver)
    )
    return LedgerPlan(apply_identity=tuple(identity), apply_status=tuple(status), delete=delete)


def identity_body(obj: GpuObject) -> dict[str, Any]:
    """Server-side-apply body for the main resource (labels, owner and spec). The owner is the Node by uid: a
    Node re-registered under the same name is another owner, and the apply replaces the stale reference."""
    metadata: dict[str, Any] = {"name": obj.name, "labels": dict(obj.labels)}
    if obj.owner_uid is not None:
        node = str(obj.spec.get("node", ""))
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": obj.owner_uid}]
    return {"apiVersion": GPU_API_VERSION, "kind": GPU_KIND, "metadata": metadata, "spec": dict(obj.spec)}


def status_body(obj: GpuObject) -> dict[str, Any]:
    """Server-side-apply body for the status subresource."""
    return {"apiVersion": GPU_API_VERSION, "kind": GPU_KIND, "metadata": {"name": obj.name}, "status": obj.status}
