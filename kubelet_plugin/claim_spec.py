"""From an allocated ResourceClaim to the CDI spec and the devices returned to the kubelet (pure logic).

Only results of this driver are used; opaque configs of this driver apply class entries first, then claim
entries, each scoped by `requests` (a config naming `gpu` also applies to the subrequest `gpu/large`).
"""

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.config_merge import ConfigEntry, EntryError, config_for
from api.gpu_config import GpuConfig, GpuConfigError
from api.names import MEMORY_CAPACITY
from api.quantity import MiB, to_bytes
from kubelet_plugin import cdi
from kubelet_plugin.devicenodes import DeviceNodeError, HostDeviceNode, gpu_device_nodes
from kubelet_plugin.model import GpuInfo, PreparedDevice
from kubelet_plugin.settings import Settings
from kubelet_plugin.slices import usable_memory

HAMI_LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
HAMI_CACHE_IN_CONTAINER = "/tmp/fracgpu-hami"


class PrepareError(Exception):
    """A claim cannot be prepared; `kind` labels the error metric, the message goes to the kubelet."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class _Share:
    result: dict[str, Any]
    gpu: GpuInfo
    memory_mib: int
    config: GpuConfig

    @property
    def base_request(self) -> str:
        return str(self.result["request"]).split("/", 1)[0]

    @property
    def share_id(self) -> str | None:
        share: str | None = self.result.get("shareID") or None
        return share


@dataclass(frozen=True)
class ClaimPlan:
    """What preparing one claim means: the spec to write (None when no result is ours) and the answer."""

    spec: cdi.Spec | None
    devices: tuple[PreparedDevice, ...]
    nodes: tuple[HostDeviceNode, ...] = ()  # every device node the spec names, as found on the host


def hami_preload_file(settings: Settings) -> Path:
    """Host file mounted as the container's /etc/ld.so.preload in HAMi-core mode."""
    return settings.plugin_data_dir / "hami" / "ld.so.preload"


def hami_cache_dir(settings: Settings, claim_uid: str) -> Path:
    """Per-claim host directory for HAMi-core's shared memory-accounting cache."""
    return settings.plugin_data_dir / "hami" / "claims" / claim_uid


def _config_for(result: dict[str, Any], configs: list[dict[str, Any]]) -> GpuConfig:
    """The merged GpuConfig that applies to one allocation result; raises PrepareError."""
    entries = [
        ConfigEntry(
            parameters=c["opaque"]["parameters"],
            requests=tuple(c.get("requests") or ()),
            from_class=c.get("source") == "FromClass",
        )
        for c in configs
    ]
    try:
        return config_for(entries, str(result["request"]))
    except EntryError as err:
        where = "DeviceClass" if err.entry.from_class else "claim"
        raise PrepareError("invalid_config", f"invalid GpuConfig in the {where} config: {err}") from None
    except GpuConfigError as err:
        raise PrepareError("invalid_config", f"invalid merged GpuConfig: {err}") from None


