"""Admission review of ResourceClaims and ResourceClaimTemplates that concern our driver (pure functions).

A claim spec concerns us when a request (or a `firstAvailable` alternative) names our DeviceClass, or an opaque
config names our driver. Refused: GpuConfig parameters that do not decode strictly, configs that decode one by one
but merge into an invalid one for some request (merged as the node plugin merges them, api/config_merge.py, with
our DeviceClass's configs first), capacity requests other than `memory`, and memory amounts that are not positive
whole numbers of bytes (an `adminAccess` request may ask for 0). Each problem names its field path, as `kubectl`
users write it, and what is allowed. Warned: requests larger than any published GPU, `enforcement: hami-core`,
`mps` or `nvml` while no published GPU offers it, and an `mps` request for more than one GPU (the node plugin
refuses a claim whose MPS shares span GPUs: a CUDA process is the client of one MPS daemon). Warned too, since
nothing else would say it: settings dropped or changed on the way, namely an opaque config of another driver that
applies only to requests of our DeviceClasses (the kubelet hands it to no driver that reads it), a memory request
the published GPUs' `requestPolicy` rounds up (naming the grant), and `computeLimitPercent` that no published GPU
can apply (only the mps and hami-core tiers do). For users of other drivers: a request without
`capacity.requests.memory` of a class shared by memory in a ResourceClaim that pods name directly (it takes a
whole GPU that all of them share; templates, adminAccess requests, the MIG class and kube-scheduler's claim for an
extended resource are not warned), and a CEL selector of a request of any of our classes that reads an attribute
or capacity no fracgpu device publishes (`api/published.py`), another domain's, or compares `device.driver` with
another driver (`controller/admission/cel_refs.py` finds them), naming the published name it likely means. An
`adminAccess` request that does not ask for `memory: 0` is warned that the scheduler places it only where that
much memory is free (all of it when it names no capacity, as Kubernetes' docs write one), though the allocation is
never counted once made.
"""

import difflib
import functools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, ConfigDict

from api import published
from api.config_merge import ConfigEntry, EntryError, MergeError, config_for
from api.gpu_config import GpuConfig, GpuConfigError, decode_gpu_config
from api.names import CONFIG_API_VERSION, CONFIG_KIND, MEMORY_CAPACITY, MPS_DEVICE_CLASS_NAME
from api.quantity import MiB, format_bytes, granted_in_range, parse_quantity
from controller.admission.cel_refs import Kind, Reference, references

log = logging.getLogger(__name__)


class Review(BaseModel):
    """Outcome of reviewing one claim spec: refusal reasons and admission warnings."""

    model_config = ConfigDict(frozen=True)

    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.problems

    @property
    def message(self) -> str:
        """All problems in one line, as the user sees it after `denied the request:`."""
        return "; ".join(self.problems)


def _check_memory(value: object, path: str, *, admin: bool = False) -> tuple[int | None, str | None]:
    """(bytes, None) for a positive whole number of bytes (or 0 on an `admin` request), else (None, problem)."""
    allowed = "must be a positive quantity of bytes such as 10Gi or 512Mi"
    if admin:
        allowed = "must be 0 (the adminAccess way: placed on any GPU) or a positive quantity of bytes such as 10Gi"
    try:
        parsed: Decimal = parse_quantity(value)
    except (ValueError, TypeError, InvalidOperation):
        return None, f"{path}: {allowed}, got {value!r}"
    if parsed < 0 or (parsed == 0 and not admin):
        return None, f"{path}: {allowed}, got {value!r}"
    if parsed != parsed.to_integral_value():
        return None, f"{path}: {allowed} (whole bytes; fractions such as {value!r} are not allowed)"
    return int(parsed), None


def _in_mib(value: int) -> str:
    """`value` bytes in Mi when whole (`3072Mi`, the unit of the node plugin's memory step), else as it is."""
    return f"{value // MiB}Mi" if value % MiB == 0 else format_bytes(value)


