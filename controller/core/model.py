"""Compact, immutable views of ResourceSlices and ResourceClaims: what the controller keeps in its indexes.

Parsing happens once per watch event; everything downstream (status, ledger, events) works on these.
"""

import functools
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel, ConfigDict

from api import mig
from api.bounded_json import short_path, skipped_parts
from api.gpu import DEVICE_GONE_CONDITION, ENFORCEMENT_CONDITION, tier_of_reason
from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION
from api.names import MEMORY_CAPACITY
from api.quantity import parse_quantity

P = ParamSpec("P")
R = TypeVar("R")

DeviceKey = tuple[str, str]
"""(pool, device)."""


class DeviceTaint(BaseModel):
    """A taint on a device: in its ResourceSlice (`devices[].taints`) or from a DeviceTaintRule."""

    model_config = ConfigDict(frozen=True)

    key: str
    value: str = ""
    effect: str
    source: str
    """`ResourceSlice/<name>` or `DeviceTaintRule/<name>`."""


class TaintRuleView(BaseModel):
    """A DeviceTaintRule that may match devices of our driver: its selector (`deviceSelector` of
    resource.k8s.io/v1, exact driver, pool and device names; an unset field matches any) and its one taint."""

    model_config = ConfigDict(frozen=True)

    name: str
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    taint: DeviceTaint

    def matches(self, driver: str, pool: str, device: str) -> bool:
        """Whether the rule's selector selects the device `device` of `pool` of `driver`."""
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == device)
        )


class DeviceRecord(BaseModel):
    """One published device of our driver, as its ResourceSlice describes it."""

    model_config = ConfigDict(frozen=True)

    pool: str
    device: str
    node: str
    generation: int
    node_uid: str | None = None
    """The uid of the Node owning its ResourceSlice (None: no Node owner reference)."""
    index: int | None = None
    uuid: str | None = None
    product_name: str | None = None
    memory_total: int
    max_request: int
    """The largest memory request the device's request policy admits (≤ memory_total)."""
    request_range: tuple[int, int] | None = None
    """`(min, step)` of its memory capacity's `requestPolicy.validRange` (None: no range; requests are granted as
    they are)."""
    attributes: dict[str, dict[str, bool | int | str]] = {}
    """Its attributes as DRA CEL sees them: domain -> name -> value (unqualified names are in the driver's
    domain); `version` attributes are left out (selectors.py does not evaluate them)."""
    hami_core: bool = False
    """The node plugin offers HAMi-core enforcement on this device (attribute `hamiCore`)."""
    memory_enforcement: str | None = None
    """The strongest memory-enforcement tier the device offers (attribute `memoryEnforcement`; None: not
    published, an older plugin)."""
    kind: str = mig.TYPE_GPU
    """Attribute `type` (api/mig.py): `gpu` (also when absent: an older plugin), `mig` (a MIG partition) or
    `mig-parent` (a MIG GPU itself, never allocatable)."""
    allow_multiple: bool = True
    """`allowMultipleAllocations`: shares of a GPU; a MIG partition is allocated whole."""
    profile: str | None = None
    placement_start: int | None = None
    memory_slices: int | None = None
    """A partition's placement size; a MIG GPU's total."""
    compute_slices: int | None = None
    """A partition's compute slices; a MIG GPU's total."""
    partition_memory_mib: int | None = None
    """A partition's memory as the driver reports it (its `memory` capacity is this rounded up to a GiB)."""
    mig_state: str | None = None
    """A MIG GPU's MIG state (attribute `migState`)."""
    taints: tuple[DeviceTaint, ...] = ()
    """Its `taints` in the slice (source `ResourceSlice/<slice>`); DeviceTaintRules' are not here."""
    default_request: int = 0
    """What an allocation that names no memory amount consumes of it: its requestPolicy's `default`, or, without a
    policy, all of its memory (0: a policy without a default, not known here)."""
    node_local: bool = True
    """Its ResourceSlice names one node (`spec.nodeName`): a claim's devices of such slices all come from one node."""

    @property
    def key(self) -> DeviceKey:
        return (self.pool, self.device)

    @property
    def ledger_device(self) -> str:
        """The device whose GPU object accounts for this one: a partition's GPU (``gpu-<index>``), else itself."""
        return f"gpu-{self.index}" if self.kind == mig.TYPE_MIG and self.index is not None else self.device

    @property
    def placement(self) -> str | None:
        """A partition's placement as nvidia-smi writes it, ``start:size``."""
        if self.placement_start is None or self.memory_slices is None:
            return None
        return f"{self.placement_start}:{self.memory_slices}"


