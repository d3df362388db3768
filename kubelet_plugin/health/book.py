"""What the driver said about each GPU's health, and the ResourceSlice taints that follow (no I/O).

A GPU turns unhealthy on an XID of class degraded/fatal (xid_catalog), on a recovery action the driver reports,
or when it falls off the bus (NVML_ERROR_GPU_IS_LOST). An XID the driver reports on one GPU instance of a MIG GPU
is remembered on the memory slices of that instance's placement (a ``SliceFault``): every partition published on
any of those slices carries its taint, whatever partition is made there later — destroying and making again a
partition is no reset. What was reported is forgotten only on the driver's word that the GPU was reset: it
answers again after being lost, or a recovery action it reported went back to none; or when an operator clears
it (``clear``). An XID without either stays, across plugin restarts too (the caller persists ``snapshot()`` and
``restore``s it): the plugin never guesses that a GPU recovered.
"""

import datetime
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from kubelet_plugin.core.model import TAINT_DOMAIN, TaintEffect
from kubelet_plugin.health.xid_catalog import SEVERITY, HealthClass, classify_action, classify_xid

XID_TAINT = f"{TAINT_DOMAIN}/xid"
LOST_TAINT = f"{TAINT_DOMAIN}/gpu-lost"
RECOVERY_TAINT = f"{TAINT_DOMAIN}/recovery-action"
State = Literal["healthy", "degraded", "fatal"]
STATES: tuple[State, ...] = ("healthy", "degraded", "fatal")


class Placement(NamedTuple):
    """A MIG partition device's GPU (device name) and the memory slices of its placement."""

    gpu: str
    slices: frozenset[int]


class SliceFault(BaseModel):
    """An XID the driver reported on GPU instance ``instance`` of a MIG GPU, remembered on the memory slices of
    that instance's placement; ``partition``: the partition device the instance was, where known."""

    model_config = ConfigDict(frozen=True)

    xid: int
    xid_class: HealthClass
    slices: tuple[int, ...]
    instance: int
    partition: str = ""
    since: str = ""

    def describe(self) -> str:
        """What the driver reported, for Events, taints' readers and the health stream."""
        where = ", ".join(str(s) for s in self.slices)
        return (
            f"XID {self.xid} ({classify_xid(self.xid).name}, {self.xid_class}) on GPU instance {self.instance}, "
            f"memory slices {where}: kept until the driver reports a GPU reset or an operator clears it"
        )


class GpuHealth(BaseModel):
    """One GPU's health as the driver reported it. ``since``: when it last changed (RFC 3339, UTC)."""

    model_config = ConfigDict(frozen=True)

    xid: int | None = None  # the first XID of the worst class since the GPU was last healthy
    xid_class: HealthClass = "ignore"
    lost: bool = False
    recovery_action: int = 0
    reset_seen: bool = False  # lost, or a pending recovery action, since the XID: a reset can be observed
    since: str = ""
    slice_faults: tuple[SliceFault, ...] = ()  # XIDs on GPU instances (MIG): not the whole GPU's state

    @property
    def state(self) -> State:
        """The whole GPU's state (its slice faults are its partitions')."""
        worst = max(
            SEVERITY[self.xid_class] if self.xid is not None else 0,
            SEVERITY[classify_action(self.recovery_action).cls],
            SEVERITY["fatal"] if self.lost else 0,
        )
        return STATES[worst]

    def on(self, slices: frozenset[int]) -> tuple[SliceFault, ...]:
        """The faults remembered on any of ``slices``, worst first."""
        hits = [f for f in self.slice_faults if slices.intersection(f.slices)]
        return tuple(sorted(hits, key=lambda f: -SEVERITY[f.xid_class]))

    def state_on(self, slices: frozenset[int]) -> State:
        """The state of a partition on ``slices``: the GPU's, or worse for a fault on those slices."""
        faults = self.on(slices)
        return STATES[max(STATES.index(self.state), SEVERITY[faults[0].xid_class] if faults else 0)]

    @property
    def worst(self) -> State:
        """The worst state of the GPU or any of its memory slices."""
        return self.state_on(frozenset(s for f in self.slice_faults for s in f.slices))

    def describe(self, slices: frozenset[int] = frozenset()) -> str:
        """What the driver reported about the GPU (and the faults on ``slices``), for Events, logs and the
        health stream."""
        parts = []
        if self.lost:
            parts.append("fell off the bus or became inaccessible (NVML_ERROR_GPU_IS_LOST)")
        if self.xid is not None:
            parts.append(f"XID {self.xid} ({classify_xid(self.xid).name}, {self.xid_class})")
        if self.recovery_action:
            parts.append(f"driver asks for recovery action {classify_action(self.recovery_action).name}")
        parts += [f.describe() for f in self.on(slices)]
        return "; ".join(parts) or "healthy"


