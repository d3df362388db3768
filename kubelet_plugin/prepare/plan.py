"""From an allocated ResourceClaim to the CDI spec and the devices returned to the kubelet (pure logic).

Only results of this driver are used; opaque configs of this driver apply class entries first, then claim
entries, each scoped by `requests` (a config naming `gpu` also applies to the subrequest `gpu/large`).
"""

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from api.config_merge import ConfigEntry, EntryError, allocation_entries, config_for
from api.gpu_config import GpuConfig, GpuConfigError
from api.mps_trust import DATA_KEY, TrustDomain, TrustDomainError, trust_domain
from api.names import MEMORY_CAPACITY
from api.quantity import MiB, to_bytes
from kubelet_plugin.core.model import GpuInfo, MigRecord, PreparedDevice
from kubelet_plugin.core.settings import Settings, is_selected
from kubelet_plugin.enforcement.tiers import EnforcementUnavailableError, GpuTiers, Tier, applied_tier, weakest
from kubelet_plugin.mps import layout as mps
from kubelet_plugin.prepare import cdi
from kubelet_plugin.prepare import container_info as info
from kubelet_plugin.prepare import device_metadata as meta
from kubelet_plugin.prepare.container_info import VOID, library_problem
from kubelet_plugin.prepare.devicenodes import DeviceNodeError, DeviceNodeSnapshot, HostDeviceNode
from kubelet_plugin.prepare.errors import ErrorKind, PrepareError
from kubelet_plugin.publishing.slices import MigDevice, device_entry, partition_entry, usable_memory

HAMI_LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
HAMI_CACHE_IN_CONTAINER = "/tmp/fracgpu-hami"
NVML_HOOK = "apply-cuda-memory-limits"
NVML_REQUEST_ENV = "NVIDIA_GPU_MEMORY_REQUEST"
NVML_LIMIT_ENV = "NVIDIA_GPU_MEMORY_LIMIT"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CUDA_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class PreparedPartition:
    """The MIG partition made for a device (its instances, ``record``) and the capability minors of its GPU
    instance and compute instance (``/dev/nvidia-caps/nvidia-cap<minor>``)."""

    record: MigRecord
    cap_minors: tuple[int, ...]


@dataclass(frozen=True)
class _Share:
    result: dict[str, Any]
    gpu: GpuInfo
    memory_mib: int
    config: GpuConfig
    tier: Tier = "none"
    partition: PreparedPartition | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    """The device's attributes as its ResourceSlice publishes them (for the device metadata)."""

    @property
    def base_request(self) -> str:
        return str(self.result["request"]).split("/", 1)[0]

    @property
    def admin(self) -> bool:
        """An adminAccess result: monitoring access that reserves nothing, limited by no tier."""
        return self.result.get("adminAccess") is True

    @property
    def share_id(self) -> str | None:
        share: str | None = self.result.get("shareID") or None
        return share


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

    def claim_files(self) -> list[info.InfoFile | meta.MetadataFile]:
        """Every file of the claim's directory that the spec mounts: the info and the metadata files."""
        return [*self.files, *self.metadata]


