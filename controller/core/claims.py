"""Compact, immutable views of ResourceClaims and of our DeviceClasses: what the controller keeps in its claim
and class indexes.

Parsing happens once per watch event (`claim_view`, which raises only `MalformedObjectError`, for a body not
shaped like a ResourceClaim; `device_class_view`); everything downstream (status, ledger, events, MPS trust
domains) works on these views: a claim's results of our driver (`Share`), its requests of our DeviceClasses
(`GpuRequest`), its constraints and what its status already says.
"""

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from api import mig
from api.bounded_json import short_path, skipped_parts
from api.compute import consumed_percent
from api.gpu import DEVICE_GONE_CONDITION, ENFORCEMENT_CONDITION, tier_of_reason
from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION
from api.names import COMPUTE_CAPACITY, MEMORY_CAPACITY
from controller.core.parsing import quantity_bytes, shape_errors
from controller.core.slices import DeviceKey

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""Set by kube-controller-manager on a claim it makes from a pod's ResourceClaimTemplate: the pod's own name for it
(its `spec.resourceClaims[].name`), there before the pod's `status.resourceClaimStatuses` says so."""
"""Set to "true" by kube-scheduler on the claim it creates for a pod's extended resource (`extendedResourceName`)."""


class Share(BaseModel):
    """One allocation result of our driver in a claim."""

    model_config = ConfigDict(frozen=True)

    request: str
    pool: str
    device: str
    share_id: str | None = None
    memory: int | None = None
    """consumedCapacity.memory in bytes; None when the result does not say (then the whole device)."""
    compute: int = 0
    """consumedCapacity.compute in whole percent of the GPU (0: none reserved, or an adminAccess result)."""
    admin_access: bool = False
    """The result has `adminAccess: true`: monitoring access that the scheduler does not count against the
    device's capacity. Such a share reserves no memory: the ledger counts it as 0 (and marks it), and the
    claim status reports `memory: "0"` with `adminAccess: true` (`controller.status.plan.share_data`)."""
    mps_binding: bool = False
    """The result carries the binding condition of MPS trust domains (`api.mps_trust.ADMITTED_CONDITION`): the
    scheduler waits for the controller to admit or refuse it (`controller.mps`)."""

    @property
    def device_key(self) -> DeviceKey:
        return (self.pool, self.device)

    @property
    def entry_key(self) -> tuple[str, str, str]:
        """Key of its status.devices entry (driver implied): (pool, device, shareID or "")."""
        return (self.pool, self.device, self.share_id or "")


class GpuRequest(BaseModel):
    """A request (or subrequest) of one of our DeviceClasses: one alternative of a claim's request."""

    model_config = ConfigDict(frozen=True)

    request: str
    """Its name: `gpu`, or `gpu/large` for a subrequest of `firstAvailable`."""
    memory: int | None = None
    """Its memory amount in bytes; None: none named (each device's `default_request`, a whole GPU)."""
    compute: int | None = None
    """Its compute amount in whole percent of a GPU (`capacity.requests.compute`); None: none named (none reserved)."""
    count: int = 1
    """`count` of allocationMode ExactCount: that many distinct devices."""
    all: bool = False
    """allocationMode All: every matching device of the node (at least one)."""
    admin_access: bool = False
    selectors: tuple[str, ...] = ()
    """CEL expressions of the request's `selectors` (all must hold)."""
    device_class: str = ""
    """The DeviceClass the alternative names (one of ours)."""


class DeviceConstraint(BaseModel):
    """One `spec.devices.constraints` entry: `matchAttribute` (`distinct` False) or `distinctAttribute`."""

    model_config = ConfigDict(frozen=True)

    requests: tuple[str, ...] = ()
    """The requests (`gpu`) or subrequests (`gpu/large`) it covers; empty: all of them."""
    attribute: str
    """The fully qualified attribute name (`gpu.fracgpu.dev/uuid`)."""
    distinct: bool = False


class DeviceClassView(BaseModel):
    """The part of our DeviceClass that claims inherit: its CEL selectors and its GpuConfig parameters."""

    model_config = ConfigDict(frozen=True)

    name: str
    selectors: tuple[str, ...] = ()
    configs: tuple[Any, ...] = ()
    """`opaque.parameters` of its config entries for our driver, in order."""


class PodRef(BaseModel):
    """A pod a claim names: its controlling owner, or one its `status.reservedFor` lists."""

    model_config = ConfigDict(frozen=True)

    name: str
    uid: str


