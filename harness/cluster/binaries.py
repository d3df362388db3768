"""Where the upstream binaries built by build-binaries.sh live, and building the missing ones."""

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-binaries.sh"
VERSIONS = HERE.parents[1] / "e2e" / "cluster" / "versions.env"
"""The pins of every upstream component (where the design card keeps them)."""
TOOLKIT = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime")
"""NVIDIA Container Toolkit commands, all built from one pinned module (NVIDIA_CTK_VERSION)."""


def cache_dir() -> Path:
    """Cache outside the repo holding built binaries (FRACGPU_CACHE, default ~/.cache/fracgpu)."""
    return Path(os.environ.get("FRACGPU_CACHE", Path.home() / ".cache" / "fracgpu"))


def versions() -> dict[str, str]:
    """Pinned versions from e2e/cluster/versions.env."""
    pinned: dict[str, str] = {}
    for raw in VERSIONS.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pinned[key] = value
    return pinned


def version_of(component: str) -> str:
    """Pinned version of one upstream component."""
    pinned = versions()
    if component.startswith("kube") or component == "kubectl":
        return pinned["KUBERNETES_VERSION"]
    if component in TOOLKIT:
        return pinned["NVIDIA_CTK_VERSION"]
    return {
        "etcd": pinned["ETCD_VERSION"],
        "containerd": pinned["CONTAINERD_VERSION"],
        "ctr": pinned["CONTAINERD_VERSION"],
        "containerd-shim-runc-v2": pinned["CONTAINERD_VERSION"],
        "helm": pinned["HELM_VERSION"],
        "runc": pinned["RUNC_VERSION"],
    }[component]


def binary(component: str) -> Path:
    """Path of a built component; ensure_built() first."""
    return cache_dir() / "bin" / f"{component}-{version_of(component)}"


def ensure_built(*components: str) -> dict[str, Path]:
    """Build the missing components (printing progress) and return their paths."""
    missing = [c for c in components if not os.access(binary(c), os.X_OK)]
    if missing:
        subprocess.run(["bash", str(BUILD_SCRIPT), *missing], check=True)
    return {c: binary(c) for c in components}
