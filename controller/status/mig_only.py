"""Which requests of a pending claim ask for MIG partitions while no MIG partition is published (pure).

A claim written for MIG (NVIDIA's MIG examples translated: a `profile` selector, a `type == "mig"` test, the MIG
DeviceClass) on a cluster whose GPUs are not MIG GPUs matches nothing: the selector is false on every GPU, or a
CEL error ("no such key") that the scheduler reports for the pod. `plan_mig_unpublished` finds, while no device
of type `mig` is published, each request every alternative of which either names the MIG DeviceClass or has a
selector (its DeviceClass's or its own) that holds on none of the published GPUs and whose outcome changes when
a GPU is given a MIG partition's attributes (`type: mig`, `profile`, `placementStart`, `memorySlices`,
`computeSlices`, `memoryMiB`, `multiprocessors`): the selector reads them. The message names the selector, the
attributes found (those whose removal from such a probe changes the outcome), why no partition is published
(no MIG GPU: the chart value `mig.gpus`; MIG GPUs whose MIG mode is not on), and the MIG DeviceClass, saying how
to get it where the cluster lacks it. Nothing is said while nothing is published (a GPU may still join).
"""

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from api import mig
from controller.core.claims import ClaimView, DeviceClassView, GpuRequest
from controller.core.slices import DeviceRecord
from controller.status.selectors import evaluate

MAX_NAMED = 3
"""MIG GPUs named per message; the rest are counted."""

_PROBE: dict[str, bool | int | str] = {
    mig.TYPE_ATTRIBUTE: mig.TYPE_MIG,
    mig.PROFILE_ATTRIBUTE: "",
    mig.PLACEMENT_ATTRIBUTE: 0,
    mig.MEMORY_SLICES_ATTRIBUTE: 0,
    mig.COMPUTE_SLICES_ATTRIBUTE: 0,
    mig.PARTITION_MEMORY_ATTRIBUTE: 0,
    mig.MULTIPROCESSORS_ATTRIBUTE: 0,
}
"""What a MIG partition publishes that a whole GPU does not (values of the right type: only presence counts)."""


class MigUnpublished(BaseModel):
    """A request of a pending claim that asks for MIG partitions where none is published."""

    model_config = ConfigDict(frozen=True)

    request: str
    message: str


def _outcome(expression: str, device: DeviceRecord, driver: str) -> bool | None:
    """True or False; None for an outcome that is not a bool (a CEL error, or not evaluated here)."""
    found = evaluate(expression, device, driver)
    return found if isinstance(found, bool) else None


def _with(device: DeviceRecord, driver: str, attributes: Mapping[str, bool | int | str]) -> DeviceRecord:
    """`device` with the driver-domain `attributes` it publishes replaced by these."""
    return device.model_copy(update={"attributes": {**device.attributes, driver: dict(attributes)}})


def _probe(device: DeviceRecord, driver: str) -> DeviceRecord:
    """`device` as if it were a MIG partition of its GPU: a partition's attributes added, allocated whole."""
    own = device.attributes.get(driver, {})
    return _with(device, driver, {**own, **_PROBE}).model_copy(update={"allow_multiple": False})


def _mig_reads(expression: str, gpus: list[DeviceRecord], driver: str) -> list[str] | None:
    """The partition attributes `expression` reads, when it holds on none of `gpus` and its outcome on the first
    changes once it has a partition's attributes; None otherwise ([] when it does but no one name alone shows)."""
    if any(_outcome(expression, d, driver) is True for d in gpus):
        return None
    first = gpus[0]
    probe = _probe(first, driver)
    as_partition = _outcome(expression, probe, driver)
    if as_partition == _outcome(expression, first, driver):
        return None
    names = []
    own = probe.attributes.get(driver, {})
    for name in _PROBE:
        left = {k: v for k, v in own.items() if k != name}
        if name in first.attributes.get(driver, {}):
            left[name] = first.attributes[driver][name]  # `type`: back to the GPU's own
        if _outcome(expression, _with(probe, driver, left), driver) != as_partition:
            names.append(name)
    return names


def _selector_reason(
    m: GpuRequest, gpus: list[DeviceRecord], cls: DeviceClassView | None, driver: str, mig_class: str
) -> str | None:
    """Why the alternative `m` asks for MIG partitions; None when it does not (as far as this can show)."""
    if m.device_class == mig_class:
        return f"asks for a MIG partition (DeviceClass {mig_class})"
    labelled = [(e, f"of DeviceClass {cls.name}") for e in cls.selectors] if cls else []
    for expression, where in [*labelled, *((e, "of the request") for e in m.selectors)]:
        names = _mig_reads(expression, gpus, driver)
        if names is None:
            continue
        shown = [f'{n} "{mig.TYPE_MIG}"' if n == mig.TYPE_ATTRIBUTE else n for n in names]
        which = f" ({', '.join(shown)})" if shown else ""
        return (
            f"has selector `{expression}` ({where}), which depends on what only MIG partitions publish{which} "
            f"and matches none of the {len(gpus)} published GPU{'s' if len(gpus) != 1 else ''}"
        )
    return None


def _why_none(parents: list[DeviceRecord]) -> str:
    """Why no MIG partition is published."""
    if not parents:
        return (
            "no GPU of this cluster is a MIG GPU (the node plugin publishes MIG partitions only for the GPUs the "
            "chart value mig.gpus names, with their MIG mode on)"
        )
    named = ", ".join(
        f"GPU {p.index} ({p.device}) of node {p.node}: migState {p.mig_state or 'unknown'}" for p in parents[:MAX_NAMED]
    )
    more = f", and {len(parents) - MAX_NAMED} more" if len(parents) > MAX_NAMED else ""
    return (
        f"the MIG GPUs published have none ({named}{more}; a MIG GPU publishes its partitions only while its MIG "
        "mode is on: nvidia-smi -i <index> -mig 1 with the GPU idle)"
    )


def plan_mig_unpublished(
    claim: ClaimView,
    devices: Iterable[DeviceRecord],
    classes: Mapping[str, DeviceClassView],
    driver: str,
    mig_class: str,
) -> tuple[MigUnpublished, ...]:
    """The requests of the pending `claim` that ask for MIG partitions (see the module's docstring) while no MIG
    partition is published. `classes`: our DeviceClasses as the cluster has them, by name (one absent: not in
    the cluster)."""
    devices = list(devices)
    if claim.allocated or not devices or any(d.kind == mig.TYPE_MIG for d in devices):
        return ()
    parents = sorted((d for d in devices if d.kind == mig.TYPE_MIG_PARENT), key=lambda d: (d.node, d.index or 0))
    gpus = [d for d in devices if d.kind != mig.TYPE_MIG_PARENT]
    lacking = f"DeviceClass {mig_class}, which this cluster lacks too (chart value deviceClass.mig.create)"
    out = []
    for alternatives in claim.requests:
        reasons = []
        for m in alternatives:
            cls = classes.get(m.device_class)
            reason = _selector_reason(m, gpus, cls, driver, mig_class) if gpus or m.device_class == mig_class else None
            if reason is None:
                break
            reasons.append(f"{m.request!r} {reason}")
        else:
            if any(m.device_class != mig_class for m in alternatives):
                ask = f"; MIG partitions are asked for with {lacking if mig_class not in classes else f'DeviceClass {mig_class}'}"
            else:
                ask = f"; and the {lacking}" if mig_class not in classes else ""
            message = (
                f"request {'; or '.join(reasons)}; but no MIG partition is published, as {_why_none(parents)}{ask}"
            )
            out.append(MigUnpublished(request=alternatives[0].request, message=message))
    return tuple(out)
