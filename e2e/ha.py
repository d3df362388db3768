"""Controller high availability on a local cluster: who leads, killing it, a burst of claims, admission probes.

Shared by e2e/test_ha.py and e2e/bench/ha_bench.py. The burst's claims are allocated by the real scheduler for
pods pinned to a fake Node (a Node object with GPUs published as the node plugin builds them, no kubelet behind
it): their containers never run, so a hundred claims cost the cluster an allocation each, and the controller sees
exactly what it sees of real pods.
"""

import contextlib
import datetime
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.gpu import GPU_PLURAL, GPU_VERSION
from api.names import API_GROUP, DEVICE_CLASS_NAME, DRIVER_NAME
from e2e import workloads as w
from e2e.install import NAMESPACE, RELEASE
from harness import kube
from kubelet_plugin.usage.cgroups import CgroupUnreadableError, pod_of_pid

LEASE = f"{RELEASE}-controller"  # the chart's controller full name, for the release name the harness installs
CONTROLLER_PODS = "app.kubernetes.io/component=controller"
FAKE_GPUS = 8
CLAIM_MEMORY = "4Gi"  # 100 claims fit the fake node's 8 x 80Gi


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A kubernetes client of the cluster admin."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


def holder(api: client.ApiClient) -> tuple[str | None, int]:
    """The leader Lease's holder identity (`<pod>_<random per process>`; None when nobody holds it) and its
    leaseTransitions."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, NAMESPACE)
    except ApiException as err:
        if err.status == 404:
            return None, 0
        raise
    return (lease.spec.holder_identity or None), int(lease.spec.lease_transitions or 0)


def leader(api: client.ApiClient) -> str | None:
    """The pod holding the leader Lease, None when nobody holds it."""
    identity, _ = holder(api)
    return (identity or "").rsplit("_", 1)[0] or None


def ready_controllers(api: client.ApiClient) -> dict[str, str]:
    """Name -> uid of the controller pods that are Ready."""
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=CONTROLLER_PODS).items
    return {
        p.metadata.name: p.metadata.uid
        for p in pods
        if not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
    }


def wait_for_two_replicas_and_a_leader(api: client.ApiClient, timeout: float = 120) -> tuple[str, dict[str, str]]:
    """Until two controller pods are Ready and one of them holds the Lease: (leader, name -> uid)."""

    def probe() -> tuple[str, dict[str, str]] | None:
        pods, holder = ready_controllers(api), leader(api)
        return (holder, pods) if len(pods) >= 2 and holder in pods else None

    return kube.wait_for(probe, timeout, interval=0.5, what="two Ready controller replicas and a leader")


def kill_controller(pod_uid: str) -> list[int]:
    """SIGKILL the controller process of the pod `pod_uid` (found by its cgroup, as the plugin finds a pod's
    processes); the PIDs killed."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            owner = pod_of_pid(Path("/proc"), pid)
            cmdline = (entry / "cmdline").read_bytes()
        except (CgroupUnreadableError, OSError):
            continue
        if owner is not None and owner.pod_uid == pod_uid and b"controller" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    assert killed, f"no controller process of pod {pod_uid} found"
    return killed


@contextlib.contextmanager
def fake_gpu_node(api: client.ApiClient) -> Iterator[str]:
    """A fake Node with FAKE_GPUS simulated GPUs published for our driver; removed afterwards (slices too, and
    waiting until the ledger has dropped its GPUs, so later tests see only the real node's)."""
    dyn = DynamicClient(api)
    body = kube.create_fake_node(api, kube.unique("ha-gpus"))
    name = body["metadata"]["name"]
    slices = kube.publish_gpus(dyn, body, DRIVER_NAME, kube.simulated_gpus(name, FAKE_GPUS))
    try:
        yield name
    finally:
        api_slices = kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice")
        for s in slices:
            with contextlib.suppress(ApiException):
                api_slices.delete(name=s["metadata"]["name"])
        with contextlib.suppress(ApiException):
            client.CoreV1Api(api).delete_node(name)
        objects = client.CustomObjectsApi(api)

        def ledger_clean() -> bool | None:  # the leader drops the GPU objects of unpublished devices
            gpus = objects.list_cluster_custom_object(API_GROUP, GPU_VERSION, GPU_PLURAL)["items"]
            return not any(g["spec"].get("node") == name for g in gpus) or None

        kube.wait_for(ledger_clean, 60, interval=0.5, what=f"the ledger without {name}'s GPUs")


def create_burst(api: client.ApiClient, namespace: str, node: str, count: int, prefix: str) -> list[str]:
    """`count` pods on `node`, each with its own claim (CLAIM_MEMORY) from one template; created 8 at a time."""
    dyn = DynamicClient(api)
    template = f"{prefix}-t"
    kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate").create(
        namespace=namespace, body=kube.claim_template(template, DEVICE_CLASS_NAME, CLAIM_MEMORY)
    )
    core = client.CoreV1Api(api)
    names = [f"{prefix}-{i:03d}" for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: core.create_namespaced_pod(namespace, kube.pod_with_claim(n, template, node)), names))
    return names