def _rounding_warning(
    field: str, request: str, value: object, memory: int, ranges: Sequence[tuple[int, int]]
) -> list[str]:
    """A warning when the published GPUs' `requestPolicy.validRange` rounds `memory` up, naming each grant."""
    rounded = sorted({(granted_in_range(memory, low, step), low, step) for low, step in ranges})
    rounded = [(grant, low, step) for grant, low, step in rounded if grant != memory]
    if not rounded:
        return []
    grants = ", and ".join(
        f"a {_in_mib(grant)} grant where the GPU's memory requestPolicy.validRange has min "
        f"{format_bytes(low)}, step {format_bytes(step)}"
        for grant, low, step in rounded
    )
    asked = _in_mib(rounded[0][0])
    return [
        f"{field}: request {request!r} asks for {value} of GPU memory ({memory} bytes), which the GPUs' request "
        f"policy does not grant as asked: the scheduler rounds it up to {grants}; the share's limit, environment "
        f"and info files are the grant, so ask for {asked} to write what it gets"
    ]


_ADMIN_WITHOUT_MEMORY = (
    "{path}: request {request!r} has adminAccess and no capacity: to place it, the scheduler charges it the GPU's "
    "default memory request (all of the GPU's memory), though it never counts an admin-access allocation once made, "
    "so it stays Pending while any share is on the GPU; write capacity: {{requests: {{memory: 0}}}} to reach any GPU, "
    "busy or not"
)
"""Kubernetes' allocator (v1.37) checks an adminAccess request's capacity like any other's when it places it on a
device that allows multiple allocations (the requestPolicy default when it names none), and only leaves it out of
the device's consumed capacity afterwards."""


def _review_request(
    exact: Mapping[str, Any],
    path: str,
    request: str,
    driver: str,
    largest: int | None,
    *,
    ranges: Sequence[tuple[int, int]] = (),
) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    warnings: list[str] = []
    requests = (exact.get("capacity") or {}).get("requests") or {}
    admin = exact.get("adminAccess") is True
    if admin and not any(n in (MEMORY_CAPACITY, f"{driver}/{MEMORY_CAPACITY}") for n in requests):
        warnings.append(_ADMIN_WITHOUT_MEMORY.format(path=path, request=request))
    for name, value in requests.items():
        field = f"{path}.capacity.requests.{name}"
        if name not in (MEMORY_CAPACITY, f"{driver}/{MEMORY_CAPACITY}"):
            problems.append(f"{field}: unknown capacity; {driver} devices offer only {MEMORY_CAPACITY!r}")
            continue
        memory, problem = _check_memory(value, field, admin=admin)
        if problem is not None:
            problems.append(problem)
        elif admin and memory:
            warnings.append(
                f"{field}: request {request!r} has adminAccess, which reserves no memory, but the scheduler places it "
                f"only on a GPU with {value} free; write memory: 0 to reach any GPU, busy or not"
            )
        elif memory is not None and largest is not None and memory > largest:
            warnings.append(
                f"{field}: request {request!r} asks for {value} of GPU memory, more than any GPU in the cluster "
                f"offers (largest GPU has {format_bytes(largest)}); the claim stays pending until a larger GPU "
                "is published"
            )
        elif memory is not None and not admin:
            warnings += _rounding_warning(field, request, value, memory, ranges)
    return problems, warnings


def _config_problems(problems: tuple[str, ...], path: str) -> list[str]:
    """Prefix GpuConfig decode problems (`field: ...` or `parameters ...`) with the config's path."""
    return [f"{path}.{p}" if p.startswith("parameters") else f"{path}.parameters.{p}" for p in problems]


