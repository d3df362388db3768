"""The Go reference DRA kubelet plugin (e2e/bench/goref, on k8s.io/dynamic-resource-allocation/kubeletplugin):
building it into the binary cache and running it as a process, for the plugin benchmark."""

import os
import shutil
import subprocess
from pathlib import Path

from harness.cluster import binaries
from harness.cluster.processes import ProcessGroup
from harness.kubelet_client import KubeletClient
from harness.nodeplugin import DRIVER, register_when_serving

SOURCE = Path(__file__).resolve().parent / "goref"


def build() -> Path:
    """`go build` the plugin (versions pinned by its go.mod/go.sum) into the cache outside the repo; its path.

    Incremental: with the Go build cache warm and the source unchanged this takes about a second."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the go-reference configuration needs Go on PATH (or leave it out with --configs)")
    target = binaries.cache_dir() / "bin" / "fracgpu-goref"
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(target), "."], cwd=SOURCE, check=True)
    return target


class GoRefProcess:
    """The Go reference plugin for `node`, with its kubelet and CDI dirs under `workdir`."""

    def __init__(self, workdir: Path, node: str, kubeconfig: Path, binary: Path) -> None:
        self.kubelet_dir = workdir / "kubelet"
        self.cdi_dir = workdir / "cdi"
        self.procs = ProcessGroup(workdir / "state", detached=False)
        self._argv = [
            str(binary),
            f"--driver-name={DRIVER}",
            f"--node-name={node}",
            f"--kubeconfig={kubeconfig}",
            f"--kubelet-dir={self.kubelet_dir}",
            f"--cdi-dir={self.cdi_dir}",
        ]

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def pid(self) -> int:
        return self.procs.procs["plugin"].pid

    def start(self, timeout: float = 30) -> KubeletClient:
        """Start the plugin, wait for its registration socket, register like the kubelet does."""
        self.procs.start("plugin", self._argv, env=dict(os.environ))
        return register_when_serving(self.procs, self.registration_socket, timeout, "Go reference plugin")

    def stop(self) -> None:
        """SIGTERM and wait."""
        self.procs.stop("plugin")
