"""What every kind's plan produces for one allocation result, and what ``prepare/plan.py`` assembles into a claim's
CDI spec and files: a ``Share`` (a device of the claim: its GPU, grant, config, tier, MIG partition and published
attributes) and the ``Edits`` a tier adds to a device (env, mounts, hooks). Pure value types.

May import: ``state`` (the CDI and metadata models), ``enforcement`` (tiers), ``core``, ``api``.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api import compute
from api.gpu_config import GpuConfig
from kubelet_plugin.core.model import GpuInfo, MigRecord
from kubelet_plugin.enforcement.tiers import Tier
from kubelet_plugin.state import cdi
from kubelet_plugin.state import device_metadata as meta


@dataclass(frozen=True)
class PreparedPartition:
    """The MIG partition made for a device (its instances, ``record``) and the capability minors of its GPU
    instance and compute instance (``/dev/nvidia-caps/nvidia-cap<minor>``)."""

    record: MigRecord
    cap_minors: tuple[int, ...]


@dataclass(frozen=True)
class Share:
    """One allocation result of this driver as its kind planned it."""

    result: Mapping[str, Any]
    gpu: GpuInfo
    memory_mib: int
    config: GpuConfig
    tier: Tier = "none"
    partition: PreparedPartition | None = None
    attributes: Mapping[str, meta.Attribute] = field(default_factory=dict)
    """The device's attributes as its ResourceSlice publishes them, as device metadata says them."""
    compute_percent: int = 0
    """The GPU compute the scheduler reserved for it (``consumedCapacity.compute``, percent; 0: none asked)."""

    @property
    def compute_ceiling(self) -> int | None:
        """The compute percentage a tier that enforces compute (mps, hami-core) gives it: the reservation, or
        ``computeLimitPercent`` when no larger (``api.compute.ceiling``); None: neither, the GPU's default."""
        return compute.ceiling(self.compute_percent, self.config.compute_limit_percent)

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

    @property
    def device(self) -> str:
        return str(self.result["device"])

    @property
    def visible_uuid(self) -> str:
        """What NVIDIA_VISIBLE_DEVICES names for it: a partition's MIG UUID, else its GPU's UUID."""
        return self.partition.record.uuid if self.partition is not None else self.gpu.uuid


@dataclass
class Edits:
    """What a tier adds to one device's container edits."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: list[cdi.Mount] = field(default_factory=list)
    hooks: list[cdi.Hook] = field(default_factory=list)