def _merged_problems(
    entries: list[ConfigEntry],
    path: str,
    request: str,
    exact: Mapping[str, Any],
    offered: Mapping[str, bool | None],
) -> tuple[list[str], list[str]]:
    """Problems and warnings of the merged GpuConfig of one request (entries that do not decode alone are
    reported where they are, not here)."""
    try:
        merged = config_for(entries, request)
    except MergeError as err:
        names = ", ".join(e.where for e in err.entries)
        problems = "; ".join(err.problems)
        return [
            f"{path}: request {request!r} gets the GpuConfigs {names} merged, and the result is invalid: {problems}"
        ], []
    except EntryError as err:
        if not err.entry.from_class:
            return [], []
        return [], [f"{err.entry.where} is invalid ({err}): claims of it fail to prepare until it is fixed"]
    compute = _compute_warnings(merged, path, request, offered)
    if merged.enforcement == "mps":
        warnings = []
        if offered.get("mps") is False:
            warnings.append(
                f"{path}: request {request!r} asks for enforcement 'mps', but no published GPU is an MPS GPU "
                "(attribute mps; chart value mps.gpus): the claim's pod fails to start on any node until one is"
            )
        count = exact.get("count", 1)
        if exact.get("allocationMode") == "All" or (isinstance(count, int) and count > 1):
            warnings.append(
                f"{path}: request {request!r} asks for enforcement 'mps' on more than one GPU, but a CUDA process "
                "is the client of one MPS daemon, which serves one GPU: the node plugin refuses such a claim; ask "
                "for one GPU per claim"
            )
        return [], warnings
    if merged.enforcement == "hami-core" and offered.get("hami-core") is False:
        return [], [
            f"{path}: request {request!r} asks for enforcement 'hami-core', but no published GPU offers it (no node "
            "plugin found the HAMi-core library): the claim's pod fails to start on any node until one does"
        ]
    if merged.enforcement == "nvml" and offered.get("nvml") is False:
        compute.insert(
            0,
            f"{path}: request {request!r} asks for enforcement 'nvml', but no published GPU offers it (attribute "
            "memoryEnforcement; nvml needs cgroup v2, a driver with nvmlDeviceSetMemoryLimits_v1 and driverEdits: "
            "toolkit): the claim's pod fails to start on any node until one does",
        )
    return [], compute


def _compute_warnings(merged: GpuConfig, path: str, request: str, offered: Mapping[str, bool | None]) -> list[str]:
    """A warning when `merged` sets computeLimitPercent that no published GPU can apply to the request: only the
    mps tier (an MPS GPU's active thread percentage) and the hami-core tier (CUDA_DEVICE_SM_LIMIT) apply it.
    None for `enforcement` mps or hami-core (their own warnings say when no GPU offers them)."""
    percent = merged.compute_limit_percent
    if percent is None or merged.enforcement in ("mps", "hami-core"):
        return []
    if merged.enforcement == "nvml":
        why = "enforcement 'nvml' does not apply it"
    elif offered.get("mps") is False and offered.get("hami-core") is False:
        why = "no published GPU can enforce it (none is an MPS GPU or offers hami-core)"
    else:
        return []
    return [
        f"{path}: request {request!r} sets computeLimitPercent {percent}, but {why}: the share gets the GPU's "
        "compute unlimited; only the mps tier applies it, as the MPS active thread percentage (MPS GPUs, attribute "
        f"mps: ask the DeviceClass {MPS_DEVICE_CLASS_NAME}), and the hami-core tier, as CUDA_DEVICE_SM_LIMIT"
    ]


