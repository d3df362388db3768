"""The `GPU` ledger (`kubectl get gpus`) and the data the controller records in a claim's `status.devices`.

Both are written by the controller (field manager `fracgpu-controller`), except a GPU's `status.usage`, which
only the node plugin of its node writes (`fracgpu-kubelet-plugin`); the models here are the
wire shapes (camelCase), and `api/crds/gpus.fracgpu.dev.yaml` is generated from `Gpu`.
"""

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from api.names import API_GROUP

GPU_VERSION: Final = "v1alpha1"
GPU_API_VERSION: Final = f"{API_GROUP}/{GPU_VERSION}"
GPU_KIND: Final = "GPU"
GPU_PLURAL: Final = "gpus"
GPU_SINGULAR: Final = "gpu"
GPU_CRD_NAME: Final = f"{GPU_PLURAL}.{API_GROUP}"
NODE_LABEL: Final = f"{API_GROUP}/node"
"""Label on every GPU object: the node it lives on (for `kubectl get gpus -l fracgpu.dev/node=...`)."""


def gpu_object_name(node: str, device: str) -> str:
    """Name of the ledger object of `device` on `node`: `<node>-<device>`."""
    return f"{node}-{device}"


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class GpuSpec(_Wire):
    """Which published device this object describes."""

    driver: str = Field(description="DRA driver that publishes the device")
    pool: str = Field(description="ResourceSlice pool of the device (the node name for fracgpu)")
    device: str = Field(description="device name inside the pool, e.g. gpu-0")
    node: str = Field(description="node the GPU is attached to")


class GpuShare(_Wire):
    """One allocation of (part of) this GPU to a request of a ResourceClaim."""

    namespace: str
    name: str = Field(description="ResourceClaim name")
    pod: str | None = Field(
        None,
        description="the pod owning the claim: made from the pod's ResourceClaimTemplate, or by the scheduler "
        "for the pod's extended resource (resources.limits, e.g. gpu.fracgpu.dev/gpu); absent for a claim of its own",
    )
    request: str = Field(description="request name inside the claim (`<request>[/<subrequest>]`)")
    share_id: str = Field("", alias="shareID", description="share ID of the allocation (empty: whole device)")
    memory: str = Field(description="GPU memory granted to the request, as a quantity (0 for admin access)")
    admin_access: bool | None = Field(
        None,
        alias="adminAccess",
        description="true for an admin-access allocation: it reserves no memory (not counted in allocatedMemory)",
    )
    enforcement: str | None = Field(
        None,
        description="memory-enforcement tier the node plugin applied to this share (none, hami-core, mps, nvml, mig)",
    )
    compute: int | None = Field(
        None, description="GPU compute reserved by the request, in percent of the GPU (absent: none reserved)"
    )
    device: str | None = Field(None, description="the MIG partition's device (absent: a share of the GPU itself)")
    profile: str | None = Field(None, description="the MIG partition's profile, e.g. 1g.10gb")
    placement: str | None = Field(None, description="the MIG partition's placement, start:size in memory slices")
    mig_uuid: str | None = Field(None, alias="migUUID", description="the MIG partition's UUID, once prepared")


class GpuMigStatus(_Wire):
    """A MIG GPU (the node plugin's --mig-gpus): its MIG state and how much of it its partitions take."""

    state: str = Field(description="enabled, disabled, pending-enable, pending-disable, unsupported or error")
    message: str = Field("", description="what the state means and what to do")
    used_compute_slices: int = Field(0, alias="usedComputeSlices")
    total_compute_slices: int = Field(0, alias="totalComputeSlices")
    used_memory_slices: int = Field(0, alias="usedMemorySlices")
    total_memory_slices: int = Field(0, alias="totalMemorySlices")
    partitions: int = Field(0, ge=0, description="partitions allocated")
    summary: str = Field(
        "", description="`3/7 compute, 4/8 memory slices, 2 partitions`, or the state when MIG mode is not on"
    )


class GpuUsageStatus(_Wire):
    """Memory in use on the GPU, sampled by the node plugin (field manager `fracgpu-kubelet-plugin`), which
    owns `status.usage` and nothing else; the controller never writes or compares it."""

    used_memory: str = Field(
        alias="usedMemory", description="GPU memory used by all processes on the GPU (NVML), as a quantity"
    )


class GpuCondition(_Wire):
    """A condition of a GPU object, written by the controller: PluginReporting, whether its node's plugin reports."""

    type: str
    status: str = Field(description="True, False or Unknown")
    reason: str
    message: str = ""
    last_transition_time: str | None = Field(
        None, alias="lastTransitionTime", description="when the status last changed (absent: not known)"
    )


