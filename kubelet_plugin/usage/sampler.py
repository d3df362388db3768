"""The usage sampler: every ``--usage-interval`` seconds, GPU memory per process (NVML) -> per claim and per GPU.

Runs in its own thread, never on the prepare path and never under the node lock: it reads only files the
preparer writes atomically (the per-request info files) and the host's ``/proc``. Each sample publishes the
metrics of ``kubelet_plugin.usage.metrics``, posts an ``OverMemoryGrant`` Warning Event on the claim and on its
pods when an unenforced share goes over its grant (once per crossing), and writes each GPU's used memory to
``status.usage`` of its GPU ledger object when it changed meaningfully (``usage.LedgerWriter``). A failing
sample is logged and counted, and the next one is tried as usual: nothing here stops the plugin.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from api.gpu import GPU_API_VERSION, GPU_KIND, GPU_PLURAL, gpu_object_name
from api.kube_errors import ApiError
from api.kube_rest import KubeRest, claim_path
from api.quantity import MiB, format_bytes
from kubelet_plugin.core.events import post_object_event
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.state.claim_files import prepared_claim_uids, read_request_infos
from kubelet_plugin.usage import cgroups
from kubelet_plugin.usage.attribution import (
    ClaimShare,
    CrossingTracker,
    LedgerWriter,
    ProcessSample,
    Snapshot,
    attribute,
)
from kubelet_plugin.usage.metrics import UsageMetrics
from kubelet_plugin.usage.nvml import NvmlProcesses, SampleError

log = logging.getLogger(__name__)

FIELD_MANAGER = "fracgpu-kubelet-plugin"
OVER_GRANT_REASON = "OverMemoryGrant"
POD_REFRESH_MIN_S = 30.0


# ----- claims prepared on this node ------------------------------------------------------------------


def read_shares(plugin_data_dir: Path) -> list[ClaimShare]:
    """The shares of every claim whose info files exist (written at prepare, removed at unprepare), per claim
    and GPU. A claim whose files vanish or cannot be parsed while being read is left out of this sample."""
    shares: list[ClaimShare] = []
    for uid in prepared_claim_uids(plugin_data_dir):
        try:
            infos = read_request_infos(plugin_data_dir, uid)
        except (OSError, ValidationError) as err:
            log.debug("skipping a claim's info files in this sample", extra={"claim": uid, "error": str(err)})
            continue
        granted: dict[str, int] = {}
        enforced: dict[str, bool] = {}
        admin: dict[str, bool] = {}
        for info in infos:
            for device in info.devices:
                granted[device.uuid] = granted.get(device.uuid, 0) + device.memory_mib * MiB
                enforced[device.uuid] = enforced.get(device.uuid, True) and device.enforcement != "none"
                admin[device.uuid] = admin.get(device.uuid, False) or device.admin_access
        if infos:
            claim = infos[0].claim
            shares += [
                ClaimShare(
                    claim_uid=claim.uid,
                    namespace=claim.namespace,
                    name=claim.name,
                    gpu_uuid=gpu,
                    granted_bytes=granted[gpu],
                    enforced=enforced[gpu],
                    admin_access=admin[gpu],
                )
                for gpu in sorted(granted)
            ]
    return shares


def reserved_pods(claim: Mapping[str, Any]) -> dict[str, str]:
    """Pod UID -> pod name of a claim's ``status.reservedFor``."""
    entries = (claim.get("status") or {}).get("reservedFor") or []
    return {
        e["uid"]: e.get("name", "")
        for e in entries
        if isinstance(e, dict) and e.get("resource") == "pods" and not e.get("apiGroup") and e.get("uid")
    }


