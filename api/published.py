"""The attribute and capacity names fracgpu's devices publish: the one list the node plugin's slices keep to
(a unit test builds every kind of device the plugin publishes and compares) and admission reads, to warn of a
CEL selector that names something no fracgpu device has. Pure: names only.

Unqualified names are in the driver's domain (`device.attributes["<driver>"].<name>` in CEL); the standard ones
are in Kubernetes' domain `resource.kubernetes.io` (`device.attributes["resource.kubernetes.io"].<name>`).
"""

from typing import Final

from api import mig
from api.names import (
    COMPUTE_CAPACITY,
    MEMORY_CAPACITY,
    MPS_CLIENTS_CAPACITY,
    NUMA_NODE_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
)

STANDARD_DOMAIN: Final = "resource.kubernetes.io"
"""Kubernetes' domain of standard device attributes."""

DRIVER_ATTRIBUTES: Final = frozenset(
    {
        mig.TYPE_ATTRIBUTE,
        "uuid",
        "index",
        "minor",
        "productName",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "hamiCore",
        "memoryEnforcement",
        "mps",
        # a MIG GPU and its partitions (api/mig.py)
        mig.PROFILE_ATTRIBUTE,
        mig.PLACEMENT_ATTRIBUTE,
        mig.MEMORY_SLICES_ATTRIBUTE,
        mig.COMPUTE_SLICES_ATTRIBUTE,
        mig.PARTITION_MEMORY_ATTRIBUTE,
        mig.MULTIPROCESSORS_ATTRIBUTE,
        mig.STATE_ATTRIBUTE,
    }
)
"""Attributes in the driver's domain, on some kind of device (a whole GPU, a MIG partition or a MIG GPU)."""

STANDARD_ATTRIBUTES: Final = frozenset(
    n.removeprefix(f"{STANDARD_DOMAIN}/") for n in (PCI_BUS_ID_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE, NUMA_NODE_ATTRIBUTE)
)
"""Attributes in `resource.kubernetes.io` (Kubernetes' standard attributes)."""

DRIVER_CAPACITIES: Final = frozenset({MEMORY_CAPACITY, COMPUTE_CAPACITY, MPS_CLIENTS_CAPACITY})
"""Capacities in the driver's domain (`mpsClients` on MPS GPUs only; `compute` on shared GPUs and MIG partitions)."""


def attributes(driver: str) -> dict[str, frozenset[str]]:
    """The published attribute names by domain, for the driver named `driver`."""
    return {driver: DRIVER_ATTRIBUTES, STANDARD_DOMAIN: STANDARD_ATTRIBUTES}


def capacities(driver: str) -> dict[str, frozenset[str]]:
    """The published capacity names by domain, for the driver named `driver`."""
    return {driver: DRIVER_CAPACITIES}
