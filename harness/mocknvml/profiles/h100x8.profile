# fracgpu mock NVML profile: 8x NVIDIA H100 80GB HBM3 (HGX H100 board)
# Format: key = value; see harness/mocknvml/mock_nvml.c. Read by libnvidia-ml.so.1 built from it
# when FRACGPU_MOCK_NVML_PROFILE points here.
driver_version = 580.65.06
cuda_driver_version = 13000
uvm_major = 510

gpu.0.uuid = GPU-ba4495f0-43e6-53d7-b12c-a82819124276
gpu.0.name = NVIDIA H100 80GB HBM3
gpu.0.memory_mib = 81559
gpu.0.minor = 0
gpu.0.pci_bus_id = 0000:18:00.0
gpu.0.architecture = hopper
gpu.0.cuda_cc = 9.0
gpu.0.sm_count = 132
gpu.0.pci_device_id = 0x233010de

gpu.1.uuid = GPU-058c2c28-7299-5436-a1ab-6da30d23ece0
gpu.1.name = NVIDIA H100 80GB HBM3
gpu.1.memory_mib = 81559
gpu.1.minor = 1
gpu.1.pci_bus_id = 0000:2a:00.0
gpu.1.architecture = hopper
gpu.1.cuda_cc = 9.0
gpu.1.sm_count = 132
gpu.1.pci_device_id = 0x233010de

gpu.2.uuid = GPU-74a171d4-d5ac-5a0a-b87e-03ba65d7f66a
gpu.2.name = NVIDIA H100 80GB HBM3
gpu.2.memory_mib = 81559
gpu.2.minor = 2
gpu.2.pci_bus_id = 0000:3a:00.0
gpu.2.architecture = hopper
gpu.2.cuda_cc = 9.0
gpu.2.sm_count = 132
gpu.2.pci_device_id = 0x233010de

gpu.3.uuid = GPU-81722b19-93d2-5254-aa65-eb294c6efbbc
gpu.3.name = NVIDIA H100 80GB HBM3
gpu.3.memory_mib = 81559
gpu.3.minor = 3
gpu.3.pci_bus_id = 0000:5d:00.0
gpu.3.architecture = hopper
gpu.3.cuda_cc = 9.0
gpu.3.sm_count = 132
gpu.3.pci_device_id = 0x233010de

gpu.4.uuid = GPU-3d91d840-a96e-5704-a80c-f83d3dddec56
gpu.4.name = NVIDIA H100 80GB HBM3
gpu.4.memory_mib = 81559
gpu.4.minor = 4
gpu.4.pci_bus_id = 0000:9a:00.0
gpu.4.architecture = hopper
gpu.4.cuda_cc = 9.0
gpu.4.sm_count = 132
gpu.4.pci_device_id = 0x233010de

gpu.5.uuid = GPU-f02fae68-cdf7-5fc7-8590-e857ad9b9a4c
gpu.5.name = NVIDIA H100 80GB HBM3
gpu.5.memory_mib = 81559
gpu.5.minor = 5
gpu.5.pci_bus_id = 0000:ab:00.0
gpu.5.architecture = hopper
gpu.5.cuda_cc = 9.0
gpu.5.sm_count = 132
gpu.5.pci_device_id = 0x233010de

gpu.6.uuid = GPU-afb25d2e-5fe9-5379-93cc-30e96483b6fc
gpu.6.name = NVIDIA H100 80GB HBM3
gpu.6.memory_mib = 81559
gpu.6.minor = 6
gpu.6.pci_bus_id = 0000:ba:00.0
gpu.6.architecture = hopper
gpu.6.cuda_cc = 9.0
gpu.6.sm_count = 132
gpu.6.pci_device_id = 0x233010de

gpu.7.uuid = GPU-f5d82031-d4c0-5d44-9c6a-d3ec64174252
gpu.7.name = NVIDIA H100 80GB HBM3
gpu.7.memory_mib = 81559
gpu.7.minor = 7
gpu.7.pci_bus_id = 0000:db:00.0
gpu.7.architecture = hopper
gpu.7.cuda_cc = 9.0
gpu.7.sm_count = 132
gpu.7.pci_device_id = 0x233010de
