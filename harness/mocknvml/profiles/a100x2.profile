# fracgpu mock NVML profile: 2x NVIDIA A100-SXM4-40GB
# Format: key = value; see harness/mocknvml/mock_nvml.c. Read by libnvidia-ml.so.1 built from it
# when FRACGPU_MOCK_NVML_PROFILE points here.
driver_version = 580.65.06
cuda_driver_version = 13000
uvm_major = 510

gpu.0.uuid = GPU-482944dd-0d51-55e5-86ff-5e97c852f099
gpu.0.name = NVIDIA A100-SXM4-40GB
gpu.0.memory_mib = 40960
gpu.0.minor = 0
gpu.0.pci_bus_id = 0000:07:00.0
gpu.0.architecture = ampere
gpu.0.cuda_cc = 8.0
gpu.0.sm_count = 108
gpu.0.pci_device_id = 0x20b010de

gpu.1.uuid = GPU-d9e73e52-c3c5-5290-a2ad-d4d4cb2e0044
gpu.1.name = NVIDIA A100-SXM4-40GB
gpu.1.memory_mib = 40960
gpu.1.minor = 1
gpu.1.pci_bus_id = 0000:0f:00.0
gpu.1.architecture = ampere
gpu.1.cuda_cc = 8.0
gpu.1.sm_count = 108
gpu.1.pci_device_id = 0x20b010de
