"""Which pending MIG requests wait because the free slices of the MIG GPUs are fragmented (pure).

A partition consumes the memory-slice counters of its placement and its profile's compute slices
(docs/architecture.md, "MIG partitions"): a GPU may have enough free memory and compute slices, by count, for a
profile that holds a request while every placement of that profile overlaps an allocated partition. The scheduler
then says only "cannot allocate all claims". `plan_mig_fragmented` finds that case for each memory request of the
MIG DeviceClass (a request of one alternative, one device) of a pending claim: no MIG GPU has a free
placement of a partition that holds the request and passes its selectors, and some GPU has the slices by count.
Its message names, per such GPU, the free memory slices, the allocated partitions in the way (their placements
and claims), what releasing claims would free, and the largest partition free there now.

Used slices are those of the allocated partitions, counted as the ledger counts them (`controller.ledger.plan`
`desired_gpu`: a share with adminAccess takes none). Nothing is said while some GPU has a free placement for the
request (the scheduler would place it), nor when no GPU has the slices by count (the request waits for slices,
or can never fit: `controller.status.feasibility`).
"""

from collections.abc import Callable, Iterable, Sequence
from functools import partial

from pydantic import BaseModel, ConfigDict

from api import mig
from api.quantity import format_bytes
from controller.core.claims import ClaimView, GpuRequest
from controller.core.slices import DeviceKey, DeviceRecord

MAX_GPUS = 3
"""GPUs described per message; the rest are counted."""


class Fragmented(BaseModel):
    """A request of a pending claim that waits for an aligned placement of a MIG partition."""

    model_config = ConfigDict(frozen=True)

    request: str
    message: str


class _Gpu:
    """One MIG GPU with MIG enabled: its partitions and which of them are allocated, to which claims."""

    def __init__(self, parent: DeviceRecord, partitions: list[DeviceRecord]) -> None:
        self.parent = parent
        self.partitions = partitions
        self.held: dict[DeviceKey, list[str]] = {}  # allocated partition -> its claims (namespace/name)
        self._used: tuple[set[int], int] | None = None  # once `held` is complete

    def slices(self, p: DeviceRecord) -> range:
        start = p.placement_start or 0
        return range(start, start + (p.memory_slices or 0))

    def used(self, without: frozenset[DeviceKey] = frozenset()) -> tuple[set[int], int]:
        """The memory slices and the count of compute slices the allocated partitions take (less `without`)."""
        if not without:
            if self._used is None:
                self._used = self._count(without)
            return self._used
        return self._count(without)

    def _count(self, without: frozenset[DeviceKey]) -> tuple[set[int], int]:
        memory: set[int] = set()
        compute = 0
        for p in self.partitions:
            if p.key in self.held and p.key not in without:
                memory.update(self.slices(p))
                compute += p.compute_slices or 0
        return memory, compute

    def free(self, p: DeviceRecord, without: frozenset[DeviceKey] = frozenset()) -> bool:
        """The placement of `p` is free: none of its memory slices is used and its compute slices are left."""
        memory, compute = self.used(without)
        total = self.parent.compute_slices or 0
        return not memory.intersection(self.slices(p)) and (p.compute_slices or 0) <= total - compute

    def by_count(self, p: DeviceRecord) -> bool:
        """The GPU's free memory and compute slices hold `p`'s, by count."""
        memory, compute = self.used()
        free_memory = (self.parent.memory_slices or 0) - len(memory)
        return (p.memory_slices or 0) <= free_memory and (p.compute_slices or 0) <= (
            self.parent.compute_slices or 0
        ) - compute

    def in_the_way(self, p: DeviceRecord) -> list[DeviceRecord]:
        """The allocated partitions whose memory slices overlap the placement of `p`."""
        span = set(self.slices(p))
        return [h for h in self.partitions if h.key in self.held and span.intersection(self.slices(h))]


def spans(slices: Iterable[int]) -> str:
    """Slice numbers as runs: ``0-1, 3-5, 7``."""
    runs: list[list[int]] = []
    for s in sorted(slices):
        if runs and runs[-1][1] == s - 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def _size(p: DeviceRecord) -> tuple[int, int]:
    return (p.memory_slices or 0, p.compute_slices or 0)


def _profiles(partitions: Iterable[DeviceRecord]) -> list[str]:
    """The profiles of `partitions`, smallest first (memory slices, then compute slices)."""
    sizes = {p.profile or p.device: _size(p) for p in partitions}
    return sorted(sizes, key=lambda n: (sizes[n], n))


def _claims(names: Sequence[str]) -> str:
    return f"claim{'s' if len(names) != 1 else ''} {', '.join(names)}"


def _gpu_name(gpu: _Gpu) -> str:
    return f"GPU {gpu.parent.index} ({gpu.parent.device}) of node {gpu.parent.node}"


