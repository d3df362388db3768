"""The Helm chart (issue #5): lint, render, schema; every rendered object accepted by the real API server;
the chart's RBAC and admission policy proven by acting as its service accounts with pod-bound tokens.

Nothing here runs the images: the chart is checked as the API server sees it. The end-to-end tests install
it into a cluster with a kubelet.
"""

import asyncio
import base64
import datetime
import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.gpu import GpuStatus
from api.heartbeat import HEARTBEAT_LABEL, heartbeat_of, lease_body, lease_name, leases_path
from api.kube_errors import ApiError
from api.kube_rest import APPLY, SLICES, KubeConnection, KubeRest, claim_path
from api.options import options
from controller.admission.certificate import self_signed_certificate
from controller.admission.verdict import review_claim_spec
from controller.admission.webhook_config import Registration
from controller.core.rbac import cluster_role_rules, heartbeat_role_rules, namespace_role_rules
from harness import kube
from harness.cluster import binaries
from harness.cluster.controlplane import ControlPlane
from harness.nodeplugin import PLUGIN_RUNTIME_ENV
from kubelet_plugin.mps_supervisor.supervisor import MpsSettings
from kubelet_plugin.prepare.ready import apply_ready
from kubelet_plugin.publishing.heartbeat import Heartbeat
from kubelet_plugin.publishing.slices import build_slices

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "fracgpu"
KUBE_VERSION = binaries.version_of("kubectl").removeprefix("v")
MiB = 1 << 20
MERGE = "application/merge-patch+json"

# Every value changed from its default that changes what is rendered.
CUSTOM: dict[str, Any] = {
    "driverName": "gpu.example.test",
    "image": {"repository": "registry.example/fracgpu", "tag": "0.1.0-abc1234", "pullPolicy": "Never"},
    "deviceClass": {
        "name": "example-gpu",
        "extendedResource": {"name": "example.test/whole-gpu"},
        "enforced": {"create": True, "name": "example-gpu-enforced"},
    },
    "kubernetesServiceHost": "192.0.2.10",
    "kubernetesServicePort": 6443,
    "logging": {"level": "debug", "format": "text"},
    "memory": {"step": "1Gi", "reserve": "2Gi"},
    "enforcement": {"mode": "hami-core", "hamiCore": {"libraryPath": "/opt/hami/lib/libvgpu.so"}},
    "driverRoot": "/run/nvidia/driver",
    "driverEdits": "toolkit",
    "nvml": {"libraryPath": "/run/nvidia/driver/usr/lib64"},
    "kubeletDir": "/data/kubelet",
    "cdiDir": "/etc/cdi",
    "controller": {
        "pluginHeartbeatTimeout": 20,
        "hostNetwork": True,
        "healthPort": 9101,
        "metricsPort": 9100,
        "webhook": {"port": 9444, "configName": "example-gpu-webhook", "failurePolicy": "Fail"},
        "replicas": 3,
        "leaderElection": {"leaseDuration": 30, "renewDeadline": 20, "retryPeriod": 4},
        "podDisruptionBudget": {"minAvailable": 2},
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
    },
    "kubeletPlugin": {
        "hostNetwork": True,
        "metricsPort": 9102,
        "terminationGracePeriodSeconds": 3,  # less than the 5 s the plugin keeps for its stop: no handover wait
        "nodeSelector": {"nvidia.com/gpu.present": None, "example.test/gpu": "yes"},
        "extraEnv": [{"name": "FRACGPU_MOCK_NVML_PROFILE", "value": "/opt/fracgpu/nvml-host/gpu80x2.profile"}],
        "usage": {"interval": 2.5, "ledgerInterval": 60},
        "health": {
            "ignoredXids": [13, 94],
            "degradedEffect": "None",
            "fatalEffect": "NoSchedule",
            "probeInterval": 2,
            "coalesce": 0.5,
        },
        "heartbeat": {"interval": 3},
    },
}
# Everything optional switched off.
MINIMAL: dict[str, Any] = {
    "deviceClass": {"create": False, "mig": {"create": False}},
    "nvml": {"libraryPath": ""},
    "controller": {
        "webhook": {"enabled": False},
        "metricsPort": 0,
        "replicas": 1,
        "leaderElection": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
    },
    "kubeletPlugin": {"metricsPort": 0, "admissionPolicy": {"enabled": False}, "nodeSelector": None},
}
VARIANTS = {"default": {}, "custom": CUSTOM, "minimal": MINIMAL}


# ----- helpers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools() -> dict[str, Path]:
    return binaries.ensure_built("helm", "kubectl")


def run(argv: list[str | Path], *, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], input=stdin, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc


def values_file(tmp: Path, values: dict[str, Any]) -> Path:
    path = tmp / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def helm_template(
    helm: Path, tmp: Path, values: dict[str, Any], *extra: str, release: str = "fg", namespace: str = "fracgpu"
) -> subprocess.CompletedProcess[str]:
    argv: list[str | Path] = [helm, "template", release, CHART, "--namespace", namespace]
    argv += ["--kube-version", KUBE_VERSION, "--values", values_file(tmp, values), *extra]
    return run(argv, check=False)


def render(
    helm: Path, tmp: Path, values: dict[str, Any], *extra: str, release: str = "fg", namespace: str = "fracgpu"
) -> list[dict[str, Any]]:
    proc = helm_template(helm, tmp, values, *extra, release=release, namespace=namespace)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{len(found)} {kind} objects named *{suffix}"
    return found[0]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def whole_gpus(driver: str) -> dict[str, Any]:
    """The selector every GPU class has besides its driver's: whole GPUs, never a MIG partition or MIG GPU."""
    return {
        "cel": {
            "expression": f'!("type" in device.attributes["{driver}"]) || device.attributes["{driver}"].type == "gpu"'
        }
    }


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def mounts_of(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """mountPath -> (host path or volume kind, read-only) for every volume mount of `container`."""
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    out = {}
    for m in container["volumeMounts"]:
        vol = volumes[m["name"]]
        source = vol["hostPath"]["path"] if "hostPath" in vol else next(k for k in vol if k != "name")
        out[m["mountPath"]] = (source, bool(m.get("readOnly")))
    return out


def refused(call: Callable[[], object], status: int = 403) -> str:
    """Run `call` (a kubernetes client or KubeRest request), expect its error with `status`; its message."""
    with pytest.raises((ApiException, ApiError)) as caught:
        call()
    assert caught.value.status == status, f"expected {status}, got {caught.value.status}: {caught.value.body}"
    body = caught.value.body
    try:
        message: str = json.loads(body)["message"]
    except (TypeError, ValueError, KeyError):
        message = str(body)
    return message


# ----- lint, schema, rendering --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_lint_and_template_pass(tools: dict[str, Path], tmp_path: Path, variant: str) -> None:
    values = values_file(tmp_path, VARIANTS[variant])
    run([tools["helm"], "lint", "--strict", CHART, "--kube-version", KUBE_VERSION, "--values", values])
    docs = render(tools["helm"], tmp_path, VARIANTS[variant])
    assert {d["kind"] for d in docs} >= {"Deployment", "DaemonSet", "ClusterRole", "ServiceAccount"}


def test_schema_and_checks_refuse_bad_values(tools: dict[str, Path], tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"enforcement": {"mode": "strict"}}, ["/enforcement/mode", "'auto', 'none', 'hami-core', 'nvml'"]),
        (
            {"enforcement": {"mode": "nvml"}, "driverEdits": "none"},
            ["enforcement.mode nvml needs driverEdits: toolkit"],
        ),
        (
            {"enforcement": {"mode": "none"}, "deviceClass": {"enforced": {"create": True}}},
            ["deviceClass.enforced.create with enforcement.mode none"],
        ),
        ({"kubeletPlugin": {"hostNetwok": True}}, ["additional properties 'hostNetwok' not allowed"]),
        ({"logging": {"format": "xml"}}, ["/logging/format", "'json', 'text'"]),
        ({"driverName": "GPU_Driver"}, ["/driverName"]),
        ({"deviceClass": {"extendedResource": {"name": "gpu"}}}, ["/deviceClass/extendedResource/name"]),
        (
            {"deviceClass": {"extendedResource": {"name": "gpu.kubernetes.io/gpu"}}},
            ['"gpu.kubernetes.io/gpu" is not an extended resource name', "kubernetes.io domains"],
        ),
        ({"deviceClass": {"extendedResource": {"enable": False}}}, ["additional properties 'enable' not allowed"]),
        ({"kubeletDir": "var/lib/kubelet"}, ["/kubeletDir"]),
        (
            {"controller": {"replicas": 2, "leaderElection": {"enabled": False}}},
            ["controller.replicas > 1 needs controller.leaderElection.enabled"],
        ),
        (
            {"controller": {"leaderElection": {"renewDeadline": 20}}},
            ["retryPeriod < renewDeadline < leaseDuration"],
        ),
        ({"image": {"pullPolicy": "Sometimes"}}, ["/image/pullPolicy", "'IfNotPresent'"]),
        ({"kubernetesServicePort": 6443}, ["kubernetesServicePort is set but kubernetesServiceHost is not"]),
        ({"controller": {"metricsPort": 8080}}, ["must differ"]),
        ({"driverEdits": "nvidia"}, ["/driverEdits", "'none', 'toolkit'"]),
        ({"kubeletPlugin": {"usage": {"interval": -1}}}, ["/kubeletPlugin/usage/interval"]),
        ({"kubeletPlugin": {"usage": {"ledgerInterval": 0}}}, ["/kubeletPlugin/usage/ledgerInterval"]),
        ({"kubeletPlugin": {"health": {"fatalEffect": "Evict"}}}, ["/kubeletPlugin/health/fatalEffect", "NoExecute"]),
        ({"kubeletPlugin": {"health": {"ignoredXids": ["13"]}}}, ["/kubeletPlugin/health/ignoredXids/0"]),
        ({"monitoring": {"podMonitor": {"interval": 30}}}, ["/monitoring/podMonitor/interval", "want string"]),
        ({"monitoring": {"serviceMonitor": {"interval": "often"}}}, ["/monitoring/serviceMonitor/interval"]),
        ({"monitoring": {"grafanaDashboard": {"enable": True}}}, ["additional properties 'enable' not allowed"]),
    ]
    for values, expected in cases:
        proc = helm_template(tools["helm"], tmp_path, values)
        assert proc.returncode != 0, f"{values} was accepted"
        for text in expected:
            assert text in proc.stderr, f"{values}: {text!r} not in {proc.stderr}"


