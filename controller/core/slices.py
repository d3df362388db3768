"""Compact, immutable views of our ResourceSlices' devices and of DeviceTaintRules: what the controller keeps in
its slice and taint-rule indexes.

Parsing happens once per watch event (`slice_view`, `taint_rule_view`; each raises only `MalformedObjectError`, for
a body not shaped like its kind); everything downstream (status, ledger, events) works on these views, and
`current_devices` picks the devices of each pool's newest generation.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from api import mig
from api.names import COMPUTE_CAPACITY, DRIVER_NAME, MEMORY_CAPACITY
from controller.core.parsing import quantity_bytes, shape_errors

DeviceKey = tuple[str, str]
"""(pool, device)."""
MPS_DOMAIN_ANNOTATION = f"{DRIVER_NAME}/mps-trust-domain"
"""The annotation of the DeviceTaintRule of an MPS GPU that records the trust domain the GPU serves (the id of an
`api.mps_trust.TrustDomain`); the controller is the rule's one writer (`controller/mps`)."""


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
    resource.k8s.io/v1, exact driver, pool and device names; an unset field matches any), its one taint, and what
    says whether it is the rule of an MPS GPU and which trust domain that rule records."""

    model_config = ConfigDict(frozen=True)

    name: str
    uid: str = ""
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    has_selector: bool = True
    """False only for a rule read back by name that has no `deviceSelector` (it selects no device)."""
    taint: DeviceTaint
    labels: dict[str, str] = {}
    mps_domain: str | None = None
    """Its annotation `MPS_DOMAIN_ANNOTATION` (None: absent), as written: whether it is a domain id is the MPS
    plan's question."""

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
    """A partition's memory as the driver reports it (MiB; its `memory` capacity is exactly this)."""
    mig_state: str | None = None
    """A MIG GPU's MIG state (attribute `migState`)."""
    taints: tuple[DeviceTaint, ...] = ()
    """Its `taints` in the slice (source `ResourceSlice/<slice>`); DeviceTaintRules' are not here."""
    default_request: int = 0
    """What an allocation that names no memory amount consumes of it: its requestPolicy's `default`, or, without a
    policy, all of its memory (0: a policy without a default, not known here)."""
    compute_total: int | None = None
    """Its `compute` capacity in percent (100 on a shared GPU, a MIG partition's share; None: not published, an
    older plugin or a MIG GPU itself)."""
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


@shape_errors("ResourceSlice")
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
        compute = ((dev.get("capacity") or {}).get(COMPUTE_CAPACITY) or {}).get("value")
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
                compute_total=quantity_bytes(compute) if compute is not None else None,
                node_local=bool(spec.get("nodeName")),
            )
        )
    return SliceView(name=slice_name, pool=pool_name, generation=generation, devices=tuple(devices))


def _taint(taint: Mapping[str, Any], source: str) -> DeviceTaint:
    return DeviceTaint(
        key=str(taint["key"]), value=str(taint.get("value") or ""), effect=str(taint.get("effect") or ""), source=source
    )


@shape_errors("DeviceTaintRule")
def taint_rule_view(body: Mapping[str, Any], driver: str, *, any_selector: bool = False) -> TaintRuleView | None:
    """The view of a DeviceTaintRule that can select devices of `driver`; None for a rule that selects none of
    them (no `deviceSelector`, or another driver's), unless `any_selector` (a rule read back by name, whatever it
    selects now). Raises only MalformedObjectError."""
    spec = body.get("spec") or {}
    selector = spec.get("deviceSelector")
    if not any_selector and (selector is None or (selector.get("driver") is not None and selector["driver"] != driver)):
        return None
    meta = body["metadata"]
    name = str(meta["name"])
    optional = {
        k: str(selector[k]) if selector is not None and selector.get(k) is not None else None
        for k in ("driver", "pool", "device")
    }
    annotation = (meta.get("annotations") or {}).get(MPS_DOMAIN_ANNOTATION)
    return TaintRuleView(
        name=name,
        uid=str(meta.get("uid") or ""),
        **optional,
        has_selector=selector is not None,
        taint=_taint(spec["taint"], f"DeviceTaintRule/{name}"),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        mps_domain=str(annotation) if annotation is not None else None,
    )


def current_devices(slices: Iterable[SliceView]) -> dict[DeviceKey, DeviceRecord]:
    """Devices of the newest generation of each pool (older generations are being replaced)."""
    slices = list(slices)
    newest: dict[str, int] = {}
    for s in slices:
        newest[s.pool] = max(newest.get(s.pool, s.generation), s.generation)
    return {d.key: d for s in slices if s.generation == newest[s.pool] for d in s.devices}
