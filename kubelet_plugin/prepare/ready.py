"""The node plugin's part of a claim's `status.devices`: the `Ready` and `MemoryEnforcement` conditions, for a share
that reserved GPU compute `ComputeEnforcement` (its ceiling, or that nothing enforces it) and, for a MIG partition,
`MigPartition`, by server-side apply.

Field manager `fracgpu-kubelet-plugin` owns only the conditions of this driver's entries; the controller
(`fracgpu-controller`) owns their `data` (an atomic field) and copies the tier of `MemoryEnforcement` and the MIG
UUID of `MigPartition` (its message, nothing else) into it. Other drivers' entries are never sent, so never
touched.

Writes the `Ready` condition of prepared claims in the background, off the kubelet's reply path
(`ReadyReporter` decides which claims need it, `ReadyWriter` writes).

A write that fails for want of the API server (no answer, 429, 5xx: `ApiTransient`, after the client's own
retries within its budget) is delayed, not dropped: tried again after 1, 2, 4, … s (at most `MAX_DELAY_S`, at
least the wait the server asked) until it is written or the claim is unprepared (`cancel`); other failures are
final, and the next prepare of the claim writes it again, because prepare checks the condition on the claim it
has just read. Each failed try is logged and counted.
"""

import datetime
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api import compute
from api.config_merge import EntryError, allocation_entries, config_for
from api.gpu import (
    COMPUTE_CONDITION,
    COMPUTE_NOT_ENFORCED,
    COMPUTE_REASONS,
    ENFORCEMENT_CONDITION,
    ENFORCEMENT_REASONS,
)
from api.gpu_config import GpuConfigError
from api.kube_errors import UNWRITABLE_STATUS, ApiAllocationImmutable, ApiError, ApiTransient, UndecodableResponse
from api.kube_rest import KubeRest, claim_path
from api.mig import PARTITION_CONDITION, PARTITION_REASON
from api.names import MPS_DEVICE_CLASS_NAME
from kubelet_plugin.core.model import MigRecord

FIELD_MANAGER = "fracgpu-kubelet-plugin"

#: (pool, device, shareID or None) -> the enforcement tier the CDI spec applies to that share.
Tiers = Mapping[tuple[str, str, str | None], str]
#: (pool, device, shareID or None) -> the MIG partition made for that device.
Partitions = Mapping[tuple[str, str, str | None], MigRecord]
#: (pool, device, shareID or None) of each adminAccess result on an MPS GPU.
AdminOnMps = Collection[tuple[str, str, str | None]]


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str | None]:
    return (entry["pool"], entry["device"], entry.get("shareID") or None)


def _has(entry: Mapping[str, Any], kind: str, status: str, reason: str | None = None) -> bool:
    return any(
        c["type"] == kind and c["status"] == status and (reason is None or c.get("reason") == reason)
        for c in entry.get("conditions") or []
    )


def _has_partition(entry: Mapping[str, Any], record: MigRecord | None) -> bool:
    return record is None or any(
        c["type"] == PARTITION_CONDITION and c["status"] == "True" and c.get("message") == record.uuid
        for c in entry.get("conditions") or []
    )


def is_ready(
    claim: dict[str, Any], driver: str, tiers: Tiers | None = None, partitions: Partitions | None = None
) -> bool:
    """True when every entry of `driver` in status.devices already has Ready=True, covers the results and
    (given `tiers`) reports the same MemoryEnforcement tier, for a result that reserved compute the same
    ComputeEnforcement status, and (given `partitions`) the same MIG UUID."""
    results = [r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == driver]
    ready = {
        _key(d)
        for d in claim["status"].get("devices") or []
        if d["driver"] == driver
        and _has(d, "Ready", "True")
        and (tiers is None or _has(d, ENFORCEMENT_CONDITION, *_enforcement_status(tiers.get(_key(d), "none"))))
        and _has_partition(d, (partitions or {}).get(_key(d)))
    }
    entries = {_key(d): d for d in claim["status"].get("devices") or []} if tiers is not None else {}
    return all(
        _key(r) in ready
        and (
            tiers is None
            or not _reserved(r)
            or _has(entries[_key(r)], COMPUTE_CONDITION, *_compute_status(tiers.get(_key(r), "none")))
        )
        for r in results
    )