_STANDARD = "standard"
_ALIASES: dict[str, tuple[Kind, str, str]] = {
    **dict.fromkeys(
        ("model", "name", "product", "gpumodel", "gputype", "cardtype", "card", "brand", "devicename"),
        ("attribute", "", "productName"),
    ),
    **dict.fromkeys(("gpuuuid", "gpuuid", "deviceuuid", "parentuuid", "id"), ("attribute", "", "uuid")),
    **dict.fromkeys(("gpuindex", "deviceindex", "idx"), ("attribute", "", "index")),
    **dict.fromkeys(("arch", "gpuarchitecture"), ("attribute", "", "architecture")),
    **dict.fromkeys(
        ("computecapability", "cudacapability", "cc", "capability"), ("attribute", "", "cudaComputeCapability")
    ),
    **dict.fromkeys(("cudadriverversion", "driver", "nvidiadriverversion"), ("attribute", "", "driverVersion")),
    **dict.fromkeys(("migprofile", "gpuinstanceprofile"), ("attribute", "", "profile")),
    **dict.fromkeys(("migmode", "migenabled", "migstatus"), ("attribute", "", "migState")),
    **dict.fromkeys(("mpsenabled", "sharing", "sharingstrategy"), ("attribute", "", "mps")),
    **dict.fromkeys(("pcibusid", "pciebusid", "busid", "pciaddress"), ("attribute", _STANDARD, "pciBusID")),
    **dict.fromkeys(("pcieroot", "pciroot"), ("attribute", _STANDARD, "pcieRoot")),
    **dict.fromkeys(("numa", "numanode", "numaid", "numanodeid"), ("attribute", _STANDARD, "numaNode")),
    **dict.fromkeys(
        (
            "memory",
            "gpumem",
            "gpumemory",
            "memorysize",
            "memorytotal",
            "totalmemory",
            "mem",
            "vram",
            "framebuffer",
            "fbmemory",
        ),
        ("capacity", "", "memory"),
    ),
}
"""Names other drivers and device plugins publish (lowercased) -> fracgpu's: (kind, domain, name), domain ""
for the driver's and "standard" for resource.kubernetes.io."""


def _published(kind: str, driver: str) -> dict[str, frozenset[str]]:
    return published.attributes(driver) if kind == "attribute" else published.capacities(driver)


def _suggestion(ref: Reference, driver: str) -> Reference | None:
    """The published name `ref` most likely means: the same name in a domain or kind that has it, a well-known
    other project's name for it, or a close spelling."""
    name = ref.name.rsplit("/", 1)[-1]  # a qualified name written as a key: "resource.kubernetes.io/pciBusID"
    other: Kind = "capacity" if ref.kind == "attribute" else "attribute"
    spelled: dict[str, Reference] = {}
    for kind in (ref.kind, other):
        for domain, names in _published(kind, driver).items():
            if name in names and (kind, domain, name) != (ref.kind, ref.domain, ref.name):
                return Reference(kind, domain, name)
            spelled |= {n.lower(): Reference(kind, domain, n) for n in names}
    alias = _ALIASES.get(name.lower())
    if alias is not None:
        kind, domain, target = alias
        return Reference(kind, published.STANDARD_DOMAIN if domain == _STANDARD else driver, target)
    close = difflib.get_close_matches(name.lower(), list(spelled), n=1, cutoff=0.75)
    return spelled[close[0]] if close else None


def _unpublished(ref: Reference, driver: str) -> str | None:
    """Why no fracgpu device has what `ref` reads, or None when some does."""
    if ref.kind == "driver":
        return None if ref.name == driver else f"every device of a {driver} DeviceClass is a {driver} device"
    names = _published(ref.kind, driver)
    if ref.domain not in names:
        where = " and ".join(names)
        return f"{driver} devices publish {ref.kind} names only in the domain(s) {where}"
    if ref.name in names[ref.domain]:
        return None
    return f"no {driver} device publishes {ref.kind} {ref.name!r} in {ref.domain}"


def _selector_warnings(exact: Mapping[str, Any], path: str, request: str, driver: str) -> list[str]:
    """A warning for each name a request's CEL selectors read that no fracgpu device publishes (an unknown
    attribute or capacity, a domain other than the driver's and resource.kubernetes.io, another driver compared
    with device.driver): on every fracgpu device the selector then fails ("no such key") or is false, so the
    request never matches; each names the published name it likely means."""
    warnings: list[str] = []
    for k, selector in enumerate(exact.get("selectors") or []):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            continue
        for ref in references(expression):
            why = _unpublished(ref, driver)
            if why is None:
                continue
            if ref.kind == "driver":
                outcome = f'so the comparison is false on every device; write device.driver == "{driver}" or drop it'
            elif ref.test:
                outcome = "so it is absent on every device (a test of it is false, an optional read has no value)"
            else:
                outcome = 'so reading it is an error on every device (CEL: "no such key"): no device matches by it'
            hint = _suggestion(ref, driver) if ref.kind != "driver" else None
            if hint is not None:
                meant = f"; did you mean {hint.cel}?"
            elif ref.kind != "driver" and ref.domain in (names := _published(ref.kind, driver)):
                meant = f"; {ref.domain} has the {ref.kind} names {', '.join(sorted(names[ref.domain]))}"
            else:
                meant = ""
            warnings.append(
                f"{path}.selectors[{k}].cel.expression: request {request!r} reads {ref.cel}, but {why}, {outcome}"
                f"{meant}"
            )
    return warnings


