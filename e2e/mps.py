"""Helpers of the e2e MPS tests (e2e/test_mps.py): the release's MPS values, the (mock) driver's MPS state on the
node (each GPU's supervisor status, compute mode, control client) and MPS claim templates.

May import: ``e2e.install``, ``e2e.workloads``, ``harness``.
"""

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from e2e import workloads as w
from e2e.install import CHART, NAMESPACE, PROFILE, RELEASE, Installation
from harness.mocknvml import read_profile

MPS_CLASS = "mps.gpu.fracgpu.dev"
UUID = read_profile(PROFILE)["gpu.0.uuid"]
SMS = int(read_profile(PROFILE)["gpu.0.sm_count"])
SUPERVISOR = "app.kubernetes.io/component=mps"
PLUGIN = "app.kubernetes.io/component=kubelet-plugin"


def mps_root(installation: Installation) -> Path:
    return installation.cluster.short_dir / "mps"


def upgrade(installation: Installation, gpus: str) -> None:
    """`helm upgrade --reuse-values` with `mps.gpus` = `gpus`, then until the plugin has rolled."""
    root = mps_root(installation)
    values = [
        f"mps.gpus={gpus}", f"mps.root={root}", "mps.hostNetwork=true", "mps.metricsPort=0",
        "deviceClass.mps.create=true",
        f"mps.extraEnv[0].name=FRACGPU_MOCK_NVML_PROFILE,mps.extraEnv[0].value=/opt/fracgpu/nvml-host/{PROFILE.name}",
        # the mock driver's "kernel" state (compute modes, which server holds a GPU) and its device nodes
        f"mps.extraEnv[1].name=FRACGPU_MOCK_NVML_STATE_DIR,mps.extraEnv[1].value={root}",
        "mps.extraEnv[2].name=FRACGPU_MOCK_NVML_DEV_ROOT,mps.extraEnv[2].value=/driver-root",
        "mps.extraEnv[3].name=FRACGPU_REFRESH,mps.extraEnv[3].value=1",
    ]  # fmt: skip
    installation.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
        *[arg for v in values for arg in ("--set-string" if v.startswith(("mps.gpus", "mps.extraEnv")) else "--set", v)],
        "--wait", "--timeout=300s",
    )  # fmt: skip
    installation.cluster.kubectl("rollout", "status", "-n", NAMESPACE, plugin_daemonset(installation), "--timeout=300s")


def plugin_daemonset(installation: Installation) -> str:
    (name,) = installation.cluster.kubectl(
        "get", "daemonset", "-n", NAMESPACE, "-l", PLUGIN, "-o", "name"
    ).stdout.split()
    return name


def status(installation: Installation) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((mps_root(installation) / UUID / "status.json").read_text())
    return found


def wait_for(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"not within {timeout} s: {what}")


def compute_mode(installation: Installation) -> int:
    path = mps_root(installation) / f"compute_mode.{UUID}"
    return int(path.read_text().strip()) if path.exists() else 0


def control(installation: Installation, *commands: str) -> str:
    """The host's (mock) driver control client against GPU 0's daemon."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps_root(installation) / UUID / "pipe"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(installation.driver.mps_control)], input="".join(f"{c}\n" for c in commands), env=env,
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return done.stdout


def mps_template(name: str, memory: str, percent: int) -> dict[str, Any]:
    config = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": percent}
    template = w.claim_template(name, memory, config)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = MPS_CLASS
    return template


def mps_gpu_of(installation: Installation, namespace: str, pod: str) -> tuple[str, str]:
    """(device, UUID) of the MPS GPU the pod's claim got."""
    claim = w.claim_of(installation.cluster, namespace, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = str(result["device"])
    return device, read_profile(PROFILE)[f"gpu.{device.removeprefix('gpu-')}.uuid"]


def gpu_status(installation: Installation, uuid: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((mps_root(installation) / uuid / "status.json").read_text())
    return found


def control_of(installation: Installation, uuid: str, *commands: str) -> list[str]:
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps_root(installation) / uuid / "pipe"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(installation.driver.mps_control)], input="".join(f"{c}\n" for c in commands), env=env,
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return done.stdout.split()