def delete_burst(api: client.ApiClient, namespace: str, pods: list[str]) -> None:
    """Force-delete the burst's pods (no kubelet will ever confirm their end)."""
    core = client.CoreV1Api(api)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: core.delete_namespaced_pod(n, namespace, grace_period_seconds=0), pods))


def our_status(claim: dict[str, Any]) -> bool:
    """Whether the controller wrote its status entry (with data) for each of the claim's results of our driver."""
    status = claim.get("status") or {}
    results = [
        r
        for r in ((status.get("allocation") or {}).get("devices") or {}).get("results", [])
        if r["driver"] == DRIVER_NAME
    ]
    written = {
        (d["pool"], d["device"], d.get("shareID"))
        for d in status.get("devices") or []
        if d["driver"] == DRIVER_NAME and d.get("data")
    }
    return bool(results) and all((r["pool"], r["device"], r.get("shareID")) in written for r in results)


def claims_of(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaims"
    )["items"]
    return items


def ledger_matches(api: client.ApiClient, node: str, claims: list[dict[str, Any]]) -> bool:
    """Whether the GPU objects of `node` list exactly the shares the claims were allocated there."""
    want: dict[str, set[tuple[str, str]]] = {}
    for claim in claims:
        meta = claim["metadata"]
        for r in claim["status"]["allocation"]["devices"]["results"]:
            if r["driver"] == DRIVER_NAME and r["pool"] == node:
                want.setdefault(r["device"], set()).add((meta["namespace"], meta["name"]))
    gpus = client.CustomObjectsApi(api).list_cluster_custom_object(API_GROUP, GPU_VERSION, GPU_PLURAL)["items"]
    have: dict[str, set[tuple[str, str]]] = {}
    for gpu in gpus:
        if gpu["spec"].get("node") == node:
            listed = (gpu.get("status") or {}).get("claims") or []
            have[gpu["spec"]["device"]] = {(c["namespace"], c["name"]) for c in listed}
    return len(have) == FAKE_GPUS and all(have.get(d, set()) == want.get(d, set()) for d in have)


CRASH_WINDOW_S = 1.0
"""How long after a SIGKILL an admission call may still meet the killed process: a call in flight to it, or sent on
an API-server connection to it before the API server has read the reset, fails (connection reset by peer) and,
under failurePolicy Ignore, is admitted unchecked. No server can answer it; every later call must be answered."""


@dataclass(frozen=True)
class ProbeProblem:
    """A probe request whose answer was not the webhook's: when it was sent and answered (epoch s), what went wrong."""

    sent: float
    answered: float
    what: str

    def overlaps(self, start: float, end: float) -> bool:
        """Whether the request was in flight at some moment of [start, end]."""
        return self.sent <= end and self.answered >= start

    def __str__(self) -> str:
        return f"{time.strftime('%H:%M:%S', time.localtime(self.sent))}: {self.what}"


@dataclass
class AdmissionProbe:
    """Dry-run creates every `interval` s from their own client, alternating a claim our webhook admits and one it
    refuses: `problems` lists every answer that was not the webhook's (a refused good claim, an admitted bad one
    (an unanswered webhook under failurePolicy Ignore), an error)."""

    api: client.ApiClient
    namespace: str
    interval: float = 0.25
    answers: int = 0
    problems: list[ProbeProblem] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> "AdmissionProbe":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def outside(self, start: float, end: float) -> list[ProbeProblem]:
        """The problems of requests that were not in flight during [start, end] (epoch s)."""
        return [p for p in self.problems if not p.overlaps(start, end)]

    def _claim(self, good: bool) -> dict[str, Any]:
        bad = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": 150}
        template = w.claim_template("unused", "1Gi", None if good else bad)
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"generateName": "probe-"},
            "spec": template["spec"]["spec"],
        }

    def _run(self) -> None:
        objects = client.CustomObjectsApi(self.api)
        good = True
        while not self._stop.is_set():
            sent = time.time()
            problem = None
            try:
                objects.create_namespaced_custom_object(
                    "resource.k8s.io", "v1", self.namespace, "resourceclaims", self._claim(good), dry_run="All"
                )
                if not good:
                    problem = "a claim with a bad GpuConfig was admitted (webhook not answering)"
            except ApiException as err:
                message = str(json.loads(err.body or "{}").get("message", err.body))
                if good or "computeLimitPercent" not in message:
                    problem = f"{'good' if good else 'bad'} claim: {err.status} {message[:200]}"
            if problem is not None:
                self.problems.append(ProbeProblem(sent, time.time(), problem))
            self.answers += 1
            good = not good
            self._stop.wait(self.interval)


FAILED_OPEN = "Failed calling webhook, failing open"


def failed_open_calls(apiserver_log: Path, since: float) -> list[tuple[float, str]]:
    """The admission calls the API server let through unanswered (its klog warning "Failed calling webhook,
    failing open ...") logged at or after `since` (epoch s): (when, the line). klog stamps local time, no year."""
    year = time.localtime().tm_year
    out = []
    for line in apiserver_log.read_text(errors="replace").splitlines():
        if FAILED_OPEN not in line:
            continue
        stamp = line[1:21]  # W1201 21:33:56.631878
        when = datetime.datetime.strptime(f"{year}{stamp}", "%Y%m%d %H:%M:%S.%f").timestamp()
        if when >= since:
            out.append((when, line[:400]))
    return out