class SliceView(BaseModel):
    """The part of one of our ResourceSlices the controller needs."""

    model_config = ConfigDict(frozen=True)

    name: str
    pool: str
    generation: int
    devices: tuple[DeviceRecord, ...]


class Share(BaseModel):
    """One allocation result of our driver in a claim."""

    model_config = ConfigDict(frozen=True)

    request: str
    pool: str
    device: str
    share_id: str | None = None
    memory: int | None = None
    """consumedCapacity.memory in bytes; None when the result does not say (then the whole device)."""
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


class MalformedObjectError(ValueError):
    """A body that does not have the shape of its kind (the API server never serves one): nothing is read."""


def _shape_errors(kind: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Turn any error of a view function on an odd body into `MalformedObjectError` (its only error)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def view(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except (AttributeError, KeyError, TypeError, IndexError, ValueError) as err:
                raise MalformedObjectError(f"not a readable {kind}: {type(err).__name__}: {str(err)[:300]}") from err

        return view

    return wrap


def quantity_bytes(value: object) -> int | None:
    """A Kubernetes quantity as whole bytes (rounded up), or None when it is not a quantity."""
    try:
        parsed: Decimal = parse_quantity(value)
    except (ValueError, TypeError, InvalidOperation):
        return None
    return int(parsed.to_integral_value(rounding="ROUND_CEILING"))


def _attribute(attributes: Mapping[str, Any], name: str, driver: str, kind: str) -> Any:
    for key in (name, f"{driver}/{name}"):
        value = (attributes.get(key) or {}).get(kind)
        if value is not None:
            return value
    return None


def _cel_attributes(attributes: Mapping[str, Any], driver: str) -> dict[str, dict[str, bool | int | str]]:
    out: dict[str, dict[str, bool | int | str]] = {}
    for name, value in attributes.items():
        domain, _, ident = str(name).rpartition("/")
        typed = next((value[k] for k in ("bool", "int", "string") if (value or {}).get(k) is not None), None)
        if isinstance(typed, bool | int | str):
            out.setdefault(domain or driver, {})[ident] = typed
    return out


@_shape_errors("ResourceSlice")
def slice_view(body: Mapping[str, Any], driver: str) -> SliceView | None:
    """The view of a ResourceSlice of `driver`; None for other drivers' slices. Raises only MalformedObjectError."""
    spec = body.get("spec") or {}
    if spec.get("driver") != driver:
        return None
    pool = spec.get("pool") or {}
    pool_name = str(pool.get("name", ""))
    generation = int(pool.get("generation", 0))
    node = str(spec.get("nodeName") or pool_name)
    owners = (body.get("metadata") or {}).get("ownerReferences") or []
    node_uid = next((str(o["uid"]) for o in owners if o.get("kind") == "Node" and o.get("name") == node), None)
    slice_name = str(body["metadata"]["name"])
    devices = []
    for dev in spec.get("devices") or []:
        attributes = dev.get("attributes") or {}
        memory = (dev.get("capacity") or {}).get(MEMORY_CAPACITY) or {}
        total = quantity_bytes(memory.get("value"))
        if total is None:
            continue  # not a GPU shareable by memory: nothing to account
        policy = memory.get("requestPolicy")
        valid_range = (policy or {}).get("validRange") or {}
        max_request = quantity_bytes(valid_range.get("max")) if valid_range.get("max") is not None else None
        range_min, range_step = quantity_bytes(valid_range.get("min")), quantity_bytes(valid_range.get("step"))
        index = _attribute(attributes, "index", driver, "int")
        kind = str(_attribute(attributes, mig.TYPE_ATTRIBUTE, driver, "string") or mig.TYPE_GPU)
        if kind == mig.TYPE_MIG_PARENT:
            max_request = 0  # never allocatable: its partitions are
        devices.append(
            DeviceRecord(
                pool=pool_name,
                device=str(dev["name"]),
                node=node,
                generation=generation,
                node_uid=node_uid,
                index=int(index) if index is not None else None,
                uuid=_attribute(attributes, "uuid", driver, "string"),
                product_name=_attribute(attributes, "productName", driver, "string"),
                memory_total=total,
                max_request=min(total, max_request) if max_request is not None else total,
                request_range=(range_min, range_step) if range_min is not None and range_step else None,
                attributes=_cel_attributes(attributes, driver),
                hami_core=_attribute(attributes, "hamiCore", driver, "bool") is True,
                memory_enforcement=_attribute(attributes, "memoryEnforcement", driver, "string"),
                kind=kind,
                allow_multiple=bool(dev.get("allowMultipleAllocations")),
                profile=_attribute(attributes, mig.PROFILE_ATTRIBUTE, driver, "string"),
                placement_start=_attribute(attributes, mig.PLACEMENT_ATTRIBUTE, driver, "int"),
                memory_slices=_attribute(attributes, mig.MEMORY_SLICES_ATTRIBUTE, driver, "int"),
                compute_slices=_attribute(attributes, mig.COMPUTE_SLICES_ATTRIBUTE, driver, "int"),
                partition_memory_mib=_attribute(attributes, mig.PARTITION_MEMORY_ATTRIBUTE, driver, "int"),
                mig_state=_attribute(attributes, mig.STATE_ATTRIBUTE, driver, "string"),
                taints=tuple(_taint(t, f"ResourceSlice/{slice_name}") for t in dev.get("taints") or []),
                default_request=total if policy is None else quantity_bytes(policy.get("default")) or 0,
                node_local=bool(spec.get("nodeName")),
            )
        )
    return SliceView(name=slice_name, pool=pool_name, generation=generation, devices=tuple(devices))


def _taint(taint: Mapping[str, Any], source: str) -> DeviceTaint:
    return DeviceTaint(
        key=str(taint["key"]), value=str(taint.get("value") or ""), effect=str(taint.get("effect") or ""), source=source
    )


@_shape_errors("DeviceTaintRule")
def taint_rule_view(body: Mapping[str, Any], driver: str) -> TaintRuleView | None:
    """The view of a DeviceTaintRule that can select devices of `driver`; None for a rule that selects none of
    them (no `deviceSelector`, or another driver's). Raises only MalformedObjectError."""
    spec = body.get("spec") or {}
    selector = spec.get("deviceSelector")
    if selector is None or (selector.get("driver") is not None and selector["driver"] != driver):
        return None
    name = str(body["metadata"]["name"])
    optional = {k: str(selector[k]) if selector.get(k) is not None else None for k in ("driver", "pool", "device")}
    return TaintRuleView(name=name, **optional, taint=_taint(spec["taint"], f"DeviceTaintRule/{name}"))


def current_devices(slices: Iterable[SliceView]) -> dict[DeviceKey, DeviceRecord]:
    """Devices of the newest generation of each pool (older generations are being replaced)."""
    slices = list(slices)
    newest: dict[str, int] = {}
    for s in slices:
        newest[s.pool] = max(newest.get(s.pool, s.generation), s.generation)
    return {d.key: d for s in slices if s.generation == newest[s.pool] for d in s.devices}


def _allocated_node(allocation: Mapping[str, Any]) -> str | None:
    terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")) or []
    if len(terms) != 1:
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) == 1 and fields[0].get("key") == "metadata.name" and len(fields[0].get("values") or []) == 1:
        return str(fields[0]["values"][0])
    return None


def _memory(capacities: Mapping[str, Any], driver: str) -> Any:
    """The `memory` capacity of a capacity map: plain or qualified by our driver's domain (the same capacity)."""
    value = capacities.get(MEMORY_CAPACITY)
    return value if value is not None else capacities.get(f"{driver}/{MEMORY_CAPACITY}")


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
    """The alternative `exact` (None: a memory amount that is not a quantity)."""
    requested = _memory((exact.get("capacity") or {}).get("requests") or {}, driver)
    memory = quantity_bytes(requested) if requested is not None else None
    if requested is not None and memory is None:
        return None
    return GpuRequest(
        request=name,
        memory=memory,
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


def _owner_pod(meta: Mapping[str, Any]) -> str | None:
    """The name of the pod a `metadata` names as its controlling owner, if any."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return str(ref["name"])
    return None


@_shape_errors("ResourceClaim")
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
    return ClaimView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        allocated=allocation is not None,
        node=_allocated_node(allocation) if allocation else None,
        pod=_owner_pod(meta),
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
