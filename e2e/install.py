"""Installs fracgpu into a SingleNodeCluster the way users do: our image imported, `helm install` of the chart.

Simulated GPUs: the mock libnvidia-ml.so.1 and its profile in a host directory the chart mounts
(`nvml.libraryPath`) for the plugin, and a faithful fake driver installation (`driverRoot`: mknod-made device
nodes, the driver's libraries with the profile compiled in, nvidia-smi) that `driverEdits: toolkit` puts into
every claim's containers. A glibc workload image with the CUDA probe is imported for the tests of that.
On a node whose default runtime is NVIDIA's, the node-level `nvidia.com/gpu` CDI spec of that driver root is
generated into the node's CDI dir, as `nvidia-cdi-refresh` does on a real node.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from api.mig import TYPE_ATTRIBUTE, TYPE_MIG
from e2e.workloads import Cluster, gpu_table
from harness import mocknvml
from harness.cluster import binaries, nvidia_runtime
from harness.cluster.mountns import NODE_ROOT
from harness.cluster.multinode import MultiNodeCluster
from harness.cluster.node import SingleNodeCluster
from harness.image.build import build_image
from harness.image.glibc import build_glibc_workload
from harness.mocknvml.driver_root import DriverInstall, make_faithful_driver_root

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "fracgpu"
PROFILE = mocknvml.PROFILES / "sim80gi-x2.profile"
RELEASE = "fracgpu"
USAGE_CONTROL = "processes"  # the mock NVML's per-process control file, in the NVML directory
USAGE_INTERVAL_S = 2
HEALTH_CONTROL = "events"  # the mock NVML's GPU health control file (XIDs, lost, reset), in the NVML directory
HEALTH_IGNORED_XIDS = [92]  # the operator's allow-list in the e2e installation (92 is degraded by default)
NAMESPACE = "fracgpu-system"
NODE_GPUS = NODE_ROOT / "gpus"  # each node of a MultiNodeCluster: its simulated GPUs (driver root, NVML)


@dataclass(frozen=True)
class Installation:
    """Where the simulated GPUs live on the host and what was installed."""

    cluster: SingleNodeCluster
    driver_root: Path
    nvml_dir: Path
    image: str
    driver: DriverInstall  # the fake driver under driver_root
    workload_image: str  # glibc image with the CUDA probe
    first_gpus: dict[str, dict[str, str]] = field(default_factory=dict)
    """The first `kubectl get gpus` in which every published GPU has its object (`first_gpu_table`)."""

    @property
    def usage_control(self) -> Path:
        """The host file whose `<GPU UUID> <pid> <bytes>` lines the plugin's mock NVML reports as processes."""
        return self.nvml_dir / USAGE_CONTROL

    @property
    def health_control(self) -> Path:
        """The host file the plugin's mock NVML reads GPU health from: append `<GPU UUID> xid <n> [<action>]`,
        `<GPU UUID> lost` or `<GPU UUID> reset` lines (harness/mocknvml/mock_nvml_events.c)."""
        return self.nvml_dir / HEALTH_CONTROL

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """helm against the cluster."""
        argv = [str(binaries.binary("helm")), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=300)


def simulated_gpus(root: Path, profile: Path = PROFILE) -> tuple[DriverInstall, Path]:
    """The mock NVML library next to `profile` under `root/nvml` (named PROFILE's name, where the chart values
    point, whatever the profile); the faithful driver root of that profile `root/driver`."""
    nvml_dir = mocknvml.build(root / "nvml")
    (nvml_dir / PROFILE.name).write_text(profile.read_text())
    (nvml_dir / HEALTH_CONTROL).write_text("")
    driver = make_faithful_driver_root(root / "driver", profile, root / "driver-build")
    return driver, nvml_dir


