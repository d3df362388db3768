"""A MIG partition's part of a claim's plan (pure): the share of a result on a published partition, from the
instances made for it (``partitions.py``): its GPU, the partition's memory as its grant, tier ``mig`` and the
partition's published attributes.

May import: ``kinds/share.py``, ``kinds/mig`` (its own modules), ``state``, ``core``, ``api``.
"""

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from api.gpu_config import GpuConfig
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.kinds.mig.publish import MigDevice, partition_entry
from kubelet_plugin.kinds.share import PreparedPartition, Share
from kubelet_plugin.state import device_metadata as meta


@lru_cache(maxsize=1024)
def published_attributes(device: MigDevice) -> Mapping[str, meta.Attribute]:
    """The partition's attributes as its ResourceSlice device publishes them, as device metadata says them."""
    return meta.attributes(partition_entry(device)["attributes"])


def partition_share(
    result: Mapping[str, Any],
    device: MigDevice,
    partitions: Mapping[str, PreparedPartition],
    config: GpuConfig,
) -> Share:
    """The share of `result` on partition `device`, whose instances the caller made (`partitions`: device name ->
    them); raises PrepareError when none were made or its GpuConfig asks for a compute limit (a partition's
    compute is its profile's)."""
    made = partitions.get(device.name)
    if made is None:
        raise PrepareError(ErrorKind.INTERNAL, f"no MIG partition was made for device {device.name}")
    if config.compute_limit_percent is not None:
        raise PrepareError(
            ErrorKind.INVALID_CONFIG,
            f"request {result['request']!r} is a MIG partition, whose compute is its profile's "
            f"({device.profile.compute_slices} of its GPU's compute slices): computeLimitPercent does "
            "not apply; leave it out of this request's GpuConfig",
        )
    memory = made.record.memory_mib
    return Share(result, device.gpu, memory, config, "mig", partition=made, attributes=published_attributes(device))
