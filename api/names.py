"""Names fixed by the architecture (docs/architecture.md, "Names")."""

from typing import Final

DRIVER_NAME: Final = "gpu.fracgpu.dev"
DEVICE_CLASS_NAME: Final = "gpu.fracgpu.dev"
MIG_DEVICE_CLASS_NAME: Final = "mig.gpu.fracgpu.dev"
MPS_DEVICE_CLASS_NAME: Final = "mps.gpu.fracgpu.dev"
"""Created by the chart only with `deviceClass.mps.create` (MPS GPUs: attribute `mps`)."""
API_GROUP: Final = "fracgpu.dev"
CONFIG_API_VERSION: Final = "fracgpu.dev/v1alpha1"
CONFIG_KIND: Final = "GpuConfig"
CDI_VENDOR_PREFIX: Final = "k8s."
CDI_CLASS: Final = "claim"
MEMORY_CAPACITY: Final = "memory"
MPS_CLIENTS_CAPACITY: Final = "mpsClients"
"""An MPS GPU's client slots: a share consumes one (or as many as it asks: one per CUDA process)."""
