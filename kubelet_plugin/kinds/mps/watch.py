"""The MPS daemons' health as the node plugin reports it: a taint on an MPS GPU whose daemon is down (no new
share is scheduled there; prepare would refuse it), Events on the Node and on every claim prepared on that GPU
when its daemon goes down, restarts or comes back, one of its servers exits, its control socket was found
replaced, or its limits were found changed (and set again), and a gauge per GPU.

The daemons are the MPS supervisor's (``kubelet_plugin/mps_supervisor``); this reads their status files
(``kubelet_plugin/state/mps_files.py``) every ``--health-probe-interval`` seconds, and reads each running daemon's
limits back through the preparer (``repair``), which sets them again where a client of the GPU's trust domain
changed them with control commands.
"""

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from api.kube_rest import KubeRest
from kubelet_plugin.core.coalesce import Coalescer
from kubelet_plugin.core.events import post_node_event, post_object_event
from kubelet_plugin.core.model import TAINT_DOMAIN, GpuInfo
from kubelet_plugin.core.settings import Settings, is_mps_gpu
from kubelet_plugin.state import mps_files as mps
from kubelet_plugin.state.checkpoint import read_claims_on

log = logging.getLogger(__name__)
MPS_TAINT = f"{TAINT_DOMAIN}/mps-daemon-down"
DOWN_REASON = "MpsDaemonDown"
RESTARTED_REASON = "MpsDaemonRestarted"
UP_REASON = "MpsDaemonRecovered"
SERVER_REASON = "MpsServerExited"
SOCKET_REASON = "MpsControlSocketReplaced"
LIMITS_REASON = "MpsLimitsChanged"
Reader = Callable[[GpuInfo], tuple[mps.DaemonStatus | None, str | None]]
Repair = Callable[[str], list[str]]
"""``repair(uuid)``: read the GPU's MPS limits back, set them again where they differ; what differed."""