class ClaimView(BaseModel):
    """The part of a ResourceClaim that concerns our driver."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str
    uid: str
    allocated: bool
    node: str | None = None
    pod: str | None = None
    """The pod that owns the claim (its controlling owner reference, of kind Pod): a claim made from the pod's
    ResourceClaimTemplate, or by the scheduler for the pod's extended resource (`resources.limits`); None for a
    claim created on its own."""
    extended_resource: bool = False
    """kube-scheduler made it for the pod's extended resource (annotation
    `resource.kubernetes.io/extended-resource-claim: "true"`): whole GPUs by design, its spec the scheduler's."""
    pod_uid: str = ""
    pod_claim_name: str = ""
    """The owner pod's own name for the claim (`POD_CLAIM_NAME_ANNOTATION`; empty when not made from a template)."""
    """The uid of that owner pod (empty when there is none)."""
    reserved: tuple[PodRef, ...] = ()
    """The pods `status.reservedFor` lists: those that hold the claim (allocated, and being bound or running)."""
    shares: tuple[Share, ...] = ()
    requests: tuple[tuple[GpuRequest, ...], ...] = ()
    """Per request all of whose alternatives name one of our classes: its alternatives (one for `exactly`, several
    for `firstAvailable`)."""
    constraints: tuple[DeviceConstraint, ...] = ()
    status_data: dict[tuple[str, str, str], Any] = {}
    status_enforcement: dict[tuple[str, str, str], str] = {}
    """The tier the node plugin reports it applied (condition `MemoryEnforcement`), by entry key."""
    """Existing `data` of our driver's status.devices entries, by entry key (None when absent)."""
    status_gone: dict[tuple[str, str, str], dict[str, Any]] = {}
    """The controller's `AllocatedDeviceGone` condition of our entries that have one, by entry key."""
    status_mig: dict[tuple[str, str, str], str] = {}
    """The MIG UUID the node plugin reports it created for an entry (condition `MigPartition`), by entry key."""
    status_mps: dict[tuple[str, str, str], dict[str, Any]] = {}
    """The controller's MPS trust-domain condition (admitted or conflict) of our entries that have one, by entry
    key."""
    allocated_at: str = ""
    """`status.allocation.allocationTimestamp` (RFC 3339), empty when the scheduler wrote none."""
    skipped: tuple[str, ...] = ()
    """Field paths (shortened) of parts the decoder skipped (`api.bounded_json`: nested too deep, integers too
    long); the rest of the claim is read as usual."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def memory_requests(self) -> tuple[tuple[GpuRequest, ...], ...]:
        """The `requests` every alternative of which names a memory amount."""
        return tuple(r for r in self.requests if all(m.memory is not None for m in r))


def _allocated_node(allocation: Mapping[str, Any]) -> str | None:
    terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")) or []
    if len(terms) != 1:
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) == 1 and fields[0].get("key") == "metadata.name" and len(fields[0].get("values") or []) == 1:
        return str(fields[0]["values"][0])
    return None


def _memory(capacities: Mapping[str, Any], driver: str, name: str = MEMORY_CAPACITY) -> Any:
    """The `memory` (or `name`) capacity of a capacity map: plain or qualified by our driver's domain (the same
    capacity)."""
    value = capacities.get(name)
    return value if value is not None else capacities.get(f"{driver}/{name}")


def _cel_selectors(selectors: object) -> tuple[str, ...]:
    """The CEL expressions of a `selectors` list (entries without one are skipped)."""
    if not isinstance(selectors, list):
        return ()
    return tuple(
        str(s["cel"]["expression"])
        for s in selectors
        if isinstance(s, Mapping) and isinstance(s.get("cel"), Mapping) and s["cel"].get("expression") is not None
    )


def _gpu_request(exact: Mapping[str, Any], name: str, driver: str) -> GpuRequest | None:
    """The alternative `exact` (None: a memory or compute amount that is not a quantity)."""
    capacities = (exact.get("capacity") or {}).get("requests") or {}
    requested = _memory(capacities, driver)
    memory = quantity_bytes(requested) if requested is not None else None
    asked = _memory(capacities, driver, COMPUTE_CAPACITY)
    compute = quantity_bytes(asked) if asked is not None else None
    if (requested is not None and memory is None) or (asked is not None and compute is None):
        return None
    return GpuRequest(
        request=name,
        memory=memory,
        compute=compute,
        count=int(exact.get("count") or 1),
        all=exact.get("allocationMode") == "All",
        admin_access=bool(exact.get("adminAccess")),
        selectors=_cel_selectors(exact.get("selectors")),
        device_class=str(exact.get("deviceClassName", "")),
    )


def _constraints(entries: object) -> tuple[DeviceConstraint, ...]:
    out = []
    for c in entries if isinstance(entries, list) else []:
        attribute, distinct = c.get("matchAttribute"), False
        if not attribute:
            attribute, distinct = c.get("distinctAttribute"), True
        if attribute:
            out.append(
                DeviceConstraint(
                    requests=tuple(map(str, c.get("requests") or ())), attribute=str(attribute), distinct=distinct
                )
            )
    return tuple(out)


def device_class_view(body: Mapping[str, Any], driver: str) -> DeviceClassView:
    """The view of a DeviceClass: its CEL selectors and the parameters of its configs for `driver`."""
    spec = body.get("spec") or {}
    configs = tuple(
        (c.get("opaque") or {}).get("parameters")
        for c in spec.get("config") or []
        if isinstance(c, Mapping) and (c.get("opaque") or {}).get("driver") == driver
    )
    return DeviceClassView(
        name=str((body.get("metadata") or {}).get("name", "")),
        selectors=_cel_selectors(spec.get("selectors")),
        configs=configs,
    )


def _owner_pod(meta: Mapping[str, Any]) -> PodRef | None:
    """The pod a `metadata` names as its controlling owner, if any."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return PodRef(name=str(ref["name"]), uid=str(ref.get("uid") or ""))
    return None


