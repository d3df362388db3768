"""NVIDIA's container runtime as the e2e node's default containerd runtime, in `cdi` mode, like a node where
the admin ran `nvidia-ctk runtime configure --set-as-default` and `nvidia-cdi-refresh` keeps a node-level
`nvidia.com/gpu` CDI spec.

The runtime reads its config from NVIDIA_CTK_CONFIG_FILE_PATH (set in containerd's environment, which shims
and runtimes inherit), never from the host's /etc. In `cdi` mode it turns the final OCI env's
NVIDIA_VISIBLE_DEVICES into `nvidia.com/gpu=<each entry>` and injects those devices from the node's CDI
dir, so an image's `NVIDIA_VISIBLE_DEVICES=all` really means every GPU unless a claim spec says `void`.
"""

import os
import subprocess
from pathlib import Path
from typing import Any

import tomli_w

from harness.cluster import binaries

BINARY = "nvidia-container-runtime"
HANDLER = "nvidia"
"""The containerd runtime handler (and RuntimeClass) name."""
CONFIG_ENV = "NVIDIA_CTK_CONFIG_FILE_PATH"
DEFAULT_KIND = "nvidia.com/gpu"
NODE_SPEC = "nvidia.yaml"
"""The node-level spec's file name in the node's CDI dir (what nvidia-cdi-refresh writes)."""


def runtime_config(cdi_dir: Path, log: Path) -> dict[str, Any]:
    """The runtime's config.toml: `cdi` mode, CDI specs from `cdi_dir`, runc from PATH, its log at `log`."""
    return {
        "nvidia-container-runtime": {
            "debug": str(log),
            "log-level": "debug",  # it logs the CDI devices it injects at debug level
            "mode": "cdi",
            "runtimes": ["runc"],  # the first on PATH: containerd's bin dir
            "modes": {"cdi": {"default-kind": DEFAULT_KIND, "spec-dirs": [str(cdi_dir)]}},
        }
    }


def write_config(directory: Path, cdi_dir: Path) -> Path:
    """Write config.toml (and make room for the runtime's log) under `directory`; return the config's path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.toml"
    path.write_text(tomli_w.dumps(runtime_config(cdi_dir, directory / "runtime.log")))
    return path


def containerd_runtimes(binary: Path) -> dict[str, Any]:
    """containerd's CRI runtime config (deep-merged) for `nvidia` as the default handler; runc stays a handler."""
    return {
        "containerd": {
            "default_runtime_name": HANDLER,
            "runtimes": {
                HANDLER: {
                    "runtime_type": "io.containerd.runc.v2",
                    "options": {"BinaryName": str(binary), "SystemdCgroup": False},
                }
            },
        }
    }


def node_spec_argv(nvidia_ctk: Path, driver_root: Path, hook: Path, output: Path) -> list[str]:
    """`nvidia-ctk cdi generate` in nvml mode against the driver root: devices `0`, `1`, `GPU-<uuid>`, `all`."""
    return [
        str(nvidia_ctk),
        "cdi",
        "generate",
        "--mode=nvml",
        f"--driver-root={driver_root}",
        f"--dev-root={driver_root}",
        f"--nvidia-cdi-hook-path={hook}",
        f"--output={output}",
    ]


def write_node_spec(driver_root: Path, cdi_dir: Path) -> Path:
    """Generate the node-level `nvidia.com/gpu` spec for the (simulated) driver at `driver_root` into `cdi_dir`.

    The mock NVML in the driver root enumerates the GPUs whose device node it can open under
    FRACGPU_MOCK_NVML_DEV_ROOT, here the driver root's /dev (the host has no /dev/nvidia*).
    """
    tools = binaries.ensure_built("nvidia-ctk", "nvidia-cdi-hook")
    output = cdi_dir / NODE_SPEC
    argv = node_spec_argv(tools["nvidia-ctk"], driver_root, tools["nvidia-cdi-hook"], output)
    env = {**os.environ, "FRACGPU_MOCK_NVML_DEV_ROOT": str(driver_root)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 or not output.is_file():
        raise RuntimeError(f"nvidia-ctk cdi generate --mode=nvml failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return output
