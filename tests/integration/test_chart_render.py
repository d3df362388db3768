"""The chart as `helm template` renders it, without a cluster (the integration tier, tests/integration/test_chart.py,
also sends every object to a real API server): how the MPS supervisor's pods take part in the NVIDIA GPU
Operator's driver upgrades (`mps.gpuOperatorClient`), and that the node plugin's pods take no part. With the pinned
helm the integration tier builds (`harness/cluster/binaries.py`)."""

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import binaries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "fracgpu"
HELM = binaries.binary("helm")
CLIENT_LABEL = "nvidia.com/gpu.deploy.client"
"""The GPU Operator's node label for third-party GPU clients: `true`, or `paused-for-driver-upgrade` (the driver
manager) and `paused-for-mig-change` (the MIG manager) while they work on the node."""

pytestmark = pytest.mark.integration


def helm_template(*values: str) -> subprocess.CompletedProcess[str]:
    argv = [str(HELM), "template", "fg", str(CHART), "--namespace", "fracgpu"]
    argv += ["--kube-version", binaries.version_of("kubectl").removeprefix("v")]
    for value in values:
        argv += ["--set", value]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def pod_specs(*values: str) -> dict[str, dict[str, Any]]:
    """Component -> pod spec of each DaemonSet the chart renders with `values`."""
    proc = helm_template(*values)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "DaemonSet"]
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"] for d in docs}


def runs_on(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a DaemonSet pod fits a node with `labels`: its nodeSelector, and the required node affinity's terms
    (ORed, each expression ANDed; the operators the chart uses)."""
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True

    def holds(expression: dict[str, Any]) -> bool:
        key, operator = expression["key"], expression["operator"]
        if operator == "In":
            return labels.get(key) in expression["values"]
        assert operator == "DoesNotExist", operator
        return key not in labels

    return any(all(holds(e) for e in term["matchExpressions"]) for term in required["nodeSelectorTerms"])


GPU_NODE = {"nvidia.com/gpu.present": "true"}
WITH_OPERATOR = GPU_NODE | {CLIENT_LABEL: "true"}
UPGRADING = GPU_NODE | {CLIENT_LABEL: "paused-for-driver-upgrade"}
CHANGING_MIG = GPU_NODE | {CLIENT_LABEL: "paused-for-mig-change"}


def test_by_default_the_supervisor_leaves_a_node_while_the_gpu_operator_upgrades_its_driver() -> None:
    pods = pod_specs("mps.gpus=all")
    mps = pods["mps"]
    assert runs_on(mps, GPU_NODE), "no GPU Operator (or one before v26.7): it runs"
    assert runs_on(mps, WITH_OPERATOR)
    assert not runs_on(mps, UPGRADING) and not runs_on(mps, CHANGING_MIG), "the DaemonSet controller deletes it"
    assert not runs_on(mps, GPU_NODE | {CLIENT_LABEL: "false"}), "the Operator's 'no GPU clients here'"
    assert CLIENT_LABEL not in mps["nodeSelector"], "the driver manager waits only for pods it selects on"


def test_the_node_plugin_stays_through_a_driver_upgrade_to_unprepare_its_claims() -> None:
    for values in (("mps.gpus=all",), ("mps.gpus=all", "mps.gpuOperatorClient=nodeSelector")):
        plugin = pod_specs(*values)["kubelet-plugin"]
        assert runs_on(plugin, UPGRADING)
        assert CLIENT_LABEL not in yaml.safe_dump(plugin), "no part in the GPU Operator's client eviction"


def test_as_a_node_selector_the_label_also_makes_the_driver_manager_wait_for_the_supervisor() -> None:
    mps = pod_specs("mps.gpus=all", "mps.gpuOperatorClient=nodeSelector")["mps"]
    assert mps["nodeSelector"] == {"nvidia.com/gpu.present": "true", CLIENT_LABEL: "true"}, "merged with the default"
    assert "affinity" not in mps
    assert runs_on(mps, WITH_OPERATOR) and not runs_on(mps, UPGRADING)
    assert not runs_on(mps, GPU_NODE), "only where the GPU Operator labelled the node"
    pinned = pod_specs(
        "mps.gpus=all", "mps.gpuOperatorClient=nodeSelector", r"mps.nodeSelector.nvidia\.com/gpu\.deploy\.client=x"
    )["mps"]
    assert pinned["nodeSelector"] == {CLIENT_LABEL: "true"}, "a value of the user's cannot opt it out"


def test_none_leaves_the_supervisor_out_and_other_values_are_refused() -> None:
    mps = pod_specs("mps.gpus=all", "mps.gpuOperatorClient=none")["mps"]
    assert "affinity" not in mps and runs_on(mps, UPGRADING)
    refused = helm_template("mps.gpus=all", "mps.gpuOperatorClient=always")
    assert refused.returncode != 0
    assert "at '/mps/gpuOperatorClient': value must be one of 'affinity', 'nodeSelector', 'none'" in refused.stderr


def controller_args(*values: str) -> list[str]:
    proc = helm_template(*values)
    assert proc.returncode == 0, proc.stderr
    (deployment,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "Deployment"]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_controller_is_told_every_further_device_class_the_chart_creates_with_or_without_mps_gpus() -> None:
    for mps in ((), ("mps.gpus=all",)):
        assert not any(a.startswith("--extra-device-classes") for a in controller_args(*mps))
        enforced = controller_args(*mps, "deviceClass.enforced.create=true", "deviceClass.enforced.name=strict.example")
        assert "--extra-device-classes=strict.example" in enforced
        both = controller_args(
            *mps, "deviceClass.enforced.create=true", "deviceClass.mps.create=true", "deviceClass.mps.name=m.example"
        )
        assert "--extra-device-classes=enforced.gpu.fracgpu.dev,m.example" in both
        assert ("--mps" in both) == bool(mps)


def test_every_install_with_webhooks_has_both_chart_made_configurations() -> None:
    for values in ((), ("mps.gpus=all",)):
        proc = helm_template(*values)
        assert proc.returncode == 0, proc.stderr
        kinds = [d["kind"] for d in yaml.safe_load_all(proc.stdout) if d]
        assert kinds.count("ValidatingWebhookConfiguration") == 1 and kinds.count("MutatingWebhookConfiguration") == 1
    off = helm_template("controller.webhook.enabled=false")
    assert off.returncode == 0 and "WebhookConfiguration" not in off.stdout
