# fracgpu mock NVML profile: 2x H100 80GB + 1x A100 40GB + 1x L4 (mixed node)
# Format: key = value; see harness/mocknvml/mock_nvml.c. Read by libnvidia-ml.so.1 built from it
# when FRACGPU_MOCK_NVML_PROFILE points here.
driver_version = 580.65.06
cuda_driver_version = 13000
uvm_major = 510

gpu.0.uuid = GPU-fcb87bd3-1909-5dd2-8f0a-7fb81345197d
gpu.0.name = NVIDIA H100 80GB HBM3
gpu.0.memory_mib = 81559
gpu.0.minor = 0
gpu.0.pci_bus_id = 0000:18:00.0
gpu.0.architecture = hopper
gpu.0.cuda_cc = 9.0
gpu.0.sm_count = 132
gpu.0.pci_device_id = 0x233010de

gpu.1.uuid = GPU-775e2cae-e862-51dd-9dae-a051f2ce1ece
gpu.1.name = NVIDIA H100 80GB HBM3
gpu.1.memory_mib = 81559
gpu.1.minor = 1
gpu.1.pci_bus_id = 0000:2a:00.0
gpu.1.architecture = hopper
gpu.1.cuda_cc = 9.0
gpu.1.sm_count = 132
gpu.1.pci_device_id = 0x233010de

gpu.2.uuid = GPU-3494b54e-aee5-534f-aa2d-ff9da8ec6faa
gpu.2.name = NVIDIA A100-SXM4-40GB
gpu.2.memory_mib = 40960
gpu.2.minor = 2
gpu.2.pci_bus_id = 0000:3b:00.0
gpu.2.architecture = ampere
gpu.2.cuda_cc = 8.0
gpu.2.sm_count = 108
gpu.2.pci_device_id = 0x20b010de

gpu.3.uuid = GPU-889fdd3b-29ad-5c01-8e38-fde058a9f711
gpu.3.name = NVIDIA L4
gpu.3.memory_mib = 23034
gpu.3.minor = 3
gpu.3.pci_bus_id = 0000:ca:00.0
gpu.3.architecture = ada
gpu.3.cuda_cc = 8.9
gpu.3.sm_count = 58
gpu.3.pci_device_id = 0x27b810de