class ClaimPods:
    """Pods that use each claim, from the claims' ``status.reservedFor``: read once per claim, and again only
    when asked for (a process of an unknown pod on its GPU) and the last read is ``refresh_s`` old."""

    def __init__(self, rest: KubeRest, refresh_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rest = rest
        self._refresh_s = refresh_s
        self._clock = clock
        self._pods: dict[str, tuple[dict[str, str], float]] = {}

    def get(self, shares: Iterable[ClaimShare], refresh: set[str]) -> dict[str, dict[str, str]]:
        """Claim UID -> {pod UID: name} for ``shares``' claims; claims in ``refresh`` are re-read when stale.
        Claims no longer given are forgotten. A failed read keeps the previous answer (empty at first)."""
        claims = {s.claim_uid: s for s in shares}
        self._pods = {uid: v for uid, v in self._pods.items() if uid in claims}
        now = self._clock()
        for uid, share in claims.items():
            known = self._pods.get(uid)
            if known is not None and not (uid in refresh and now - known[1] >= self._refresh_s):
                continue
            try:
                claim = self._rest.get(claim_path(share.namespace, share.name))
            except ApiError as err:
                log.warning(
                    "cannot read a claim's pods",
                    extra={"claim": f"{share.namespace}/{share.name}", "error": str(err)},
                )
                self._pods[uid] = (known[0] if known else {}, now)
                continue
            same = (claim.get("metadata") or {}).get("uid") == uid
            self._pods[uid] = (reserved_pods(claim) if same else {}, now)
        return {uid: pods for uid, (pods, _) in self._pods.items()}


# ----- Events and the ledger --------------------------------------------------------------------------


def post_event(rest: KubeRest, involved: dict[str, str], node: str, reason: str, message: str) -> bool:
    """Post a Warning Event about ``involved`` (its ``namespace`` holds the Event); False when it failed."""
    return post_object_event(rest, involved, node, reason, message)


def usage_status(used_bytes: int) -> dict[str, Any]:
    """The server-side-apply body's ``status`` of a GPU ledger object: only ``usage``, owned by the plugin."""
    rounded = -(-used_bytes // MiB) * MiB
    return {"usage": {"usedMemory": format_bytes(rounded)}}


def gpu_status_path(name: str) -> str:
    """The status subresource of a GPU ledger object."""
    return f"/apis/{GPU_API_VERSION}/{GPU_PLURAL}/{name}/status"


# ----- the sampler ------------------------------------------------------------------------------------


class UsageSampler:
    """Takes a sample every ``interval_s`` (see the module docstring)."""

    def __init__(
        self,
        *,
        node: str,
        gpus: list[GpuInfo],
        plugin_data_dir: Path,
        proc_root: Path,
        rest: KubeRest,
        metrics: UsageMetrics,
        interval_s: float,
        ledger_min_interval_s: float,
        ledger_threshold_bytes: int,
        nvml: Callable[[], tuple[list[ProcessSample], dict[str, str]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node = node
        self._gpus = gpus
        self._plugin_data_dir = plugin_data_dir
        self._proc_root = proc_root
        self._rest = rest
        self._metrics = metrics
        self._interval = interval_s
        self._nvml = nvml or NvmlProcesses(gpus).sample
        self._clock = clock
        # a process of a pod no claim lists (another driver's pod on the GPU, or a new pod of a shared claim)
        # re-reads the claims on its GPU at most this often
        self._pods = ClaimPods(rest, max(interval_s, POD_REFRESH_MIN_S), clock)
        self._crossings = CrossingTracker()
        self._ledger = LedgerWriter(ledger_threshold_bytes, ledger_min_interval_s)
        self._last_problem: str | None = None
        self._unreadable: set[int] = set()  # PIDs whose unreadable cgroup was logged
        self._failed_gpus: dict[str, str] = {}  # GPU UUID -> the NVML error logged

    def run(self, stop: threading.Event) -> None:
        """Sample at once, then every interval until ``stop`` is set; never raises."""
        while True:
            self.sample_once()
            if stop.wait(self._interval):
                return

    def sample_once(self) -> Snapshot | None:
        """One sample (the snapshot published, or None when it failed)."""
        try:
            snapshot = self._sample()
        except SampleError as err:
            self._fail(err.reason, str(err))
            return None
        except Exception as err:  # a bug must not end the thread: counted and logged with its traceback
            self._fail("internal", f"{type(err).__name__}: {err}", err)
            return None
        self._last_problem = None
        return snapshot

    def _fail(self, reason: str, message: str, exc: BaseException | None = None) -> None:
        self._metrics.sample_failures.labels(reason).inc()
        self._metrics.publish(None)
        if message != self._last_problem:  # once per distinct problem, not every interval
            log.error("GPU memory usage sample failed", exc_info=exc, extra={"reason": reason, "error": message})
        self._last_problem = message

    def _sample(self) -> Snapshot:
        processes, failed = self._nvml()
        for gpu, error in failed.items():
            self._metrics.sample_failures.labels("nvml_query").inc()
            if self._failed_gpus.get(gpu) != error:  # once per GPU and error, not every interval
                log.warning("NVML could not list a GPU's processes", extra={"gpu": gpu, "error": error})
        self._failed_gpus = dict(failed)
        shares = [s for s in read_shares(self._plugin_data_dir) if s.gpu_uuid not in failed]
        pod_of_pid: dict[int, str | None] = {}
        unreadable: set[int] = set()
        for pid in sorted({p.pid for p in processes}):
            try:
                found = cgroups.pod_of_pid(self._proc_root, pid)
            except cgroups.CgroupUnreadableError as err:
                self._metrics.unreadable_cgroups.inc()
                unreadable.add(pid)
                if pid not in self._unreadable:  # once per process, not every interval
                    log.warning("process on a GPU not attributed: its cgroup cannot be read", extra={"error": str(err)})
                continue
            pod_of_pid[pid] = found.pod_uid if found else None
        self._unreadable = unreadable
        pods = self._pods.get(shares, refresh=set())
        known = {uid for claim_pods in pods.values() for uid in claim_pods}
        missing_gpus = {p.gpu_uuid for p in processes if pod_of_pid.get(p.pid) and pod_of_pid[p.pid] not in known}
        if missing_gpus:  # a pod not (yet) in any claim's reservedFor: the claims on its GPUs are read again
            pods = self._pods.get(shares, refresh={s.claim_uid for s in shares if s.gpu_uuid in missing_gpus})
        gpu_uuids = [g.uuid for g in self._gpus if g.uuid not in failed]
        snapshot = attribute(processes, pod_of_pid, shares, pods, gpu_uuids)
        self._metrics.publish(snapshot)
        for crossing in self._crossings.update(snapshot):
            self._metrics.crossings.inc()
            self._post_crossing(
                crossing.share, crossing.used_bytes, crossing.pods, pods.get(crossing.share.claim_uid, {})
            )
        self._write_ledger(snapshot)
        return snapshot

    def _post_crossing(self, share: ClaimShare, used: int, pods: tuple[str, ...], reserved: dict[str, str]) -> None:
        message = (
            f"claim {share.namespace}/{share.name} uses {format_bytes(-(-used // MiB) * MiB)} of GPU {share.gpu_uuid}, "
            f"more than its grant of {format_bytes(share.granted_bytes)}"
            + (f" (pods {', '.join(pods)})" if pods else "")
            + "; nothing enforces the grant on this GPU, so other shares of it may run out of memory"
        )
        log.warning("a share uses more GPU memory than granted", extra={"claim": f"{share.namespace}/{share.name}"})
        post_event(
            self._rest,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "namespace": share.namespace,
                "name": share.name,
                "uid": share.claim_uid,
            },
            self._node,
            OVER_GRANT_REASON,
            message,
        )
        uid_of = {name: uid for uid, name in reserved.items()}
        for pod in pods:
            post_event(
                self._rest,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": share.namespace,
                    "name": pod,
                    "uid": uid_of.get(pod, ""),
                },
                self._node,
                OVER_GRANT_REASON,
                message,
            )

    def _write_ledger(self, snapshot: Snapshot) -> None:
        now = self._clock()
        device_of = {g.uuid: g.device_name for g in self._gpus}
        for gpu in self._ledger.due(snapshot.gpus, now):
            name = gpu_object_name(self._node, device_of[gpu.uuid])
            body = {
                "apiVersion": GPU_API_VERSION,
                "kind": GPU_KIND,
                "metadata": {"name": name},
                "status": usage_status(gpu.used_bytes),
            }
            try:
                self._rest.apply(gpu_status_path(name), body, FIELD_MANAGER)
            except ApiError as err:
                self._metrics.ledger_writes.labels("error").inc()
                self._ledger.failed(gpu, now)
                log.warning(
                    "cannot write used memory to the GPU ledger; retried with the next sample",
                    extra={"gpu": name, "error": str(err)},
                )
                continue
            self._metrics.ledger_writes.labels("ok").inc()
            self._ledger.written(gpu, now)