class GpuTaint(_Wire):
    """A taint in effect on the GPU's device: published by the node plugin in its ResourceSlice (health, MPS
    daemon) or added by a DeviceTaintRule whose selector matches the device. A claim that does not tolerate a
    NoSchedule or NoExecute taint is not allocated the GPU (NoExecute also evicts the pods of claims on it)."""

    key: str
    value: str | None = None
    effect: str = Field(description="None, NoSchedule or NoExecute (an unknown effect counts as None)")
    source: str = Field(
        description="where the taint comes from: ResourceSlice/<name> (the node plugin) or DeviceTaintRule/<name>"
    )


class GpuStatus(_Wire):
    """The GPU and its allocations, recomputed by the controller from slices and claims; `usage`: the node plugin's."""

    node: str
    index: int | None = Field(None, description="NVML index of the GPU on its node")
    uuid: str = Field("", description="GPU UUID")
    model: str = Field("", description="product name")
    enforcement: str | None = Field(
        None, description="the strongest memory-enforcement tier the GPU offers (device attribute memoryEnforcement)"
    )
    total_memory: str = Field(alias="totalMemory", description="memory offered for sharing, as a quantity")
    allocated_memory: str = Field(alias="allocatedMemory", description="sum of the granted memory of all shares")
    free_memory: str = Field(alias="freeMemory", description="totalMemory minus allocatedMemory (at least 0)")
    allocated_compute: int | None = Field(
        None,
        alias="allocatedCompute",
        description="sum of the compute its shares reserved (capacity compute), in percent of the GPU's 100; absent "
        "while none is reserved",
    )
    shares: int = Field(ge=0, description="number of allocations on this GPU")
    claims: list[GpuShare] = Field(default_factory=list, description="the allocations, sorted by claim")
    share_enforcement: str = Field(
        "",
        alias="shareEnforcement",
        description="tiers applied to the shares, strongest first, as tier=count (unreported: not yet prepared)",
    )
    mps_trust_domain: str | None = Field(
        None,
        alias="mpsTrustDomain",
        description="an MPS GPU with claims: the trust domain its daemon serves (namespace/<ns>, label/<key>=<value> "
        "or cluster); only that domain's claims are placed there",
    )
    taints: list[GpuTaint] | None = Field(
        None, description="the taints in effect on the device, strongest effect first (absent: none)"
    )
    taint_summary: str | None = Field(
        None,
        alias="taintSummary",
        description="how many taints of each effect, strongest first, e.g. NoSchedule=1: a new pod lands on the GPU "
        "only if its claim tolerates the NoSchedule and NoExecute ones (absent: no taint)",
    )
    tainted_by: str | None = Field(
        None,
        alias="taintedBy",
        description="the taints as key=value:effect, comma-separated (absent: no taint)",
    )
    usage: GpuUsageStatus | None = Field(
        None, description="memory in use, written by the node plugin when it samples usage (--usage-interval)"
    )
    conditions: list[GpuCondition] | None = Field(
        None, description="PluginReporting: whether the node's plugin renews its heartbeat (absent: not watched)"
    )
    mig: GpuMigStatus | None = Field(None, description="a MIG GPU: its state, slices and partitions")


class Gpu(_Wire):
    """A physical GPU published by the node plugin, with its allocations: one object per device."""

    spec: GpuSpec
    status: GpuStatus | None = None


