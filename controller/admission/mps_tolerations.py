"""MPS trust domains at admission (pure): the toleration a new claim is given, and the tolerations refused.

An MPS GPU that serves a trust domain carries that domain's taint (``api/mps_trust.py``, effect NoSchedule), so
the scheduler places there only the claims that tolerate it. The requests of the driver's DeviceClasses (the
default class and the further ones, `--extra-device-classes`: each may select MPS GPUs; the MIG class never does)
are the ones admission looks after:

- **Given.** The mutating webhook adds to each such request (or `firstAvailable` alternative) of a new claim the
  toleration of the claim's domain (`tolerations_patch`), unless one it carries already tolerates that taint, in
  whatever form (``operator`` omitted or ``Equal``, ``effect`` omitted or ``NoSchedule``, any
  ``tolerationSeconds``).
- **Refused.** The validating review refuses each toleration that tolerates another domain's taint
  (`foreign_tolerations`): one of a trust-domain taint key (on any request) with ``operator: Exists`` or another
  value, and, on the requests of the driver's DeviceClasses, one without a key (``operator: Exists`` with no
  effect or ``NoSchedule``), which tolerates every taint. Admitted, such a claim could be placed on an MPS GPU of
  another domain, where the controller's binding condition refuses it and the scheduler places it again, maybe
  there again, without end; refused at admission, its author gets a terminal answer at ``kubectl apply``. A
  toleration that tolerates no NoSchedule taint (``effect: NoExecute``) or only other keys is admitted.

Under scope ``cluster`` no claim has a domain taint: nothing is given, nothing refused.
"""

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from api.mps_trust import TAINT_EFFECT, TrustDomain


def _alternatives(spec: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(JSON pointer, field path, content) of each request's `exactly` and each `firstAvailable` alternative of a
    ResourceClaimSpec at field path `prefix` (the pointer assumes a claim: ``/spec/...``)."""
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    for i, request in enumerate(requests if isinstance(requests, list) else []):
        if not isinstance(request, Mapping):
            continue
        if isinstance(exactly := request.get("exactly"), Mapping):
            yield f"/spec/devices/requests/{i}/exactly", f"{prefix}.devices.requests[{i}].exactly", exactly
        alternatives = request.get("firstAvailable")
        for j, sub in enumerate(alternatives if isinstance(alternatives, list) else []):
            if isinstance(sub, Mapping):
                yield (
                    f"/spec/devices/requests/{i}/firstAvailable/{j}",
                    f"{prefix}.devices.requests[{i}].firstAvailable[{j}]",
                    sub,
                )


def _tolerations(target: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """(index, toleration) of each toleration of a request."""
    found = target.get("tolerations")
    return [(k, t) for k, t in enumerate(found) if isinstance(t, Mapping)] if isinstance(found, list) else []


def _names(target: Mapping[str, Any], classes: Collection[str]) -> bool:
    """Whether a request (or alternative) names one of `classes`."""
    name = target.get("deviceClassName")
    return isinstance(name, str) and name in classes


def tolerations_patch(spec: Mapping[str, Any], classes: Collection[str], domain: TrustDomain) -> list[dict[str, Any]]:
    """JSON-patch operations that give each request of a claim `spec` for one of `classes` (and each such
    `firstAvailable` alternative) the toleration of `domain`: none for ``cluster``, and none where a toleration
    there already tolerates the domain's taint, in any form."""
    toleration = domain.toleration()
    if toleration is None:
        return []
    ops: list[dict[str, Any]] = []
    for pointer, _, target in _alternatives(spec, "spec"):
        if not _names(target, classes):
            continue
        if not isinstance(target.get("tolerations"), list):
            ops.append({"op": "add", "path": f"{pointer}/tolerations", "value": [toleration]})
        elif not any(domain.tolerates_own(t) for _, t in _tolerations(target)):
            ops.append({"op": "add", "path": f"{pointer}/tolerations/-", "value": toleration})
    return ops


def foreign_tolerations(
    spec: Mapping[str, Any], domain: TrustDomain, classes: Collection[str], prefix: str = "spec"
) -> list[str]:
    """One refusal per toleration in a ResourceClaimSpec `spec` (at field path `prefix`) that tolerates the taint of
    another trust domain than `domain`: of a trust-domain taint key on any request; without a key on a request of
    `classes`. Each names the field, what it tolerates and what to do. Empty for ``cluster``."""
    refused: list[str] = []
    own = domain.describe()
    for _, where, target in _alternatives(spec, prefix):
        ours = _names(target, classes)
        for k, toleration in _tolerations(target):
            if not domain.tolerates_others(toleration):
                continue
            at = f"{where}.tolerations[{k}]"
            key = toleration.get("key")
            if isinstance(key, str) and key:
                refused.append(_keyed(at, toleration, key, own))
            elif ours:
                refused.append(_keyless(at, toleration, own))
    return refused


_REMOVE = (
    "Remove it: admission gives each request of the driver's DeviceClasses the toleration of its own domain, and "
    "a claim may reach only the MPS GPUs of its own domain (chart value mps.trustDomain.scope)"
)


def _keyed(at: str, toleration: Mapping[str, Any], key: str, own: str) -> str:
    if toleration.get("operator") == "Exists":
        taint = f"the MPS trust-domain taint {key} with any value, so the MPS GPUs of other trust domains"
    else:
        taint = f"the MPS trust-domain taint {key}={toleration.get('value')}, that of MPS GPUs of another trust domain"
    return f"{at} tolerates {taint}, and this claim belongs to {own}. {_REMOVE}"


def _keyless(at: str, toleration: Mapping[str, Any], own: str) -> str:
    effect = " NoSchedule" if toleration.get("effect") == TAINT_EFFECT else ""
    if toleration.get("operator") == "Exists":
        what, written = f"every{effect} taint", "operator Exists without a key"
    else:
        what, written = f"every{effect} taint of value {toleration.get('value')}", "no key"
    return (
        f"{at} ({written}) tolerates {what}, the MPS trust-domain taints of other trust domains than this claim's "
        f"({own}) included: the scheduler could place the claim on an MPS GPU that serves another domain, where it "
        "is refused (the binding condition MpsTrustDomainConflict, or the node plugin at prepare) and the scheduler "
        "places it again, maybe there again, without end. Name the key of each taint the claim must tolerate "
        "instead (admission gives each request of the driver's DeviceClasses the toleration of its own domain), "
        "or write effect: NoExecute for a toleration meant only to keep the claim's pods from eviction"
    )