def _reserved(result: Mapping[str, Any]) -> int:
    """The compute a result reserved (percent; 0 for none, and for an adminAccess result, which reserves nothing)."""
    return 0 if result.get("adminAccess") is True else compute.consumed_percent(result.get("consumedCapacity"))


def _compute_status(tier: str) -> tuple[str, str]:
    reason = COMPUTE_REASONS.get(tier)
    return ("True", reason) if reason is not None else ("False", COMPUTE_NOT_ENFORCED)


def _enforcement_status(tier: str) -> tuple[str, str]:
    return ("False" if tier == "none" else "True", ENFORCEMENT_REASONS[tier])


def _enforcement_message(tier: str) -> str:
    if tier == "mig":
        return (
            "GPU memory and compute isolated by the hardware: a MIG partition with its own memory, streaming "
            "multiprocessors, L2 cache and copy engines, which nothing in the container can enlarge"
        )
    if tier == "nvml":
        return (
            "GPU memory limited by the driver: NVIDIA's apply-cuda-memory-limits hook in the CDI spec sets the "
            "grant as the container cgroup's limit (nvmlDeviceSetMemoryLimits_v1)"
        )
    if tier == "mps":
        return (
            "GPU memory and compute limited by CUDA MPS: the grant is the client's pinned device memory limit and "
            "the compute ceiling (reserved compute, or computeLimitPercent) its active thread percentage "
            "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, "
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); a process that rewrites them gets at most the largest grant and "
            "percentage on its GPU, which its MPS daemon holds"
        )
    if tier == "hami-core":
        return "GPU memory limited in the process by HAMi-core (libvgpu.so preloaded, CUDA_DEVICE_MEMORY_LIMIT_<i>)"
    return "GPU memory not enforced: the grant is advisory (scheduler accounting, env and info files)"


ADMIN_MESSAGE = (
    "admin access (monitoring): the whole GPU's memory is visible to this claim, none of it reserved for it, and no "
    "tier limits it"
)
ADMIN_ON_MPS = (
    "the GPU is an MPS GPU and this claim is no MPS client of it (no trust domain, pipe directory or MPS limits); "
    "the GPU is in EXCLUSIVE_PROCESS compute mode, where its MPS server holds the one CUDA context, so the claim's "
    "containers monitor it through NVML (nvidia-smi, DCGM) but cannot create a CUDA context while that server runs "
    "(and one made while none runs would keep the GPU's MPS clients out until it ended)"
)


def _compute_percent(claim: dict[str, Any], result: Mapping[str, Any], driver: str) -> int | None:
    """The computeLimitPercent of one allocated request's merged GpuConfig (None: unset or unreadable)."""
    entries = allocation_entries(claim["status"]["allocation"]["devices"].get("config"), driver)
    try:
        return config_for(entries, str(result["request"])).compute_limit_percent
    except (EntryError, GpuConfigError):
        return None


def _compute_not_enforced(percent: int) -> str:
    """What the MemoryEnforcement message adds for a share of a tier that does not apply computeLimitPercent."""
    return (
        f"computeLimitPercent {percent} is not enforced on this tier: only mps (MPS GPUs, DeviceClass "
        f"{MPS_DEVICE_CLASS_NAME}) and hami-core apply it"
    )


def _mps_limits(claim: dict[str, Any], result: Mapping[str, Any], driver: str) -> str:
    """`MPS limits: memory <grant>, active threads <percentage>` of one mps share, from its allocation (the
    percentage: its compute ceiling, ``api.compute.ceiling``)."""
    memory = (result.get("consumedCapacity") or {}).get("memory", "the whole GPU")
    percent = compute.ceiling(_reserved(result), _compute_percent(claim, result, driver))
    return f"MPS limits: memory {memory}, active threads {f'{percent} %' if percent else 'the GPU default'}"


