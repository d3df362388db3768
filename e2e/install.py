"""Installs fracgpu into a SingleNodeCluster the way users do: our image imported, `helm install` of the chart.

Simulated GPUs: the mock libnvidia-ml.so.1 and its profile in a host directory the chart mounts
(`nvml.libraryPath`) for the plugin, and a faithful fake driver installation (`driverRoot`: mknod-made device
nodes, the driver's libraries with the profile compiled in, nvidia-smi) that `driverEdits: toolkit` puts into
every claim's containers. A glibc workload image with the CUDA probe is imported for the tests of that.
On a node whose default runtime is NVIDIA's, the node-level `nvidia.com/gpu` CDI spec of that driver root is
generated into the node's CDI dir, as `nvidia-cdi-refresh` does on a real node.
"""

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from e2e import mocknvml
from e2e.cluster import binaries, nvidia_runtime
from e2e.cluster.node import SingleNodeCluster
from e2e.image.build import build_image
from e2e.image.glibc import build_glibc_workload
from e2e.mocknvml.driver_root import DriverInstall, make_faithful_driver_root

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "fracgpu"
PROFILE = mocknvml.PROFILES / "sim80gi-x2.profile"
RELEASE = "fracgpu"
USAGE_CONTROL = "processes"  # the mock NVML's per-process control file, in the NVML directory
USAGE_INTERVAL_S = 2
NAMESPACE = "fracgpu-system"


@dataclass(frozen=True)
class Installation:
    """Where the simulated GPUs live on the host and what was installed."""

    cluster: SingleNodeCluster
    driver_root: Path
    nvml_dir: Path
    image: str
    driver: DriverInstall  # the fake driver under driver_root
    workload_image: str  # glibc image with the CUDA probe

    @property
    def usage_control(self) -> Path:
        """The host file whose `<GPU UUID> <pid> <bytes>` lines the plugin's mock NVML reports as processes."""
        return self.nvml_dir / USAGE_CONTROL

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """helm against the cluster."""
        argv = [str(binaries.binary("helm")), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=300)


def simulated_gpus(root: Path) -> tuple[DriverInstall, Path]:
    """The mock NVML library next to its profile under `root/nvml`; the faithful driver root `root/driver`."""
    nvml_dir = mocknvml.build(root / "nvml")
    (nvml_dir / PROFILE.name).write_text(PROFILE.read_text())
    driver = make_faithful_driver_root(root / "driver", PROFILE, root / "driver-build")
    return driver, nvml_dir


def install(cluster: SingleNodeCluster, *, image_out: Path, timeout: float = 300) -> Installation:
    """Build and import the image, make simulated GPUs, helm-install the chart, wait until it serves."""
    image = build_image(image_out)
    cluster.import_image(image.archive.path)
    driver, nvml_dir = simulated_gpus(cluster.short_dir / "gpus")
    driver_root = driver.root
    if cluster.nvidia_runtime:
        nvidia_runtime.write_node_spec(driver_root, cluster.cdi_dir)
    workload = build_glibc_workload(image_out / "workload", driver.cuda_probe)
    cluster.import_image(workload.path)
    repository, tag = image.name.rsplit(":", 1)
    host = cluster.netns.address
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "kubernetesServiceHost": host,  # never the default Service's ClusterIP: there is no kube-proxy
        "kubernetesServicePort": str(cluster.plane.api_port),
        "kubeletDir": str(cluster.kubelet_dir),
        "cdiDir": str(cluster.cdi_dir),
        "driverRoot": str(driver_root),
        # hooks at <kubeletDir>/plugins/<driver>/nvidia-cdi-hook, a host path: the runtime runs them there
        "driverEdits": "toolkit",
        "nvml": {"libraryPath": str(nvml_dir)},
        "logging": {"format": "text"},
        "controller": {"hostNetwork": True, "webhook": {"host": host}},
        "kubeletPlugin": {
            "hostNetwork": True,
            "extraEnv": [
                {"name": "FRACGPU_MOCK_NVML_PROFILE", "value": f"/opt/fracgpu/nvml-host/{PROFILE.name}"},
                # the processes the mock NVML reports: written by e2e/test_usage.py (Installation.usage_control)
                {"name": "FRACGPU_MOCK_NVML_PROCESSES", "value": f"/opt/fracgpu/nvml-host/{USAGE_CONTROL}"},
            ],
            "usage": {"interval": USAGE_INTERVAL_S, "ledgerInterval": USAGE_INTERVAL_S},
        },
    }
    installation = Installation(cluster, driver_root, nvml_dir, image.name, driver, workload.name)
    values_file = cluster.state_dir / "fracgpu-values.json"
    values_file.write_text(json.dumps(values, indent=2))
    installation.helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--values", str(values_file), "--wait", f"--timeout={int(timeout)}s",
    )  # fmt: skip
    wait_serving(cluster, timeout)
    return installation


def wait_serving(cluster: SingleNodeCluster, timeout: float) -> None:
    """Until the node's GPUs are published and the controller's webhook is registered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slices = cluster.kubectl("get", "resourceslices", "-o", "name", check=False).stdout.split()
        # the chart makes the configuration empty; the controller patches its webhooks in once it serves
        webhook = cluster.kubectl(
            "get",
            "validatingwebhookconfiguration",
            "gpu.fracgpu.dev",
            "-o",
            "jsonpath={.webhooks[*].name}",
            check=False,
        )
        if slices and webhook.returncode == 0 and webhook.stdout.strip():
            return
        time.sleep(1)
    logs = cluster.kubectl(
        "logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=kubelet-plugin", "--tail=30", check=False
    )
    raise TimeoutError(
        f"fracgpu did not publish GPUs / register its webhook in {timeout}s:\n{logs.stdout}{logs.stderr}"
    )


def remove_dev_char_links(driver_root: Path, dev_char: Path = Path("/dev/char")) -> None:
    """Delete the /dev/char links the plugin made for the simulated GPUs (they point into `driver_root`)."""
    if not dev_char.is_dir():
        return
    for link in dev_char.iterdir():
        if link.is_symlink() and str(link.readlink()).startswith(f"{driver_root}/"):
            link.unlink()
