"""Which requests of a pending claim wait because no GPU they may use has the memory and compute they ask free now
(pure).

A request that asks for a share (`capacity.requests.memory`, and `compute` where it names one) of a GPU that can
hold it waits while every GPU its selectors allow (its DeviceClass's, then its own:
`controller.status.feasibility.selected_by`) has less memory free than it asks, or less compute (issue 39: three
shares of `compute: 50` on one GPU, the third waits); the scheduler says only "cannot allocate all claims".
`plan_room_waiting` finds that case for each request every alternative of which names a memory amount, is neither
adminAccess nor allocationMode All, and is not of a skipped class (the MIG class: `MigPlacementsFragmented` speaks
for partitions): for each alternative, no published GPU it may use has both free, as the ledger counts them (the
GPU objects' `freeMemory`, and the device's `compute` capacity less the object's `allocatedCompute`). The message
says what it asks, the most free memory and the most free compute among those GPUs (and which GPU), which of the
two is short, and that it is placed once a share goes and leaves room (the scheduler tries again when a claim is
deallocated).

It says nothing where it cannot be sure: some GPU it may use has the room (taints and MPS trust domains may hold that
one back: other reasons speak for those), a device it may use is not a shared GPU (a MIG partition: allocated
whole), the ledger has no figures for one yet, or no GPU is allowed at all (`UnsatisfiableGpuRequest`'s case). The
scan stops at the first GPU with room, the common case, so a burst of pending claims costs little.
"""

from collections.abc import Callable, Collection, Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from api import mig
from api.quantity import format_bytes
from controller.core.claims import ClaimView, GpuRequest
from controller.core.slices import DeviceRecord


class RoomWaiting(BaseModel):
    """A request of a pending claim that waits for room on the GPUs it may use."""

    model_config = ConfigDict(frozen=True)

    request: str
    message: str


class RoomPlan(BaseModel):
    """What `plan_room_waiting` found."""

    model_config = ConfigDict(frozen=True)

    waiting: tuple[RoomWaiting, ...] = ()
    undecided: bool = False
    """Some request it looks at was left unsaid because a GPU had room or the ledger had no figures: the answer may
    change as the ledger does (look again later)."""


class _Short(BaseModel):
    """An alternative no GPU it may use has the room for: how many it may use and the best of each figure."""

    model_config = ConfigDict(frozen=True)

    gpus: int
    memory: tuple[int, DeviceRecord]
    compute: tuple[int, DeviceRecord]


_Found = _Short | Literal["room", "unwritten", "unknown"]


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _where(device: DeviceRecord) -> str:
    return f"{device.device} of node {device.node}"


def _look(
    m: GpuRequest,
    devices: Iterable[DeviceRecord],
    room: Callable[[DeviceRecord], tuple[int, int] | None],
    selected: Callable[[GpuRequest, DeviceRecord], bool],
) -> _Found:
    """Whether some GPU the alternative may use has its memory and compute free ("room"), the figures of those it may
    use when none has (`_Short`), "unwritten": the ledger has no figures for one of them, or "unknown": a device it
    may use whose room is not counted here, or none at all."""
    memory, compute = m.memory or 0, m.compute or 0
    gpus = 0
    best_memory: tuple[int, DeviceRecord] | None = None
    best_compute: tuple[int, DeviceRecord] | None = None
    for device in devices:
        if device.kind == mig.TYPE_MIG_PARENT or not selected(m, device):
            continue
        if device.kind != mig.TYPE_GPU or not device.allow_multiple:
            return "unknown"
        free = room(device)
        if free is None:
            return "unwritten"
        free_memory, free_compute = free
        if free_memory >= memory and free_compute >= compute:
            return "room"
        gpus += 1
        if best_memory is None or free_memory > best_memory[0]:
            best_memory = (free_memory, device)
        if best_compute is None or free_compute > best_compute[0]:
            best_compute = (free_compute, device)
    if best_memory is None or best_compute is None:
        return "unknown"
    return _Short(gpus=gpus, memory=best_memory, compute=best_compute)


def _message(m: GpuRequest, short: _Short) -> str:
    memory, compute = m.memory or 0, m.compute or 0
    each = f"{m.count} GPUs of one node, each with " if m.count > 1 else ""
    asks = f"request {m.request!r} asks for {each}{format_bytes(memory)} of memory"
    (free_memory, on_memory), (free_compute, on_compute) = short.memory, short.compute
    if not compute:
        return (
            f"{asks}, and none of the {_gpus(short.gpus)} its selectors allow has that much free now (as the GPU "
            f"ledger counts it, kubectl get gpus): the most free is {format_bytes(free_memory)}, on "
            f"{_where(on_memory)}"
        )
    memory_short, compute_short = free_memory < memory, free_compute < compute
    if memory_short and compute_short:
        which = "both are short"
    elif memory_short or compute_short:
        which = f"{'memory' if memory_short else 'compute'} is short"
    else:
        which = "no one GPU has both: those with the memory free lack the compute"
    return (
        f"{asks} and compute {compute} (percent of a GPU), and none of the {_gpus(short.gpus)} its selectors allow "
        f"has both free now (as the GPU ledger counts them, kubectl get gpus): the most free memory is "
        f"{format_bytes(free_memory)}, on {_where(on_memory)}, the most free compute {free_compute}, on "
        f"{_where(on_compute)}; {which}"
    )


def plan_room_waiting(
    claim: ClaimView,
    devices: Iterable[DeviceRecord],
    room: Callable[[DeviceRecord], tuple[int, int] | None],
    selected: Callable[[GpuRequest, DeviceRecord], bool],
    *,
    told: Collection[str] = (),
    skip_classes: Collection[str] = (),
) -> RoomPlan:
    """The requests of the pending `claim` that wait for room on every GPU they may use (see the module's
    docstring). `devices`: the published devices; `room`: what the ledger says a shared GPU has free, (memory in
    bytes, compute in percent) (None: no figures yet: `DeviceCatalogue.free`); `selected`: whether an alternative's selectors leave it a device; `told`: requests whose reason
    another Event gives (by name, or a subrequest's, or several joined by commas): left out; `skip_classes`: classes
    whose requests are left out."""
    if claim.allocated or claim.extended_resource:
        return RoomPlan()
    said = {name.split("/")[0] for names in told for name in names.split(",")}
    listed = list(devices)
    out = []
    undecided = False
    for alternatives in claim.requests:
        if alternatives[0].request.split("/")[0] in said or any(
            m.memory is None or m.admin_access or m.all or m.device_class in skip_classes for m in alternatives
        ):
            continue
        found = []
        for m in alternatives:
            short = _look(m, listed, room, selected)
            if not isinstance(short, _Short):
                undecided = undecided or short != "unknown"
                break
            found.append(_message(m, short))
        else:
            out.append(
                RoomWaiting(
                    request=alternatives[0].request,
                    message="; or ".join(found)
                    + (
                        ". It is placed once a share on one of them goes and leaves that room (the scheduler tries "
                        "again when a claim is deallocated), if that GPU's taints and MPS trust domain admit it too"
                    ),
                )
            )
    return RoomPlan(waiting=tuple(out), undecided=undecided)