def chart_values(
    image: str, *, api_host: str, api_port: int, kubelet_dir: Path, cdi_dir: Path, driver_root: Path, nvml_dir: Path
) -> dict[str, Any]:
    """The chart values of a local cluster: our image (never pulled), the API server at `api_host` (no kube-proxy)
    and the node's paths; the controller's webhook on `api_host` too (it runs on that node, in its host network)."""
    repository, tag = image.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "kubernetesServiceHost": api_host,  # never the default Service's ClusterIP: there is no kube-proxy
        "kubernetesServicePort": str(api_port),
        "kubeletDir": str(kubelet_dir),
        "cdiDir": str(cdi_dir),
        "driverRoot": str(driver_root),
        # hooks at <kubeletDir>/plugins/<driver>/nvidia-cdi-hook, a host path: the runtime runs them there
        "driverEdits": "toolkit",
        "nvml": {"libraryPath": str(nvml_dir)},
        "logging": {"format": "text"},
        # two replicas (the chart's default) in the node's host network: they share the webhook port (SO_REUSEPORT)
        # and could not share kopf's liveness port or the metrics port, so those are off here
        "controller": {"hostNetwork": True, "webhook": {"host": api_host}, "healthPort": 0, "metricsPort": 0},
        "kubeletPlugin": {
            "hostNetwork": True,
            "extraEnv": [
                {"name": "FRACGPU_MOCK_NVML_PROFILE", "value": f"/opt/fracgpu/nvml-host/{PROFILE.name}"},
                # the processes the mock NVML reports: written by e2e/test_usage.py (Installation.usage_control)
                {"name": "FRACGPU_MOCK_NVML_PROCESSES", "value": f"/opt/fracgpu/nvml-host/{USAGE_CONTROL}"},
                # GPU health (XIDs, lost GPUs, resets): written by e2e/test_health.py (Installation.health_control)
                {"name": "FRACGPU_MOCK_NVML_EVENTS", "value": f"/opt/fracgpu/nvml-host/{HEALTH_CONTROL}"},
                # the simulated GPUs' PCIe roots and NUMA nodes: the driver root's sysfs (mocknvml.make_sysfs)
                {"name": "FRACGPU_SYS_ROOT", "value": str(driver_root / mocknvml.SYSFS)},
            ],
            "usage": {"interval": USAGE_INTERVAL_S, "ledgerInterval": USAGE_INTERVAL_S},
            "health": {"ignoredXids": HEALTH_IGNORED_XIDS, "probeInterval": 1},
        },
    }


def helm_install(
    kubeconfig: Path, values: dict[str, Any], values_file: Path, timeout: float, chart: Path = CHART
) -> None:
    """`helm upgrade --install` of `chart` with `values` (written to `values_file`), waiting for its pods."""
    values_file.write_text(json.dumps(values, indent=2))
    argv = [
        str(binaries.binary("helm")), f"--kubeconfig={kubeconfig}", "upgrade", "--install", RELEASE, str(chart),
        "--namespace", NAMESPACE, "--create-namespace", "--values", str(values_file), "--wait",
        f"--timeout={int(timeout)}s",
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout + 60)
    if done.returncode != 0:
        raise RuntimeError(f"helm upgrade --install of {chart} failed ({done.returncode}):\n{done.stderr}{done.stdout}")


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
    values = chart_values(
        image.name, api_host=cluster.netns.address, api_port=cluster.plane.api_port, kubelet_dir=cluster.kubelet_dir,
        cdi_dir=cluster.cdi_dir, driver_root=driver_root, nvml_dir=nvml_dir,
    )  # fmt: skip
    installation = Installation(cluster, driver_root, nvml_dir, image.name, driver, workload.name)
    helm_install(cluster.kubeconfig, values, cluster.state_dir / "fracgpu-values.json", timeout)
    wait_serving(cluster, timeout)
    return replace(installation, first_gpus=first_gpu_table(cluster, timeout))


@dataclass(frozen=True)
class ClusterInstallation:
    """fracgpu installed on every node of a MultiNodeCluster: one release, one DaemonSet, each node's own GPUs."""

    cluster: MultiNodeCluster
    image: str
    driver_root: Path  # as every node sees it (NODE_GPUS/driver): a different directory on each


def merged(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in, maps recursively (as Helm merges values files)."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def accepted_by(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`values` without the keys a chart whose values.yaml is `defaults` does not declare (maps recursively; under
    a key whose default is an empty map, everything is kept): this tree's values for an older chart whose schema
    refuses keys it does not know."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in defaults:
            continue
        default = defaults[key]
        nested = isinstance(value, Mapping) and isinstance(default, Mapping) and default
        out[key] = accepted_by(value, default) if nested else value
    return out


def accepted_by_chart(values: Mapping[str, Any], chart: Path, attempts: int = 5) -> dict[str, Any]:
    """`values` for another release's `chart`: the keys its values.yaml does not declare dropped
    (`accepted_by`), then each value its schema refuses (as `helm template` names it) set to that chart's
    default. Raises RuntimeError when it still refuses them after `attempts` renders."""
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    out = accepted_by(values, defaults)
    kube = binaries.version_of("kube-apiserver").removeprefix("v")
    for _ in range(attempts):
        argv = [str(binaries.binary("helm")), "template", RELEASE, str(chart), "--values", "-", "--kube-version", kube]
        done = subprocess.run(argv, check=False, input=json.dumps(out), capture_output=True, text=True, timeout=60)
        refused = re.findall(r"^- at '(/[^']*)'", done.stderr, re.MULTILINE)
        if done.returncode == 0 or not refused:
            break
        for pointer in refused:
            *parents, leaf = pointer.lstrip("/").split("/")
            target, default = out, defaults
            for key in parents:
                target, default = target[key], default[key]
            target[leaf] = default[leaf]
    if done.returncode != 0:
        raise RuntimeError(f"{chart} refuses the e2e values:\n{done.stderr}")
    return out