def _whole_gpu_warning(exact: Mapping[str, Any], path: str, request: str) -> list[str]:
    """A warning for a request of a ResourceClaim (not a template) without capacity.requests.memory: it takes a
    whole GPU, and every pod that references the claim shares that one GPU."""
    if (exact.get("capacity") or {}).get("requests") or exact.get("adminAccess"):
        return []
    count = exact.get("count", 1)
    if exact.get("allocationMode") == "All":
        what = "every matching GPU of its node, each whole"
    elif isinstance(count, int) and count > 1:
        what = f"{count} whole GPUs"
    else:
        what = "a whole GPU"
    return [
        f"{path}: request {request!r} asks for no capacity.requests.memory, so it takes {what} (all of its memory: "
        "no share can join it), and every pod that references this ResourceClaim shares what it takes; for a "
        "share per pod, write a ResourceClaimTemplate whose request asks for capacity.requests.memory (e.g. "
        "10Gi) and name it in the pod's resourceClaimTemplateName"
    ]


def _request_owners(requests: Sequence[Mapping[str, Any]], classes: Collection[str]) -> dict[str, bool]:
    """Whether each request name (and `request/alternative` of `firstAvailable`) asks only for `classes`."""
    owners: dict[str, bool] = {}
    for req in requests:
        name = str(req.get("name", ""))
        if req.get("exactly"):
            owners[name] = req["exactly"].get("deviceClassName") in classes
            continue
        subs = req.get("firstAvailable") or []
        for sub in subs:
            owners[f"{name}/{sub.get('name', '')}"] = sub.get("deviceClassName") in classes
        owners[name] = bool(subs) and all(sub.get("deviceClassName") in classes for sub in subs)
    return owners


def _foreign_config_warning(config: Mapping[str, Any], path: str, driver: str, owners: Mapping[str, bool]) -> list[str]:
    """A warning for an opaque config of another driver that applies only to requests of our DeviceClasses."""
    other = (config.get("opaque") or {}).get("driver")
    named = [str(n) for n in config.get("requests") or ()] or list(owners)
    if not other or not named or not all(owners.get(n) for n in named):
        return []
    return [
        f"{path}.opaque: a config for driver {other!r} on request(s) {', '.join(repr(n) for n in named)}, which "
        f"only {driver} prepares: {driver} ignores other drivers' configs, so none of its settings take effect; "
        f"to configure these requests write a GpuConfig (apiVersion {CONFIG_API_VERSION}, kind {CONFIG_KIND}) "
        f"under opaque with driver: {driver} (GPU memory is asked as capacity.requests.memory, compute as "
        "computeLimitPercent)"
    ]


EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""Set to "true" by kube-scheduler on the ResourceClaim it creates for a pod's extended resource
(`DeviceClass.extendedResourceName`): a claim of one pod, whole GPUs by design."""


def is_extended_resource_claim(claim: Mapping[str, Any]) -> bool:
    """Whether `claim` is the one kube-scheduler made for a pod's extended resource (its annotation)."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true")


def _total(review: Callable[..., Review]) -> Callable[..., Review]:
    """Make a review answer a refusal, never an error, for a spec not shaped as the API server serves one."""

    @functools.wraps(review)
    def reviewed(spec: Any, prefix: str, **kwargs: Any) -> Review:
        try:
            return review(spec, prefix, **kwargs)
        except (AttributeError, KeyError, TypeError, IndexError, ValueError) as err:
            log.warning("cannot review claim spec", exc_info=True)
            return Review(problems=(f"{prefix}: not a readable ResourceClaimSpec ({type(err).__name__})",))

    return reviewed