def _reserved_pods(status: Mapping[str, Any]) -> tuple[PodRef, ...]:
    """The pods of `status.reservedFor` (entries of other resources are left out)."""
    return tuple(
        PodRef(name=str(r["name"]), uid=str(r.get("uid") or ""))
        for r in status.get("reservedFor") or []
        if isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup") and r.get("name")
    )


@shape_errors("ResourceClaim")
def claim_view(body: Mapping[str, Any], driver: str, device_class: str | tuple[str, ...]) -> ClaimView | None:
    """The view of a claim that has results of `driver` or requests `device_class` (or one of several of our
    classes); None otherwise.

    Raises only MalformedObjectError (for bodies that are not shaped like a ResourceClaim)."""
    meta = body.get("metadata") or {}
    spec_devices = (body.get("spec") or {}).get("devices") or {}
    status = body.get("status") or {}
    allocation = status.get("allocation")
    shares = tuple(
        Share(
            request=str(r.get("request", "")),
            pool=str(r["pool"]),
            device=str(r["device"]),
            share_id=r.get("shareID") or None,
            memory=quantity_bytes(consumed)
            if (consumed := _memory(r.get("consumedCapacity") or {}, driver)) is not None
            else None,
            compute=0 if r.get("adminAccess") else consumed_percent(r.get("consumedCapacity")),
            admin_access=bool(r.get("adminAccess")),
            mps_binding=ADMITTED_CONDITION in (r.get("bindingConditions") or []),
        )
        for r in ((allocation or {}).get("devices") or {}).get("results") or []
        if r.get("driver") == driver
    )
    classes = (device_class,) if isinstance(device_class, str) else device_class
    ours_requested = False
    requests: list[tuple[GpuRequest, ...]] = []
    for req in spec_devices.get("requests") or []:
        alternatives = (
            [(req["exactly"], req["name"])]
            if req.get("exactly")
            else [(sub, f"{req['name']}/{sub['name']}") for sub in req.get("firstAvailable") or []]
        )
        ours = [(exact, name) for exact, name in alternatives if exact.get("deviceClassName") in classes]
        ours_requested = ours_requested or bool(ours)
        if ours and len(ours) == len(alternatives):  # only if every alternative needs one of our GPUs
            found = [m for exact, name in ours if (m := _gpu_request(exact, name, driver)) is not None]
            if len(found) == len(ours):
                requests.append(tuple(found))
    if not shares and not ours_requested:
        return None
    status_data = {
        (str(d["pool"]), str(d["device"]), str(d.get("shareID") or "")): d.get("data")
        for d in status.get("devices") or []
        if d.get("driver") == driver
    }
    status_enforcement = {
        (str(d["pool"]), str(d["device"]), str(d.get("shareID") or "")): tier
        for d in status.get("devices") or []
        if d.get("driver") == driver
        for c in d.get("conditions") or []
        if isinstance(c, Mapping)
        and c.get("type") == ENFORCEMENT_CONDITION
        and (tier := tier_of_reason(c.get("reason"))) is not None
    }
    status_gone = {
        (str(d["pool"]), str(d["device"]), str(d.get("shareID") or "")): dict(c)
        for d in status.get("devices") or []
        if d.get("driver") == driver
        for c in d.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") == DEVICE_GONE_CONDITION
    }
    status_mig = {
        (str(d["pool"]), str(d["device"]), str(d.get("shareID") or "")): str(c["message"])
        for d in status.get("devices") or []
        if d.get("driver") == driver
        for c in d.get("conditions") or []
        if isinstance(c, Mapping)
        and c.get("type") == mig.PARTITION_CONDITION
        and c.get("status") == "True"
        and mig.is_mig_uuid(c.get("message"))
    }
    status_mps = {
        (str(d["pool"]), str(d["device"]), str(d.get("shareID") or "")): dict(c)
        for d in status.get("devices") or []
        if d.get("driver") == driver
        for c in d.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") in (ADMITTED_CONDITION, CONFLICT_CONDITION)
    }
    owner = _owner_pod(meta)
    return ClaimView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        allocated=allocation is not None,
        node=_allocated_node(allocation) if allocation else None,
        extended_resource=(meta.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true",
        pod=owner.name if owner else None,
        pod_uid=owner.uid if owner else "",
        pod_claim_name=str((meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) or "") if owner else "",
        reserved=_reserved_pods(status),
        shares=shares,
        requests=tuple(requests),
        constraints=_constraints(spec_devices.get("constraints")),
        status_data=status_data,
        status_enforcement=status_enforcement,
        status_gone=status_gone,
        status_mig=status_mig,
        status_mps=status_mps,
        allocated_at=str((allocation or {}).get("allocationTimestamp") or ""),
        skipped=tuple(f"{short_path(path)}: {marker.strip('<>')}" for path, marker in skipped_parts(body)),
    )
