"""What the driver said about each GPU's health, and the ResourceSlice taints that follow (no I/O).

A GPU turns unhealthy on an XID of class degraded/fatal (xid_catalog), on a recovery action the driver reports,
or, for a MIG partition (a device of its own, recorded the first time the driver reports an XID on its GPU
instance; a GPU-wide XID is the GPU's, whose taints its partitions carry too), on an XID on it,
or when it falls off the bus (NVML_ERROR_GPU_IS_LOST). It turns healthy again only on the driver's word that it
was reset: it answers again after being lost, or its recovery action went from pending to none; its XID state
is then forgotten. An XID without either (a driver that reports no recovery action) stays until the plugin
restarts, e.g. after a driver reload: the plugin never guesses that a GPU recovered.
"""

import datetime
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from kubelet_plugin.core.model import TAINT_DOMAIN, TaintEffect
from kubelet_plugin.health.xid_catalog import SEVERITY, HealthClass, classify_action, classify_xid

XID_TAINT = f"{TAINT_DOMAIN}/xid"
LOST_TAINT = f"{TAINT_DOMAIN}/gpu-lost"
RECOVERY_TAINT = f"{TAINT_DOMAIN}/recovery-action"
State = Literal["healthy", "degraded", "fatal"]
STATES: tuple[State, ...] = ("healthy", "degraded", "fatal")


class GpuHealth(BaseModel):
    """One GPU's health as the driver reported it. ``since``: when it last changed (RFC 3339, UTC)."""

    model_config = ConfigDict(frozen=True)

    xid: int | None = None  # the first XID of the worst class since the GPU was last healthy
    xid_class: HealthClass = "ignore"
    lost: bool = False
    recovery_action: int = 0
    reset_seen: bool = False  # lost, or a pending recovery action, since the XID: a reset can be observed
    since: str = ""

    @property
    def state(self) -> State:
        worst = max(
            SEVERITY[self.xid_class] if self.xid is not None else 0,
            SEVERITY[classify_action(self.recovery_action).cls],
            SEVERITY["fatal"] if self.lost else 0,
        )
        return STATES[worst]

    def describe(self) -> str:
        """What happened, for Events, logs and the health stream."""
        parts = []
        if self.lost:
            parts.append("fell off the bus or became inaccessible (NVML_ERROR_GPU_IS_LOST)")
        if self.xid is not None:
            parts.append(f"XID {self.xid} ({classify_xid(self.xid).name}, {self.xid_class})")
        if self.recovery_action:
            parts.append(f"driver asks for recovery action {classify_action(self.recovery_action).name}")
        return "; ".join(parts) or "healthy"


class Transition(BaseModel):
    """A GPU whose state changed."""

    model_config = ConfigDict(frozen=True)

    device: str
    before: State
    after: GpuHealth


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class HealthBook:
    """The health of this node's GPUs, updated by the NVML watcher and read by publisher and health stream.
    Thread-safe; every ``record_*`` returns the Transition when the GPU's state changed (else None)."""

    def __init__(self, devices: Iterable[str], clock: Callable[[], str] = _now) -> None:
        self._gpus = {d: GpuHealth() for d in devices}
        self._lock = threading.Lock()
        self._clock = clock

    def snapshot(self) -> dict[str, GpuHealth]:
        with self._lock:
            return dict(self._gpus)

    def _update(self, device: str, new: GpuHealth) -> Transition | None:
        with self._lock:
            old = self._gpus.get(device, GpuHealth())
            if new == old:
                return None
            visible = (new.state, new.xid, new.lost, new.recovery_action) != (
                old.state,
                old.xid,
                old.lost,
                old.recovery_action,
            )
            self._gpus[device] = new.model_copy(update={"since": self._clock()}) if visible else new
            return Transition(device=device, before=old.state, after=self._gpus[device]) if visible else None

    def record_xid(self, device: str, xid: int, ignored: frozenset[int], action: int | None) -> Transition | None:
        """An XID critical error event, with the recovery action read after it (None: not reported)."""
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

    def forget(self, devices: Iterable[str]) -> list[Transition]:
        """MIG partitions that are gone (their instances destroyed): what was reported on them no longer holds;
        the transitions of those that were unhealthy."""
        out = []
        for device in devices:
            with self._lock:
                old = self._gpus.pop(device, None)
            if old is not None and old.state != "healthy":
                out.append(Transition(device=device, before=old.state, after=GpuHealth(since=self._clock())))
        return out

    def record_lost(self, device: str) -> Transition | None:
        """The GPU answered NVML_ERROR_GPU_IS_LOST."""
        old = self.snapshot()[device]
        return self._update(device, old.model_copy(update={"lost": True, "reset_seen": True}))

    def record_answer(self, device: str, action: int | None) -> Transition | None:
        """The GPU answered a query; ``action``: its recovery action (None: the driver does not report one).
        Clears the GPU when this is the driver's word that it was reset (see the module docstring)."""
        old = self.snapshot()[device]
        action_now = old.recovery_action if action is None else action
        if old.reset_seen and action_now == 0:
            return self._update(device, GpuHealth(since=old.since))
        update: dict[str, Any] = {"lost": False, "recovery_action": action_now}
        if action_now != 0:
            update["reset_seen"] = True
        return self._update(device, old.model_copy(update=update))


class Effects(BaseModel):
    """The taint effect of each class (``--health-degraded-effect``, ``--health-fatal-effect``)."""

    model_config = ConfigDict(frozen=True)

    degraded: TaintEffect = "NoSchedule"
    fatal: TaintEffect = "NoExecute"

    def of(self, cls: HealthClass) -> TaintEffect:
        return self.fatal if cls == "fatal" else self.degraded


def plan_taints(health: Mapping[str, GpuHealth], effects: Effects) -> dict[str, list[dict[str, str]]]:
    """Device name -> its ``devices[].taints`` (only GPUs that have any): one taint per thing the driver
    reported — the XID (value: number and name), the GPU lost, a pending recovery action — with its class's
    effect and ``timeAdded`` = when the GPU's health last changed (stable across republishes)."""
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
    return planned