def _describe(gpu: _Gpu, holding: list[DeviceRecord], selected: Callable[[DeviceRecord], bool]) -> str:
    """What `gpu` has free, what is in the way of the partitions `holding` the request, and what would help."""
    memory, compute = gpu.used()
    total_memory, total_compute = gpu.parent.memory_slices or 0, gpu.parent.compute_slices or 0
    free = [s for s in range(total_memory) if s not in memory]
    placements = "; ".join(
        f"{name} at {', '.join(str(p.placement_start) for p in holding if (p.profile or p.device) == name)}"
        for name in _profiles(holding)
    )
    blocking = sorted(
        {h.key: h for p in holding for h in gpu.in_the_way(p)}.values(), key=lambda h: h.placement_start or 0
    )
    way = ", ".join(f"{h.profile} at {h.placement_start} ({_claims(gpu.held[h.key])})" for h in blocking)
    text = (
        f"on {_gpu_name(gpu)} memory slices {spans(free)} are free ({len(free)} of {total_memory}) and "
        f"{total_compute - compute} of {total_compute} compute slices, but every placement of "
        f"{', '.join(_profiles(holding))} ({placements}) overlaps an allocated partition: {way}"
    )
    options = []
    for p in holding:
        blockers = gpu.in_the_way(p)
        released = frozenset(h.key for h in blockers)
        if gpu.free(p, released):
            claims = sorted({c for h in blockers for c in gpu.held[h.key]})
            options.append(
                (len(claims), p.memory_slices or 0, p.compute_slices or 0, p.placement_start or 0, claims, p)
            )
    if options:
        *_, claims, best = min(options, key=lambda o: o[:4])
        text += f"; releasing {_claims(claims)} would free {best.profile} at {best.placement_start}"
    room = [p for p in gpu.partitions if gpu.free(p) and selected(p)]
    if room:
        largest = max(room, key=lambda p: (p.memory_total, -(p.memory_slices or 0), -(p.compute_slices or 0)))
        text += (
            f"; the largest partition free there now is {largest.profile} at {largest.placement_start} "
            f"({format_bytes(largest.memory_total)}): a request of at most that much fits there now"
        )
    return text


def mig_gpus(devices: Iterable[DeviceRecord], claims: Iterable[ClaimView]) -> list["_Gpu"]:
    """The MIG GPUs with MIG enabled, with their partitions and the claims allocated on them."""
    devices = list(devices)
    parents = {
        (d.pool, d.device): _Gpu(d, [])
        for d in devices
        if d.kind == mig.TYPE_MIG_PARENT and d.mig_state == "enabled" and d.memory_slices and d.compute_slices
    }
    by_key: dict[DeviceKey, _Gpu] = {}
    for d in sorted(devices, key=lambda d: d.key):
        gpu = parents.get((d.pool, d.ledger_device)) if d.kind == mig.TYPE_MIG else None
        if gpu is not None and d.placement_start is not None and d.memory_slices and d.compute_slices:
            gpu.partitions.append(d)
            by_key[d.key] = gpu
    for claim in claims:
        for share in claim.shares:
            if not share.admin_access and (gpu := by_key.get(share.device_key)) is not None:
                gpu.held.setdefault(share.device_key, []).append(f"{claim.namespace}/{claim.name}")
    return sorted(parents.values(), key=lambda g: (g.parent.node, g.parent.index or 0, g.parent.device))


def plan_mig_fragmented(
    claim: ClaimView,
    devices: Iterable[DeviceRecord],
    claims: Iterable[ClaimView],
    selected: Callable[[GpuRequest, DeviceRecord], bool],
    mig_class: str,
) -> tuple[Fragmented, ...]:
    """The memory requests of the pending `claim` of DeviceClass `mig_class` that no MIG GPU has a free aligned
    placement for while some GPU has the free slices by count. `devices`: the published devices; `claims`: every
    claim (the allocated ones hold partitions); `selected`: whether a request's selectors leave it a device
    (`controller.status.feasibility.selected_by`)."""
    if claim.allocated:
        return ()
    wanted = [
        alternatives[0]
        for alternatives in claim.memory_requests
        if len(alternatives) == 1 and alternatives[0].device_class == mig_class
        and alternatives[0].count == 1 and not alternatives[0].all
    ]  # fmt: skip
    if not wanted:
        return ()
    gpus = mig_gpus(devices, claims)
    out = []
    for m in wanted:
        memory = m.memory or 0
        crowded: list[tuple[_Gpu, list[DeviceRecord]]] = []
        room = False
        for gpu in gpus:
            holding = [p for p in gpu.partitions if p.max_request >= memory and selected(m, p)]
            if any(gpu.free(p) for p in holding):
                room = True
                break
            if fits := [p for p in holding if gpu.by_count(p)]:
                crowded.append((gpu, fits))
        if room or not crowded:
            continue
        profiles = _profiles(p for _, fits in crowded for p in fits)
        parts = [_describe(gpu, fits, partial(selected, m)) for gpu, fits in crowded[:MAX_GPUS]]
        more = f"; and {len(crowded) - MAX_GPUS} more GPU(s) alike" if len(crowded) > MAX_GPUS else ""
        message = (
            f"request {m.request!r} asks for {format_bytes(memory)} of GPU memory, which a "
            f"{' or '.join(profiles)} partition would hold in the free slices of a MIG GPU, but none has a free "
            "aligned placement of one: a partition takes the memory slices of its placement, and the scheduler "
            "reports only that it cannot allocate the claim; " + "; ".join(parts) + more
        )
        out.append(Fragmented(request=m.request, message=message))
    return tuple(out)
