# fracgpu mock NVML profile: one GPU of each MIG product the mock models (e2e/mocknvml/mock_mig.h), MIG on, plus
# a GPU with MIG off and one that cannot do MIG: the MIG tests of the mock and of publishing use it.
# Format: key = value; see e2e/mocknvml/mock_nvml.c.
driver_version = 580.65.06
cuda_driver_version = 13000
uvm_major = 510

gpu.0.uuid = GPU-6a3f1c52-0d7e-5b1a-9c44-1e2f3a4b5c60
gpu.0.name = NVIDIA H100 80GB HBM3
gpu.0.memory_mib = 81559
gpu.0.minor = 0
gpu.0.pci_bus_id = 0000:18:00.0
gpu.0.architecture = hopper
gpu.0.cuda_cc = 9.0
gpu.0.mig_mode = enabled

gpu.1.uuid = GPU-6a3f1c52-0d7e-5b1a-9c44-1e2f3a4b5c61
gpu.1.name = NVIDIA A100-SXM4-40GB
gpu.1.memory_mib = 40960
gpu.1.minor = 1
gpu.1.pci_bus_id = 0000:2a:00.0
gpu.1.architecture = ampere
gpu.1.cuda_cc = 8.0
gpu.1.mig_mode = enabled

gpu.2.uuid = GPU-6a3f1c52-0d7e-5b1a-9c44-1e2f3a4b5c62
gpu.2.name = NVIDIA A100-SXM4-80GB
gpu.2.memory_mib = 81920
gpu.2.minor = 2
gpu.2.pci_bus_id = 0000:3a:00.0
gpu.2.architecture = ampere
gpu.2.cuda_cc = 8.0
gpu.2.mig_mode = enabled

gpu.3.uuid = GPU-6a3f1c52-0d7e-5b1a-9c44-1e2f3a4b5c63
gpu.3.name = NVIDIA H200
gpu.3.memory_mib = 143771
gpu.3.minor = 3
gpu.3.pci_bus_id = 0000:5d:00.0
gpu.3.architecture = hopper
gpu.3.cuda_cc = 9.0
gpu.3.mig_mode = enabled

gpu.4.uuid = GPU-6a3f1c52-0d7e-5b1a-9c44-1e2f3a4b5c64
gpu.4.name = NVIDIA H100 80GB HBM3
gpu.4.memory_mib = 81559
gpu.4.minor = 4
gpu.4.pci_bus_id = 0000:9a:00.0
gpu.4.architecture = hopper
gpu.4.cuda_cc = 9.0
gpu.4.mig_mode = pending-enable

gpu.5.uuid = GPU-6a3f1c52-0d7e-5b1a-9c44-1e2f3a4b5c65
gpu.5.name = NVIDIA L4
gpu.5.memory_mib = 23034
gpu.5.minor = 5
gpu.5.pci_bus_id = 0000:ab:00.0
gpu.5.architecture = ada
gpu.5.cuda_cc = 8.9
