"""Simulated GPUs for tests and the demo: the mock libnvidia-ml.so.1 plus mknod-made device nodes."""

import os
import re
import stat
import subprocess
from pathlib import Path

from kubelet_plugin.publishing.discovery import normalise_pci_bus_id

HERE = Path(__file__).resolve().parent
PROFILES = HERE / "profiles"
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
DEVICE_NODE_MODE = 0o666  # as the NVIDIA driver creates them (NVreg_DeviceFileMode default)
NVIDIA_CAPS_MAJOR = 508
"""The character major of the simulated driver's MIG capability nodes (the real one's is dynamic)."""
CAPS_NODE_MODE = 0o444  # as nvidia-modprobe creates them
MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"
"""Where a driver root keeps the simulated driver's table of MIG capability minors (the real one is in /proc)."""


def build(outdir: Path) -> Path:
    """Compile the mock NVML library into `outdir`; return the directory for LD_LIBRARY_PATH."""
    subprocess.run(["bash", str(HERE / "build.sh"), str(outdir)], check=True, capture_output=True)
    return outdir


def read_profile(profile: Path) -> dict[str, str]:
    """The profile's `key = value` lines."""
    values: dict[str, str] = {}
    for raw in profile.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def gpu_minors(profile: Path) -> list[int]:
    """Minor numbers of the profile's GPUs."""
    values = read_profile(profile)
    return sorted(int(v) for k, v in values.items() if k.startswith("gpu.") and k.endswith(".minor"))


def mig_gpu_minors(profile: Path) -> list[int]:
    """Minor numbers of the profile's GPUs that have a `gpu.<i>.mig_mode` (MIG GPUs of the tests, whatever mode)."""
    values = read_profile(profile)
    indices = {k.split(".")[1] for k in values if k.startswith("gpu.") and k.endswith(".mig_mode")}
    return sorted(int(values[f"gpu.{i}.minor"]) for i in indices)


def cap_minor(gpu_minor: int, gpu_instance: int, compute_instance: int | None = None) -> int:
    """A MIG capability minor as the driver's mig-minors table numbers them (harness/mocknvml/mock_mig.h)."""
    return 3 + 135 * gpu_minor + 9 * gpu_instance + (0 if compute_instance is None else 1 + compute_instance)


def mig_minors_table() -> str:
    """The driver's /proc/driver/nvidia-caps/mig-minors: config, monitor and every GPU, GPU and compute instance."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {cap_minor(gpu, gi)}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {cap_minor(gpu, gi, ci)}" for ci in range(8)]
    return "\n".join(lines) + "\n"


def _mknod(path: Path, major: int, minor: int, mode: int = DEVICE_NODE_MODE) -> None:
    """A character device node like the NVIDIA driver's: mode 0666 (or `mode`) whatever the umask."""
    if path.is_symlink() or path.exists():
        st = path.lstat()
        if not (stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)):
            path.unlink()
    if not path.exists():
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod applies the umask


SYSFS = "sys"
"""Where a driver root keeps the simulated host's sysfs (the plugin's --sys-root is `<root>/sys`)."""
_PCIE_ROOT = re.compile(r"pci([0-9a-f]{4,8}):([0-9a-f]{2})")


def make_sysfs(root: Path, profile: Path) -> Path:
    """The PCI part of a host's sysfs under `<root>/sys` for the profile's GPUs that have a `gpu.<i>.pcie_root`: as
    Linux lays it out, `devices/<pcie root>/<root port>/<bus id>/` (the root port `<domain>:<root bus>:01.0`) with
    the file `numa_node` (the GPU's `gpu.<i>.numa_node`, -1 when it has none) and the link
    `bus/pci/devices/<bus id>` -> `../../../devices/<pcie root>/<root port>/<bus id>`. Needs no privileges.
    Returns `<root>/sys`."""
    values = read_profile(profile)
    sysfs = root / SYSFS
    links = sysfs / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    indices = sorted({k.split(".")[1] for k in values if k.startswith("gpu.") and k.endswith(".pcie_root")})
    for i in indices:
        pcie_root = values[f"gpu.{i}.pcie_root"]
        match = _PCIE_ROOT.fullmatch(pcie_root)
        if match is None:
            raise ValueError(f"{profile}: gpu.{i}.pcie_root must look like pci0000:17, got {pcie_root!r}")
        bus_id = normalise_pci_bus_id(values[f"gpu.{i}.pci_bus_id"])
        port = f"{match[1]}:{match[2]}:01.0"
        device = sysfs / "devices" / pcie_root / port / bus_id
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(values.get(f"gpu.{i}.numa_node", "-1") + "\n")
        link = links / bus_id
        link.unlink(missing_ok=True)
        link.symlink_to(Path("..", "..", "..", "devices", pcie_root, port, bus_id))
    return sysfs


def make_driver_root(root: Path, profile: Path) -> Path:
    """Create `<root>/dev/nvidia<minor>` per GPU, nvidiactl, nvidia-uvm and nvidia-uvm-tools, all 0666 (needs root);
    for the profile's MIG GPUs (`mig_gpu_minors`) also every MIG capability node `dev/nvidia-caps/nvidia-cap<minor>`
    (config, monitor and those of each GPU and compute instance), 0444, and the driver's table of their minors at
    `<root>/proc/driver/nvidia-caps/mig-minors` (the real driver keeps it in /proc); and the GPUs' sysfs
    (`make_sysfs`)."""
    dev = root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    uvm_major = int(read_profile(profile).get("uvm_major", "510"))
    for minor in gpu_minors(profile):
        _mknod(dev / f"nvidia{minor}", NVIDIA_MAJOR, minor)
    _mknod(dev / "nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)
    _mknod(dev / "nvidia-uvm", uvm_major, 0)
    _mknod(dev / "nvidia-uvm-tools", uvm_major, 1)
    mig = mig_gpu_minors(profile)
    if mig:
        caps = dev / "nvidia-caps"
        caps.mkdir(exist_ok=True)
        for minor in [1, 2, *(m for g in mig for m in range(cap_minor(g, 0), cap_minor(g, 15)))]:
            _mknod(caps / f"nvidia-cap{minor}", NVIDIA_CAPS_MAJOR, minor, CAPS_NODE_MODE)
        table = root / MIG_MINORS
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(mig_minors_table())
    make_sysfs(root, profile)
    return root


def build_nvml_variant(outdir: Path, *cflags: str) -> Path:
    """Compile only the mock libnvidia-ml.so.1 into `outdir` with extra C flags (e.g.
    `-DMOCK_NO_RUNNING_PROCESSES`: a driver without the per-process calls); return `outdir`."""
    outdir.mkdir(parents=True, exist_ok=True)
    sources = [
        str(HERE / name)
        for name in ("mock_nvml.c", "mock_nvml_events.c", "mock_nvml_mig.c", "mock_mig.c", "mock_profile.c")
    ]
    argv = ["cc", "-O2", "-Wall", "-Wextra", "-Werror", *cflags, "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1"]
    subprocess.run(
        [*argv, "-o", str(outdir / "libnvidia-ml.so.1"), *sources, "-lpthread"], check=True, capture_output=True
    )
    return outdir