def _compute_condition(
    claim: dict[str, Any], result: Mapping[str, Any], driver: str, tier: str
) -> tuple[str, str, str]:
    """(status, reason, message) of the ComputeEnforcement condition of a result that reserved compute."""
    reserved = _reserved(result)
    limit = _compute_percent(claim, result, driver)
    top = compute.ceiling(reserved, limit)
    status, reason = _compute_status(tier)
    said = f"{reserved} % of the GPU's compute reserved (consumedCapacity.compute: the scheduler places at most 100 % on a GPU)"
    if limit is not None and limit < reserved:
        said += f"; computeLimitPercent {limit} sets the ceiling below it"
    elif limit is not None and limit > reserved:
        said += f"; computeLimitPercent {limit} is above the reservation, so the ceiling is the reservation"
    if tier == "mps":
        return (
            status,
            reason,
            (
                f"{said}; ceiling {top} % as the MPS client's active thread percentage "
                "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), which a process can lower but not raise above the largest "
                "percentage on its GPU, held by the GPU's MPS daemon"
            ),
        )
    if tier == "hami-core":
        return (
            status,
            reason,
            (
                f"{said}; ceiling {top} % of the GPU's streaming multiprocessors as HAMi-core's CUDA_DEVICE_SM_LIMIT, "
                "in the process (a workload that drops the preload is not limited)"
            ),
        )
    return (
        status,
        reason,
        (
            f"{said}; not enforced on tier {tier}: nothing limits this share's compute (only mps, on MPS GPUs of "
            f"DeviceClass {MPS_DEVICE_CLASS_NAME}, and hami-core apply a compute ceiling)"
        ),
    )


def apply_ready(
    rest: KubeRest,
    claim: dict[str, Any],
    driver: str,
    node: str,
    tiers: Tiers | None = None,
    *,
    partitions: Partitions | None = None,
    admin_on_mps: AdminOnMps = (),
) -> None:
    """Set Ready=True, MemoryEnforcement (from `tiers`, default none; an adminAccess result's message says what
    admin access gives, on an MPS GPU (`admin_on_mps`) also what it does not), ComputeEnforcement on a result
    that reserved compute (its ceiling on mps and hami-core, else that nothing enforces it) and, for a MIG partition
    (`partitions`), MigPartition (message: its MIG UUID) on each of `driver`'s status.devices entries of `claim`
    (server-side apply)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    generation = claim["metadata"].get("generation", 0)
    entries = []
    for result in claim["status"]["allocation"]["devices"]["results"]:
        if result["driver"] != driver:
            continue
        entry: dict[str, Any] = {"driver": driver, "pool": result["pool"], "device": result["device"]}
        if result.get("shareID"):
            entry["shareID"] = result["shareID"]
        tier = (tiers or {}).get(_key(result), "none")
        status, reason = _enforcement_status(tier)
        message = _enforcement_message(tier)
        if result.get("adminAccess") is True:
            message = f"{ADMIN_MESSAGE}; {ADMIN_ON_MPS}" if _key(result) in admin_on_mps else ADMIN_MESSAGE
        if tier == "mps":
            message = f"{_mps_limits(claim, result, driver)}; {message}"
        elif tier in {"none", "nvml"} and (percent := _compute_percent(claim, result, driver)) is not None:
            message = f"{message}; {_compute_not_enforced(percent)}"
        entry["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": f"CDI device prepared on node {node}",
                "lastTransitionTime": now,
                "observedGeneration": generation,
            },
            {
                "type": ENFORCEMENT_CONDITION,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": generation,
            },
        ]
        if _reserved(result):
            status, reason, message = _compute_condition(claim, result, driver, tier)
            entry["conditions"].append(
                {
                    "type": COMPUTE_CONDITION,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now,
                    "observedGeneration": generation,
                }
            )
        record = (partitions or {}).get(_key(result))
        if record is not None:
            entry["conditions"].append(
                {
                    "type": PARTITION_CONDITION,
                    "status": "True",
                    "reason": PARTITION_REASON,
                    "message": record.uuid,
                    "lastTransitionTime": now,
                    "observedGeneration": generation,
                }
            )
        entries.append(entry)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim["metadata"]["name"], "namespace": claim["metadata"]["namespace"]},
        "status": {"devices": entries},
    }
    path = claim_path(claim["metadata"]["namespace"], claim["metadata"]["name"]) + "/status"
    rest.apply(path, body, FIELD_MANAGER)


log = logging.getLogger(__name__)

#: Writes Ready=True on one claim (`kubelet_plugin.prepare.ready.apply_ready` bound to the plugin's client).
Write = Callable[[dict[str, Any]], None]


MAX_DELAY_S = 30.0
"""The longest wait between two tries of one claim's write."""


def _describe(err: Exception) -> str:
    if isinstance(err, ApiAllocationImmutable):
        return f"{err}; {UNWRITABLE_STATUS}"  # a write of conditions only: every status write to the claim fails
    return str(err) if isinstance(err, ApiError) else f"{type(err).__name__}: {err}"


