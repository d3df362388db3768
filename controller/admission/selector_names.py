"""Admission warnings for the names a request's CEL selectors read that no fracgpu device publishes (pure).

`selector_warnings` takes one request (or `firstAvailable` alternative) of one of our DeviceClasses and returns a
warning for each attribute or capacity its selectors read (found by `controller/admission/cel_refs.py`) that no
fracgpu device publishes (`api/published.py`), each in a domain other than the driver's and resource.kubernetes.io,
and each comparison of `device.driver` with another driver: on every fracgpu device such a selector fails or is
false, so the request never matches. Each warning names the published name it likely means: the same name in a
domain or kind that has it, fracgpu's name for another project's (`_ALIASES`), or a close spelling. It refuses
nothing and never raises on a request shaped as the API server serves one.
"""

import difflib
from collections.abc import Mapping
from typing import Any

from api import published
from controller.admission.cel_refs import Kind, Reference, references

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
    **dict.fromkeys(
        ("cores", "gpucores", "computepercent", "sm", "smpercent", "corepercent"), ("capacity", "", "compute")
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


def selector_warnings(exact: Mapping[str, Any], path: str, request: str, driver: str) -> list[str]:
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
