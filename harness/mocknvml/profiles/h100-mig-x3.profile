# fracgpu mock NVML profile: 3x NVIDIA H100 80GB HBM3 for the MIG tests: GPU 0 a whole GPU, GPU 1 a MIG GPU with
# MIG mode on, GPU 2 a MIG GPU whose MIG mode is off (named in --mig-gpus, it must say why it offers nothing).
# Format: key = value; see e2e/mocknvml/mock_nvml.c. Read by libnvidia-ml.so.1 built from it
# when FRACGPU_MOCK_NVML_PROFILE points here.
driver_version = 580.65.06
cuda_driver_version = 13000
uvm_major = 510

gpu.0.uuid = GPU-7c1d2e3f-4a5b-5c6d-8e7f-0a1b2c3d4e50
gpu.0.name = NVIDIA H100 80GB HBM3
gpu.0.memory_mib = 81559
gpu.0.minor = 0
gpu.0.pci_bus_id = 0000:18:00.0
gpu.0.architecture = hopper
gpu.0.cuda_cc = 9.0

gpu.1.uuid = GPU-7c1d2e3f-4a5b-5c6d-8e7f-0a1b2c3d4e51
gpu.1.name = NVIDIA H100 80GB HBM3
gpu.1.memory_mib = 81559
gpu.1.minor = 1
gpu.1.pci_bus_id = 0000:2a:00.0
gpu.1.architecture = hopper
gpu.1.cuda_cc = 9.0
gpu.1.mig_mode = enabled

gpu.2.uuid = GPU-7c1d2e3f-4a5b-5c6d-8e7f-0a1b2c3d4e52
gpu.2.name = NVIDIA H100 80GB HBM3
gpu.2.memory_mib = 81559
gpu.2.minor = 2
gpu.2.pci_bus_id = 0000:3a:00.0
gpu.2.architecture = hopper
gpu.2.cuda_cc = 9.0
gpu.2.mig_mode = disabled
