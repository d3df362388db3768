# fracgpu mock NVML profile: 2 GPUs of exactly 80Gi (81920 MiB), named like H100s: the e2e tests and
# the demo use it so that two 40Gi shares fill one GPU exactly (a real H100 80GB reports 81559 MiB).
# Format: key = value; see harness/mocknvml/mock_nvml.c. Read by libnvidia-ml.so.1 built from it
# when FRACGPU_MOCK_NVML_PROFILE points here.
# Each GPU on a PCIe root and NUMA node of its own, as the driver root's sysfs says (mocknvml.make_sysfs).
driver_version = 580.65.06
cuda_driver_version = 13000
uvm_major = 510

gpu.0.uuid = GPU-e311ac15-7c36-5bd0-91a6-3dc862bb53b2
gpu.0.name = NVIDIA H100 80GB HBM3
gpu.0.memory_mib = 81920
gpu.0.minor = 0
gpu.0.pci_bus_id = 0000:18:00.0
gpu.0.architecture = hopper
gpu.0.cuda_cc = 9.0
gpu.0.sm_count = 132
gpu.0.pci_device_id = 0x233010de
gpu.0.pcie_root = pci0000:17
gpu.0.numa_node = 0

gpu.1.uuid = GPU-1d492704-49c3-5be7-977e-269165e18e2c
gpu.1.name = NVIDIA H100 80GB HBM3
gpu.1.memory_mib = 81920
gpu.1.minor = 1
gpu.1.pci_bus_id = 0000:2a:00.0
gpu.1.architecture = hopper
gpu.1.cuda_cc = 9.0
gpu.1.sm_count = 132
gpu.1.pci_device_id = 0x233010de
gpu.1.pcie_root = pci0000:29
gpu.1.numa_node = 1
# MIG mode off: e2e/test_mig.py turns it on (as the operator would) and names GPU 1 in mig.gpus; the key gives
# the driver root this GPU's MIG capability nodes (e2e/mocknvml/__init__.py make_driver_root)
gpu.1.mig_mode = disabled
