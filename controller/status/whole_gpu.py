"""Which pending requests wait because they name no memory and so take a whole GPU, where a share would have room
(pure).

A request of a class shared by memory (`gpu.fracgpu.dev` and `--extra-device-classes`) without
`capacity.requests.memory` consumes the memory capacity's `requestPolicy.default`: all of the GPU's memory
(docs/architecture.md, "Resource model"). A ResourceClaimTemplate written that way gives every replica a whole
GPU, and once each GPU its selectors allow holds a share the scheduler says only "cannot allocate all claims".
`plan_whole_gpu` finds that case for each request of a pending claim: every alternative names no memory, is of a
shared class and not allocationMode All; no node has the `count` GPUs it needs (GPUs its selectors allow,
`controller.status.feasibility.selected_by`) with room for the whole-GPU default; and some node has that many
with memory free, where a request naming a memory amount could be placed by memory. An adminAccess request is
charged the default the same way to be placed (docs/architecture.md, "Admin access"); its message says to ask
for `memory: 0`. kube-scheduler's claim for an extended resource asks for whole GPUs by design and is left out.

Allocated memory is counted as the ledger counts it (`controller.ledger.plan` `desired_gpu`): a share's
`consumedCapacity.memory`, all of the GPU for a share that names none, nothing for adminAccess.
"""

from collections.abc import Callable, Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from api import mig
from api.quantity import format_bytes
from controller.core.claims import ClaimView, GpuRequest
from controller.core.slices import DeviceKey, DeviceRecord


class WholeGpu(BaseModel):
    """A request of a pending claim that waits for a GPU with nothing allocated, because it names no memory."""

    model_config = ConfigDict(frozen=True)

    request: str
    message: str


def allocated_memory(devices: Iterable[DeviceRecord], claims: Iterable[ClaimView]) -> dict[DeviceKey, int]:
    """The memory allocated on each shared GPU of `devices` (those with an allocation only)."""
    shared = {d.key: d for d in devices if d.kind == mig.TYPE_GPU and d.allow_multiple}
    used: dict[DeviceKey, int] = {}
    for claim in claims:
        for share in claim.shares:
            device = shared.get(share.device_key)
            if device is not None and not share.admin_access:
                amount = share.memory if share.memory is not None else device.memory_total
                used[device.key] = used.get(device.key, 0) + amount
    return used


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _blocked(
    m: GpuRequest, candidates: Sequence[DeviceRecord], used: dict[DeviceKey, int]
) -> tuple[int, str, list[tuple[int, str]]] | None:
    """For an alternative no node can place whole while some node has room for it by memory: the most GPUs with
    nothing allocated on one node, and the node with the most memory free on the `count` GPUs it needs (that
    many (amount, device), largest first). None otherwise."""
    need = m.count
    whole: dict[str, int] = {}
    free: dict[str, list[tuple[int, str]]] = {}
    for d in candidates:
        if d.default_request != d.memory_total:
            return None  # the default is not the whole GPU (or not known here): not this case
        left = d.memory_total - used.get(d.key, 0)
        if left >= d.memory_total:
            whole[d.node] = whole.get(d.node, 0) + 1
            if whole[d.node] >= need:
                return None
        if left > 0:
            free.setdefault(d.node, []).append((left, d.device))
    roomy = {node: sorted(amounts, reverse=True)[:need] for node, amounts in free.items() if len(amounts) >= need}
    if not roomy:
        return None
    node = max(roomy, key=lambda n: (roomy[n][-1][0], roomy[n][0][0], n))
    return max(whole.values(), default=0), node, roomy[node]


def _message(m: GpuRequest, claim: ClaimView, blocked: tuple[int, str, list[tuple[int, str]]], candidates: int) -> str:
    most, node, amounts = blocked
    if m.count == 1:
        asks = f"request {m.request!r} asks for no capacity.requests.memory"
        takes = "a whole GPU"
        now = f"the most free on one is {format_bytes(amounts[0][0])}, on {amounts[0][1]} of node {node}"
        missing = "every GPU its selectors allow has memory allocated"
    else:
        asks = f"request {m.request!r} asks for {m.count} GPUs and no capacity.requests.memory"
        takes = f"{m.count} whole GPUs of one node"
        now = (
            f"node {node} has {m.count} of them with memory free, the least of those {format_bytes(amounts[-1][0])}; "
            f"the most with nothing allocated on one node is {most}"
        )
        missing = f"no node has {m.count} GPUs its selectors allow with no memory allocated"
    if m.admin_access:
        return (
            f"{asks} and has adminAccess: to place it the scheduler charges it the memory capacity's default, "
            f"all of a GPU's memory, so it waits for {takes} with nothing allocated, and {missing} "
            f"({_gpus(candidates)}; {now}); ask for capacity.requests.memory: 0 to reach a GPU in use (admin access "
            "takes no share of it)"
        )
    where = (
        "in its ResourceClaimTemplate (the pod's claim is made from it)"
        if claim.pod is not None
        else "in a new ResourceClaim (a claim's spec cannot change)"
    )
    return (
        f"{asks}, so it takes {takes} (the memory capacity's default is all of a GPU's memory) and waits until "
        f"{'one has' if m.count == 1 else 'they have'} nothing allocated, but {missing} ({_gpus(candidates)}; "
        f"{now}); to take a share of a GPU instead, ask for capacity.requests.memory (e.g. 10Gi) {where}"
    )


def plan_whole_gpu(
    claim: ClaimView,
    devices: Iterable[DeviceRecord],
    claims: Iterable[ClaimView],
    selected: Callable[[GpuRequest, DeviceRecord], bool],
    shared_classes: Iterable[str],
) -> tuple[WholeGpu, ...]:
    """The requests of the pending `claim` that wait for whole GPUs because they name no memory, while a request
    of a memory amount would have GPUs with memory free (see the module's docstring). `devices`: the published
    devices; `claims`: every claim (the allocated ones hold memory); `selected`: whether an alternative's
    selectors leave it a device; `shared_classes`: our DeviceClasses shared by memory."""
    if claim.allocated or claim.extended_resource:
        return ()
    shared = frozenset(shared_classes)
    wanted = [
        alternatives
        for alternatives in claim.requests
        if all(m.memory is None and m.device_class in shared and not m.all for m in alternatives)
    ]
    if not wanted:
        return ()
    gpus = [d for d in devices if d.kind == mig.TYPE_GPU and d.allow_multiple]
    used = allocated_memory(gpus, claims)
    out = []
    for alternatives in wanted:
        found = []
        for m in alternatives:
            candidates = [d for d in gpus if selected(m, d)]
            blocked = _blocked(m, candidates, used)
            if blocked is None:
                break
            found.append(_message(m, claim, blocked, len(candidates)))
        else:
            out.append(WholeGpu(request=alternatives[0].request, message="; or ".join(found)))
    return tuple(out)