class ReadyWriter:
    """Runs `write` for submitted claims on a few threads of its own; one claim is written by one task at
    a time (a claim submitted again while its write is pending is not written twice)."""

    def __init__(self, write: Write, on_failure: Callable[[], None], *, first_delay: float = 1.0) -> None:
        self._write = write
        self._on_failure = on_failure
        self._first_delay = first_delay
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fracgpu-ready")
        self._pending: set[str] = set()
        self._changed = threading.Condition()

    def submit(self, claim: dict[str, Any]) -> None:
        """Write Ready on `claim` soon; returns at once."""
        uid = claim["metadata"]["uid"]
        with self._changed:
            if uid in self._pending:
                return
            self._pending.add(uid)
        self._pool.submit(self._run, claim, 1)

    def cancel(self, uid: str) -> None:
        """Stop retrying the write of claim `uid` (unprepared); a try in flight finishes."""
        self._done(uid)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no write is pending or being retried; False if `timeout` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending, timeout)

    def _run(self, claim: dict[str, Any], attempt: int) -> None:
        meta = claim["metadata"]
        with self._changed:
            if meta["uid"] not in self._pending:
                return  # cancelled while waiting
        try:
            self._write(claim)
        except UndecodableResponse:
            pass  # written: only the answer, the claim as it is now, could not be decoded
        except Exception as err:
            self._on_failure()
            retry = isinstance(err, ApiTransient)
            log.warning(
                "cannot set Ready on claim status" + ("; trying again" if retry else ""),
                extra={"claim": f"{meta['namespace']}/{meta['name']}", "attempt": attempt, "error": _describe(err)},
            )
            if isinstance(err, ApiTransient):
                delay = min(MAX_DELAY_S, max(self._first_delay * 2 ** (attempt - 1), err.retry_after or 0.0))
                timer = threading.Timer(delay, self._resubmit, (claim, attempt + 1))
                timer.daemon = True
                timer.start()
                return
        self._done(meta["uid"])

    def _done(self, uid: str) -> None:
        with self._changed:
            self._pending.discard(uid)
            self._changed.notify_all()

    def _resubmit(self, claim: dict[str, Any], attempt: int) -> None:
        try:
            self._pool.submit(self._run, claim, attempt)
        except RuntimeError:  # the interpreter is shutting down: the next prepare writes it
            self._done(claim["metadata"]["uid"])


class ReadyReporter:
    """The Ready and MemoryEnforcement conditions of prepared claims: the tiers each claim got, whether the
    claim as read already says so, and the background write (`ReadyWriter`) when it does not."""

    def __init__(self, rest: KubeRest, driver: str, node: str, on_failure: Callable[[], None]) -> None:
        self._driver = driver
        # claim UID -> tier and MIG partition per share, adminAccess results on MPS GPUs
        self._applied: dict[str, tuple[Tiers, Partitions, AdminOnMps]] = {}
        self._writer = ReadyWriter(
            lambda claim: self._apply(rest, claim, node),
            on_failure,
        )

    def _apply(self, rest: KubeRest, claim: dict[str, Any], node: str) -> None:
        tiers, partitions, admin_on_mps = self._applied.get(claim["metadata"]["uid"], ({}, {}, ()))
        apply_ready(rest, claim, self._driver, node, tiers, partitions=partitions, admin_on_mps=admin_on_mps)

    def prepared(
        self,
        claim: dict[str, Any],
        tiers: Tiers,
        partitions: Partitions | None = None,
        *,
        admin_on_mps: AdminOnMps = (),
    ) -> None:
        """`claim` (as just read) was prepared with `tiers` (and MIG `partitions`; `admin_on_mps`: its adminAccess
        results on MPS GPUs): write its conditions unless they are there."""
        uid = claim["metadata"]["uid"]
        self._applied[uid] = (tiers, partitions or {}, admin_on_mps)
        if tiers and not is_ready(claim, self._driver, tiers, partitions):
            self._writer.submit(claim)

    def forget(self, claim_uid: str) -> None:
        """The claim was unprepared: its write, if still pending, is not tried again."""
        self._applied.pop(claim_uid, None)
        self._writer.cancel(claim_uid)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the submitted writes are done (or given up); False on timeout."""
        return self._writer.wait_idle(timeout)
