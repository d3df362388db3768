"""Value types passed between the node plugin's modules (discovery, gRPC server, prepare logic).

``GpuInfo`` is validated where it enters (NVML, once at start); the per-call types are frozen dataclasses."""

from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from api.mig import MigState

NodeMode = Literal["auto", "none", "hami-core", "nvml"]
"""The node's enforcement floor (``--enforcement``): ``auto`` = each GPU's strongest tier, or a tier."""
NODE_MODES: tuple[NodeMode, ...] = get_args(NodeMode)
TAINT_DOMAIN = "gpu.fracgpu.dev"
"""The domain of the taints the plugin puts on its devices (health, MPS daemons)."""
TaintEffect = Literal["None", "NoSchedule", "NoExecute"]
"""What a GPU's health class does to its ResourceSlice device (``None``: no taint)."""


class GpuInfo(BaseModel):
    """One physical GPU as NVML reports it, and where it sits on the host as sysfs says (None: sysfs does not)."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0, description="NVML device index")
    uuid: str = Field(description="e.g. GPU-8f6c1a2e-...")
    product_name: str = Field(description="nvmlDeviceGetName, e.g. 'NVIDIA H100 80GB HBM3'")
    memory_total_bytes: int = Field(gt=0)
    minor: int = Field(ge=0, description="minor number of /dev/nvidia<minor>")
    pci_bus_id: str = Field(description="normalised 'dddd:bb:dd.f', lower case")
    architecture: str = Field(description="e.g. 'Hopper', 'Ampere'")
    cuda_compute_capability: str = Field(description="'<major>.<minor>', e.g. '9.0'")
    driver_version: str = Field(description="e.g. '580.65.06'")
    pcie_root: str | None = Field(None, description="its PCIe root complex, e.g. 'pci0000:17'")
    numa_node: int | None = Field(None, ge=0, description="its NUMA node")

    @property
    def device_name(self) -> str:
        """Name of this GPU's device in the ResourceSlice."""
        return f"gpu-{self.index}"


class MigProfile(BaseModel):
    """One GPU-instance profile a MIG GPU offers, as NVML reports it (``nvmlDeviceGetGpuInstanceProfileInfoV``)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="e.g. '1g.10gb' (NVML's name without 'MIG ')")
    profile_id: int = Field(ge=0, description="the profile ID nvmlDeviceCreateGpuInstanceWithPlacement takes")
    compute_slices: int = Field(gt=0)
    memory_slices: int = Field(gt=0, description="the size of each placement")
    memory_mib: int = Field(gt=0, description="the partition's memory (memorySizeMB)")
    multiprocessors: int = Field(ge=0)
    placements: tuple[int, ...] = Field(description="the possible placement starts, ascending")


class MigGpu(BaseModel):
    """What a GPU named in ``--mig-gpus`` offers for MIG: its state and, while MIG mode is on, its profiles."""

    model_config = ConfigDict(frozen=True)

    state: MigState
    detail: str = Field("", description="what NVML said, when it failed")
    memory_slices: int = Field(0, ge=0, description="the GPU's memory slices (8 on A100/H100/H200)")
    compute_slices: int = Field(0, ge=0, description="the GPU's compute slices (7)")
    profiles: tuple[MigProfile, ...] = ()


class MigRecord(BaseModel):
    """A MIG partition the plugin created for a device: its GPU instance and compute instance (what unprepare
    destroys and recovery checks), and the MIG device they make. Stored in the checkpoint (camelCase; fields of a
    newer plugin are kept, as the checkpoint's own models keep them)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, populate_by_name=True)

    parent_uuid: str = Field(alias="parentUUID", description="the physical GPU")
    gpu_instance: int = Field(alias="gpuInstance", description="GPU instance id")
    compute_instance: int = Field(alias="computeInstance", description="compute instance id in it")
    profile: str = Field(description="GPU-instance profile, e.g. 1g.10gb")
    profile_id: int = Field(alias="profileID", description="its NVML profile ID")
    placement_start: int = Field(alias="placementStart")
    memory_slices: int = Field(alias="memorySlices", description="the placement's size")
    uuid: str = Field(description="the MIG device's UUID (MIG-...)")
    memory_mib: int = Field(alias="memoryMiB", description="the partition's memory as the driver reports it")
    multiprocessors: int = Field(default=0, description="the compute instance's streaming multiprocessors")


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources (plain data: built per
    claim on the hot path, from a protobuf message that is already typed)."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as returned to the kubelet (plain data, see ClaimRef)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """Outcome for one claim: devices on success, or a non-empty error (plain data, see ClaimRef)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