def plan_claim(claim: dict[str, Any], settings: Settings, gpus: dict[str, GpuInfo]) -> ClaimPlan:
    """Compute the CDI spec and kubelet answer for an allocated claim; raises PrepareError."""
    driver = settings.driver_name
    uid: str = claim["metadata"]["uid"]
    allocation = claim["status"]["allocation"]["devices"]
    results = [r for r in allocation.get("results") or [] if r["driver"] == driver]
    if not results:
        return ClaimPlan(spec=None, devices=())
    configs = [c for c in allocation.get("config") or [] if (c.get("opaque") or {}).get("driver") == driver]
    shares = []
    for result in results:
        if result["pool"] != settings.node_name:
            raise PrepareError(
                "unknown_device", f"device {result['pool']}/{result['device']} belongs to another node's pool"
            )
        gpu = gpus.get(result["device"])
        if gpu is None:
            raise PrepareError(
                "unknown_device",
                f"allocated device {result['device']} is not a GPU of node {settings.node_name} "
                f"(known: {', '.join(sorted(gpus)) or 'none'})",
            )
        consumed = (result.get("consumedCapacity") or {}).get(MEMORY_CAPACITY)
        granted = (
            to_bytes(consumed)
            if consumed is not None
            else usable_memory(gpu, settings.memory_step_bytes, settings.memory_reserve_bytes)
        )
        shares.append(_Share(result, gpu, granted // MiB, _config_for(result, configs)))

    by_request: dict[str, list[_Share]] = defaultdict(list)
    for share in sorted(shares, key=lambda s: s.gpu.pci_bus_id):  # CUDA's default device order
        by_request[share.base_request].append(share)
    if len(by_request) > 1 and any(enforcement(s.config, settings) == "hami-core" for s in shares):
        raise PrepareError(
            "invalid_config",
            "HAMi-core enforcement supports one request per claim (its CUDA_DEVICE_MEMORY_LIMIT_<i> variables "
            f"are per container); this claim has requests {', '.join(sorted(by_request))}: use one claim per request",
        )

    devices: list[cdi.Device] = []
    answer: list[PreparedDevice] = []
    host_nodes: list[HostDeviceNode] = []
    namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
    for share in shares:
        try:
            nodes = gpu_device_nodes(settings.driver_root, share.gpu.minor)
        except DeviceNodeError as err:
            raise PrepareError("device_node_missing", str(err)) from None
        host_nodes += nodes
        group = by_request[share.base_request]
        edits = _edits(share, group, f"{namespace}/{name}", uid, settings=settings, nodes=nodes)
        device_name = cdi.cdi_device_name(uid, share.result["device"], share.share_id)
        devices.append(cdi.Device(name=device_name, container_edits=edits))
        answer.append(
            PreparedDevice(
                request_names=(share.base_request,),
                pool_name=share.result["pool"],
                device_name=share.result["device"],
                cdi_device_ids=(cdi.cdi_device_id(driver, uid, share.result["device"], share.share_id),),
                share_id=share.share_id,
            )
        )
    spec = cdi.Spec(kind=cdi.cdi_kind(driver), devices=devices)
    return ClaimPlan(spec=spec, devices=tuple(answer), nodes=tuple(host_nodes))


def _edits(
    share: _Share, group: list[_Share], claim: str, uid: str, *, settings: Settings, nodes: list[HostDeviceNode]
) -> cdi.ContainerEdits:
    """Edits for one device: identical env across a request's devices, so they never conflict."""
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(s.gpu.uuid for s in group),
        "FRACGPU_MEMORY_LIMIT_MIB": ",".join(str(s.memory_mib) for s in group),
        "FRACGPU_CLAIM": claim,
    }
    share_ids = [s.share_id for s in group if s.share_id]
    if share_ids:
        env["FRACGPU_SHARE_ID"] = ",".join(share_ids)
    env.update(share.config.env)
    mounts: list[cdi.Mount] = []
    if enforcement(share.config, settings) == "hami-core":
        mounts = _hami_mounts(settings, uid)
        env["FRACGPU_ENFORCEMENT"] = "hami-core"
        for i, s in enumerate(group):
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{s.memory_mib}m"
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{HAMI_CACHE_IN_CONTAINER}/vgpu.cache"
        if share.config.compute_limit_percent is not None:
            env["CUDA_DEVICE_SM_LIMIT"] = str(share.config.compute_limit_percent)
    return cdi.ContainerEdits(
        env=[f"{k}={v}" for k, v in env.items()],
        device_nodes=[
            cdi.DeviceNode(
                path=n.container_path,
                host_path=str(n.host_path) if str(n.host_path) != n.container_path else None,
                type="c",
                major=n.major,
                minor=n.minor,
            )
            for n in nodes
        ],
        mounts=mounts,
    )


def enforcement(config: GpuConfig, settings: Settings) -> str:
    """A claim's GpuConfig may turn enforcement on, never off: the node's mode is the administrator's."""
    return "hami-core" if "hami-core" in (settings.enforcement, config.enforcement) else "none"


def _hami_mounts(settings: Settings, uid: str) -> list[cdi.Mount]:
    library = settings.hami_core_library
    if not library.is_file():
        raise PrepareError(
            "hami_core_missing",
            f"HAMi-core enforcement is configured but its library {library} does not exist on this node; "
            "install HAMi-core there, set the chart's enforcement.hamiCore.libraryPath, or use enforcement: none",
        )
    ro = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    rw = ["rw", "nosuid", "nodev", "rbind", "rprivate"]
    return [
        cdi.Mount(host_path=str(library), container_path=HAMI_LIBRARY_IN_CONTAINER, options=ro),
        cdi.Mount(host_path=str(hami_preload_file(settings)), container_path="/etc/ld.so.preload", options=ro),
        cdi.Mount(host_path=str(settings.hami_core_lock_dir), container_path="/tmp/vgpulock", options=rw),
        cdi.Mount(host_path=str(hami_cache_dir(settings, uid)), container_path=HAMI_CACHE_IN_CONTAINER, options=rw),
    ]