@_total
def review_claim_spec(
    spec: Mapping[str, Any] | None,
    prefix: str,
    *,
    driver: str,
    device_class: str,
    largest: int | None,
    class_configs: Sequence[object] = (),
    hami_core_offered: bool | None = None,
    nvml_offered: bool | None = None,
    mps_offered: bool | None = None,
    request_ranges: Sequence[tuple[int, int]] = (),
    our_classes: Collection[str] = (),
    shared_classes: Collection[str] = (),
    standalone: bool = False,
) -> Review:
    """Review a ResourceClaimSpec found at field path `prefix` (`spec` or `spec.spec` for templates).

    `largest` is the largest memory request any published GPU admits (None when none is published);
    requests above it pass with a warning, since a larger GPU may join later. `class_configs` are the
    `opaque.parameters` of our DeviceClass's configs for `driver` (merged before the claim's);
    `hami_core_offered` / `nvml_offered` / `mps_offered` whether some published GPU offers HAMi-core / nvml / mps
    enforcement (None when none is published); `request_ranges` the `(min, step)` of the published GPUs' memory
    `requestPolicy.validRange`; `our_classes` our driver's further DeviceClasses (an opaque config of another
    driver on requests of only these and `device_class` is ignored by every driver), whose requests' CEL
    selectors are checked for names no fracgpu device publishes; `shared_classes` those of them whose GPUs are
    shared by memory (`device_class` always is; the MIG class is not: a partition is never shared); `standalone`:
    the spec is a ResourceClaim's that pods name directly (not a template's, not the scheduler's claim for an
    extended resource), so a request of a shared class without `capacity.requests.memory` is warned of: it takes
    a whole GPU that every pod of the claim shares. Never raises: a spec that is not shaped like a
    ResourceClaimSpec is refused.
    """
    devices = (spec or {}).get("devices") or {}
    problems: list[str] = []
    warnings: list[str] = []
    decode_problems: list[str] = []  # reported after the requests' problems
    entries = [
        ConfigEntry(parameters=p, from_class=True, where=f"GpuConfig {k + 1} of DeviceClass {device_class}")
        for k, p in enumerate(class_configs)
    ]
    owners = _request_owners(devices.get("requests") or [], {device_class, *our_classes})
    for k, config in enumerate(devices.get("config") or []):
        opaque = config.get("opaque") or {}
        path = f"{prefix}.devices.config[{k}]"
        if opaque.get("driver") != driver:
            warnings += _foreign_config_warning(config, path, driver, owners)
            continue
        entries.append(
            ConfigEntry(parameters=opaque.get("parameters"), requests=tuple(config.get("requests") or ()), where=path)
        )
        try:
            decode_gpu_config(opaque.get("parameters"))  # type: ignore[arg-type]  # any JSON: it reports
        except GpuConfigError as err:
            decode_problems += _config_problems(err.problems, f"{path}.opaque")
    for i, req in enumerate(devices.get("requests") or []):
        base = f"{prefix}.devices.requests[{i}]"
        name = str(req.get("name", ""))
        alternatives = [(req["exactly"], f"{base}.exactly", name)] if req.get("exactly") else []
        alternatives += [
            (sub, f"{base}.firstAvailable[{j}]", f"{name}/{sub.get('name', '')}")
            for j, sub in enumerate(req.get("firstAvailable") or [])
        ]
        for exact, path, request in alternatives:
            if exact.get("deviceClassName") in {device_class, *our_classes}:
                warnings += _selector_warnings(exact, path, request, driver)
            if standalone and exact.get("deviceClassName") in {device_class, *shared_classes}:
                warnings += _whole_gpu_warning(exact, path, request)
            if exact.get("deviceClassName") == device_class:
                p, w = _review_request(exact, path, request, driver, largest, ranges=request_ranges)
                problems += p
                warnings += w
                offered = {"hami-core": hami_core_offered, "nvml": nvml_offered, "mps": mps_offered}
                p, w = _merged_problems(entries, path, request, exact, offered)
                problems += p
                warnings += [x for x in w if x not in warnings]
    return Review(problems=(*problems, *decode_problems), warnings=tuple(warnings))