class MpsWatch:
    """`check()` compares each MPS GPU's daemon with what it saw last and reports what changed; `run(stop)`
    checks every `interval` seconds. `changes` is notified when a taint comes or goes."""

    def __init__(
        self,
        gpus: list[GpuInfo],
        read: Reader,
        registry: CollectorRegistry,
        *,
        post: Callable[[str, str, str, str], None] | None = None,
        changes: Coalescer | None = None,
        interval: float = 5.0,
        on_up: Callable[[str], None] | None = None,
        repair: Repair | None = None,
    ) -> None:
        """`on_up(uuid)`: called when a GPU's daemon is back or was restarted (it starts without the ceiling);
        `repair`: called for each GPU whose daemon runs, at every check."""
        self._gpus = gpus
        self._read = read
        self._post = post or (lambda *_: None)
        self._interval = interval
        self._on_up = on_up or (lambda _: None)
        self._repair = repair or (lambda _: [])
        self._socket_replacements: dict[str, int] = {}
        self._down: dict[str, str] = {}  # device -> why
        self._restarts: dict[str, int] = {}
        self._server_exits: dict[str, int] = {}
        self._lock = threading.Lock()
        self.changes = changes or Coalescer(0.0)
        self._up = Gauge(
            "fracgpu_mps_daemon_up",
            "1 while the MPS GPU's control daemon runs (as its supervisor last wrote), else 0",
            ["device", "uuid"],
            registry=registry,
        )
        for gpu in gpus:  # each starts as up: the first check posts a down that is already the case
            self._up.labels(gpu.device_name, gpu.uuid).set(1)

    def check(self) -> list[tuple[str, str, str]]:
        """Read every MPS GPU's status; (device, Event reason, message) for each change since the last check."""
        events = []
        for gpu in self._gpus:
            status, problem = self._read(gpu)
            if status is not None and status.state == "switching" and mps.is_fresh(status):
                problem = None  # a new trust domain's daemon is on its way: nothing is wrong
            device = gpu.device_name
            restarts = status.restarts if status is not None else None
            exits = status.server_exits if status is not None else None
            replaced = status.socket_replacements if status is not None else None
            with self._lock:
                replaced_before = self._socket_replacements.get(device)
                if replaced is not None:
                    self._socket_replacements[device] = replaced
                was_down = device in self._down
                before = self._restarts.get(device)
                exits_before = self._server_exits.get(device)
                if exits is not None:
                    self._server_exits[device] = exits
                if problem is None:
                    self._down.pop(device, None)
                else:
                    self._down[device] = problem
                if restarts is not None:
                    self._restarts[device] = restarts
            self._up.labels(device, gpu.uuid).set(0 if problem else 1)
            where = f"GPU {device} ({gpu.uuid})"
            if problem is not None and not was_down:
                events.append((device, DOWN_REASON, f"the MPS control daemon of {where} is not running: new MPS "
                               f"shares there are refused and its clients have lost their server; {problem}"))  # fmt: skip
            elif problem is None and was_down:
                events.append((device, UP_REASON, f"the MPS control daemon of {where} runs again"))
            elif problem is None and before is not None and restarts is not None and restarts > before:
                events.append((device, RESTARTED_REASON, f"the MPS control daemon of {where} was restarted by "
                               "its supervisor: clients connected before lost their MPS server"))  # fmt: skip
            elif problem is None and exits_before is not None and exits is not None and exits > exits_before:
                events.append((device, SERVER_REASON, f"an MPS server of {where} exited: its clients lost the GPU "
                               "(processes of claims on it that used CUDA must be restarted); new clients get a "
                               "new server"))  # fmt: skip
            if replaced is not None and replaced_before is not None and replaced > replaced_before:
                events.append((device, SOCKET_REASON, f"the control socket of the MPS daemon of {where} was removed "
                               "or replaced by something other than the daemon: the supervisor restarted the daemon "
                               "(clients connected before lost their server)"))  # fmt: skip
            if (problem is None) == was_down:
                self.changes.notify()
        return events

    def repair(self) -> list[tuple[str, str, str]]:
        """Read the limits of every running MPS daemon back and set them again where they changed; (device, Event
        reason, message) for each GPU where they had."""
        events = []
        for gpu in self._gpus:
            with self._lock:
                if gpu.device_name in self._down:
                    continue
            try:
                changed = self._repair(gpu.uuid)
            except Exception as err:  # a daemon between two states, the node lock held long: next round
                log.warning("cannot read the MPS limits back", extra={"uuid": gpu.uuid, "error": str(err)})
                continue
            if changed:
                events.append((gpu.device_name, LIMITS_REASON, f"the MPS limits of GPU {gpu.device_name} "
                               f"({gpu.uuid}) were changed through its control daemon, by a client of its trust "
                               f"domain or another process that reaches it: {'; '.join(changed)}. They were set "
                               "back to the ceiling of the claims on the GPU; CUDA processes that started in "
                               "between keep what they got until they exit"))  # fmt: skip
        return events

    def taints(self) -> dict[str, list[dict[str, str]]]:
        """Device name -> its MPS taint, for the GPUs whose daemon is down."""
        with self._lock:
            return {d: [{"key": MPS_TAINT, "value": "down", "effect": "NoSchedule"}] for d in sorted(self._down)}

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                for device, reason, message in [*self.check(), *self.repair()]:
                    log.warning("MPS daemon", extra={"device": device, "reason": reason, "detail": message})
                    if reason in (UP_REASON, RESTARTED_REASON):
                        self._on_up(next(g.uuid for g in self._gpus if g.device_name == device))
                    self._post(device, reason, message, "Normal" if reason == UP_REASON else "Warning")
            except Exception:
                log.exception("checking the MPS daemons failed")
            stop.wait(self._interval)


def event_poster(rest: KubeRest, node: str, checkpoint_path: Path) -> Callable[[str, str, str, str], None]:
    """Posts an MPS Event on the Node and on each claim the checkpoint lists on the device."""

    def post(device: str, reason: str, message: str, type_: str) -> None:
        post_node_event(rest, node, reason, message, type_)
        for namespace, name, uid in read_claims_on(checkpoint_path, device):
            involved = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": namespace,
                        "name": name, "uid": uid}  # fmt: skip
            post_object_event(rest, involved, node, reason, message, type_=type_)

    return post


def mps_gpus(settings: Settings, gpus: list[GpuInfo]) -> list[GpuInfo]:
    """The GPUs `--mps-gpus` names."""
    return [g for g in gpus if is_mps_gpu(settings.mps_gpus, g.index, g.uuid)]


def status_reader(settings: Settings) -> Reader:
    return lambda gpu: mps.read_status(settings.mps_root, gpu.uuid)