PRINTER_COLUMNS: Final[tuple[dict[str, object], ...]] = (
    # The default table (priority 0) is what a platform engineer reads at a glance, and fits 120 characters on
    # the demo with room for one more short column (tests/unit/api/test_gpu_columns.py); `-o wide` adds the rest
    # in this order. NODE is wide only: every object's name is `<node>-<device>` (`gpu_object_name`).
    {"name": "Node", "type": "string", "jsonPath": ".spec.node", "priority": 1},
    {"name": "Model", "type": "string", "jsonPath": ".status.model"},
    {"name": "Total", "type": "string", "jsonPath": ".status.totalMemory"},
    {"name": "Allocated", "type": "string", "jsonPath": ".status.allocatedMemory"},
    {"name": "Used", "type": "string", "jsonPath": ".status.usage.usedMemory", "priority": 1},
    {"name": "Compute", "type": "integer", "jsonPath": ".status.allocatedCompute", "priority": 1},
    {"name": "Free", "type": "string", "jsonPath": ".status.freeMemory"},
    {"name": "Shares", "type": "integer", "jsonPath": ".status.shares"},
    {"name": "Enforcement", "type": "string", "jsonPath": ".status.enforcement"},
    {"name": "Reporting", "type": "string", "jsonPath": '.status.conditions[?(@.type=="PluginReporting")].status'},
    {"name": "Taints", "type": "string", "jsonPath": ".status.taintSummary", "priority": 1},
    {"name": "MIG", "type": "string", "jsonPath": ".status.mig.summary", "priority": 1},
    {"name": "Trust-Domain", "type": "string", "jsonPath": ".status.mpsTrustDomain", "priority": 1},
    {"name": "Index", "type": "integer", "jsonPath": ".status.index", "priority": 1},
    {"name": "UUID", "type": "string", "jsonPath": ".status.uuid", "priority": 1},
    {"name": "Share-Enforcement", "type": "string", "jsonPath": ".status.shareEnforcement", "priority": 1},
    {"name": "Tainted-By", "type": "string", "jsonPath": ".status.taintedBy", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


class AllocatedGpuData(_Wire):
    """`status.devices[].data` of a claim's entry for one of our allocation results.

    Tells the user which physical GPU the request got and how much of its memory. An admin-access result
    (`adminAccess: true`) reserves no memory, since the scheduler does not count it against the GPU's
    capacity: its `memory` is "0" and `adminAccess` is true (it may still use the whole GPU).
    """

    gpu: str = Field(description="name of the GPU ledger object (`kubectl get gpu <gpu>`)")
    node: str
    device: str
    index: int | None = None
    uuid: str | None = None
    product_name: str | None = Field(None, alias="productName")
    request: str
    memory: str = Field(description="granted memory (the allocation's consumedCapacity), as a quantity")
    memory_total: str = Field(alias="memoryTotal", description="memory the GPU offers, as a quantity")
    admin_access: bool | None = Field(None, alias="adminAccess", description="true for an admin-access result")
    enforcement: str | None = Field(
        None,
        description="memory-enforcement tier the node plugin applied (condition MemoryEnforcement); absent "
        "until the claim is prepared",
    )
    profile: str | None = Field(None, description="a MIG partition: its profile, e.g. 1g.10gb")
    placement: str | None = Field(None, description="a MIG partition: its placement, start:size in memory slices")
    partition_memory: str | None = Field(
        None,
        alias="partitionMemory",
        description="a MIG partition: its memory as the driver reports it (what CUDA sees)",
    )
    mig_uuid: str | None = Field(
        None, alias="migUUID", description="a MIG partition: the MIG UUID the node plugin created (absent until then)"
    )
    mps_trust_domain: str | None = Field(
        None,
        alias="mpsTrustDomain",
        description="on an MPS GPU: the claim's MPS trust domain (api/mps_trust.py id), which the GPU's daemon serves",
    )

    def to_data(self) -> dict[str, object]:
        """The JSON object stored in `data` (camelCase, unset fields omitted)."""
        out: dict[str, object] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return out


PLUGIN_REPORTING_CONDITION: Final = "PluginReporting"
"""Condition of a GPU object: True while its node's plugin renews its heartbeat Lease, False once it has not for
the controller's `--plugin-heartbeat-timeout`, Unknown while no heartbeat was ever seen."""
DEVICE_GONE_CONDITION: Final = "AllocatedDeviceGone"
"""Condition the controller sets on a claim's `status.devices` entries whose node was deleted (the device is gone
with it; the claim must be recreated)."""
ENFORCEMENT_CONDITION: Final = "MemoryEnforcement"
"""Condition the node plugin sets on each of its `status.devices` entries: the memory-enforcement tier it put
into the CDI spec (status True unless the tier is `none`), by reason."""
ENFORCEMENT_REASONS: Final[dict[str, str]] = {
    "none": "None",
    "hami-core": "HamiCore",
    "mps": "Mps",
    "nvml": "Nvml",
    "mig": "Mig",
}
"""Tier -> condition reason (reasons must be CamelCase)."""


COMPUTE_CONDITION: Final = "ComputeEnforcement"
"""Condition the node plugin sets on each of its `status.devices` entries that reserved GPU compute
(`consumedCapacity.compute` above 0): True where the tier enforces the share's compute ceiling (reason `Mps`,
`HamiCore`), False where nothing does (`NotEnforced`); absent on entries that reserved no compute."""
COMPUTE_REASONS: Final[dict[str, str]] = {"mps": "Mps", "hami-core": "HamiCore"}
"""Tier -> reason of a True `COMPUTE_CONDITION`: the tiers that enforce a compute ceiling."""
COMPUTE_NOT_ENFORCED: Final = "NotEnforced"


def tier_of_reason(reason: object) -> str | None:
    """The tier an `ENFORCEMENT_CONDITION` reason stands for, or None for an unknown reason."""
    return next((tier for tier, r in ENFORCEMENT_REASONS.items() if r == reason), None)