def install_cluster(
    cluster: MultiNodeCluster,
    *,
    image_out: Path,
    timeout: float = 300,
    chart: Path = CHART,
    image: tuple[str, Path] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ClusterInstallation:
    """Build and import the image on every node, give each node the simulated GPUs of its profile at the same
    path (its own directory), helm-install the chart once, wait until every node's GPUs are published.
    The controller runs on the first node, whose network namespace holds the API server that calls its webhook.
    `chart` and `image` (name, archive; default: this tree's, built into `image_out`) install another release;
    `overrides` are merged into the values; another chart gets only the values it declares and accepts."""
    if image is None:
        built = build_image(image_out)
        image = (built.name, built.archive.path)
    name, archive = image
    cluster.import_image(archive)
    for node in cluster.nodes:
        simulated_gpus(node.host_path(NODE_GPUS), node.profile.gpus)
    values = merged(cluster_values(cluster, name), overrides or {})
    if chart != CHART:  # another release's chart: only the values it declares and accepts
        values = accepted_by_chart(values, chart)
    helm_install(cluster.kubeconfig, values, cluster.state_dir / "fracgpu-values.json", timeout, chart)
    wait_serving(cluster, timeout, frozenset(n.name for n in cluster.nodes))
    return ClusterInstallation(cluster, name, NODE_GPUS / "driver")


def cluster_values(cluster: MultiNodeCluster, image: str) -> dict[str, Any]:
    """The chart values of a MultiNodeCluster with `image`: every node's paths, the controller on the first."""
    first = cluster.nodes[0]
    values = chart_values(
        image, api_host=first.netns.address, api_port=cluster.plane.api_port, kubelet_dir=first.kubelet_dir,
        cdi_dir=first.cdi_dir, driver_root=NODE_GPUS / "driver", nvml_dir=NODE_GPUS / "nvml",
    )  # fmt: skip
    values["controller"]["nodeSelector"] = {"kubernetes.io/hostname": first.name}
    return values


def wait_serving(cluster: Cluster, timeout: float, nodes: frozenset[str] = frozenset()) -> None:
    """Until the GPUs of every node in `nodes` (of some node when empty) are published and the controller's
    webhook is registered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = cluster.kubectl("get", "resourceslices", "-o", "jsonpath={.items[*].spec.nodeName}", check=False)
        published = set(listed.stdout.split())
        slices = published >= nodes if nodes else published
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


def first_gpu_table(cluster: Cluster, timeout: float) -> dict[str, dict[str, str]]:
    """The first `kubectl get gpus` (by column name) in which every GPU the node plugins publish (every device but a
    MIG partition) has its GPU object with its status written (its TOTAL), as a user would first see it."""
    deadline = time.monotonic() + timeout
    table: dict[str, dict[str, str]] = {}
    while time.monotonic() < deadline:
        slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
        published = sum(
            1
            for s in slices
            for d in s["spec"].get("devices") or []
            if ((d.get("attributes") or {}).get(TYPE_ATTRIBUTE) or {}).get("string") != TYPE_MIG
        )
        table = gpu_table(cluster)
        if published and len(table) == published and all(row["TOTAL"] for row in table.values()):
            return table
        time.sleep(0.2)
    raise TimeoutError(f"the GPU objects of the published GPUs did not appear in {timeout}s: {table}")


def remove_dev_char_links(driver_root: Path, dev_char: Path = Path("/dev/char")) -> None:
    """Delete the /dev/char links the plugin made for the simulated GPUs (they point into `driver_root`)."""
    if not dev_char.is_dir():
        return
    for link in dev_char.iterdir():
        if link.is_symlink() and str(link.readlink()).startswith(f"{driver_root}/"):
            link.unlink()


KEEP_STATE = "FRACGPU_E2E_KEEP_STATE"  # set (non-empty): a cluster's state dir (logs/*.log) is kept for a look


@contextlib.contextmanager
def state_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory under /tmp for one e2e cluster's files and logs; removed afterwards unless the
    environment sets FRACGPU_E2E_KEEP_STATE (then its path is printed)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        if os.environ.get(KEEP_STATE):
            print(f"\n{KEEP_STATE}: the e2e cluster's files and logs stay in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def tear_down(
    cluster: SingleNodeCluster | MultiNodeCluster, installed: Installation | ClusterInstallation | None
) -> None:
    """Stop `cluster`'s processes and delete the /dev/char links its plugins made (when it got installed)."""
    cluster.stop()
    if installed is not None:
        remove_dev_char_links(installed.driver_root)
