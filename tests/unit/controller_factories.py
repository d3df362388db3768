"""Factories and fakes shared by the controller's unit tests: slices as the node plugin builds them, claims,
allocation results, an in-memory `Writer`, kopf-shaped indexes, and `eventually`."""

import asyncio
import json
from collections.abc import Callable
from typing import Any

from api.kube_errors import api_error
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import GiB, MiB
from controller.core.claims import ClaimView, PodRef, claim_view
from controller.core.kube import pod_event_name
from controller.core.slices import SliceView, TaintRuleView, slice_view
from controller.ledger.plan import ExistingGpu
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.publishing.slices import build_slices

NODE = "node-a"
ALREADY_EXISTS = {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409}


def gpu(index: int, memory_gib: int = 80, model: str = "NVIDIA H100 80GB HBM3") -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:08d}-1111-2222-3333-444444444444",
        product_name=model,
        memory_total_bytes=memory_gib * GiB,
        minor=index,
        pci_bus_id=f"0000:{index + 16:02x}:00.0",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        driver_version="580.65.06",
    )


def slices(node: str = NODE, count: int = 2, generation: int = 1, memory_gib: int = 80) -> list[dict[str, Any]]:
    return build_slices(
        node,
        "uid-" + node,
        DRIVER_NAME,
        [gpu(i, memory_gib) for i in range(count)],
        step=256 * MiB,
        reserve=0,
        generation=generation,
    )


def result(request: str, device: str, memory: str | None, share: str | None, pool: str = NODE) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": DRIVER_NAME, "pool": pool, "device": device}
    if share:
        out["shareID"] = share
    if memory:
        out["consumedCapacity"] = {"memory": memory}
    return out


def claim(
    name: str = "c1",
    *,
    results: list[dict[str, Any]] | None = None,
    requests: list[dict[str, Any]] | None = None,
    devices_status: list[dict[str, Any]] | None = None,
    namespace: str = "ns",
    node: str = NODE,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": requests
                if requests is not None
                else [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_NAME}}]
            }
        },
        "status": {},
    }
    if results is not None:
        body["status"]["allocation"] = {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            },
        }
    if devices_status is not None:
        body["status"]["devices"] = devices_status
    return body


def memory_request(name: str, memory: str, device_class: str = DEVICE_CLASS_NAME) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, "capacity": {"requests": {"memory": memory}}}}


