"""The attributes every published device of a physical GPU carries, whatever its kind: the GPU's identity and
where it sits (Kubernetes' standard ``resource.kubernetes.io/pciBusID``, ``pcieRoot`` and ``numaNode``). Pure.

Used by the kinds' publishing (``kinds/gpu/publish.py``, ``kinds/mig/publish.py``), so a whole GPU, a MIG GPU
and its partitions say the same thing about the GPU they are.
"""

from typing import Any

from api.names import NUMA_NODE_ATTRIBUTE, PCI_BUS_ID_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE
from kubelet_plugin.core.model import GpuInfo


def semver(version: str) -> str:
    """`9.0` → `9.0.0`, `580.65.06` → `580.65.6`: DRA version attributes must be semantic versions."""
    parts = [str(int(p)) for p in version.split(".")[:3] if p.isdigit()]
    return ".".join([*parts, "0", "0", "0"][:3])


def pci_attributes(gpu: GpuInfo) -> dict[str, Any]:
    """Kubernetes' standard attributes of where the GPU sits: its PCI address, and its PCIe root and NUMA node where
    sysfs says them (left out where it does not)."""
    attributes: dict[str, Any] = {PCI_BUS_ID_ATTRIBUTE: {"string": gpu.pci_bus_id}}
    if gpu.pcie_root is not None:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": gpu.pcie_root}
    if gpu.numa_node is not None:
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": gpu.numa_node}
    return attributes


def identity_attributes(gpu: GpuInfo) -> dict[str, Any]:
    """The physical GPU's identity as published: UUID, index, minor, product, architecture, versions, place."""
    return {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "productName": {"string": gpu.product_name[:64]},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": semver(gpu.cuda_compute_capability)},
        "driverVersion": {"version": semver(gpu.driver_version)},
        **pci_attributes(gpu),
    }
