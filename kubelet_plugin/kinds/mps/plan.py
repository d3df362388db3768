"""An MPS share's part of a claim's plan (pure): the claim's trust domain, and what an MPS client is told (its
GPU's pipe directory and /dev/shm, its grant as the pinned memory limit, its compute share).

May import: ``kinds/share.py``, ``state``, ``core``, ``api``.
"""

from typing import Any

from api.mps_trust import DATA_KEY, TrustDomain, TrustDomainError, trust_domain
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.kinds.share import Edits, Share
from kubelet_plugin.state import cdi
from kubelet_plugin.state import mps_files as mps

MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CUDA_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def mps_trust_domain(claim: dict[str, Any], settings: Settings) -> TrustDomain:
    """The claim's MPS trust domain; raises PrepareError. With ``--mps-trust-scope=namespaceLabel`` it is the one
    the controller recorded in the claim's status (``data.mpsTrustDomain`` of an entry of this driver): the
    controller reads namespaces, the plugin does not."""
    namespace = claim["metadata"]["namespace"]
    if settings.mps_trust_scope != "namespaceLabel":
        return trust_domain(settings.mps_trust_scope, settings.mps_trust_label, namespace, None)
    recorded = {
        str((entry.get("data") or {}).get(DATA_KEY))
        for entry in (claim.get("status") or {}).get("devices") or []
        if entry.get("driver") == settings.driver_name and (entry.get("data") or {}).get(DATA_KEY)
    }
    if len(recorded) != 1:
        raise PrepareError(
            ErrorKind.ENFORCEMENT_UNAVAILABLE,
            "the fracgpu controller has not recorded this claim's MPS trust domain in its status yet "
            f"(status.devices[].data.{DATA_KEY}; found {sorted(recorded) or 'none'}): is the controller running? "
            "The kubelet retries",
        )
    try:
        domain = TrustDomain.parse(recorded.pop())
    except TrustDomainError as err:
        raise PrepareError(ErrorKind.INVALID_CONFIG, f"the claim's status: {err}") from None
    if domain.kind == "namespace" and domain.value != namespace:
        raise PrepareError(
            ErrorKind.INVALID_CONFIG,
            f"the claim's status records the MPS trust domain {domain.describe()}, but the claim is in namespace "
            f"{namespace}",
        )
    return domain


def client_edits(share: Share, settings: Settings) -> Edits:
    """What an ``mps`` share's device adds: the client's variables and its GPU's pipe directory and /dev/shm."""
    if share.tier != "mps":
        return Edits()
    env = mps_env(share.gpu.uuid, share.memory_mib, share.compute_ceiling)
    return Edits(env=env, mounts=mps_mounts(settings, share.gpu.uuid))


def mps_env(uuid: str, memory_mib: int, thread_percentage: int | None) -> dict[str, str]:
    """An MPS client's variables: its GPU's pipe directory, the grant as its pinned device memory limit and the
    compute share as its active thread percentage. Device ordinal 0: a client sees only the GPU its daemon
    serves, and each daemon serves one GPU. ``CUDA_VISIBLE_DEVICES`` is that GPU's UUID, so an image that sets
    it to an index of another machine's GPUs (which the MPS client would look for and not find) cannot lose it."""
    env = {
        MPS_PIPE_ENV: mps.PIPE_IN_CONTAINER,
        MPS_MEMORY_ENV: f"0={memory_mib}M",
        CUDA_DEVICES_ENV: uuid,
        "FRACGPU_ENFORCEMENT": "mps",
    }
    if thread_percentage is not None:
        env[MPS_THREADS_ENV] = str(thread_percentage)
    return env


def mps_mounts(settings: Settings, uuid: str) -> list[cdi.Mount]:
    """The GPU's MPS pipe directory, read-only (a client only connects to the daemon's socket there: it can
    neither remove nor replace it), and the GPU's own /dev/shm (a tmpfs of its trust domain), which a client
    shares with its server."""
    ro = ["ro", "nosuid", "nodev", "noexec", "rbind", "rprivate"]
    rw = ["rw", "nosuid", "nodev", "noexec", "rbind", "rprivate"]
    return [
        cdi.Mount(
            host_path=str(mps.pipe_dir(settings.mps_root, uuid)), container_path=mps.PIPE_IN_CONTAINER, options=ro
        ),
        cdi.Mount(host_path=str(mps.shm_dir(settings.mps_root, uuid)), container_path=mps.SHM_IN_CONTAINER, options=rw),
    ]
