"""Which pending requests no published GPU can ever satisfy, and the constraint no device meets (pure).

A request alternative needs a device that passes every selector (its DeviceClass's, then its own) and
admits its memory amount. A MIG GPU itself (``type: mig-parent``) is never a candidate: only its partitions are
allocated. A device is ruled out only by a selector that evaluates to false; a selector
that cannot be evaluated (controller/status/selectors.py) rules nothing out, so every claim made is true: the
message then says which selector was not evaluated.
"""

from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from api.mig import TYPE_MIG_PARENT
from api.quantity import format_bytes
from controller.core.model import ClaimView, DeviceClassView, DeviceRecord, MemoryRequest
from controller.status.selectors import NotEvaluated, evaluate


class Unsatisfiable(BaseModel):
    """A request of a pending claim that no published GPU can satisfy."""

    model_config = ConfigDict(frozen=True)

    request: str
    """The first alternative's name (`gpu` or `gpu/large`)."""
    message: str


def _gpus(n: int) -> str:
    return f"{n} published GPU{'s' if n != 1 else ''}"


def _alternative(
    m: MemoryRequest, devices: Sequence[DeviceRecord], device_class: DeviceClassView | None, driver: str
) -> str | None:
    """Why no device can satisfy this alternative; None when one may."""
    labelled = [(e, f"of DeviceClass {device_class.name}") for e in device_class.selectors] if device_class else []
    labelled += [(e, "of the request") for e in m.selectors]
    for device in devices:  # usually the first large enough device passes: no full scan for a claim that fits
        if device.max_request >= m.memory and all(evaluate(e, device, driver) is not False for e, _ in labelled):
            return None
    passes = {e: 0 for e, _ in labelled}  # devices each selector does not rule out
    unknown: dict[str, NotEvaluated] = {}
    candidates = []
    for device in devices:
        ruled_out = False
        for expression, _ in labelled:
            outcome = evaluate(expression, device, driver)
            if isinstance(outcome, NotEvaluated):
                unknown.setdefault(expression, outcome)
            if outcome is False:
                ruled_out = True
            else:
                passes[expression] += 1
        if not ruled_out:
            candidates.append(device)
    asks = f"request {m.request!r} asks for {format_bytes(m.memory)} of GPU memory"
    if any(d.max_request >= m.memory for d in candidates):
        return None
    not_evaluated = "".join(
        f"; selector `{e}` was not evaluated ({u.reason}), so it ruled out no GPU" for e, u in unknown.items()
    )
    if len(candidates) == len(devices):
        largest = max(d.max_request for d in devices)
        return f"{asks}, and the largest GPU has {format_bytes(largest)}{not_evaluated}"
    if not candidates:
        none = [(e, where) for e, where in labelled if passes[e] == 0]
        if none:
            expression, where = none[0]
            return f"{asks}, but no published GPU matches selector `{expression}` ({where}){not_evaluated}"
        each = ", ".join(f"`{e}` ({where}: {passes[e]})" for e, where in labelled)
        return f"{asks}, but no published GPU matches all of its selectors together: {each}{not_evaluated}"
    largest = max(d.max_request for d in candidates)
    selectors = ", ".join(f"`{e}` ({where})" for e, where in labelled)
    return (
        f"{asks}, but only {_gpus(len(candidates))} of {len(devices)} match selectors {selectors}, "
        f"and the largest of them has {format_bytes(largest)}{not_evaluated}"
    )


def plan_unsatisfiable(
    claim: ClaimView,
    devices: Iterable[DeviceRecord],
    device_class: DeviceClassView | Mapping[str, DeviceClassView] | None,
    driver: str,
) -> tuple[Unsatisfiable, ...]:
    """The requests of a pending claim that no device in `devices` can satisfy (none while nothing is
    published: a GPU may still join). `device_class`: our DeviceClasses as the cluster has them, by name (each
    alternative is checked against the one it names; absent: unknown), or one for every alternative."""
    devices = [d for d in devices if d.kind != TYPE_MIG_PARENT]
    if claim.allocated or not devices:
        return ()
    out = []
    for alternatives in claim.memory_requests:
        reasons = [
            _alternative(
                m,
                devices,
                device_class.get(m.device_class) if isinstance(device_class, Mapping) else device_class,
                driver,
            )
            for m in alternatives
        ]
        if all(r is not None for r in reasons):
            because = "; or ".join(r for r in reasons if r is not None)
            out.append(
                Unsatisfiable(
                    request=alternatives[0].request,
                    message=f"no GPU of {driver} can ever satisfy this claim: {because}",
                )
            )
    return tuple(out)