def test_default_values_render_as_documented(tools: dict[str, Path], tmp_path: Path) -> None:
    docs = render(tools["helm"], tmp_path, {}, "--include-crds", namespace="gpus")
    crd = one(docs, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "gpus.fracgpu.dev"
    assert named(docs, "DeviceClass", "gpu.fracgpu.dev")["spec"] == {
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.fracgpu.dev"'}}, whole_gpus("gpu.fracgpu.dev")],
        # pods' resources.limits {gpu.fracgpu.dev/gpu: N}: N whole GPUs, no claim written by the user
        "extendedResourceName": "gpu.fracgpu.dev/gpu",
    }
    # the MIG partitions' class, there whether or not a GPU is a MIG GPU (its claims then stay Pending)
    assert named(docs, "DeviceClass", "mig.gpu.fracgpu.dev")["spec"] == {
        "selectors": [
            {"cel": {"expression": 'device.driver == "gpu.fracgpu.dev"'}},
            {"cel": {"expression": '"type" in device.attributes["gpu.fracgpu.dev"] && '
                     'device.attributes["gpu.fracgpu.dev"].type == "mig"'}},
        ]
    }  # fmt: skip
    assert len([d for d in docs if d["kind"] == "DeviceClass"]) == 2
    # the webhook configurations, validating and mutating (a new claim's GpuConfig bytes): made by the chart without
    # webhooks (the controller patches them in; a `webhooks` field here would fight it on `helm upgrade`)
    configs = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    assert sorted(c["kind"] for c in configs) == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    for config in configs:
        assert config["metadata"]["name"] == "gpu.fracgpu.dev"
        assert set(config) == {"apiVersion", "kind", "metadata"}, "no webhooks: the controller owns them"

    # controller: two replicas (a leader elected), surge updates, a PDB, spread over nodes, probes, non-root,
    # read-only root, no capabilities, webhook via Service
    deploy = one(docs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    (ctr,) = spec["containers"]
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": deploy["spec"]["selector"]}
    (spread,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert spread["podAffinityTerm"]["labelSelector"] == deploy["spec"]["selector"]
    assert {
        "--leader-elect",
        "--lease-name=fg-fracgpu-controller",
        "--lease-duration=15",
        "--renew-deadline=10",
        "--retry-period=2",
        "--webhook-cert-secret=gpus/fg-fracgpu-controller-webhook-cert",
    } <= set(ctr["args"])
    assert env_of(ctr)["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert ctr["image"] == "fracgpu.local/fracgpu:0.1.0" and ctr["imagePullPolicy"] == "IfNotPresent"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
    sc = ctr["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    # ready = serves admission (listening, the certificate loaded), not leadership
    assert ctr["readinessProbe"]["tcpSocket"] == {"port": 9443}
    assert ctr["resources"]["requests"] and ctr["resources"]["limits"]
    assert "--webhook-service=gpus/fg-fracgpu-webhook" in ctr["args"]
    assert {"--webhook-port=9443", "--health-port=8080", "--metrics-port=8081"} <= set(ctr["args"])
    assert env_of(ctr)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # the node plugins' heartbeat Leases are read in the release namespace, a plugin called silent after 60 s
    assert env_of(ctr)["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "--plugin-heartbeat-timeout=60" in ctr["args"]
    assert "hostNetwork" not in spec
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 9443, "targetPort": 9443, "protocol": "TCP"}]
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]

    # node plugin: downward API, critical priority, surge update, GPU nodes, host paths at the same paths
    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (plugin,) = spec["containers"]
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = env_of(plugin)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}  # its heartbeat Lease's
    assert env["FRACGPU_HEARTBEAT_INTERVAL"] == "10"
    assert env["LD_LIBRARY_PATH"] == "/opt/fracgpu/nvml"
    # tests and benchmarks run the plugin process with the chart's runtime env
    assert {k: env.get(k) for k in PLUGIN_RUNTIME_ENV} == PLUGIN_RUNTIME_ENV
    # handover: serve after SIGTERM until the replacement registered, within the grace period; ready = registered
    assert (spec["terminationGracePeriodSeconds"], env["FRACGPU_HANDOVER_TIMEOUT"]) == (30, "25")
    assert plugin["readinessProbe"]["exec"]["command"] == [
        "/bin/sh",
        "-c",
        'test -e /var/lib/kubelet/plugins/gpu.fracgpu.dev/dra-"$POD_UID".registered',
    ]
    assert "KUBERNETES_SERVICE_HOST" not in env
    mounts = mounts_of(spec, plugin)
    for path in (
        "/var/lib/kubelet/plugins/gpu.fracgpu.dev",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/dev",
    ):
        assert mounts[path] == (path, False)
    assert mounts["/opt/fracgpu/nvml-host"] == ("/usr/lib/x86_64-linux-gnu", True)
    assert env["FRACGPU_DRIVER_EDITS"] == "toolkit", "claim specs carry the driver by default"
    assert mounts["/driver-root"] == ("/", True) and env["FRACGPU_TOOLKIT_DRIVER_ROOT"] == "/driver-root"
    (init,) = spec["initContainers"]
    assert init["securityContext"]["runAsNonRoot"] is True
    assert plugin["securityContext"]["privileged"] is True

    # the admission policy matches exactly the plugin's service account
    user = "system:serviceaccount:gpus:fg-fracgpu-kubelet-plugin"
    for suffix in ("-resourceslices", "-gpus", "-events"):
        vap = one(docs, "ValidatingAdmissionPolicy", suffix)
        assert vap["spec"]["matchConditions"][0]["expression"] == f'request.userInfo.username == "{user}"'
        assert one(docs, "ValidatingAdmissionPolicyBinding", suffix)["spec"]["policyName"] == vap["metadata"]["name"]
    assert spec["serviceAccountName"] == "fg-fracgpu-kubelet-plugin"

    # usage sampling is on: host PIDs, the interval in the env, no monitoring objects unless asked for
    assert spec["hostPID"] is True
    assert (env["FRACGPU_USAGE_INTERVAL"], env["FRACGPU_USAGE_LEDGER_INTERVAL"]) == ("15", "30")
    assert not [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor", "ConfigMap")]


def test_usage_sampling_off_drops_host_pids_and_its_rights(tools: dict[str, Path], tmp_path: Path) -> None:
    docs = render(tools["helm"], tmp_path, {"kubeletPlugin": {"usage": {"interval": 0}}})
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert "hostPID" not in spec
    assert env_of(spec["containers"][0])["FRACGPU_USAGE_INTERVAL"] == "0"
    rules = one(docs, "ClusterRole", "-kubelet-plugin")["rules"]
    assert not [r for r in rules if "gpus/status" in r["resources"]]
    # GPU health still posts Events on the claims of an unhealthy GPU; with health off too, no Events either
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in rules
    off = render(tools["helm"], tmp_path, {"kubeletPlugin": {"usage": {"interval": 0}, "health": {"enabled": False}}})
    assert not [r for r in one(off, "ClusterRole", "-kubelet-plugin")["rules"] if "events" in r["resources"]]
    assert env_of(one(off, "DaemonSet")["spec"]["template"]["spec"]["containers"][0])["FRACGPU_HEALTH_NVML"] == "false"
    on = one(render(tools["helm"], tmp_path, {}), "ClusterRole", "-kubelet-plugin")["rules"]
    assert {"apiGroups": ["fracgpu.dev"], "resources": ["gpus/status"], "verbs": ["patch"]} in on
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in on


def test_monitoring_objects_and_dashboard(tools: dict[str, Path], tmp_path: Path) -> None:
    values = {
        "monitoring": {
            "podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "grafanaDashboard": {"enabled": True, "namespace": "grafana"},
        }
    }
    docs = render(tools["helm"], tmp_path, values, namespace="gpus")
    pods = one(docs, "PodMonitor")
    assert pods["metadata"]["labels"]["release"] == "prom"
    assert pods["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    selected = pods["spec"]["selector"]["matchLabels"]
    for workload in (one(docs, "DaemonSet"), one(docs, "Deployment")):  # both components, by their pod labels
        template = workload["spec"]["template"]
        assert selected.items() <= template["metadata"]["labels"].items()
        (ctr,) = template["spec"]["containers"]
        assert "metrics" in [p["name"] for p in ctr["ports"]]
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    services = [one(docs, "Service", f"-{c}-metrics") for c in ("kubelet-plugin", "controller")]
    for service, port in zip(services, (8082, 8081), strict=True):
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert service["spec"]["ports"] == [
            {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
        ]
        assert service["spec"]["clusterIP"] == "None"
    plugin_pods = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert services[0]["spec"]["selector"].items() <= plugin_pods.items()
    dashboard = one(docs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["namespace"] == "grafana"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "fracgpu.json").read_text())
    assert json.loads(dashboard["data"]["fracgpu.json"]) == shipped
    # with a metrics port off, that component gets no metrics Service
    off = render(tools["helm"], tmp_path, {**values, "controller": {"metricsPort": 0}}, namespace="gpus")
    assert not [d for d in off if d["kind"] == "Service" and d["metadata"]["name"].endswith("-controller-metrics")]


@pytest.mark.parametrize("scope", ["namespace", "namespaceLabel"])
def test_with_mps_gpus_the_controller_cluster_role_is_the_one_in_the_code(
    tools: dict[str, Path], tmp_path: Path, scope: str
) -> None:
    trust = {"scope": scope, **({"label": "team"} if scope == "namespaceLabel" else {})}
    values = {"mps": {"gpus": "0", "trustDomain": trust}, "deviceClass": {"mps": {"create": True}}}
    role = one(render(tools["helm"], tmp_path, values), "ClusterRole", "-controller")
    assert role["rules"] == cluster_role_rules(mps=True, namespaces=scope == "namespaceLabel")
    verbs = [r["verbs"] for r in role["rules"] if r["resources"] == ["devicetaintrules"]]
    assert verbs == [["list", "watch"], ["create", "patch", "delete"]]  # read for the ledger, written for MPS


def test_gpu_policy_protects_exactly_the_controllers_status_fields(tools: dict[str, Path], tmp_path: Path) -> None:
    vap = one(render(tools["helm"], tmp_path, {}), "ValidatingAdmissionPolicy", "-gpus")
    expression = vap["spec"]["validations"][2]["expression"]
    guarded = set(re.findall(r"!has\(object\.status\.(\w+)\)", expression))
    owned = {f.alias or n for n, f in GpuStatus.model_fields.items()} - {"usage"}
    assert guarded == owned


def test_driver_edits_none_mounts_no_driver_root(tools: dict[str, Path], tmp_path: Path) -> None:
    docs = render(tools["helm"], tmp_path, {"driverEdits": "none"})
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (plugin,) = spec["containers"]
    env = env_of(plugin)
    assert env["FRACGPU_DRIVER_EDITS"] == "none"
    assert "/driver-root" not in mounts_of(spec, plugin) and "FRACGPU_TOOLKIT_DRIVER_ROOT" not in env


@pytest.mark.parametrize(("driver_root", "propagation"), [("/", None), ("/run/nvidia/driver", "HostToContainer")])
def test_toolkit_driver_edits_mount_the_driver_root(
    tools: dict[str, Path], tmp_path: Path, driver_root: str, propagation: str | None
) -> None:
    docs = render(tools["helm"], tmp_path, {"driverEdits": "toolkit", "driverRoot": driver_root})
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (plugin,) = spec["containers"]
    env = env_of(plugin)
    plugin_dir = "/var/lib/kubelet/plugins/gpu.fracgpu.dev"
    assert env["FRACGPU_DRIVER_EDITS"] == "toolkit"
    assert env["FRACGPU_TOOLKIT_DRIVER_ROOT"] == "/driver-root"
    assert env["FRACGPU_HOST_DRIVER_ROOT"] == driver_root
    assert env["FRACGPU_NVIDIA_CDI_HOOK_PATH"] == f"{plugin_dir}/nvidia-cdi-hook"
    mounts = mounts_of(spec, plugin)
    assert mounts["/driver-root"] == (driver_root, True)
    assert mounts[plugin_dir] == (plugin_dir, False), "the hook's directory is writable and the host's"
    (mount,) = [m for m in plugin["volumeMounts"] if m["mountPath"] == "/driver-root"]
    assert mount.get("mountPropagation") == propagation


def test_enforced_device_class_selects_gpus_with_enforcement(tools: dict[str, Path], tmp_path: Path) -> None:
    docs = render(tools["helm"], tmp_path, {"deviceClass": {"enforced": {"create": True}}})
    classes = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    assert classes["enforced.gpu.fracgpu.dev"] == {
        "selectors": [
            {"cel": {"expression": 'device.driver == "gpu.fracgpu.dev"'}},
            {
                "cel": {
                    "expression": '"memoryEnforcement" in device.attributes["gpu.fracgpu.dev"] && '
                    'device.attributes["gpu.fracgpu.dev"].memoryEnforcement != "none"'
                }
            },
            whole_gpus("gpu.fracgpu.dev"),
        ]
    }
    plugin = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(plugin)["FRACGPU_ENFORCEMENT"] == "auto"  # the default mode


def test_extended_resource_name_follows_the_driver_and_switches_off(tools: dict[str, Path], tmp_path: Path) -> None:
    docs = render(tools["helm"], tmp_path, {"driverName": "gpu.example.test"})
    assert named(docs, "DeviceClass", "gpu.example.test")["spec"]["extendedResourceName"] == "gpu.example.test/gpu"
    assert "extendedResourceName" not in named(docs, "DeviceClass", "mig.gpu.example.test")["spec"]
    docs = render(tools["helm"], tmp_path, {"deviceClass": {"extendedResource": {"enabled": False}}})
    assert named(docs, "DeviceClass", "gpu.fracgpu.dev")["spec"] == {
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.fracgpu.dev"'}}, whole_gpus("gpu.fracgpu.dev")]
    }


def test_custom_values_reach_flags_and_env(tools: dict[str, Path], tmp_path: Path) -> None:
    docs = render(tools["helm"], tmp_path, CUSTOM)
    classes = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    assert sorted(classes) == ["example-gpu", "example-gpu-enforced", "mig.gpu.example.test"]
    assert classes["example-gpu"]["extendedResourceName"] == "example.test/whole-gpu"
    assert "extendedResourceName" not in classes["example-gpu-enforced"], "one class per extended resource"
    deploy = one(docs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    (ctr,) = spec["containers"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert ctr["image"] == "registry.example/fracgpu:0.1.0-abc1234" and ctr["imagePullPolicy"] == "Never"
    assert {
        "--driver-name=gpu.example.test",
        "--device-class=example-gpu",
        "--webhook-port=9444",
        "--webhook-config-name=example-gpu-webhook",
        "--health-port=9101",
        "--metrics-port=9100",
        "--log-level=debug",
        "--log-format=text",
        "--lease-duration=30",
        "--renew-deadline=20",
        "--retry-period=4",
        "--plugin-heartbeat-timeout=20",
    } <= set(ctr["args"])
    assert deploy["spec"]["replicas"] == 3 and one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 2
    # host network: no declared (host) ports, which would keep a second replica off a node; probes by number
    assert "ports" not in ctr and ctr["readinessProbe"]["tcpSocket"] == {"port": 9444}
    env = env_of(ctr)
    assert env["KUBERNETES_SERVICE_HOST"] == "192.0.2.10" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["FRACGPU_WEBHOOK_FAILURE_POLICY"] == "Fail" and env["EXTRA"] == "1"

    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (plugin,) = spec["containers"]
    assert spec["hostNetwork"] is True
    # host network: still a surge update (handover); the metrics port is no host port the scheduler would guard
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert "ports" not in plugin
    assert spec["nodeSelector"] == {"example.test/gpu": "yes"}
    env = env_of(plugin)
    assert {k: env[k] for k in env if k.startswith(("FRACGPU_", "KUBERNETES_"))} == {
        "FRACGPU_USAGE_INTERVAL": "2.5",
        "FRACGPU_USAGE_LEDGER_INTERVAL": "60",
        "FRACGPU_HEALTH_NVML": "true",
        "FRACGPU_HEALTH_IGNORED_XIDS": "13,94",
        "FRACGPU_HEALTH_DEGRADED_EFFECT": "None",
        "FRACGPU_HEALTH_FATAL_EFFECT": "NoSchedule",
        "FRACGPU_HEALTH_PROBE_INTERVAL": "2",
        "FRACGPU_HEALTH_COALESCE": "0.5",
        "FRACGPU_HEARTBEAT_INTERVAL": "3",
        "FRACGPU_DRIVER_NAME": "gpu.example.test",
        "FRACGPU_KUBELET_DIR": "/data/kubelet",
        "FRACGPU_CDI_DIR": "/etc/cdi",
        "FRACGPU_DRIVER_ROOT": "/run/nvidia/driver",
        "FRACGPU_DRIVER_EDITS": "toolkit",
        "FRACGPU_TOOLKIT_DRIVER_ROOT": "/driver-root",
        "FRACGPU_HOST_DRIVER_ROOT": "/run/nvidia/driver",
        "FRACGPU_NVIDIA_CDI_HOOK_PATH": "/data/kubelet/plugins/gpu.example.test/nvidia-cdi-hook",
        "FRACGPU_MEMORY_STEP": "1Gi",
        "FRACGPU_MEMORY_RESERVE": "2Gi",
        "FRACGPU_ENFORCEMENT": "hami-core",
        "FRACGPU_HAMI_CORE_LIBRARY": "/opt/hami/lib/libvgpu.so",
        "FRACGPU_METRICS_PORT": "9102",
        "FRACGPU_MPS_GPUS": "",
        "FRACGPU_MIG_GPUS": "",
        "FRACGPU_MPS_ROOT": "/run/fracgpu/mps",
        "FRACGPU_HANDOVER_TIMEOUT": "0",
        "FRACGPU_LOG_LEVEL": "debug",
        "FRACGPU_LOG_FORMAT": "text",
        "FRACGPU_MOCK_NVML_PROFILE": "/opt/fracgpu/nvml-host/gpu80x2.profile",
        "KUBERNETES_SERVICE_HOST": "192.0.2.10",
        "KUBERNETES_SERVICE_PORT": "6443",
    }
    mounts = mounts_of(spec, plugin)
    assert mounts["/data/kubelet/plugins/gpu.example.test"] == ("/data/kubelet/plugins/gpu.example.test", False)
    assert mounts["/data/kubelet/plugins_registry"] == ("/data/kubelet/plugins_registry", False)
    assert mounts["/etc/cdi"] == ("/etc/cdi", False)
    assert mounts["/run/nvidia/driver"] == ("/run/nvidia/driver", True)
    assert mounts["/opt/hami/lib"] == ("/opt/hami/lib", True)
    assert mounts["/tmp/vgpulock"] == ("/tmp/vgpulock", False)
    assert mounts["/opt/fracgpu/nvml-host"] == ("/run/nvidia/driver/usr/lib64", True)
    for rules in (
        one(docs, "ClusterRole", "-kubelet-plugin")["rules"],
        one(docs, "ClusterRole", "-controller")["rules"],
    ):
        assert [r["resourceNames"] for r in rules if r["resources"] == ["resourceclaims/driver"]] == [
            ["gpu.example.test"]
        ]
    configs = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    assert [c["metadata"]["name"] for c in configs] == ["example-gpu-webhook"] * 2

    minimal = render(tools["helm"], tmp_path, MINIMAL)
    kinds = {d["kind"] for d in minimal}
    assert not kinds & {
        "Service",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    }
    assert "--no-admission" in one(minimal, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    plugin_spec = one(minimal, "DaemonSet")["spec"]["template"]["spec"]
    assert "initContainers" not in plugin_spec and "nodeSelector" not in plugin_spec
    assert "LD_LIBRARY_PATH" not in env_of(plugin_spec["containers"][0])


@pytest.mark.parametrize("variant", VARIANTS)
def test_controller_cluster_role_is_the_one_in_the_code(tools: dict[str, Path], tmp_path: Path, variant: str) -> None:
    values = VARIANTS[variant]
    role = one(render(tools["helm"], tmp_path, values), "ClusterRole", "-controller")
    driver = values.get("driverName", "gpu.fracgpu.dev")
    webhook = values.get("controller", {}).get("webhook", {})
    assert role["rules"] == cluster_role_rules(
        driver, webhook.get("configName") or None, admission=webhook.get("enabled", True)
    )
    controller = values.get("controller", {})
    elected = controller.get("leaderElection", {}).get("enabled", True)
    shared = webhook.get("enabled", True) and not webhook.get("certSecretName")
    local = one(render(tools["helm"], tmp_path, values), "Role", "-controller")
    name = local["metadata"]["name"]
    assert (local["rules"] or []) == namespace_role_rules(
        name if elected else None, f"{name}-webhook-cert" if shared else None
    )
    # on webhook configurations: get and patch of its own only (the chart makes it; RBAC cannot scope create by name)
    webhook_rules = [r for r in role["rules"] if r["apiGroups"] == ["admissionregistration.k8s.io"]]
    if webhook.get("enabled", True):
        assert webhook_rules == [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                "verbs": ["get", "patch"],
                "resourceNames": [webhook.get("configName") or driver],
            }
        ]
    else:
        assert webhook_rules == []


def test_crds_are_the_generated_ones() -> None:
    generated = {p.name: p.read_bytes() for p in (REPO / "api" / "crds").glob("*.yaml")}
    shipped = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert generated, "no CRDs in api/crds"
    assert shipped == generated, "charts/fracgpu/crds/ differs from api/crds/: cp api/crds/*.yaml charts/fracgpu/crds/"


def example_docs() -> list[dict[str, Any]]:
    return [d for p in sorted((CHART / "examples").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_examples_pass_the_admission_review() -> None:
    claims = 0
    for doc in example_docs():
        if doc["kind"] == "ResourceClaimTemplate":
            spec, prefix = doc["spec"]["spec"], "spec.spec"
        elif doc["kind"] == "ResourceClaim":
            spec, prefix = doc["spec"], "spec"
        else:
            continue
        review = review_claim_spec(
            spec, prefix, driver="gpu.fracgpu.dev", device_class="gpu.fracgpu.dev", largest=80 * 1024 * MiB
        )
        assert review.allowed and not review.warnings, (doc["metadata"]["name"], review)
        claims += 1
    assert claims == 4


# ----- the real API server ------------------------------------------------------------------------------


def kubectl(plane: ControlPlane, tools: dict[str, Path], *args: str, stdin: str | None = None) -> str:
    argv: list[str | Path] = [tools["kubectl"], f"--kubeconfig={plane.kubeconfig}", *args]
    return run(argv, stdin=stdin).stdout


def as_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs)


@pytest.mark.parametrize("variant", VARIANTS)
def test_api_server_accepts_every_object(
    control_plane: ControlPlane, tools: dict[str, Path], tmp_path: Path, namespace: str, variant: str
) -> None:
    docs = render(
        tools["helm"], tmp_path, VARIANTS[variant], "--include-crds", release="r" + namespace, namespace=namespace
    )
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    assert crds and len(rest) >= 10
    # a dry run of objects of a CRD's kind needs the CRD: install it for real (it is the generated one,
    # which other tests of this session install as well)
    kubectl(control_plane, tools, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=as_yaml(crds))
    kubectl(control_plane, tools, "wait", "--for=condition=Established", "--timeout=30s", "crd/gpus.fracgpu.dev")
    out = kubectl(
        control_plane,
        tools,
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",
        "--field-manager=chart-test",
        "-f",
        "-",
        stdin=as_yaml(rest),
    )
    assert out.count("serverside-applied (server dry run)") == len(rest), out
    if variant == "default":
        examples = example_docs()
        out = kubectl(
            control_plane, tools, "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=as_yaml(examples)
        )
        assert out.count("(server dry run)") == len(examples), out


def test_helm_install_dry_run_prints_usage_notes(
    control_plane: ControlPlane, tools: dict[str, Path], namespace: str
) -> None:
    """`helm install` against the real API server (kubeVersion from the server), notes included."""
    argv: list[str | Path] = [tools["helm"], "install", "fracgpu", CHART, "--namespace", namespace, "--dry-run=server"]
    out = run([*argv, f"--kubeconfig={control_plane.kubeconfig}"]).stdout
    notes = out[out.index("NOTES:") :]
    assert "deviceClassName: gpu.fracgpu.dev" in notes and "memory: 10Gi" in notes
    assert "resources.limits: {gpu.fracgpu.dev/gpu: 1}" in notes, "whole GPUs by the extended resource"
    assert "kubectl get gpus" in notes
    assert f"kubectl -n {namespace} get pods -l app.kubernetes.io/instance=fracgpu" in notes


# ----- RBAC and the admission policy, acting as the chart's service accounts ------------------------------


class Installed:
    """The chart's RBAC, admission policy and DeviceClass, applied for real for a unique driver name."""

    def __init__(self, docs: list[dict[str, Any]], namespace: str, driver: str) -> None:
        self.docs = docs
        self.namespace = namespace
        self.driver = driver
        self.plugin_sa = one(docs, "ServiceAccount", "-kubelet-plugin")["metadata"]["name"]
        self.controller_sa = one(docs, "ServiceAccount", "-controller")["metadata"]["name"]
        self.device_class = named(docs, "DeviceClass", driver)["metadata"]["name"]
        self.other_driver = "other-" + driver  # another DRA driver's devices, for the refusals


INSTALLED_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "DeviceClass",
    "FlowSchema",
    "PriorityLevelConfiguration",
}


@pytest.fixture
def installed(
    control_plane: ControlPlane, dyn: DynamicClient, tools: dict[str, Path], tmp_path: Path, namespace: str
) -> Iterator[Installed]:
    driver = f"gpu-{uuid.uuid4().hex[:6]}.fracgpu.test"
    docs = render(tools["helm"], tmp_path, {"driverName": driver}, release="r" + namespace, namespace=namespace)
    docs = [d for d in docs if d["kind"] in INSTALLED_KINDS]
    manifest = as_yaml(docs)
    kubectl(control_plane, tools, "apply", "--server-side", "--field-manager=chart-test", "-f", "-", stdin=manifest)
    installed = Installed(docs, namespace, driver)
    kube.ensure_device_class(dyn, installed.other_driver, installed.other_driver)
    try:
        yield installed
    finally:
        kubectl(control_plane, tools, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=manifest)
        kube.resource(dyn, "resource.k8s.io/v1", "DeviceClass").delete(name=installed.other_driver)


def slice_for(driver: str, node: dict[str, Any], gpus: int = 1) -> dict[str, Any]:
    """The ResourceSlice the node plugin builds for `node` (one slice, `gpus` simulated 80 GiB GPUs)."""
    name = node["metadata"]["name"]
    (body,) = build_slices(
        name, node["metadata"]["uid"], driver, kube.simulated_gpus(name, gpus), step=256 * MiB, reserve=0, generation=1
    )
    return body


def allocate_two_driver_claim(
    api_client: client.ApiClient, dyn: DynamicClient, namespace: str, *, node: str, device_class: str, other: str
) -> dict[str, Any]:
    """A claim for 10Gi of one of our GPUs and one device of driver `other` (DeviceClass named like it),
    used by a pod pinned to `node`; returned once the real scheduler has allocated it."""
    name = kube.unique("two-drivers")
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": device_class, "capacity": {"requests": {"memory": "10Gi"}}},
                },
                {"name": "other", "exactly": {"deviceClassName": other}},
            ]
        }
    }
    claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")
    claims.create(namespace=namespace, body={"metadata": {"name": name}, "spec": spec})
    pod = kube.pod_with_claim(name, "unused", node)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod)

    def allocated() -> dict[str, Any] | None:
        claim: dict[str, Any] = claims.get(namespace=namespace, name=name).to_dict()
        return claim if (claim.get("status") or {}).get("allocation") else None

    return kube.wait_for(allocated, 60, what=f"allocation of claim {namespace}/{name}")


def test_api_priority_gives_both_service_accounts_their_own_bounded_flow(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tools: dict[str, Path],
    tmp_path: Path,
    installed: Installed,
) -> None:
    """The chart's FlowSchema matches the plugin's and the controller's requests (the API server names the flow
    and priority level it chose in each answer's `X-Kubernetes-PF-*` headers), its priority level never borrows,
    and `apiPriority.enabled: false` renders neither."""
    ns = installed.namespace
    schema = one(installed.docs, "FlowSchema")
    name = schema["metadata"]["name"]
    admin = KubeRest(KubeConnection.of(api_client))
    flow = admin.get(f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{name}")
    level = admin.get(f"/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/{name}")
    assert level["spec"]["limited"]["borrowingLimitPercent"] == 0
    assert level["spec"]["limited"]["limitResponse"]["type"] == "Queue"

    def dangling() -> bool | None:
        conditions = admin.get(f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{name}").get("status", {})
        found = [c for c in conditions.get("conditions") or [] if c["type"] == "Dangling"]
        return found[0]["status"] == "True" if found else None

    kube.wait_for(lambda: dangling() is False, 30, what="the FlowSchema's priority level found")
    for account in (installed.plugin_sa, installed.controller_sa):
        token = kube.service_account_token(api_client, ns, account)
        rest = KubeRest(KubeConnection.of(kube.token_client(control_plane.server, control_plane.ca_cert, token)))

        def classified(rest: KubeRest = rest) -> tuple[str, str] | None:
            """(FlowSchema uid, priority level uid) of a request, once the API server puts it in the chart's flow."""
            resp = rest.send("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=SELF_REVIEW)
            flow_uid = str(resp.headers.get("X-Kubernetes-PF-FlowSchema-UID", ""))
            level_uid = str(resp.headers.get("X-Kubernetes-PF-PriorityLevel-UID", ""))
            return (flow_uid, level_uid) if flow_uid == flow["metadata"]["uid"] else None

        # the API server's APF configuration follows the objects through an informer: wait until it does
        got = kube.wait_for(classified, 30, what=f"{account}'s requests in the chart's flow")
        assert got == (flow["metadata"]["uid"], level["metadata"]["uid"]), account
    # the admin's own requests are not in it
    resp = admin.send("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=SELF_REVIEW)
    assert resp.headers.get("X-Kubernetes-PF-FlowSchema-UID") != flow["metadata"]["uid"]
    off = render(tools["helm"], tmp_path, {"apiPriority": {"enabled": False}})
    assert not [d for d in off if d["kind"] in ("FlowSchema", "PriorityLevelConfiguration")]


SELF_REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


def test_service_accounts_can_do_their_job_and_nothing_else(
    control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient, installed: Installed
) -> None:
    ns, driver = installed.namespace, installed.driver
    core = client.CoreV1Api(api_client)
    admin = KubeRest(KubeConnection.of(api_client))
    nodes = [kube.create_fake_node(api_client, kube.unique("chart-node")) for _ in range(2)]
    node_a, node_b = (n["metadata"]["name"] for n in nodes)
    try:

        def act_as(service_account: str, pod_on: str | None) -> KubeRest:
            pod = None
            if pod_on is not None:
                pod = kube.node_bound_pod(
                    api_client, ns, kube.unique("sa-pod"), node=pod_on, service_account=service_account
                )
            token = kube.service_account_token(api_client, ns, service_account, bound_pod=pod)
            return KubeRest(KubeConnection.of(kube.token_client(control_plane.server, control_plane.ca_cert, token)))

        plugin_a = act_as(installed.plugin_sa, node_a)
        plugin_b = act_as(installed.plugin_sa, node_b)
        plugin_unbound = act_as(installed.plugin_sa, None)
        controller = act_as(installed.controller_sa, None)
        # the token of a pod on node A carries that node's name, as a DaemonSet pod's token does
        me = kube.whoami(plugin_a)
        assert me["username"] == f"system:serviceaccount:{ns}:{installed.plugin_sa}"
        assert me["extra"]["authentication.kubernetes.io/node-name"] == [node_a]

        slice_a, slice_b = (slice_for(driver, n) for n in nodes)
        dry = {"dryRun": "All"}

        def create_slice(rest: KubeRest, body: dict[str, Any], query: dict[str, Any] | None = None) -> None:
            rest.request("POST", SLICES, query, body=body)

        # the policy is enforced from when the API server's informer has it: wait (dry runs change nothing)
        def policy_active() -> bool:
            try:
                create_slice(plugin_a, slice_b, dry)
            except ApiError as err:
                assert err.status == 403, err.body
                return True
            return False

        kube.wait_for(policy_active, 30, what="the admission policy in force")

        # ResourceSlices: its own node's, of its own driver, only
        create_slice(plugin_a, slice_a)
        # it reads its slices as the code does: list and watch with a field selector (never one GET)
        own_slices = {"fieldSelector": f"spec.nodeName={node_a},spec.driver={driver}"}
        (mine,) = plugin_a.get(SLICES, **own_slices)["items"]
        next(plugin_a.watch(SLICES, 1, **own_slices, resourceVersion="0"))
        refused(lambda: plugin_a.get(f"{SLICES}/{slice_a['metadata']['name']}"))
        refused(
            lambda: plugin_a.request(
                "PATCH", f"{SLICES}/{slice_a['metadata']['name']}", dry, body={}, content_type=MERGE
            )
        )
        mine["spec"]["pool"]["generation"] = 2
        plugin_a.replace(f"{SLICES}/{slice_a['metadata']['name']}", mine)
        message = refused(lambda: create_slice(plugin_a, slice_b))
        assert f"node '{node_a}' may only write ResourceSlices of its own node, not of node '{node_b}'" in message
        other_driver = slice_for("other.fracgpu.test", nodes[0])
        assert "may only write ResourceSlices of driver" in refused(lambda: create_slice(plugin_a, other_driver))
        assert "no node name" in refused(lambda: create_slice(plugin_unbound, slice_a, dry))
        create_slice(KubeRest(KubeConnection.of(api_client)), slice_b)  # node B's slice, published by node B's plugin
        theirs = admin.get(f"{SLICES}/{slice_b['metadata']['name']}")
        theirs["spec"]["pool"]["generation"] = 2
        message = refused(lambda: plugin_a.replace(f"{SLICES}/{slice_b['metadata']['name']}", theirs))
        assert f"may only write ResourceSlices of its own node, not of node '{node_b}'" in message
        refused(lambda: plugin_a.request("DELETE", f"{SLICES}/{slice_b['metadata']['name']}", dry))
        plugin_b.request("DELETE", f"{SLICES}/{slice_b['metadata']['name']}", dry)

        # the rest of the plugin's rights: its node, claims (read), Events about its node
        plugin_a.get(f"/api/v1/nodes/{node_a}")
        refused(lambda: plugin_a.get("/api/v1/nodes"))
        refused(lambda: plugin_a.request("PATCH", f"/api/v1/nodes/{node_a}", body={}, content_type=MERGE))

        def event(about: dict[str, str], reporter: str = node_a) -> dict[str, Any]:
            return {
                "metadata": {"generateName": "chart-test-"},
                "involvedObject": about,
                "reportingInstance": reporter,
                "source": {"component": "fracgpu-kubelet-plugin", "host": reporter},
            }

        node_event = event({"kind": "Node", "name": node_a})
        plugin_a.request("POST", "/api/v1/namespaces/default/events", dry, body=node_event)
        # usage sampling: Events on claims and pods in their namespaces, reported from its own node only
        claim_event = event({"kind": "ResourceClaim", "namespace": ns, "name": "c"})
        plugin_a.request("POST", f"/api/v1/namespaces/{ns}/events", dry, body=claim_event)
        message = refused(
            lambda: plugin_a.request(
                "POST", f"/api/v1/namespaces/{ns}/events", dry, body=event(claim_event["involvedObject"], node_b)
            )
        )
        assert f"node '{node_a}' may only post Events it reports from its own node" in message
        message = refused(
            lambda: plugin_a.request(
                "POST", "/api/v1/namespaces/default/events", dry, body=event({"kind": "Node", "name": node_b})
            )
        )
        assert "only post Events about its own Node, ResourceClaims and Pods" in message
        refused(
            lambda: plugin_a.request(
                "POST",
                f"/api/v1/namespaces/{ns}/events",
                dry,
                body=event({"kind": "Secret", "namespace": ns, "name": "s"}),
            )
        )
        refused(lambda: plugin_a.get(f"/api/v1/namespaces/{ns}/secrets"))
        refused(lambda: plugin_a.request("POST", f"/api/v1/namespaces/{ns}/pods", dry, body={}))

        # status.devices: one claim allocated on node A with a device of ours and one of another driver
        # (published by an administrator), so that only authorization can refuse an entry
        other = installed.other_driver
        kube.publish_gpus(dyn, nodes[0], other, kube.simulated_gpus(node_a, 1))
        claim = allocate_two_driver_claim(
            api_client, dyn, ns, node=node_a, device_class=installed.device_class, other=other
        )
        ours, theirs_result = (
            next(r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == d)
            for d in (driver, other)
        )
        # the plugin GETs the claims it is asked to prepare (never writes them) and may mark its own driver's
        # devices on claims allocated on its own node: with the code it runs
        claim = plugin_a.get(claim_path(ns, claim["metadata"]["name"]))
        refused(lambda: plugin_a.request("DELETE", claim_path(ns, claim["metadata"]["name"]), dry))
        # ... but may not list or watch claims (other tenants' GpuConfig parameters), here or cluster-wide
        for claims in (
            f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
            "/apis/resource.k8s.io/v1/resourceclaims",
        ):
            refused(partial(plugin_a.get, claims))
            refused(partial(next, plugin_a.watch(claims, 1)))
        # RBAC cannot tie a read to the claim's node and admission never sees reads: a plugin's token may GET
        # any claim whose namespace and name it knows (node B's plugin reads node A's claim)
        plugin_b.get(claim_path(ns, claim["metadata"]["name"]))
        apply_ready(plugin_a, claim, driver, node_a)
        (entry,) = admin.get(claim_path(ns, claim["metadata"]["name"]))["status"]["devices"]
        assert (entry["driver"], entry["conditions"][0]["type"]) == (driver, "Ready")
        # ... not from another node (the API server answers 422 with a Forbidden cause: the check is in the
        # claim strategy, not in the authorizer)
        message = refused(lambda: apply_ready(plugin_b, claim, driver, node_b), 422)
        assert 'requires resource="resourceclaims/driver", verb="[arbitrary-node:patch]"' in message, message
        foreign = {k: v for k, v in theirs_result.items() if k in ("driver", "pool", "device", "shareID")}
        status_path = claim_path(ns, claim["metadata"]["name"]) + "/status"

        def apply_entry(rest: KubeRest, entry: dict[str, Any], manager: str) -> None:
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": claim["metadata"]["name"], "namespace": ns},
                "status": {"devices": [entry]},
            }
            rest.apply(status_path, body, manager)

        # ... and never another driver's entries
        message = refused(lambda: apply_entry(plugin_a, foreign, "fracgpu-kubelet-plugin"), 422)
        assert 'verb="[associated-node:patch arbitrary-node:patch]"' in message, message
        assert f'"{other}" is forbidden' in message and "must be an allocated device" not in message, message

        # the controller: reads claims and slices, writes its driver's status.devices data on any node's claims
        controller.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
        controller.get(SLICES)
        # ... reads pods (those a claim's Event concerns: by name, a namespace's unbound ones), never watches them
        controller.get(f"/api/v1/namespaces/{ns}/pods", fieldSelector="spec.nodeName=")
        refused(partial(next, controller.watch(f"/api/v1/namespaces/{ns}/pods", 1)))
        own = {k: v for k, v in ours.items() if k in ("driver", "pool", "device", "shareID")} | {
            "data": {"node": node_a}
        }
        apply_entry(controller, own, "fracgpu-controller")
        assert "resourceclaims/driver" in refused(lambda: apply_entry(controller, foreign, "fracgpu-controller"), 422)
        kube.apply_crd(api_client, yaml.safe_load((CHART / "crds" / "gpus.fracgpu.dev.yaml").read_text()))
        gpu: dict[str, Any] = {
            "apiVersion": "fracgpu.dev/v1alpha1",
            "kind": "GPU",
            "metadata": {"name": kube.unique("gpu")},
            "spec": {"driver": driver, "pool": node_a, "device": "gpu-0", "node": node_a},
        }
        controller.request("POST", "/apis/fracgpu.dev/v1alpha1/gpus", dry, body=gpu)
        # the plugin writes status.usage of its own node's GPU objects, once the controller wrote their status
        gpus = "/apis/fracgpu.dev/v1alpha1/gpus"
        ledger: dict[str, str] = {}
        for n in (node_a, node_b):
            name = kube.unique("gpu")
            body = {**gpu, "metadata": {"name": name}, "spec": {**gpu["spec"], "pool": n, "node": n}}
            controller.request("POST", gpus, body=body)
            status = {"node": n, "totalMemory": "80Gi", "allocatedMemory": "10Gi", "freeMemory": "70Gi", "shares": 1}
            controller.apply(f"{gpus}/{name}/status", {**body, "status": status}, "fracgpu-controller")
            ledger[n] = name

        def apply_usage(rest: KubeRest, node: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
            body = {
                "apiVersion": "fracgpu.dev/v1alpha1",
                "kind": "GPU",
                "metadata": {"name": ledger[node]},
                "status": {"usage": {"usedMemory": "3Gi"}, **(extra or {})},
            }
            return rest.apply(f"{gpus}/{ledger[node]}/status", body, "fracgpu-kubelet-plugin")

        def gpu_policy_active() -> bool:
            try:
                apply_usage(plugin_a, node_b)
            except ApiError as err:
                assert err.status == 403, err.body
                return True
            return False

        kube.wait_for(gpu_policy_active, 30, what="the GPU admission policy in force")
        written = apply_usage(plugin_a, node_a)
        assert written["status"]["usage"] == {"usedMemory": "3Gi"} and written["status"]["allocatedMemory"] == "10Gi"
        message = refused(lambda: apply_usage(plugin_a, node_b))
        assert f"node '{node_a}' may only write GPU objects of its own node, not of node '{node_b}'" in message
        message = refused(lambda: apply_usage(plugin_a, node_a, {"allocatedMemory": "0"}))
        assert "may only write status.usage of a GPU object" in message
        refused(lambda: plugin_a.request("POST", gpus, dry, body=gpu))
        refused(lambda: plugin_a.request("DELETE", f"{gpus}/{ledger[node_a]}", dry))
        refused(lambda: plugin_a.get(f"{gpus}/{ledger[node_a]}"))
        # the controller's next status apply (of its fields only) keeps the plugin's
        status = {"node": node_a, "totalMemory": "80Gi", "allocatedMemory": "20Gi", "freeMemory": "60Gi", "shares": 2}
        body = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GPU", "metadata": {"name": ledger[node_a]}}
        after = controller.apply(f"{gpus}/{ledger[node_a]}/status", {**body, "status": status}, "fracgpu-controller")
        assert after["status"]["usage"] == {"usedMemory": "3Gi"} and after["status"]["shares"] == 2
        for name in ledger.values():
            admin.delete(f"{gpus}/{name}")
        # ... and nothing it does not need
        refused(lambda: create_slice(controller, slice_a, dry))
        refused(lambda: controller.request("DELETE", claim_path(ns, claim["metadata"]["name"]), dry))
        refused(lambda: controller.request("POST", f"/api/v1/namespaces/{ns}/pods", dry, body={}))
        refused(lambda: controller.get(f"/api/v1/namespaces/{ns}/secrets"))
        refused(lambda: controller.get("/api/v1/namespaces/kube-system/secrets/anything"))
        refused(lambda: controller.request("PATCH", f"/api/v1/nodes/{node_a}", body={}, content_type=MERGE))
        # webhook configurations: it patches the chart-made ones (validating and mutating), and may neither create
        # one (of any name: a webhook of its own on every request in the cluster) nor patch or delete another
        vwcs = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
        mwcs = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        config_name = one(installed.docs, "ValidatingWebhookConfiguration")["metadata"]["name"]
        assert one(installed.docs, "MutatingWebhookConfiguration")["metadata"]["name"] == config_name
        for configs in (vwcs, mwcs):
            controller.request("PATCH", f"{configs}/{config_name}", dry, body={"webhooks": []}, content_type=MERGE)
            for name in (config_name, kube.unique("any")):
                refused(partial(controller.request, "POST", configs, dry, body={"metadata": {"name": name}}))
            refused(partial(controller.request, "PATCH", f"{configs}/someone-elses", dry, body={}, content_type=MERGE))
            refused(partial(controller.request, "DELETE", f"{configs}/{config_name}", dry))
        # changing an allocation needs resourceclaims/binding, which neither has
        unallocate = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "status": {"allocation": None}}
        for rest in (controller, plugin_a):
            message = refused(
                partial(rest.request, "PATCH", status_path, dry, body=unallocate, content_type=MERGE), 422
            )
            assert "resourceclaims/binding" in message
        assert admin.get(status_path)["status"]["allocation"]
    finally:
        for n in (node_a, node_b):
            core.delete_node(n)


def test_each_plugin_renews_only_its_own_nodes_heartbeat_and_the_controller_reads_them(
    control_plane: ControlPlane, api_client: client.ApiClient, installed: Installed
) -> None:
    ns, driver = installed.namespace, installed.driver
    core = client.CoreV1Api(api_client)
    nodes = [kube.create_fake_node(api_client, kube.unique("beat-node"))["metadata"]["name"] for _ in range(2)]
    node_a, node_b = nodes
    try:

        def act_as(service_account: str, pod_on: str | None) -> KubeRest:
            pod = None
            if pod_on is not None:
                pod = kube.node_bound_pod(
                    api_client, ns, kube.unique("sa-pod"), node=pod_on, service_account=service_account
                )
            token = kube.service_account_token(api_client, ns, service_account, bound_pod=pod)
            return KubeRest(KubeConnection.of(kube.token_client(control_plane.server, control_plane.ca_cert, token)))

        plugin_a, plugin_unbound = act_as(installed.plugin_sa, node_a), act_as(installed.plugin_sa, None)
        controller = act_as(installed.controller_sa, None)
        now = datetime.datetime.now(datetime.UTC)

        def write(rest: KubeRest, node: str, holder: str | None = None) -> None:
            """Server-side apply of `node`'s Lease held by `holder` (default: that node), in dry run."""
            body = lease_body(node, driver, renewed=now, acquired=now, duration_seconds=30)
            body["spec"]["holderIdentity"] = holder or node
            query = {"fieldManager": "fracgpu-kubelet-plugin", "dryRun": "All"}
            path = f"{leases_path(ns)}/{lease_name(node)}"
            rest.request("PATCH", path, query, body=json.dumps(body), content_type=APPLY)

        # the policy is enforced from when the API server's informer has it
        def policy_active() -> bool:
            try:
                write(plugin_a, node_b)
            except ApiError as err:
                assert err.status == 403, err.body
                return True
            return False

        kube.wait_for(policy_active, 30, what="the heartbeat admission policy in force")
        Heartbeat(plugin_a, ns, node_a, driver, interval_s=1).beat()  # the plugin's own code: created, then renewed
        Heartbeat(plugin_a, ns, node_a, driver, interval_s=1).beat()
        message = refused(lambda: write(plugin_a, node_b))
        assert f"the node plugin on node '{node_a}' may only write its own heartbeat Lease" in message, message
        assert "may only write its own heartbeat Lease" in refused(lambda: write(plugin_a, node_a, holder=node_b))
        assert "no node name" in refused(lambda: write(plugin_unbound, node_a))
        refused(lambda: plugin_a.get(leases_path(ns)))  # it reads no Lease
        refused(lambda: plugin_a.request("DELETE", f"{leases_path(ns)}/{lease_name(node_a)}"))

        (lease,) = controller.get(leases_path(ns), labelSelector=f"{HEARTBEAT_LABEL}={driver}")["items"]
        assert heartbeat_of(lease) == (node_a, lease["spec"]["renewTime"])
        refused(lambda: controller.get("/apis/coordination.k8s.io/v1/leases"))  # only its namespace's
        refused(lambda: write(controller, node_a))  # it writes none
        write(plugin_a, node_a)  # the dry run itself is allowed: what refuses the others is the policy
        assert one(installed.docs, "Role", "-controller-heartbeats")["rules"] == heartbeat_role_rules()
    finally:
        for n in nodes:
            core.delete_node(n)


def test_helm_upgrade_keeps_the_webhooks_the_controller_patched_in(
    control_plane: ControlPlane, api_client: client.ApiClient, tools: dict[str, Path], tmp_path: Path, namespace: str
) -> None:
    """The chart makes the configuration empty; the controller's own registration code, with its service
    account's token, patches its webhooks in; `helm upgrade` (a three-way merge) keeps them while it updates
    the object's labels; `helm uninstall` removes the configuration (nothing is left behind)."""
    driver = f"gpu-{uuid.uuid4().hex[:6]}.fracgpu.test"
    release = "u" + namespace
    values = values_file(tmp_path, {"driverName": driver})
    docs = render(tools["helm"], tmp_path, {"driverName": driver}, release=release, namespace=namespace)
    controller_sa = one(docs, "ServiceAccount", "-controller")["metadata"]["name"]
    helm: list[str | Path] = [tools["helm"], f"--kubeconfig={control_plane.kubeconfig}", "--namespace", namespace]
    admission = client.AdmissionregistrationV1Api(api_client)
    run([*helm, "install", release, CHART, "--skip-crds", "--values", values])
    try:
        made = admission.read_validating_webhook_configuration(driver)
        assert not made.webhooks and made.metadata.annotations["meta.helm.sh/release-name"] == release

        token = kube.service_account_token(api_client, namespace, controller_sa)
        rest = KubeRest(KubeConnection.of(kube.token_client(control_plane.server, control_plane.ca_cert, token)))
        ca = base64.b64encode(self_signed_certificate(["127.0.0.1"])[0]).decode()
        client_config = kopf.WebhookClientConfig(url="https://127.0.0.1:1", caBundle=ca)
        registration = Registration(rest, driver, fail=False, retry=(0.2, 1.0))
        asyncio.run(asyncio.wait_for(registration.register(client_config), 30))
        registered = admission.read_validating_webhook_configuration(driver).to_dict()["webhooks"]
        assert [(w["name"], w["client_config"]["url"], w["client_config"]["ca_bundle"]) for w in registered] == [
            (f"resourceclaims.{driver}", "https://127.0.0.1:1/resourceclaims", ca),
            (f"resourceclaimtemplates.{driver}", "https://127.0.0.1:1/resourceclaimtemplates", ca),
        ]

        run([*helm, "upgrade", release, CHART, "--skip-crds", "--values", values, "--set", "commonLabels.upgraded=yes"])
        upgraded = admission.read_validating_webhook_configuration(driver)
        assert upgraded.metadata.labels["upgraded"] == "yes", "helm did not update the object"
        assert upgraded.to_dict()["webhooks"] == registered, "helm upgrade changed the controller's webhooks"

        # emptied behind its back (a replica of an older release at its exit): the kept registration, with
        # the same token (get and patch of this one name), puts its webhooks back
        keeping = Registration(rest, driver, fail=False, retry=(0.2, 1.0), check_seconds=0.2)

        async def emptied_and_put_back() -> list[Any]:
            task = asyncio.create_task(keeping.keep(client_config))
            try:
                while not keeping.registered:
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(admission.patch_validating_webhook_configuration, driver, {"webhooks": []})
                while True:
                    live = await asyncio.to_thread(admission.read_validating_webhook_configuration, driver)
                    if live.webhooks:
                        return list(live.to_dict()["webhooks"])
                    await asyncio.sleep(0.1)
            finally:
                task.cancel()
                await asyncio.wait([task])

        assert asyncio.run(asyncio.wait_for(emptied_and_put_back(), 30)) == registered

        asyncio.run(asyncio.wait_for(registration.unregister(), 30))
        assert not admission.read_validating_webhook_configuration(driver).webhooks
        run([*helm, "uninstall", release])
        refused(lambda: admission.read_validating_webhook_configuration(driver), 404)
    finally:
        run([*helm, "uninstall", release, "--ignore-not-found"], check=False)


def test_mps_gpus_add_a_supervisor_daemonset_apart_from_the_plugin(tools: dict[str, Path], tmp_path: Path) -> None:
    assert [d for d in render(tools["helm"], tmp_path, {}) if d["metadata"]["name"].endswith("-mps")] == []
    values = {"mps": {"gpus": "0,GPU-1"}, "deviceClass": {"mps": {"create": True}}, "driverEdits": "none"}
    docs = render(tools["helm"], tmp_path, values)
    ds = one(docs, "DaemonSet", "-mps")
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}, "helm upgrade must not restart a daemon"
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["automountServiceAccountToken"] is False
    (supervisor,) = spec["containers"]
    assert supervisor["command"] == ["fracgpu-mps-supervisor"]
    env = env_of(supervisor)
    known = {o.env for o in options(MpsSettings)}
    assert {k for k in env if k.startswith("FRACGPU_")} <= known, "every variable is a supervisor option"
    assert (env["FRACGPU_MPS_GPUS"], env["FRACGPU_MULTI_USER"]) == ("0,GPU-1", "true")
    mounts = mounts_of(spec, supervisor)
    assert mounts["/run/fracgpu/mps"] == ("/run/fracgpu/mps", False)
    assert "/dev/shm" not in mounts, "each trust domain's daemon gets its own tmpfs, not a shared host directory"
    (root_mount,) = [m for m in supervisor["volumeMounts"] if m["mountPath"] == "/run/fracgpu/mps"]
    assert root_mount["mountPropagation"] == "Bidirectional", "the per-domain tmpfs mounts must reach the host"
    assert supervisor["securityContext"]["privileged"] is True, "Bidirectional propagation needs a privileged container"
    assert mounts["/driver-root"] == ("/", True)
    MpsSettings(**{o.field: env[o.env] for o in options(MpsSettings) if o.env in env})  # values the supervisor takes
    plugin = one(docs, "DaemonSet", "-kubelet-plugin")["spec"]["template"]["spec"]
    assert env_of(plugin["containers"][0])["FRACGPU_MPS_GPUS"] == "0,GPU-1"
    plugin_mounts = mounts_of(plugin, plugin["containers"][0])
    assert plugin_mounts["/run/fracgpu/mps"] == ("/run/fracgpu/mps", False), "the plugin writes tenant.json"
    # the driver's MPS control client sets the ceilings, even without driver edits
    assert plugin_mounts["/driver-root"] == ("/", True)
    control = env_of(plugin["containers"][0])["FRACGPU_MPS_CONTROL"]
    assert control == "/driver-root/usr/bin/nvidia-cuda-mps-control"
    classes = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    assert classes["mps.gpu.fracgpu.dev"]["selectors"][1] == {
        "cel": {
            "expression": '"mps" in device.attributes["gpu.fracgpu.dev"] && device.attributes["gpu.fracgpu.dev"].mps'
        }
    }


def test_bad_mps_gpus_are_refused_by_the_schema(tools: dict[str, Path], tmp_path: Path) -> None:
    proc = helm_template(tools["helm"], tmp_path, {"mps": {"gpus": "gpu0"}})
    assert proc.returncode != 0 and "/mps/gpus" in proc.stderr


def test_mig_gpus_reach_the_plugin_and_are_never_also_mps_gpus(tools: dict[str, Path], tmp_path: Path) -> None:
    docs = render(tools["helm"], tmp_path, {"mig": {"gpus": "1,GPU-2"}})
    plugin = one(docs, "DaemonSet", "-kubelet-plugin")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(plugin)["FRACGPU_MIG_GPUS"] == "1,GPU-2"
    (controller,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--mig-device-class=mig.gpu.fracgpu.dev" in controller["args"]
    renamed = render(tools["helm"], tmp_path, {"deviceClass": {"mig": {"name": "isolated-gpu"}}})
    assert named(renamed, "DeviceClass", "isolated-gpu")
    (controller,) = one(renamed, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--mig-device-class=isolated-gpu" in controller["args"]
    off = render(tools["helm"], tmp_path, {"deviceClass": {"mig": {"create": False}}})
    assert [d["metadata"]["name"] for d in off if d["kind"] == "DeviceClass"] == ["gpu.fracgpu.dev"]
    for mig, mps in (("1", "0,1"), ("all", "0"), ("0", "all")):
        proc = helm_template(tools["helm"], tmp_path, {"mig": {"gpus": mig}, "mps": {"gpus": mps}})
        assert proc.returncode != 0 and "a MIG GPU is never an MPS GPU" in proc.stderr, proc.stderr
    proc = helm_template(tools["helm"], tmp_path, {"mig": {"gpus": "gpu1"}})
    assert proc.returncode != 0 and "/mig/gpus" in proc.stderr
