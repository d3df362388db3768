"""A faithful fake NVIDIA driver installation: what `nvidia-ctk cdi generate` finds, and what a container gets.

The mock libnvidia-ml and libcuda carry the profile compiled in and, like the real driver, enumerate only the
GPUs whose `/dev/nvidia<minor>` the calling process can open (under FRACGPU_MOCK_NVML_DEV_ROOT, default `/`),
so what a process sees through NVML, nvidia-smi or CUDA depends on its device nodes, not on its environment.
"""

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.mocknvml import HERE, make_driver_root, read_profile

LIBDIR = "usr/lib/x86_64-linux-gnu"
"""Where the driver's libraries go inside a driver root (the Debian/Ubuntu multiarch directory)."""


@dataclass(frozen=True)
class DriverInstall:
    """A fake driver installed under `root` for one profile."""

    root: Path
    version: str
    libdir: Path
    nvidia_smi: Path
    cuda_probe: Path
    """The CUDA probe built alongside (not part of the root): run it with `libdir` on the loader path."""
    mps_control: Path
    """`<root>/usr/bin/nvidia-cuda-mps-control`, the mock MPS control daemon and client (profile compiled in)."""
    mps_server: Path
    """`<root>/usr/bin/nvidia-cuda-mps-server`, which the daemon starts next to itself."""


def driver_version(profile: Path) -> str:
    """The profile's `driver_version`; ValueError naming the profile when it has none."""
    version = read_profile(profile).get("driver_version", "")
    if not version:
        raise ValueError(f"mock NVML profile {profile} has no driver_version; add e.g. 'driver_version = 580.65.06'")
    return version


def build_driver(profile: Path, build_dir: Path) -> None:
    """Compile the driver files for `profile` into `build_dir` (build.sh --embed-profile)."""
    argv = ["bash", str(HERE / "build.sh"), "--embed-profile", str(profile), str(build_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the mock driver for {profile} failed ({done.returncode}): {done.stderr.strip()}")


def install_driver(root: Path, profile: Path, build_dir: Path) -> DriverInstall:
    """Lay out a driver installation for `profile` under `root` (needs no privileges); compiles into `build_dir`.

    `<root>/usr/lib/x86_64-linux-gnu/` gets libnvidia-ml.so.<ver> and libcuda.so.<ver> (profile compiled in)
    and stub libraries with the real drivers' sonames, each with its soname link; `<root>/usr/bin/` gets
    nvidia-smi, nvidia-cuda-mps-control and nvidia-cuda-mps-server; `<root>/lib/firmware/nvidia/<ver>/` a GSP firmware placeholder. Device nodes are
    make_driver_root()'s job (see make_faithful_driver_root()).
    """
    version = driver_version(profile)
    build_driver(profile, build_dir)
    libdir = root / LIBDIR
    bindir = root / "usr" / "bin"
    firmware = root / "lib" / "firmware" / "nvidia" / version
    for directory in (libdir, bindir, firmware):
        directory.mkdir(parents=True, exist_ok=True)
    for built in sorted(build_dir.glob("lib*.so.*")):
        target = libdir / built.name
        target.unlink(missing_ok=True)
        if built.is_symlink():
            target.symlink_to(built.readlink())
        else:
            shutil.copy2(built, target)
    for program in ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        shutil.copy2(build_dir / program, bindir / program)
    (firmware / "gsp_ga10x.bin").write_bytes(b"")
    return DriverInstall(
        root,
        version,
        libdir,
        bindir / "nvidia-smi",
        build_dir / "cuda-probe",
        bindir / "nvidia-cuda-mps-control",
        bindir / "nvidia-cuda-mps-server",
    )


def make_faithful_driver_root(root: Path, profile: Path, build_dir: Path) -> DriverInstall:
    """install_driver() plus the device nodes of make_driver_root(): a root for `nvidia-ctk` (needs root)."""
    install = install_driver(root, profile, build_dir)
    make_driver_root(root, profile)
    return install
