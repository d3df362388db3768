"""Admission review of ResourceClaims and ResourceClaimTemplates that concern our driver (pure functions).

A claim spec concerns us when a request (or a `firstAvailable` alternative) names our DeviceClass, or an opaque
config names our driver. Refused: GpuConfig parameters that do not decode strictly, configs that decode one by one
but merge into an invalid one for some request (merged as the node plugin merges them, api/config_merge.py, with
our DeviceClass's configs first), capacity requests other than `memory` and `compute` (HAMi's `cores` and
`gpucores` named as `compute`), memory amounts that are not positive whole numbers of bytes (an `adminAccess`
request may ask for 0) and compute amounts that are not whole percentages from 0 to 100. Each problem names its field path, as `kubectl`
users write it, and what is allowed. Warned: requests larger than any published GPU, `enforcement: hami-core`,
`mps` or `nvml` while no published GPU offers it, and an `mps` request for more than one GPU (the node plugin
refuses a claim whose MPS shares span GPUs: a CUDA process is the client of one MPS daemon). Warned too, since
nothing else would say it: settings dropped or changed on the way, namely an opaque config of another driver that
applies only to requests of our DeviceClasses (the kubelet hands it to no driver that reads it), a memory request
the published GPUs' `requestPolicy` rounds up (naming the grant), reserved compute or `computeLimitPercent` that no published
GPU can apply (only the mps and hami-core tiers do), how `computeLimitPercent` maps beside reserved compute, and
compute asked without memory (which takes a whole GPU's memory). For users of other drivers: a request without
`capacity.requests.memory` of a class shared by memory in a ResourceClaim that pods name directly (it takes a
whole GPU that all of them share; templates, adminAccess requests, the MIG class and kube-scheduler's claim for an
extended resource are not warned), and a CEL selector of a request of any of our classes that reads an attribute
or capacity no fracgpu device publishes (`api/published.py`), another domain's, or compares `device.driver` with
another driver (`controller/admission/cel_refs.py` finds them), naming the published name it likely means. An
`adminAccess` request that does not ask for `memory: 0` is warned that the scheduler places it only where that
much memory is free (all of it when it names no capacity, as Kubernetes' docs write one), though the allocation is
never counted once made.

The warnings that refuse nothing are phrased in `controller/admission/spec_warnings.py` (whole GPU, another
driver's config, compute, rounding) and `controller/admission/selector_names.py` (CEL selector names); this
module reviews the spec, refuses, and gathers them (`review_claim_spec`).
"""

import functools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, ConfigDict

from api import compute
from api.config_merge import ConfigEntry, EntryError, MergeError, config_for
from api.gpu_config import GpuConfigError, decode_gpu_config
from api.names import COMPUTE_CAPACITY, MEMORY_CAPACITY
from api.quantity import format_bytes, parse_quantity
from controller.admission.selector_names import selector_warnings
from controller.admission.spec_warnings import (
    compute_warnings,
    foreign_config_warning,
    request_owners,
    rounding_warning,
    whole_gpu_warning,
)
from controller.core.claims import EXTENDED_RESOURCE_CLAIM_ANNOTATION

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
        if name in (COMPUTE_CAPACITY, f"{driver}/{COMPUTE_CAPACITY}"):
            p, w = _review_compute(value, field, request, admin=admin, memory=_named_memory(requests, driver))
            problems += p
            warnings += w
            continue
        if name not in (MEMORY_CAPACITY, f"{driver}/{MEMORY_CAPACITY}"):
            problems.append(_unknown_capacity(field, name, value, driver))
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
            warnings += rounding_warning(field, request, value, memory, ranges)
    return problems, warnings


def _named_memory(requests: Mapping[str, Any], driver: str) -> bool:
    return any(n in (MEMORY_CAPACITY, f"{driver}/{MEMORY_CAPACITY}") for n in requests)


def _unknown_capacity(field: str, name: str, value: object, driver: str) -> str:
    """The refusal of a capacity no fracgpu device offers; HAMi's `cores` is named as `compute`, its equivalent."""
    offered = f"{driver} devices offer only {MEMORY_CAPACITY!r} and {COMPUTE_CAPACITY!r}"
    if name.rsplit("/", 1)[-1] in compute.HAMI_NAMES:
        return (
            f"{field}: unknown capacity; {offered}: HAMi's {name.rsplit('/', 1)[-1]!r} is {COMPUTE_CAPACITY!r} here "
            f"(percent of the GPU, 100 per GPU), write capacity.requests.{COMPUTE_CAPACITY}: {value}"
        )
    return f"{field}: unknown capacity; {offered}"


