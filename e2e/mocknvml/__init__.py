"""Simulated GPUs for tests and the demo: the mock libnvidia-ml.so.1 plus mknod-made device nodes."""

import os
import stat
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILES = HERE / "profiles"
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
DEVICE_NODE_MODE = 0o666  # as the NVIDIA driver creates them (NVreg_DeviceFileMode default)


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


def _mknod(path: Path, major: int, minor: int) -> None:
    """A character device node like the NVIDIA driver's: mode 0666 whatever the umask."""
    if path.is_symlink() or path.exists():
        st = path.lstat()
        if not (stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)):
            path.unlink()
    if not path.exists():
        os.mknod(path, DEVICE_NODE_MODE | stat.S_IFCHR, os.makedev(major, minor))
    os.chmod(path, DEVICE_NODE_MODE)  # mknod applies the umask


def make_driver_root(root: Path, profile: Path) -> Path:
    """Create `<root>/dev/nvidia<minor>` per GPU, nvidiactl, nvidia-uvm and nvidia-uvm-tools, all 0666 (needs root)."""
    dev = root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    uvm_major = int(read_profile(profile).get("uvm_major", "510"))
    for minor in gpu_minors(profile):
        _mknod(dev / f"nvidia{minor}", NVIDIA_MAJOR, minor)
    _mknod(dev / "nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)
    _mknod(dev / "nvidia-uvm", uvm_major, 0)
    _mknod(dev / "nvidia-uvm-tools", uvm_major, 1)
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