class Transition(BaseModel):
    """A device whose state changed: ``what`` the driver reported (or the operator did), for Events and logs."""

    model_config = ConfigDict(frozen=True)

    device: str
    before: State
    after: State
    what: str


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _time(text: str) -> datetime.datetime | None:
    """An RFC 3339 time as a UTC datetime (None: not one)."""
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.replace(tzinfo=parsed.tzinfo or datetime.UTC).astimezone(datetime.UTC)


def _reset_reported(old: GpuHealth) -> str:
    """What the driver reported that counts as a reset of ``old``."""
    if old.lost:
        return "the driver reports a reset: the GPU answers again after NVML_ERROR_GPU_IS_LOST"
    action = classify_action(old.recovery_action).name
    return f"the driver reports a reset: the recovery action it asked for ({action}) is back to none"


class HealthBook:
    """The health of this node's GPUs, updated by the NVML watcher and read by publisher and health stream.
    Thread-safe; every ``record_*`` returns the Transition when a device's state changed (else None)."""

    def __init__(self, devices: Iterable[str], clock: Callable[[], str] = _now) -> None:
        self._gpus = {d: GpuHealth() for d in devices}
        self._lock = threading.Lock()
        self._clock = clock

    def snapshot(self) -> dict[str, GpuHealth]:
        with self._lock:
            return dict(self._gpus)

    def restore(self, remembered: Mapping[str, GpuHealth]) -> None:
        """What an earlier run of the plugin remembered (its XIDs, slice faults and recovery state; lost and
        recovery action are the driver's to say again), for GPUs of this book; no transition."""
        with self._lock:
            for device, health in remembered.items():
                if device in self._gpus:
                    self._gpus[device] = health.model_copy(update={"lost": False})

    def remembers(self) -> bool:
        """Whether any GPU has an XID or slice fault that only a reset or an operator clears."""
        return any(h.xid is not None or h.slice_faults for h in self.snapshot().values())

    def _update(self, device: str, new: GpuHealth, what: str | None = None) -> Transition | None:
        """Set ``device``'s health; a Transition (named ``what``, else the GPU's ``describe``) when its visible
        state changed."""
        with self._lock:
            old = self._gpus.get(device, GpuHealth())
            if new == old:
                return None
            visible = (new.state, new.xid, new.lost, new.recovery_action, new.slice_faults) != (
                old.state,
                old.xid,
                old.lost,
                old.recovery_action,
                old.slice_faults,
            )
            self._gpus[device] = new.model_copy(update={"since": self._clock()}) if visible else new
            if not visible:
                return None
            return Transition(device=device, before=old.worst, after=new.worst, what=what or new.describe())

    def record_xid(self, device: str, xid: int, ignored: frozenset[int], action: int | None) -> Transition | None:
        """An XID critical error event on the whole GPU, with the recovery action read after it (None: not
        reported)."""
        cls = classify_xid(xid, ignored).cls
        old = self.snapshot().get(device, GpuHealth())
        worse = cls != "ignore" and (old.xid is None or SEVERITY[cls] > SEVERITY[old.xid_class])
        action_now = old.recovery_action if action is None else action
        update: dict[str, Any] = {"recovery_action": action_now}
        if worse:
            update |= {"xid": xid, "xid_class": cls}
        # a reset is observable while an action is pending or the GPU is lost; a new XID needs a new one
        update["reset_seen"] = action_now != 0 or old.lost or (old.reset_seen and not worse)
        return self._update(device, old.model_copy(update=update))

    def record_instance_xid(
        self, gpu: str, fault: SliceFault, ignored: frozenset[int], action: int | None
    ) -> Transition | None:
        """An XID event on one GPU instance of MIG GPU ``gpu`` (``fault``: where), with the GPU's recovery
        action read after it; remembered on the fault's memory slices unless one as bad is already there. The
        Transition is the partition's (``fault.partition``, else the GPU's)."""
        cls = classify_xid(fault.xid, ignored).cls
        old = self.snapshot().get(gpu, GpuHealth())
        action_now = old.recovery_action if action is None else action
        slices = frozenset(fault.slices)
        known = old.on(slices)
        new_fault = cls != "ignore" and not (known and SEVERITY[known[0].xid_class] >= SEVERITY[cls])
        update: dict[str, Any] = {"recovery_action": action_now}
        if new_fault:
            stamped = fault.model_copy(update={"xid_class": cls, "since": self._clock()})
            update["slice_faults"] = (*old.slice_faults, stamped)
        update["reset_seen"] = action_now != 0 or old.lost or (old.reset_seen and not new_fault)
        transition = self._update(gpu, old.model_copy(update=update))
        if transition is None or not new_fault:
            return transition
        new = self.snapshot()[gpu]
        return Transition(
            device=fault.partition or gpu,
            before=old.state_on(slices),
            after=new.state_on(slices),
            what=new.describe(slices) if fault.partition else f"{gpu}: {new.describe(slices)}",
        )

    def record_lost(self, device: str) -> Transition | None:
        """The GPU answered NVML_ERROR_GPU_IS_LOST."""
        old = self.snapshot()[device]
        return self._update(device, old.model_copy(update={"lost": True, "reset_seen": True}))

    def record_answer(self, device: str, action: int | None) -> Transition | None:
        """The GPU answered a query; ``action``: its recovery action (None: the driver does not report one).
        Clears the GPU and its memory slices when this is the driver's word that it was reset (see the module
        docstring)."""
        old = self.snapshot()[device]
        action_now = old.recovery_action if action is None else action
        if old.reset_seen and action_now == 0:
            return self._update(device, GpuHealth(since=old.since), _reset_reported(old))
        update: dict[str, Any] = {"lost": False, "recovery_action": action_now}
        if action_now != 0:
            update["reset_seen"] = True
        return self._update(device, old.model_copy(update=update))

    def clear(self, device: str, until: str, by: str) -> Transition | None:
        """An operator's clear (``by``: how it was written): forgets the GPU's XID and slice faults recorded at or
        before RFC 3339 time ``until``; what the driver still reports (lost, a pending recovery action) stays."""
        limit = _time(until)
        old = self.snapshot().get(device)
        if limit is None or old is None:
            return None
        kept = tuple(f for f in old.slice_faults if (_time(f.since) or limit) > limit)
        update: dict[str, Any] = {"slice_faults": kept}
        if old.xid is not None and (_time(old.since) or limit) <= limit:
            update |= {"xid": None, "xid_class": "ignore"}
        new = old.model_copy(update=update)
        what = (
            f"an operator cleared what the driver reported until {until} ({by}); the driver reported no reset; "
            f"now: {new.describe(frozenset(s for f in new.slice_faults for s in f.slices))}"
        )
        return self._update(device, new, what)


