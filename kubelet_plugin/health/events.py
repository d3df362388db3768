"""Events about GPU health changes: on the Node, and on each claim prepared on that GPU (from the checkpoint).

Posted from a thread of its own so that the NVML watcher never waits on the API server.
"""

import logging
import queue
import threading
from pathlib import Path

from api.kube_rest import KubeRest
from kubelet_plugin.core.events import post_node_event, post_object_event
from kubelet_plugin.health.book import Transition
from kubelet_plugin.state.checkpoint import read_claims_on

log = logging.getLogger(__name__)
UNHEALTHY_REASON = "GpuUnhealthy"
HEALTHY_REASON = "GpuHealthy"


def message(transition: Transition) -> str:
    """The Events' text: the new state and what the driver reported (or the operator did)."""
    if transition.after == "healthy":
        return f"GPU {transition.device} is healthy again (was {transition.before}): {transition.what}"
    return f"GPU {transition.device} is {transition.after}: {transition.what}"


class HealthEventPoster:
    """``submit(transition)`` from any thread; ``run(stop)`` posts the Events."""

    def __init__(self, rest: KubeRest, node: str, checkpoint_path: Path) -> None:
        self._rest = rest
        self._node = node
        self._checkpoint = checkpoint_path
        self._queue: queue.SimpleQueue[Transition] = queue.SimpleQueue()

    def submit(self, transition: Transition) -> None:
        self._queue.put(transition)

    def post(self, transition: Transition) -> None:
        """The Node's Event and one per claim on the GPU."""
        healthy = transition.after == "healthy"
        reason, type_ = (HEALTHY_REASON, "Normal") if healthy else (UNHEALTHY_REASON, "Warning")
        text = message(transition)
        post_node_event(self._rest, self._node, reason, text, type_)
        for namespace, name, uid in read_claims_on(self._checkpoint, transition.device):
            involved = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": namespace,
                        "name": name, "uid": uid}  # fmt: skip
            post_object_event(self._rest, involved, self._node, reason, text, type_=type_)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                transition = self._queue.get(timeout=1)
            except queue.Empty:
                continue
            try:
                self.post(transition)
            except Exception:
                log.exception("posting GPU health Events failed", extra={"gpu": transition.device})