# Names each device sets to the same value (so any mix of devices in one container agrees on them).
CONSTANT_ENV = {"FRACGPU_INFO_DIR": info.DIR_IN_CONTAINER, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
# Per request, so two requests in one container disagree and the runtime keeps one: it then names fewer GPUs
# than the container has, never a GPU it lacks (documented; the device nodes decide access).
LAST_WINS_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES"})


def hami_preload_file(settings: Settings) -> Path:
    """Host file mounted as the container's /etc/ld.so.preload in HAMi-core mode."""
    return settings.plugin_data_dir / "hami" / "ld.so.preload"


def hami_cache_root(settings: Settings) -> Path:
    """Host directory of the per-claim HAMi-core caches."""
    return settings.plugin_data_dir / "hami" / "claims"


def hami_cache_dir(settings: Settings, claim_uid: str) -> Path:
    """Per-claim host directory for HAMi-core's shared memory-accounting cache."""
    return hami_cache_root(settings) / claim_uid


def _config_for(result: dict[str, Any], entries: list[ConfigEntry]) -> GpuConfig:
    """The merged GpuConfig that applies to one allocation result; raises PrepareError."""
    try:
        return config_for(entries, str(result["request"]))
    except EntryError as err:
        where = "DeviceClass" if err.entry.from_class else "claim"
        raise PrepareError(ErrorKind.INVALID_CONFIG, f"invalid GpuConfig in the {where} config: {err}") from None
    except GpuConfigError as err:
        raise PrepareError(ErrorKind.INVALID_CONFIG, f"invalid merged GpuConfig: {err}") from None


def plan_claim(
    claim: dict[str, Any],
    settings: Settings,
    gpus: dict[str, GpuInfo],
    driver_edits: cdi.ContainerEdits | None,
    tiers: Mapping[str, GpuTiers],
    *,
    nodes: DeviceNodeSnapshot,
    mig_devices: Mapping[str, MigDevice] | None = None,
    partitions: Mapping[str, PreparedPartition] | None = None,
    hami_core_installed: bool = False,
) -> ClaimPlan:
    """Compute the CDI spec and kubelet answer for an allocated claim; raises PrepareError. Pure: everything
    about the host comes in as arguments (``nodes``: the device nodes as the caller found them).

    With ``settings.driver_edits == "toolkit"``, ``driver_edits`` (the generated driver libraries, binaries and
    hooks) become the spec-level edits and every device says ``NVIDIA_VISIBLE_DEVICES=void``; missing or
    library-less edits are a PrepareError, never a spec without the driver. With ``none`` they are ignored.

    ``tiers`` (device name -> the enforcement tiers that GPU offers now, ``EnforcementDetector.tiers()``)
    decide each share's tier with the node's mode and the share's GpuConfig
    (enforcement.applied_tier); a tier a GPU cannot give is a PrepareError ``enforcement_unavailable``.
    An ``adminAccess`` result (monitoring, KEP-5018) is a device of tier ``none`` whose grant is the whole GPU's
    memory, marked ``adminAccess`` for the container: the scheduler never counts it, nothing limits it.

    A result on a published MIG partition (``mig_devices``: device name -> the partition it stands for) is a
    device of tier ``mig`` whose instances the caller made (``partitions``: device name -> them): its GPU's node,
    the capability nodes of its instances, the partition's memory as its grant and its MIG UUID and profile. A
    MIG GPU itself (``--mig-gpus``) is never prepared.

    Each request also gets Kubernetes' device metadata file (``device_metadata``): its devices with the attributes
    their ResourceSlice publishes, for which ``hami_core_installed`` says whether HAMi-core's library is on the
    node (the publisher's ``hamiCore``) and ``tiers`` gives each GPU's published ``memoryEnforcement``.
    """
    driver = settings.driver_name
    toolkit = settings.driver_edits == "toolkit"
    uid: str = claim["metadata"]["uid"]
    allocation = claim["status"]["allocation"]["devices"]
    results = [r for r in allocation.get("results") or [] if r["driver"] == driver]
    if not results:
        return ClaimPlan(spec=None, devices=())
    if toolkit:
        problem = "no driver edits were given" if driver_edits is None else library_problem(driver_edits)
        if problem is not None:
            raise PrepareError(
                ErrorKind.DRIVER_EDITS,
                f"driver edits are on (--driver-edits=toolkit) but {problem}; check the NVIDIA driver root "
                f"{settings.toolkit_driver_root or settings.driver_root} (chart value driverRoot)",
            )
    entries = allocation_entries(allocation.get("config"), driver)
    shares = []
    for result in results:
        if result["pool"] != settings.node_name:
            raise PrepareError(
                ErrorKind.UNKNOWN_DEVICE, f"device {result['pool']}/{result['device']} belongs to another node's pool"
            )
        partition = _partition(result, mig_devices or {}, partitions or {})
        if partition is not None:
            config = _config_for(result, entries)
            if config.compute_limit_percent is not None:
                raise PrepareError(
                    ErrorKind.INVALID_CONFIG,
                    f"request {result['request']!r} is a MIG partition, whose compute is its profile's "
                    f"({partition[0].profile.compute_slices} of its GPU's compute slices): computeLimitPercent does "
                    "not apply; leave it out of this request's GpuConfig",
                )
            memory = partition[1].record.memory_mib
            published = partition_entry(partition[0])["attributes"]
            shares.append(
                _Share(result, partition[0].gpu, memory, config, "mig", partition=partition[1], attributes=published)
            )
            continue
        gpu = gpus.get(result["device"])
        if gpu is None:
            raise PrepareError(
                ErrorKind.UNKNOWN_DEVICE,
                f"allocated device {result['device']} is not a GPU of node {settings.node_name} "
                f"(known: {', '.join(sorted(gpus)) or 'none'})",
            )
        if is_selected(settings.mig_gpus, gpu.index, gpu.uuid):
            raise PrepareError(
                ErrorKind.UNKNOWN_DEVICE,
                f"device {result['device']} is MIG GPU {gpu.uuid} itself, which is allocated only by its partitions "
                "(DeviceClass mig.gpu.fracgpu.dev); a claim that tolerates its taint gpu.fracgpu.dev/mig-parent "
                "gets nothing: ask for a MIG partition, or a GPU not named in mig.gpus",
            )
        step, reserve = settings.memory_step_bytes, settings.memory_reserve_bytes
        consumed = (result.get("consumedCapacity") or {}).get(MEMORY_CAPACITY)
        granted = (
            to_bytes(consumed)
            if consumed is not None and result.get("adminAccess") is not True
            else usable_memory(gpu, step, reserve)
        )  # an adminAccess result reaches the whole GPU, whatever it asked the scheduler for
        entry = device_entry(gpu, step, reserve, hami_core_installed, tiers[gpu.device_name].published)
        shares.append(_Share(result, gpu, granted // MiB, _config_for(result, entries), attributes=entry["attributes"]))
    shares = _with_tiers(shares, settings, tiers, uid)

    by_request: dict[str, list[_Share]] = defaultdict(list)
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
    devices: list[cdi.Device] = []
    answer: list[PreparedDevice] = []
    host_nodes: list[HostDeviceNode] = []
    files: list[info.InfoFile] = []
    metadata: list[meta.MetadataFile] = []
    for request, group in by_request.items():
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
        files.append(file)
        metadata.append(_metadata_file(claim, driver, request, group, file.host_path.parent))
        for share, device_info in zip(group, request_info.devices, strict=True):
            share_nodes = _nodes(nodes, share)
            host_nodes += share_nodes
            edits = _edits(
                share,
                group,
                device_info,
                request_info,
                file,
                metadata=metadata[-1],
                settings=settings,
                nodes=share_nodes,
            )
            name = cdi.cdi_device_name(uid, share.result["device"], share.share_id)
            devices.append(cdi.Device(name=name, container_edits=edits))
            answer.append(
                PreparedDevice(
                    request_names=(request,),
                    pool_name=share.result["pool"],
                    device_name=share.result["device"],
                    cdi_device_ids=(device_info.cdi_device,),
                    share_id=share.share_id,
                )
            )
    _check_no_collision(devices)
    spec = cdi.Spec(
        kind=cdi.cdi_kind(driver),
        annotations={cdi.CLAIM_ANNOTATION: f"{claim_name.namespace}/{claim_name.name}"},
        devices=devices,
        container_edits=driver_edits if toolkit else None,
    )
    return ClaimPlan(
        spec=spec,
        devices=tuple(answer),
        nodes=tuple(host_nodes),
        files=tuple(files),
        metadata=tuple(metadata),
        hami_core=hami_core,
        tiers=tuple((s.result["pool"], s.result["device"], s.share_id, s.tier) for s in shares),
        mps_domain=mps_trust_domain(claim, settings) if any(s.tier == "mps" for s in shares) else None,
    )


def _metadata_file(
    claim: dict[str, Any], driver: str, request: str, group: list[_Share], info_dir: Path
) -> meta.MetadataFile:
    """The device metadata of one (base) request: its devices in the order of its info file."""
    devices = [
        meta.Device(
            driver=driver, pool=s.result["pool"], name=s.result["device"], attributes=meta.attributes(s.attributes)
        )
        for s in group
    ]
    try:
        request_ref = str(group[0].result["request"])
        return meta.metadata_file(claim, driver, request, request_ref=request_ref, devices=devices, info_dir=info_dir)
    except meta.MetadataNameError as err:
        raise PrepareError(ErrorKind.INVALID_NAME, str(err)) from None


def _partition(
    result: Mapping[str, Any], mig_devices: Mapping[str, MigDevice], partitions: Mapping[str, PreparedPartition]
) -> tuple[MigDevice, PreparedPartition] | None:
    """The partition a result stands for and the instances made for it; None for a result that is no partition."""
    device = mig_devices.get(str(result["device"]))
    if device is None:
        return None
    made = partitions.get(device.name)
    if made is None:
        raise PrepareError(ErrorKind.INTERNAL, f"no MIG partition was made for device {device.name}")
    return device, made


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


def _with_tiers(shares: list[_Share], settings: Settings, tiers: Mapping[str, GpuTiers], uid: str) -> list[_Share]:
    """Each share with its enforcement tier (a MIG partition keeps ``mig``, which every tier a GpuConfig can ask
    for is weaker than). HAMi-core, once preloaded for one share, limits every GPU the container sees, so the
    claim's other ``none`` shares are ``hami-core`` too, and it cannot go with a MIG partition in one claim. nvml
    shares of one claim must have one grant: NVIDIA's hook reads a single NVIDIA_GPU_MEMORY_LIMIT per container."""
    out = []
    for share in shares:
        if share.partition is not None or share.admin:  # an admin's tier stays none: nothing limits monitoring
            out.append(share)
            continue
        where = f"GPU {share.result['device']} ({share.gpu.uuid})"
        try:
            tier = applied_tier(settings.enforcement, share.config.enforcement, tiers[share.gpu.device_name], where)
        except EnforcementUnavailableError as err:
            raise PrepareError(
                ErrorKind.ENFORCEMENT_UNAVAILABLE, f"request {share.result['request']!r}: {err}"
            ) from None
        out.append(replace(share, tier=tier))
    if any(s.tier == "hami-core" for s in out):
        if any(s.partition is not None for s in out):
            raise PrepareError(
                ErrorKind.INVALID_CONFIG,
                f"claim {uid} has a MIG partition and a hami-core share, but HAMi-core preloaded for one limits every "
                "GPU of the container, the partition too: put the MIG partition in a claim of its own",
            )
        out = [replace(s, tier="hami-core") if s.tier == "none" else s for s in out]
    mps_gpus = {s.gpu.uuid for s in out if s.tier == "mps"}
    if mps_gpus and len({s.gpu.uuid for s in out}) > 1:
        raise PrepareError(
            ErrorKind.INVALID_CONFIG,
            f"claim {uid} has an MPS share and shares on {len({s.gpu.uuid for s in out})} GPUs, but a CUDA process is "
            "the client of one MPS daemon (one CUDA_MPS_PIPE_DIRECTORY), which serves one GPU: the process would "
            "see only that GPU. Put each MPS share in a claim of its own (one request, count 1) and give a container "
            "at most one of them",
        )
    grants = sorted({s.memory_mib for s in out if s.tier == "nvml"})
    if len(grants) > 1:
        raise PrepareError(
            ErrorKind.INVALID_CONFIG,
            f"claim {uid} has nvml-enforced shares of different sizes ({', '.join(f'{g} MiB' for g in grants)}), "
            f"but NVIDIA's hook reads one {NVML_LIMIT_ENV} per container: use one claim per share size",
        )
    return out


def _nodes(nodes: DeviceNodeSnapshot, share: _Share) -> list[HostDeviceNode]:
    """The GPU's node and the control nodes; for a MIG partition also its instances' capability nodes."""
    try:
        found = nodes.gpu_nodes(share.gpu.minor)
        if share.partition is not None:
            found += nodes.cap_nodes(share.partition.cap_minors)
        return found
    except DeviceNodeError as err:
        raise PrepareError(ErrorKind.DEVICE_NODE_MISSING, str(err)) from None


def _device_info(share: _Share, driver: str, uid: str) -> info.DeviceInfo:
    name = cdi.cdi_device_name(uid, share.result["device"], share.share_id)
    try:
        prefix = info.env_prefix(name)
    except info.InfoNameError as err:
        raise PrepareError(ErrorKind.INVALID_NAME, str(err)) from None
    return info.DeviceInfo(
        uuid=share.gpu.uuid,
        memory_mib=share.memory_mib,
        share_id=share.share_id,
        device=share.result["device"],
        pci_bus_id=share.gpu.pci_bus_id,
        minor=share.gpu.minor,
        cdi_device=cdi.cdi_device_id(driver, uid, share.result["device"], share.share_id),
        env_prefix=prefix,
        enforcement=share.tier,
        active_thread_percentage=share.config.compute_limit_percent if share.tier == "mps" else None,
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
    share: _Share,
    group: list[_Share],
    device: info.DeviceInfo,
    request: info.RequestInfo,
    file: info.InfoFile,
    *,
    metadata: meta.MetadataFile,
    settings: Settings,
    nodes: list[HostDeviceNode],
) -> cdi.ContainerEdits:
    """Edits for one device: constants, its own FRACGPU_DEV_<KEY>_* names, its request's info and device metadata
    files and (identical across the request's devices, which always travel together) NVIDIA_VISIBLE_DEVICES (the
    request's UUIDs, a MIG partition's MIG UUID, with driver edits ``none``; ``void`` with ``toolkit``) and
    HAMi-core's env."""
    env = dict(CONSTANT_ENV)
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(s.partition.record.uuid if s.partition else s.gpu.uuid for s in group)
    env.update(info.device_env(device.env_prefix, device, request.claim, request.request))
    env.update(share.config.env)
    if settings.driver_edits == "toolkit":  # the spec carries the driver: no nvidia runtime may inject it again
        env["NVIDIA_VISIBLE_DEVICES"] = VOID.partition("=")[2]
    mounts = [
        cdi.Mount(host_path=str(f.host_path), container_path=f.container_path, options=info.mount_options())
        for f in (file, metadata)
    ]
    hooks = []
    if share.tier == "nvml":
        env[NVML_REQUEST_ENV] = env[NVML_LIMIT_ENV] = str(share.memory_mib)
        hooks.append(nvml_hook(settings, share.gpu.uuid))
    if share.tier == "hami-core":
        mounts += _hami_mounts(settings, request.claim.uid)
        env["FRACGPU_ENFORCEMENT"] = "hami-core"
        for i, s in enumerate(group):
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{s.memory_mib}m"
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{HAMI_CACHE_IN_CONTAINER}/vgpu.cache"
        if share.config.compute_limit_percent is not None:
            env["CUDA_DEVICE_SM_LIMIT"] = str(share.config.compute_limit_percent)
    if share.tier == "mps":
        env.update(mps_env(share.gpu.uuid, share.memory_mib, share.config.compute_limit_percent))
        mounts += mps_mounts(settings, share.gpu.uuid)
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
        hooks=hooks,
    )


def nvml_hook(settings: Settings, uuid: str) -> cdi.Hook:
    """NVIDIA's ``createRuntime`` hook that has the driver cap the container's cgroup on GPU `uuid` at
    NVIDIA_GPU_MEMORY_REQUEST (soft) / NVIDIA_GPU_MEMORY_LIMIT (hard), in MiB; the hook binary is the one
    driver edits install on the host, the driver root the host's."""
    root = settings.host_driver_root or settings.driver_root
    return cdi.Hook(
        hook_name="createRuntime",
        path=str(settings.cdi_hook_path),
        args=["nvidia-cdi-hook", NVML_HOOK, "--driver-root", str(root), "--gpu-id", uuid],
        env=["NVIDIA_CTK_DEBUG=false"],
    )


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


def _hami_mounts(settings: Settings, uid: str) -> list[cdi.Mount]:
    """HAMi-core's mounts; only for a share whose tier is hami-core, which `tiers` offers only while the library
    is on the node."""
    library = settings.hami_core_library
    ro = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    rw = ["rw", "nosuid", "nodev", "rbind", "rprivate"]
    return [
        cdi.Mount(host_path=str(library), container_path=HAMI_LIBRARY_IN_CONTAINER, options=ro),
        cdi.Mount(host_path=str(hami_preload_file(settings)), container_path="/etc/ld.so.preload", options=ro),
        cdi.Mount(host_path=str(settings.hami_core_lock_dir), container_path="/tmp/vgpulock", options=rw),
        cdi.Mount(host_path=str(hami_cache_dir(settings, uid)), container_path=HAMI_CACHE_IN_CONTAINER, options=rw),
    ]