class Effects(BaseModel):
    """The taint effect of each class (``--health-degraded-effect``, ``--health-fatal-effect``)."""

    model_config = ConfigDict(frozen=True)

    degraded: TaintEffect = "NoSchedule"
    fatal: TaintEffect = "NoExecute"

    def of(self, cls: HealthClass) -> TaintEffect:
        return self.fatal if cls == "fatal" else self.degraded


def plan_taints(
    health: Mapping[str, GpuHealth], effects: Effects, partitions: Mapping[str, Placement] | None = None
) -> dict[str, list[dict[str, str]]]:
    """Device name -> its ``devices[].taints`` (only devices that have any): for a GPU, one taint per thing the
    driver reported — the XID (value: number and name), the GPU lost, a pending recovery action — with its class's
    effect and ``timeAdded`` = when the GPU's health last changed (stable across republishes); for a partition in
    ``partitions`` (its GPU's taints it gets from its GPU's entry), the worst XID remembered on its memory slices,
    ``timeAdded`` = when that was reported."""
    planned: dict[str, list[dict[str, str]]] = {}
    for device, gpu in sorted(health.items()):
        taints: list[dict[str, str]] = []
        if gpu.lost:
            taints.append({"key": LOST_TAINT, "value": "gpu-is-lost", "effect": effects.of("fatal")})
        if gpu.xid is not None:
            value = f"{gpu.xid}-{classify_xid(gpu.xid).name}"[:63]
            taints.append({"key": XID_TAINT, "value": value, "effect": effects.of(gpu.xid_class)})
        if gpu.recovery_action:
            action = classify_action(gpu.recovery_action)
            taints.append({"key": RECOVERY_TAINT, "value": action.name, "effect": effects.of(action.cls)})
        if taints:
            for taint in taints:
                if gpu.since:
                    taint["timeAdded"] = gpu.since
            planned[device] = taints
    for name, placement in sorted((partitions or {}).items()):
        faults = health.get(placement.gpu, GpuHealth()).on(placement.slices)
        if faults:  # one taint: with its GPU's three, a device's at most four
            f = faults[0]
            taint = {"key": XID_TAINT, "value": f"{f.xid}-{classify_xid(f.xid).name}"[:63],
                     "effect": effects.of(f.xid_class)}  # fmt: skip
            planned[name] = [taint | ({"timeAdded": f.since} if f.since else {})]
    return planned