class FakeWriter:
    """Records writes; `fail` makes the next calls raise the given errors in turn.

    `event_results` makes the next Event posts answer these results in turn (True: posted).
    """

    def __init__(self) -> None:
        self.claims: list[tuple[str, str, dict[str, Any]]] = []
        self.gpus: list[tuple[str, bool]] = []
        self.gpu_status: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        self.event_attempts: list[tuple[str, ...]] = []
        self.event_results: list[bool] = []
        self.fail: list[Exception] = []
        self.leases: list[dict[str, Any]] = []
        """What `list_heartbeats` answers."""
        self.taint_rules: dict[str, dict[str, Any]] = {}
        """The DeviceTaintRules as the API server has them (what `read_taint_rule` answers): created, applied,
        deleted; a test edits them to play someone else."""
        self.rule_writes: list[tuple[str, str]] = []
        """(verb, name) of each DeviceTaintRule write, in order: create, apply, delete."""
        self.rule_events: list[tuple[str, str, str, str]] = []
        """(rule name, uid, reason, message) of each Event posted about a DeviceTaintRule."""
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        """The Pods as the API server has them, by (namespace, name): what `read_pod` and `list_unbound_pods`
        answer."""
        self.pod_reads: list[tuple[str, str]] = []
        """("get", name) or ("list", namespace) of each pod read, in order."""
        self.pod_fail: list[Exception] = []
        """Errors the next pod reads raise, in turn."""
        self.pod_events: dict[str, tuple[str, str, str, str]] = {}
        """Events on pods as the API server keeps them, by Event name: (pod name, pod uid, reason, message); a post
        of an existing name creates nothing (AlreadyExists counts as posted)."""
        self.pod_event_results: list[bool] = []
        """The next pod Event posts answer these in turn (False: failed, nothing created)."""

    def _maybe_fail(self) -> None:
        if self.fail:
            raise self.fail.pop(0)

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._maybe_fail()
        self.claims.append((namespace, name, body))

    def apply_gpu(self, body: dict[str, Any], *, status: bool) -> None:
        self._maybe_fail()
        self.gpus.append((body["metadata"]["name"], status))
        if status:
            self.gpu_status[body["metadata"]["name"]] = body["status"]

    def delete_gpu(self, name: str) -> None:
        self._maybe_fail()
        self.deleted.append(name)

    def post_claim_event(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        self.event_attempts.append((claim.uid, *key))
        if self.event_results and not self.event_results.pop(0):
            return False
        self.events.append((claim.name, reason, message))
        return True

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.pod_reads.append(("get", name))
        if self.pod_fail:
            raise self.pod_fail.pop(0)
        return self.pods.get((namespace, name))

    def list_unbound_pods(self, namespace: str) -> list[dict[str, Any]]:
        self.pod_reads.append(("list", namespace))
        if self.pod_fail:
            raise self.pod_fail.pop(0)
        return [b for (ns, _), b in self.pods.items() if ns == namespace and not b["spec"].get("nodeName")]

    def post_pod_event(self, namespace: str, pod: PodRef, about: tuple[str, ...], reason: str, message: str) -> bool:
        if self.pod_event_results and not self.pod_event_results.pop(0):
            return False
        self.pod_events.setdefault(pod_event_name(pod, about), (pod.name, pod.uid, reason, message))
        return True

    def list_heartbeats(self, namespace: str) -> list[dict[str, Any]]:
        self._maybe_fail()
        return list(self.leases)

    def create_taint_rule(self, body: dict[str, Any]) -> str:
        self._maybe_fail()
        name = body["metadata"]["name"]
        if name in self.taint_rules:
            raise api_error(409, "AlreadyExists", json.dumps(ALREADY_EXISTS))
        uid = f"uid-rule-{len(self.rule_writes)}"
        self.taint_rules[name] = {**body, "metadata": {**body["metadata"], "uid": uid}}
        self.rule_writes.append(("create", name))
        return uid

    def read_taint_rule(self, name: str) -> dict[str, Any] | None:
        self._maybe_fail()
        return self.taint_rules.get(name)

    def apply_taint_rule(self, body: dict[str, Any]) -> None:
        self._maybe_fail()
        name = body["metadata"]["name"]
        uid = (self.taint_rules.get(name) or {}).get("metadata", {}).get("uid", f"uid-rule-{len(self.rule_writes)}")
        self.taint_rules[name] = {**body, "metadata": {**body["metadata"], "uid": uid}}
        self.rule_writes.append(("apply", name))

    def delete_taint_rule(self, name: str) -> None:
        self._maybe_fail()
        self.taint_rules.pop(name, None)
        self.rule_writes.append(("delete", name))

    def post_taint_rule_event(self, name: str, uid: str, reason: str, message: str) -> bool:
        self.rule_events.append((name, uid, reason, message))
        return True


class World:
    """kopf-shaped indexes (key -> list of values) the tests edit directly."""

    def __init__(self, gpu_count: int = 2) -> None:
        self.slices: dict[str, list[SliceView]] = {}
        self.claims: dict[tuple[str, str], list[ClaimView]] = {}
        self.gpus: dict[str, list[ExistingGpu]] = {}
        self.rules: dict[str, list[TaintRuleView]] = {}
        """DeviceTaintRules that may select our devices (bind it as `taint_rules`)."""
        self.publish(gpu_count)

    def publish(self, count: int, generation: int = 1) -> None:
        self.slices.clear()
        for body in slices(count=count, generation=generation):
            view = slice_view(body, DRIVER_NAME)
            assert view is not None
            self.slices[view.name] = [view]

    def put(self, body: dict[str, Any]) -> tuple[str, str]:
        view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
        assert view is not None
        self.claims[view.key] = [view]
        return view.key


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)
