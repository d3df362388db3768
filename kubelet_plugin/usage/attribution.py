"""GPU memory use per claim: attributing NVML's processes to claims, grant crossings, ledger writes (pure).

Mapping (the cheapest correct one). NVML names host PIDs per GPU; a PID's cgroup names its pod UID
(``kubelet_plugin.usage.cgroups``). The claims prepared on this node, with their grants and GPUs, are in the
plugin's per-request info files; which pods use a claim is in the claim's ``status.reservedFor`` (the kubelet
gives Prepare only the claim's UID, namespace and name, and does not call Prepare again when another pod
starts using an already prepared claim), read by the sampler with one GET per claim and again (at most every
30 s) only when a process on one of its GPUs belongs to no known pod. A process is attributed to the one claim that has a
share on the process's GPU and lists the process's pod. A process of no claim's pod (another driver's pod, a
host process) counts only towards the GPU's used memory; a process whose pod holds two claims on the same GPU
is not attributed at all (it cannot be told which one it uses): never a wrong claim.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True)


class ProcessSample(_Value):
    """One process with a context on one GPU, as NVML reports it."""

    gpu_uuid: str
    pid: int
    used_bytes: int = Field(ge=0)


class ClaimShare(_Value):
    """What a prepared claim holds of one GPU (all its requests' shares of that GPU summed)."""

    claim_uid: str
    namespace: str
    name: str
    gpu_uuid: str
    granted_bytes: int = Field(ge=0)
    enforced: bool = Field(description="a tier caps the claim's memory (the grant cannot be exceeded)")
    admin_access: bool = Field(
        False, description="an adminAccess allocation: its grant (the whole GPU) is reach, not a reservation"
    )


class ClaimUsage(_Value):
    """Memory a claim's processes in one pod use on one GPU (``pod`` is empty while no pod is known)."""

    share: ClaimShare
    pod_uid: str
    pod: str
    used_bytes: int


class GpuUsage(_Value):
    """One GPU's totals: what the prepared claims were granted and what all its processes use."""

    uuid: str
    granted_bytes: int
    used_bytes: int


class Snapshot(_Value):
    """The result of one sample."""

    claims: tuple[ClaimUsage, ...] = ()
    gpus: tuple[GpuUsage, ...] = ()
    unattributed: int = Field(0, description="processes on a GPU of this node attributed to no claim")
    ambiguous: int = Field(0, description="of those, processes of a pod holding several claims on that GPU")


def attribute(
    processes: Iterable[ProcessSample],
    pod_of_pid: Mapping[int, str | None],
    shares: Iterable[ClaimShare],
    pods_of_claim: Mapping[str, Mapping[str, str]],
    gpu_uuids: Iterable[str],
) -> Snapshot:
    """Attribute ``processes`` to claims (see the module docstring).

    ``pod_of_pid``: a PID's pod UID, None for a process of no pod; a PID missing here (its cgroup could not be
    read) is unattributed. ``pods_of_claim``: claim UID -> {pod UID: pod name}. Every share gets a series per
    pod that reserves its claim (with 0 used when none of its processes run), or one with ``pod`` empty.
    """
    share_list = sorted(shares, key=lambda s: (s.namespace, s.name, s.gpu_uuid))
    on_gpu: dict[str, list[ClaimShare]] = defaultdict(list)
    for share in share_list:
        on_gpu[share.gpu_uuid].append(share)
    used: dict[tuple[str, str, str], int] = defaultdict(int)  # (claim, gpu, pod uid) -> bytes
    gpu_used: dict[str, int] = defaultdict(int)
    unattributed = ambiguous = 0
    for proc in processes:
        gpu_used[proc.gpu_uuid] += proc.used_bytes
        pod_uid = pod_of_pid.get(proc.pid)
        owners = [s for s in on_gpu.get(proc.gpu_uuid, []) if pod_uid and pod_uid in pods_of_claim.get(s.claim_uid, {})]
        if len(owners) == 1:
            used[(owners[0].claim_uid, proc.gpu_uuid, pod_uid or "")] += proc.used_bytes
            continue
        unattributed += 1
        ambiguous += len(owners) > 1
    claims: list[ClaimUsage] = []
    for share in share_list:
        pods = pods_of_claim.get(share.claim_uid) or {}
        for pod_uid, pod in sorted(pods.items(), key=lambda p: p[1]) or [("", "")]:
            claims.append(
                ClaimUsage(
                    share=share, pod_uid=pod_uid, pod=pod, used_bytes=used[(share.claim_uid, share.gpu_uuid, pod_uid)]
                )
            )
    granted: dict[str, int] = defaultdict(int)
    for share in share_list:
        granted[share.gpu_uuid] += 0 if share.admin_access else share.granted_bytes
    gpus = tuple(GpuUsage(uuid=u, granted_bytes=granted[u], used_bytes=gpu_used[u]) for u in sorted(set(gpu_uuids)))
    return Snapshot(claims=tuple(claims), gpus=gpus, unattributed=unattributed, ambiguous=ambiguous)


class Crossing(_Value):
    """An unenforced share whose processes went over its grant (``pods``: names of the pods using memory)."""

    share: ClaimShare
    used_bytes: int
    pods: tuple[str, ...]


class CrossingTracker:
    """Reports each time an unenforced share goes from within its grant to over it: once per crossing; it is
    re-armed when the share's use is back within the grant, and forgotten with the share."""

    def __init__(self) -> None:
        self._over: set[tuple[str, str]] = set()  # (claim uid, gpu uuid)

    def update(self, snapshot: Snapshot) -> list[Crossing]:
        """The new crossings of ``snapshot``; remembers which shares are over their grant now."""
        totals: dict[tuple[str, str], tuple[ClaimShare, int, list[str]]] = {}
        for usage in snapshot.claims:
            key = (usage.share.claim_uid, usage.share.gpu_uuid)
            share, total, pods = totals.get(key, (usage.share, 0, []))
            if usage.used_bytes and usage.pod:
                pods.append(usage.pod)
            totals[key] = (share, total + usage.used_bytes, pods)
        over = {key for key, (share, total, _) in totals.items() if not share.enforced and total > share.granted_bytes}
        new = [
            Crossing(share=totals[key][0], used_bytes=totals[key][1], pods=tuple(sorted(totals[key][2])))
            for key in sorted(over - self._over)
        ]
        self._over = over
        return new


class LedgerWriter:
    """Decides when a GPU's used memory is written to its ledger object: when it differs from the value last
    written by at least ``threshold_bytes`` (or turns 0 / non-0), and no sooner than ``min_interval_s`` after
    the last write (or failed attempt) of that GPU. A change held back by the interval is written by the first
    sample after it; a failed write is tried again after the interval."""

    def __init__(self, threshold_bytes: int, min_interval_s: float) -> None:
        self._threshold = threshold_bytes
        self._interval = min_interval_s
        self._written: dict[str, tuple[int | None, float]] = {}  # gpu uuid -> (bytes, None: failed; monotonic time)

    def due(self, gpus: Iterable[GpuUsage], now: float) -> list[GpuUsage]:
        """The GPUs whose value should be written now."""
        out = []
        for gpu in gpus:
            last = self._written.get(gpu.uuid)
            if last is not None:
                value, when = last
                meaningful = (
                    value is None
                    or abs(gpu.used_bytes - value) >= self._threshold
                    or (value == 0) != (gpu.used_bytes == 0)
                )
                if not meaningful or now - when < self._interval:
                    continue
            out.append(gpu)
        return out

    def written(self, gpu: GpuUsage, now: float) -> None:
        """Record a successful write (a failed one is retried by the next sample)."""
        self._written[gpu.uuid] = (gpu.used_bytes, now)

    def failed(self, gpu: GpuUsage, now: float) -> None:
        """Record a failed write: tried again ``min_interval_s`` later, whatever the value then."""
        self._written[gpu.uuid] = (None, now)