def _review_compute(
    value: object, field: str, request: str, *, admin: bool, memory: bool
) -> tuple[list[str], list[str]]:
    """A `compute` amount must be a whole percentage of one GPU, 0 to 100; warned: one without `memory`, which takes
    a whole GPU's memory, and one on an adminAccess request, which reserves nothing."""
    try:
        parsed: Decimal = parse_quantity(value)
    except (ValueError, TypeError, InvalidOperation):
        parsed = Decimal(-1)
    if not 0 <= parsed <= compute.TOTAL or parsed != parsed.to_integral_value():
        return [
            f"{field}: must be a whole percentage of one GPU's compute from 0 to {compute.TOTAL} (a GPU offers "
            f"{compute.TOTAL}), got {value!r}"
        ], []
    if admin and parsed:
        return [], [
            f"{field}: request {request!r} has adminAccess, which reserves no compute, but the scheduler places it "
            f"only on a GPU with {value} compute free; leave compute out to reach any GPU, busy or not"
        ]
    if not memory and not admin:
        return [], [
            f"{field}: request {request!r} asks for compute but no capacity.requests.memory, so it is charged the "
            "GPU's default memory request, all of its memory: it takes a whole GPU that no share can join; ask for "
            "capacity.requests.memory too (e.g. 10Gi) for a share of compute and memory"
        ]
    return [], []


def reserved_compute(exact: Mapping[str, Any], driver: str) -> int:
    """The compute a request asks for (whole percent; 0 when none or not a valid amount)."""
    requests = (exact.get("capacity") or {}).get("requests") or {}
    return compute.consumed_percent(
        {COMPUTE_CAPACITY: requests.get(COMPUTE_CAPACITY, requests.get(f"{driver}/{COMPUTE_CAPACITY}"))}
    )


def _config_problems(problems: tuple[str, ...], path: str) -> list[str]:
    """Prefix GpuConfig decode problems (`field: ...` or `parameters ...`) with the config's path."""
    return [f"{path}.{p}" if p.startswith("parameters") else f"{path}.parameters.{p}" for p in problems]


def _merged_problems(
    entries: list[ConfigEntry],
    path: str,
    request: str,
    exact: Mapping[str, Any],
    offered: Mapping[str, bool | None],
    *,
    driver: str,
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
    said = compute_warnings(merged, path, request, offered, reserved_compute(exact, driver))
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
        said.insert(
            0,
            f"{path}: request {request!r} asks for enforcement 'nvml', but no published GPU offers it (attribute "
            "memoryEnforcement; nvml needs cgroup v2, a driver with nvmlDeviceSetMemoryLimits_v1 and driverEdits: "
            "toolkit): the claim's pod fails to start on any node until one does",
        )
    return [], said


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
    mps_class: bool | None = None,
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
    enforcement (None when none is published); `mps_class` whether the MPS DeviceClass exists (None: not known),
    for the advice that names it; `request_ranges` the `(min, step)` of the published GPUs' memory
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
    owners = request_owners(devices.get("requests") or [], {device_class, *our_classes})
    for k, config in enumerate(devices.get("config") or []):
        opaque = config.get("opaque") or {}
        path = f"{prefix}.devices.config[{k}]"
        if opaque.get("driver") != driver:
            warnings += foreign_config_warning(config, path, driver, owners)
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
                warnings += selector_warnings(exact, path, request, driver)
            if standalone and exact.get("deviceClassName") in {device_class, *shared_classes}:
                warnings += whole_gpu_warning(exact, path, request)
            if exact.get("deviceClassName") == device_class:
                p, w = _review_request(exact, path, request, driver, largest, ranges=request_ranges)
                problems += p
                warnings += w
                offered = {
                    "hami-core": hami_core_offered,
                    "nvml": nvml_offered,
                    "mps": mps_offered,
                    "mps-class": mps_class,
                }
                p, w = _merged_problems(entries, path, request, exact, offered, driver=driver)
                problems += p
                warnings += [x for x in w if x not in warnings]
    return Review(problems=(*problems, *decode_problems), warnings=tuple(warnings))
