"""From an allocated ResourceClaim to its CDI spec, files and the devices returned to the kubelet (pure logic).

Each result of this driver becomes a ``Share`` through its kind's plan (``kinds/gpu/plan.py``, ``kinds/mig/plan.py``;
the tiers through ``kinds/gpu/plan.with_tiers``); this module assembles them: one info file and one device metadata
file per request, one CDI device per share with the edits every device gets plus its tier's (``kinds/gpu/plan.py``,
``kinds/mps/plan.py``). Opaque configs of this driver apply class entries first, then claim entries, each scoped by
`requests` (a config naming `gpu` also applies to the subrequest `gpu/large`).
"""

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.config_merge import ConfigEntry, EntryError, allocation_entries, config_for
from api.gpu_config import GpuConfig, GpuConfigError
from api.mps_trust import TrustDomain
from kubelet_plugin.core.devicenodes import DeviceNodeError, DeviceNodeSnapshot, HostDeviceNode
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import GpuInfo, MigRecord, PreparedDevice
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.tiers import GpuTiers, Tier, weakest
from kubelet_plugin.kinds.gpu.plan import gpu_share, tier_edits, with_tiers
from kubelet_plugin.kinds.mig.plan import partition_share
from kubelet_plugin.kinds.mig.publish import MigDevice
from kubelet_plugin.kinds.mps.plan import client_edits, mps_trust_domain
from kubelet_plugin.kinds.share import PreparedPartition, Share
from kubelet_plugin.state import cdi
from kubelet_plugin.state import container_info as info
from kubelet_plugin.state import device_metadata as meta
from kubelet_plugin.state.container_info import VOID, library_problem

