"""The node plugin process never imports the kubernetes package (issue 12: its generated client alone costs
~32 MiB of RSS). In a fresh interpreter: import the entry module, then build what `main` builds up to
serving — credentials from a kubeconfig, the connection, Preparer, SlicePublisher, usage sampler, driver
edits, the gRPC server (started and stopped) — and send requests through all of it."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import json, sys, threading
from pathlib import Path

def loaded():
    return sorted(m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes."))

import kubelet_plugin.__main__ as entry
print(json.dumps({"after_import": loaded()}), flush=True)

from api.kube_config import load
from api.kube_errors import ApiError
from api.kube_rest import KubeConnection, KubeRest
from kubelet_plugin.state.checkpoint import CheckpointStore
from kubelet_plugin.serving.grpc_server import PluginServer
from kubelet_plugin.health.source import DeviceHealth
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import ClaimRef, GpuInfo
from kubelet_plugin.prepare.preparer import Preparer
from kubelet_plugin.publishing.publisher import SlicePublisher
from kubelet_plugin.core.settings import parse_settings
from tests.unit.fake_apiserver import serve

tmp = Path(sys.argv[1])
gpu = GpuInfo(index=0, uuid="GPU-00000000-0000-0000-0000-000000000000", product_name="NVIDIA H100 80GB HBM3",
              memory_total_bytes=80 << 30, minor=0, pci_bus_id="0000:01:00.0", architecture="Hopper",
              cuda_compute_capability="9.0", driver_version="580.65.06")
with serve() as (_, url):
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        f"apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: u, user: {token: t0}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    api = KubeConnection(load({"KUBECONFIG": str(kubeconfig)}))
    settings = parse_settings([
        "--node-name=node-a", f"--kubelet-dir={tmp / 'kubelet'}", f"--cdi-dir={tmp / 'cdi'}",
        f"--driver-root={tmp / 'root'}", f"--dev-char-dir={tmp / 'dev-char'}", "--metrics-port=0",
        "--usage-interval=0",
    ])
    metrics = PluginMetrics()
    edits = entry.make_driver_edits(settings, KubeRest.bounded(api, settings.api_timeout_seconds), metrics)
    preparer = Preparer(api, settings, [gpu], CheckpointStore(settings.checkpoint_path), metrics)
    preparer.recover()
    publisher = SlicePublisher(api, settings, [gpu])
    entry.start_usage_sampler(settings, api, [gpu], metrics, threading.Event())
    server = PluginServer(
        settings.driver_name, preparer, DeviceHealth(settings.node_name, [gpu], preparer.device_nodes),
        kubelet_dir=settings.kubelet_dir,
    )  # fmt: skip
    server.start()
    result = preparer.prepare([ClaimRef(namespace="ns", name="absent", uid="uid-1")])["uid-1"]
    assert "not found" in result.error, result.error
    try:
        publisher.sync()
    except ApiError as err:
        assert err.status == 404, err
    server.stop(grace=0)
print(json.dumps({"after_serving": loaded()}), flush=True)
"""


def test_the_node_plugin_never_imports_the_kubernetes_package() -> None:
    with tempfile.TemporaryDirectory(prefix="fg-", dir="/tmp") as short:  # socket paths: 107 bytes at most
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, short],
            check=False,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    reports = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert reports and reports[0] == {"after_import": []}, run.stdout + run.stderr
    assert run.returncode == 0, run.stderr
    assert reports[1:] == [{"after_serving": []}], run.stdout + run.stderr


def test_the_usage_sampler_is_imported_only_when_sampling_is_on() -> None:
    script = (
        "import sys, kubelet_plugin.__main__; "
        "print(sorted(m for m in sys.modules if m.startswith('kubelet_plugin.usage')))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], check=True, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.stdout.strip() == "[]", run.stdout
