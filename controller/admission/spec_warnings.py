"""Admission warnings of a claim spec's settings that refuse nothing but that nothing else would say (pure).

Each function phrases one kind of warning, prefixed with the field path `kubectl` users write, for
`controller/admission/verdict.py` to gather: a memory request the published GPUs' `requestPolicy` rounds up
(`rounding_warning`, naming each grant), reserved compute or `computeLimitPercent` that no published GPU can
apply and how `computeLimitPercent` maps beside reserved compute (`compute_warnings`), a request of a ResourceClaim that pods name directly that takes a whole GPU they all share
(`whole_gpu_warning`), and an opaque config of another driver that applies only to requests of our DeviceClasses
(`foreign_config_warning`, over `request_owners`). Each returns a list, empty when there is nothing to say.
"""

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from api import compute
from api.gpu_config import GpuConfig
from api.names import CONFIG_API_VERSION, CONFIG_KIND, MPS_DEVICE_CLASS_NAME
from api.quantity import MiB, format_bytes, granted_in_range


def _in_mib(value: int) -> str:
    """`value` bytes in Mi when whole (`3072Mi`, the unit of the node plugin's memory step), else as it is."""
    return f"{value // MiB}Mi" if value % MiB == 0 else format_bytes(value)


def rounding_warning(
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


def compute_warnings(
    merged: GpuConfig, path: str, request: str, offered: Mapping[str, bool | None], reserved: int = 0
) -> list[str]:
    """Warnings on a request's compute: how `computeLimitPercent` maps when it also reserves `reserved` compute
    (`capacity.requests.compute`; the ceiling is the smaller, `api.compute.ceiling`), and a ceiling no published GPU
    can apply to the request: only the mps tier (an MPS GPU's active thread percentage) and the hami-core tier
    (CUDA_DEVICE_SM_LIMIT) apply one. Nothing on that for `enforcement` mps or hami-core (their own warnings say
    when no GPU offers them). `offered["mps-class"]` False: the MPS DeviceClass the warning names is not in the
    cluster, and the warning says how to get it."""
    percent = merged.compute_limit_percent
    out = []
    if reserved and percent is not None and percent > reserved:
        out.append(
            f"{path}: request {request!r} reserves compute {reserved} and sets computeLimitPercent {percent}, above "
            f"it: the share's compute ceiling is its reservation, {reserved} % (the scheduler counts only the "
            "reservation, so a higher ceiling would let the GPU's shares exceed 100 % together)"
        )
    elif reserved and percent is not None and percent < reserved:
        out.append(
            f"{path}: request {request!r} reserves compute {reserved} and sets computeLimitPercent {percent}: the "
            f"share's compute ceiling is {percent} %, and the scheduler still counts {reserved} % of the GPU for it"
        )
    if compute.ceiling(reserved, percent) is None or merged.enforcement in ("mps", "hami-core"):
        return out
    if merged.enforcement == "nvml":
        why = "enforcement 'nvml' does not apply it"
    elif offered.get("mps") is False and offered.get("hami-core") is False:
        why = "no published GPU can enforce it (none is an MPS GPU or offers hami-core)"
    else:
        return out
    if percent is not None and not reserved:
        said = f"sets computeLimitPercent {percent}, but {why}: the share gets the GPU's compute unlimited"
    else:
        said = (
            f"reserves compute {reserved}, but {why}: the scheduler counts the reservation, and the share gets the "
            "GPU's compute unlimited"
        )
    return [
        *out,
        f"{path}: request {request!r} {said}; only the mps tier applies it, as the MPS active thread percentage (MPS "
        f"GPUs, attribute mps: ask the DeviceClass {MPS_DEVICE_CLASS_NAME}"
        f"{_MPS_CLASS_MISSING if offered.get('mps-class') is False else ''}), and the hami-core tier, as "
        "CUDA_DEVICE_SM_LIMIT",
    ]


_MPS_CLASS_MISSING = (
    ", which this cluster lacks: the chart creates it with the value deviceClass.mps.create, and its GPUs are those the "
    "chart value mps.gpus names"
)


def whole_gpu_warning(exact: Mapping[str, Any], path: str, request: str) -> list[str]:
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


def request_owners(requests: Sequence[Mapping[str, Any]], classes: Collection[str]) -> dict[str, bool]:
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


def foreign_config_warning(config: Mapping[str, Any], path: str, driver: str, owners: Mapping[str, bool]) -> list[str]:
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