# Names each device sets to the same value (so any mix of devices in one container agrees on them).
CONSTANT_ENV = {"FRACGPU_INFO_DIR": info.DIR_IN_CONTAINER, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
# Per request, so two requests in one container disagree and the runtime keeps one: it then names fewer GPUs
# than the container has, never a GPU it lacks (documented; the device nodes decide access).
LAST_WINS_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES"})


@dataclass(frozen=True)
class HostFacts:
    """What the plan knows of the node, read once per call: its GPUs by device name, the published MIG partitions
    by device name and those made for this claim, the device nodes as found, the tiers each GPU offers, whether
    HAMi-core's library is installed (as the publisher says it) and the driver edits (None with
    ``--driver-edits=none``)."""

    gpus: Mapping[str, GpuInfo]
    nodes: DeviceNodeSnapshot
    tiers: Mapping[str, GpuTiers]
    driver_edits: cdi.ContainerEdits | None = None
    mig_devices: Mapping[str, MigDevice] | None = None
    partitions: Mapping[str, PreparedPartition] | None = None
    hami_core_installed: bool = False


@dataclass(frozen=True)
class ClaimPlan:
    """What preparing one claim means: the files and spec to write (None when no result is ours), the answer."""

    spec: cdi.Spec | None
    devices: tuple[PreparedDevice, ...]
    nodes: tuple[HostDeviceNode, ...] = ()  # every device node the spec names, as found on the host
    files: tuple[info.InfoFile, ...] = ()  # one per request, mounted by each of its devices
    metadata: tuple[meta.MetadataFile, ...] = ()  # Kubernetes' device metadata: one per request, mounted likewise
    hami_core: bool = False
    tiers: tuple[tuple[str, str, str | None, Tier], ...] = ()
    """(pool, device, shareID, tier) per result: the enforcement this spec applies (for the claim's status)."""
    mps_domain: TrustDomain | None = None
    """The claim's MPS trust domain when it has an MPS share (``api/mps_trust.py``), else None."""
    mps_grants: Mapping[str, tuple[tuple[int, int | None], ...]] | None = None
    """Per MPS GPU (UUID): (grant MiB, active thread percentage) of each of this claim's MPS shares on it (an
    adminAccess share is none: it is no MPS client)."""
    admin_on_mps: frozenset[tuple[str, str, str | None]] = frozenset()
    """(pool, device, shareID) of each adminAccess result on an MPS GPU: tier ``none``, no MPS client, so its
    containers can monitor the GPU through NVML but not run CUDA work beside the GPU's MPS server."""

    def claim_files(self) -> list[info.InfoFile | meta.MetadataFile]:
        """Every file of the claim's directory that the spec mounts: the info and the metadata files."""
        return [*self.files, *self.metadata]


def plan_claim(claim: dict[str, Any], settings: Settings, node: HostFacts) -> ClaimPlan:
    """Compute the CDI spec and kubelet answer for an allocated claim; raises PrepareError. Pure: everything
    about the host comes in `node`.

    With ``settings.driver_edits == "toolkit"`` the driver edits (libraries, binaries and hooks) become the
    spec-level edits and every device says ``NVIDIA_VISIBLE_DEVICES=void``; missing or library-less edits are a
    PrepareError, never a spec without the driver. With ``none`` they are ignored. Each share's tier comes from the
    node's mode, the share's GpuConfig and what its GPU offers (``kinds/gpu/plan.with_tiers``); an
    ``adminAccess`` result is a device of tier ``none`` granted the whole GPU (on an MPS GPU too: no MPS client, no
    trust domain, no part in the GPU's ceiling). A result on a published MIG partition is a device of tier ``mig``
    (``kinds/mig/plan.py``); a MIG GPU itself is never prepared.
    """
    uid: str = claim["metadata"]["uid"]
    allocation = claim["status"]["allocation"]["devices"]
    results = [r for r in allocation.get("results") or [] if r["driver"] == settings.driver_name]
    if not results:
        return ClaimPlan(spec=None, devices=())
    toolkit = _toolkit_edits(settings, node.driver_edits)
    entries = allocation_entries(allocation.get("config"), settings.driver_name)
    shares = with_tiers([_share(r, entries, settings, node) for r in results], settings, node.tiers, uid)
    by_request: dict[str, list[Share]] = defaultdict(list)
    for share in sorted(shares, key=lambda s: s.gpu.pci_bus_id):  # CUDA order, with CUDA_DEVICE_ORDER=PCI_BUS_ID
        by_request[share.base_request].append(share)
    hami_core = any(s.tier == "hami-core" for s in shares)
    if len(by_request) > 1 and hami_core:
        raise PrepareError(
            ErrorKind.INVALID_CONFIG,
            "HAMi-core enforcement supports one request per claim (its CUDA_DEVICE_MEMORY_LIMIT_<i> variables "
            f"are per container); this claim has requests {', '.join(sorted(by_request))}: use one claim per request",
        )
    claim_name = info.ClaimName(namespace=claim["metadata"]["namespace"], name=claim["metadata"]["name"], uid=uid)
    parts = [
        _request_part(claim, claim_name, request, group, settings=settings, node=node)
        for request, group in by_request.items()
    ]
    devices = [d for part in parts for d in part.devices]
    _check_no_collision(devices)
    spec = cdi.Spec(
        kind=cdi.cdi_kind(settings.driver_name),
        annotations={cdi.CLAIM_ANNOTATION: f"{claim_name.namespace}/{claim_name.name}"},
        devices=devices,
        container_edits=toolkit,
    )
    mps_grants: dict[str, list[tuple[int, int | None]]] = defaultdict(list)
    for part in parts:
        for device in part.file.info.devices:
            if device.enforcement == "mps" and not device.admin_access:
                mps_grants[device.uuid].append((device.memory_mib, device.active_thread_percentage))
    return ClaimPlan(
        spec=spec,
        devices=tuple(a for part in parts for a in part.answer),
        nodes=tuple(n for part in parts for n in part.nodes),
        files=tuple(part.file for part in parts),
        metadata=tuple(part.metadata for part in parts),
        hami_core=hami_core,
        tiers=tuple((s.result["pool"], s.device, s.share_id, s.tier) for s in shares),
        mps_domain=mps_trust_domain(claim, settings) if mps_grants else None,
        mps_grants={uuid: tuple(grants) for uuid, grants in mps_grants.items()},
        admin_on_mps=frozenset(
            (s.result["pool"], s.device, s.share_id)
            for s in shares
            if s.admin and s.partition is None and node.tiers[s.gpu.device_name].required == "mps"
        ),
    )


def _toolkit_edits(settings: Settings, driver_edits: cdi.ContainerEdits | None) -> cdi.ContainerEdits | None:
    """The spec-level driver edits with ``--driver-edits=toolkit`` (None otherwise); raises PrepareError."""
    if settings.driver_edits != "toolkit":
        return None
    problem = "no driver edits were given" if driver_edits is None else library_problem(driver_edits)
    if problem is not None:
        raise PrepareError(
            ErrorKind.DRIVER_EDITS,
            f"driver edits are on (--driver-edits=toolkit) but {problem}; check the NVIDIA driver root "
            f"{settings.toolkit_driver_root or settings.driver_root} (chart value driverRoot)",
        )
    return driver_edits


def _share(result: dict[str, Any], entries: list[ConfigEntry], settings: Settings, node: HostFacts) -> Share:
    """The share of one result of this driver, by its kind; raises PrepareError."""
    if result["pool"] != settings.node_name:
        raise PrepareError(
            ErrorKind.UNKNOWN_DEVICE, f"device {result['pool']}/{result['device']} belongs to another node's pool"
        )
    config = _config_for(result, entries)
    partition = (node.mig_devices or {}).get(str(result["device"]))
    if partition is not None:
        return partition_share(result, partition, node.partitions or {}, config)
    gpu = node.gpus.get(result["device"])
    if gpu is None:
        raise PrepareError(
            ErrorKind.UNKNOWN_DEVICE,
            f"allocated device {result['device']} is not a GPU of node {settings.node_name} "
            f"(known: {', '.join(sorted(node.gpus)) or 'none'})",
        )
    published = node.tiers[gpu.device_name].published
    return gpu_share(result, gpu, config, settings, published=published, hami_core_installed=node.hami_core_installed)


def _config_for(result: dict[str, Any], entries: list[ConfigEntry]) -> GpuConfig:
    """The merged GpuConfig that applies to one allocation result; raises PrepareError."""
    try:
        return config_for(entries, str(result["request"]))
    except EntryError as err:
        where = "DeviceClass" if err.entry.from_class else "claim"
        raise PrepareError(ErrorKind.INVALID_CONFIG, f"invalid GpuConfig in the {where} config: {err}") from None
    except GpuConfigError as err:
        raise PrepareError(ErrorKind.INVALID_CONFIG, f"invalid merged GpuConfig: {err}") from None


@dataclass(frozen=True)
class _RequestPart:
    """One (base) request's part of the plan: its info and metadata files, CDI devices, answers and device nodes."""

    file: info.InfoFile
    metadata: meta.MetadataFile
    devices: list[cdi.Device]
    answer: list[PreparedDevice]
    nodes: list[HostDeviceNode]


def _request_part(
    claim: dict[str, Any],
    claim_name: info.ClaimName,
    request: str,
    group: list[Share],
    *,
    settings: Settings,
    node: HostFacts,
) -> _RequestPart:
    driver, uid = settings.driver_name, claim_name.uid
    request_info = info.RequestInfo(
        claim=claim_name,
        request=request,
        enforcement=weakest([s.tier for s in group]),
        devices=[_device_info(s, driver, uid) for s in group],
    )
    try:
        file = info.info_file(settings.plugin_data_dir, request_info)
    except info.InfoNameError as err:
        raise PrepareError(ErrorKind.INVALID_NAME, str(err)) from None
    metadata = _metadata_file(claim, driver, request, group, file)
    part = _RequestPart(file, metadata, [], [], [])
    visible = ",".join(s.visible_uuid for s in group)
    for share, device_info in zip(group, request_info.devices, strict=True):
        share_nodes = _nodes(node.nodes, share)
        part.nodes.extend(share_nodes)
        edits = _edits(
            share, group, device_info, request_info, part=part, visible=visible, settings=settings, nodes=share_nodes
        )
        name = cdi.cdi_device_name(uid, share.device, share.share_id)
        part.devices.append(cdi.Device(name=name, container_edits=edits))
        part.answer.append(
            PreparedDevice(
                request_names=(request,),
                pool_name=share.result["pool"],
                device_name=share.device,
                cdi_device_ids=(device_info.cdi_device,),
                share_id=share.share_id,
            )
        )
    return part


def _metadata_file(
    claim: dict[str, Any], driver: str, request: str, group: list[Share], file: info.InfoFile
) -> meta.MetadataFile:
    """The device metadata of one (base) request: its devices in the order of its info file."""
    devices = [
        meta.Device(driver=driver, pool=s.result["pool"], name=s.device, attributes=dict(s.attributes)) for s in group
    ]
    try:
        request_ref = str(group[0].result["request"])
        info_dir = file.host_path.parent
        return meta.metadata_file(claim, driver, request, request_ref=request_ref, devices=devices, info_dir=info_dir)
    except meta.MetadataNameError as err:
        raise PrepareError(ErrorKind.INVALID_NAME, str(err)) from None


def _nodes(nodes: DeviceNodeSnapshot, share: Share) -> list[HostDeviceNode]:
    """The GPU's node and the control nodes; for a MIG partition also its instances' capability nodes."""
    try:
        found = nodes.gpu_nodes(share.gpu.minor)
        if share.partition is not None:
            found += nodes.cap_nodes(share.partition.cap_minors)
        return found
    except DeviceNodeError as err:
        raise PrepareError(ErrorKind.DEVICE_NODE_MISSING, str(err)) from None


def _device_info(share: Share, driver: str, uid: str) -> info.DeviceInfo:
    name = cdi.cdi_device_name(uid, share.device, share.share_id)
    try:
        prefix = info.env_prefix(name)
    except info.InfoNameError as err:
        raise PrepareError(ErrorKind.INVALID_NAME, str(err)) from None
    return info.DeviceInfo(
        uuid=share.gpu.uuid,
        memory_mib=share.memory_mib,
        share_id=share.share_id,
        device=share.device,
        pci_bus_id=share.gpu.pci_bus_id,
        minor=share.gpu.minor,
        cdi_device=cdi.cdi_device_id(driver, uid, share.device, share.share_id),
        env_prefix=prefix,
        enforcement=share.tier,
        active_thread_percentage=share.compute_ceiling if share.tier == "mps" else None,
        mig=_mig_info(share.partition.record) if share.partition is not None else None,
        admin_access=share.admin,
    )


def _mig_info(record: MigRecord) -> info.MigInfo:
    return info.MigInfo(
        uuid=record.uuid,
        profile=record.profile,
        gpu_instance=record.gpu_instance,
        compute_instance=record.compute_instance,
        placement_start=record.placement_start,
        memory_slices=record.memory_slices,
        multiprocessors=record.multiprocessors,
    )


def _check_no_collision(devices: list[cdi.Device]) -> None:
    """Refuse a claim whose devices set one name to two values (a container referencing the whole claim would
    get one of them): only GpuConfig env scoped to different requests can do that."""
    seen: dict[str, tuple[str, str]] = {}
    for device in devices:
        for entry in device.container_edits.env:
            key, _, value = entry.partition("=")
            if key in LAST_WINS_ENV:
                continue
            first = seen.setdefault(key, (value, device.name))
            if first[0] != value:
                raise PrepareError(
                    ErrorKind.INVALID_CONFIG,
                    f"environment variable {key} would be {first[0]!r} for device {first[1]} and {value!r} for "
                    f"device {device.name} of the same claim, and a container gets only one: give the requests' "
                    "GpuConfigs the same value or different names",
                )


def _edits(
    share: Share,
    group: list[Share],
    device: info.DeviceInfo,
    request: info.RequestInfo,
    *,
    part: _RequestPart,
    visible: str,
    settings: Settings,
    nodes: list[HostDeviceNode],
) -> cdi.ContainerEdits:
    """Edits for one device: constants, its own FRACGPU_DEV_<KEY>_* names, its request's info and device metadata
    files and (identical across the request's devices, which always travel together) NVIDIA_VISIBLE_DEVICES
    (`visible`: the request's UUIDs, a MIG partition's MIG UUID, with driver edits ``none``; ``void`` with
    ``toolkit``), then its tier's edits (``kinds/gpu/plan.tier_edits``, ``kinds/mps/plan.client_edits``)."""
    env = dict(CONSTANT_ENV)
    env["NVIDIA_VISIBLE_DEVICES"] = visible
    env.update(info.device_env(device.env_prefix, device, request.claim, request.request))
    env.update(share.config.env)
    if settings.driver_edits == "toolkit":  # the spec carries the driver: no nvidia runtime may inject it again
        env["NVIDIA_VISIBLE_DEVICES"] = VOID.partition("=")[2]
    mounts = [
        cdi.Mount(host_path=str(f.host_path), container_path=f.container_path, options=info.mount_options())
        for f in (part.file, part.metadata)
    ]
    tier = (
        client_edits(share, settings) if share.tier == "mps" else tier_edits(share, group, settings, request.claim.uid)
    )
    env.update(tier.env)
    mounts += tier.mounts
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
        hooks=tier.hooks,
    )
