"""Runs the node plugin as a process on the host for tests and benchmarks: simulated GPUs, its own dirs."""

import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import grpc

from harness import mocknvml
from harness.cluster.processes import ProcessGroup
from harness.kubelet_client import KubeletClient

DRIVER = "gpu.fracgpu.dev"
PLUGIN_RUNTIME_ENV = {"PYTHONOPTIMIZE": "2", "MALLOC_ARENA_MAX": "2"}
"""What the chart's DaemonSet sets for the plugin process (asserted by tests/integration/test_chart.py): tests and
benchmarks run the plugin as deployed."""


def toolkit_args(tools: Mapping[str, Path]) -> list[str]:
    """Plugin flags for driver edits with NVIDIA's binaries `tools` (as `binaries.ensure_built` returns them)."""
    return [
        "--driver-edits=toolkit",
        f"--nvidia-ctk={tools['nvidia-ctk']}",
        f"--nvidia-cdi-hook-source={tools['nvidia-cdi-hook']}",
    ]


def register_when_serving(procs: ProcessGroup, socket: Path, timeout: float, what: str) -> KubeletClient:
    """Wait until process "plugin" of `procs` serves its registration `socket`; register like the kubelet does.

    Raises TimeoutError with the log's tail after `timeout` seconds (`what` names the plugin)."""
    deadline = time.monotonic() + timeout
    while True:
        procs.check_alive("plugin")
        if socket.exists():
            kubelet = KubeletClient(socket)
            try:
                kubelet.register(timeout=1)
                return kubelet
            except grpc.RpcError:
                kubelet.close()  # a stale socket of a killed instance, or not serving yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not register:\n{procs.log_tail('plugin')}")
        time.sleep(0.1)


class NodePluginProcess:
    """`python -m kubelet_plugin` for `node` with kubelet/CDI/driver-root/dev-char dirs under `workdir` (the host's
    sysfs: the driver root's, `mocknvml.make_sysfs`)."""

    def __init__(
        self,
        workdir: Path,
        node: str,
        kubeconfig: Path,
        profile: Path,
        nvml_dir: Path,
        *extra_args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        """``env``: more environment for the plugin (e.g. the mock NVML's per-process control file)."""
        self.workdir = workdir
        self.node = node
        self.kubelet_dir = workdir / "kubelet"
        self.cdi_dir = workdir / "cdi"
        self.driver_root = workdir / "driver-root"
        self.dev_char_dir = workdir / "dev-char"
        self.profile = profile
        self.procs = ProcessGroup(workdir / "state", detached=False)
        self._env = {
            **os.environ,
            **PLUGIN_RUNTIME_ENV,
            "KUBECONFIG": str(kubeconfig),
            "LD_LIBRARY_PATH": str(nvml_dir),
            "FRACGPU_MOCK_NVML_PROFILE": str(profile),
            **(env or {}),
        }
        self._args = extra_args
        mocknvml.make_driver_root(self.driver_root, profile)

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def checkpoint(self) -> Path:
        return self.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"

    def start(self, timeout: float = 30) -> KubeletClient:
        """Start the plugin, wait for its registration socket, register like the kubelet does."""
        self.launch()
        return self.register(timeout)

    def register(self, timeout: float = 30) -> KubeletClient:
        """Wait until the running plugin serves its registration socket; register like the kubelet does."""
        return register_when_serving(self.procs, self.registration_socket, timeout, "plugin")

    def launch(self) -> None:
        """Start the plugin process (without waiting for it to serve)."""
        self.procs.start(
            "plugin",
            [
                sys.executable,
                "-m",
                "kubelet_plugin",
                f"--node-name={self.node}",
                f"--kubelet-dir={self.kubelet_dir}",
                f"--cdi-dir={self.cdi_dir}",
                f"--driver-root={self.driver_root}",
                f"--dev-char-dir={self.dev_char_dir}",
                f"--sys-root={self.driver_root / mocknvml.SYSFS}",
                "--metrics-port=0",
                "--log-format=text",
                *self._args,
            ],
            env=self._env,
        )

    def stop(self) -> None:
        """SIGTERM (the plugin removes its sockets) and wait."""
        self.procs.stop("plugin")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        proc = self.procs.procs.pop("plugin")
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def log(self) -> str:
        return self.procs.log_tail("plugin", 200)
