"""Two nodes, one control plane, one fracgpu release: node A has 2x H100 80GB, node B 1x A100 40GB.

Claims land on both nodes and each node's GPUs are in the ledger as they are; memory and CEL selectors pick the
node; each node plugin, with the real service-account token of its DaemonSet pod, is refused what belongs to
the other node or to another driver. The lifecycle tests at the end stop one node's plugin, drain
that node and finally delete it (the last test: the node does not come back). The cluster is this module's own
(the other e2e modules share a single-node one).
"""

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from e2e import workloads as w
from e2e.install import NAMESPACE, ClusterInstallation, install_cluster, state_dir, tear_down
from harness.cluster.multinode import A100X1, H100X2, ClusterNode, MultiNodeCluster, NodeProfile
from harness.mocknvml import read_profile

T = TypeVar("T")
H100_NODE, A100_NODE = "fracgpu-h100", "fracgpu-a100"
OTHER_DRIVER = "other.fracgpu.test"
HEARTBEAT_TIMEOUT_S = 6
SHORT_HEARTBEAT = {
    "kubeletPlugin": {"heartbeat": {"interval": 1}},
    "controller": {"pluginHeartbeatTimeout": HEARTBEAT_TIMEOUT_S},
}
"""Plugins renew every second, the controller calls one silent after 6 s (node lifecycle tests, at the end)."""
A100_SELECTOR = f'device.attributes["{w.DEVICE_CLASS}"].productName.startsWith("NVIDIA A100")'


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[ClusterInstallation]:
    """A Ready two-node cluster with fracgpu installed by its chart (one plugin per node, the controller on A)."""
    if os.geteuid() != 0:
        pytest.skip("the e2e cluster needs root: network and mount namespaces, mounts, mknod and runc")
    with state_dir("fracgpu-e2e-multi-") as files:
        cluster = MultiNodeCluster(files, [NodeProfile(H100_NODE, H100X2), NodeProfile(A100_NODE, A100X1)])
        cluster.start()
        installed: ClusterInstallation | None = None
        try:
            installed = install_cluster(cluster, image_out=files / "image", overrides=SHORT_HEARTBEAT)
            yield installed
        finally:
            tear_down(cluster, installed)


@pytest.fixture
def ns(two_nodes: ClusterInstallation) -> Iterator[str]:
    """A fresh namespace, deleted with everything in it afterwards."""
    with w.fresh_namespace(two_nodes.cluster) as name:
        yield name


def _profile_gpus(profile: Path) -> dict[str, str]:
    """UUID -> product name of a mock NVML profile's GPUs."""
    values = read_profile(profile)
    return {v: values[k.replace(".uuid", ".name")] for k, v in values.items() if k.endswith(".uuid")}


def _allocated_node(claim: dict[str, Any]) -> str:
    """The node the scheduler allocated the claim on (its node selector's one metadata.name)."""
    (term,) = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    (field,) = term["matchFields"]
    assert (field["key"], field["operator"]) == ("metadata.name", "In"), field
    (node,) = field["values"]
    return str(node)


def _ledger(cluster: MultiNodeCluster) -> list[dict[str, Any]]:
    return [g["status"] for g in w.get(cluster, "gpus")["items"]]


def test_claims_land_on_both_nodes_and_the_ledger_lists_each_nodes_gpus(
    two_nodes: ClusterInstallation, ns: str
) -> None:
    cluster = two_nodes.cluster
    expected_gpus = Counter(
        [(H100_NODE, "NVIDIA H100 80GB HBM3", "80Gi")] * 2 + [(A100_NODE, "NVIDIA A100-SXM4-40GB", "40Gi")]
    )

    def listed(ledger: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
        return Counter((g.get("node", ""), g.get("model", ""), g.get("totalMemory", "")) for g in ledger)

    deadline = time.monotonic() + 30  # the controller writes the ledger shortly after the slices appear
    while listed(ledger := _ledger(cluster)) != expected_gpus and time.monotonic() < deadline:
        time.sleep(1)
    assert listed(ledger) == expected_gpus, ledger
    table = cluster.kubectl("get", "gpus", "-o", "wide").stdout.splitlines()  # NODE is a wide column
    assert len(table) == 1 + len(ledger), table  # a header and a row per GPU
    for (node, model, total), count in expected_gpus.items():
        matching = [line for line in table if f" {node} " in line and f" {model} " in line and f" {total} " in line]
        assert len(matching) == count, (node, model, total, table)

    w.apply(cluster, ns, w.claim_template("share-10gi", "10Gi"))
    w.apply(
        cluster,
        ns,
        w.on_node(w.gpu_pod("on-h100", "share-10gi"), H100_NODE),
        w.on_node(w.gpu_pod("on-a100", "share-10gi"), A100_NODE),
    )
    w.wait_running(cluster, ns, ["on-h100", "on-a100"])
    for pod, node, profile in (("on-h100", H100_NODE, H100X2), ("on-a100", A100_NODE, A100X1)):
        claim = w.claim_of(cluster, ns, pod)
        gpu = w.recorded_gpu(claim)
        assert _allocated_node(claim) == node and gpu["node"] == node, (pod, gpu)
        assert gpu["uuid"] in _profile_gpus(profile), f"{pod} got {gpu['uuid']}, not a GPU of {node}"
        assert w.report(cluster, ns, pod).uuids() == {gpu["uuid"]}, f"{pod}'s container sees another GPU"

    def allocated() -> Counter[tuple[str, str]]:
        return Counter((g["node"], g.get("allocatedMemory", "")) for g in _ledger(cluster))

    want = Counter({(H100_NODE, "10Gi"): 1, (H100_NODE, "0"): 1, (A100_NODE, "10Gi"): 1})
    deadline = time.monotonic() + 30
    while allocated() != want and time.monotonic() < deadline:
        time.sleep(1)
    assert allocated() == want


def test_a_50gi_claim_lands_only_on_the_h100_node(two_nodes: ClusterInstallation, ns: str) -> None:
    """Two 50Gi shares: one per H100 (80Gi each), none on the idle A100 (40Gi)."""
    cluster = two_nodes.cluster
    w.apply(cluster, ns, w.claim_template("share-50gi", "50Gi"), w.gpu_pod("big-a", "share-50gi"))
    w.apply(cluster, ns, w.gpu_pod("big-b", "share-50gi"))
    w.wait_running(cluster, ns, ["big-a", "big-b"])
    gpus = {p: w.recorded_gpu(w.claim_of(cluster, ns, p)) for p in ("big-a", "big-b")}
    nodes = {p: w.get(cluster, "pod", "-n", ns, p)["spec"]["nodeName"] for p in gpus}
    assert nodes == {"big-a": H100_NODE, "big-b": H100_NODE}, nodes
    assert {g["node"] for g in gpus.values()} == {H100_NODE}
    assert gpus["big-a"]["uuid"] != gpus["big-b"]["uuid"], "two 50Gi shares cannot fit one 80Gi GPU"


def test_an_a100_selected_by_cel_asking_50gi_stays_pending_with_the_controllers_event(
    two_nodes: ClusterInstallation, ns: str
) -> None:
    cluster = two_nodes.cluster
    template = w.claim_template("a100-50gi", "50Gi")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": A100_SELECTOR}}
    ]
    w.apply(cluster, ns, template, w.gpu_pod("a100-big", "a100-50gi"))
    deadline = time.monotonic() + 90
    message, scheduled = "", dict[str, Any]()
    while time.monotonic() < deadline:
        pod = w.get(cluster, "pod", "-n", ns, "a100-big")
        scheduled = next((c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})
        statuses = pod["status"].get("resourceClaimStatuses", [])
        if statuses and scheduled.get("reason") == "Unschedulable":
            claim = statuses[0]["resourceClaimName"]
            events = w.get(cluster, "events", "-n", ns, f"--field-selector=involvedObject.name={claim}")["items"]
            found = [e["message"] for e in events if e["reason"] == "UnsatisfiableGpuRequest"]
            if found:
                (message,) = found
                break
        time.sleep(1)
    assert scheduled.get("reason") == "Unschedulable", scheduled
    class_selectors = [
        s["cel"]["expression"] for s in w.get(cluster, "deviceclass", w.DEVICE_CLASS)["spec"]["selectors"]
    ]
    assert class_selectors[0] == f'device.driver == "{w.DEVICE_CLASS}"'
    of_class = "".join(f"`{e}` (of DeviceClass {w.DEVICE_CLASS}), " for e in class_selectors)
    assert message == (
        f"no GPU of {w.DEVICE_CLASS} can ever satisfy this claim: request 'gpu' asks for 50Gi of GPU memory, "
        f"but only 1 published GPU of 3 match selectors {of_class}`{A100_SELECTOR}` (of the "
        "request), and the largest of them has 40Gi"
    ), message


class Identity:
    """Requests to the API server as one identity: a node plugin's token, or the administrator's certificate."""

    def __init__(self, cluster: MultiNodeCluster, token: str | None = None) -> None:
        self.cluster = cluster
        self.token = token
        self.context = ssl.create_default_context(cafile=str(cluster.plane.ca_cert))
        if token is None:
            pki = cluster.plane.pki_dir
            self.context.load_cert_chain(pki / "admin.crt", pki / "admin.key")

    def request(self, method: str, path: str, body: dict[str, Any], content_type: str) -> str:
        """A write in dry-run (authentication, authorization, admission and validation run, nothing is stored):
        '' when it is allowed, else the API server's answer."""
        headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        separator = "&" if "?" in path else "?"
        url = f"{self.cluster.server}{path}{separator}dryRun=All"
        req = urllib.request.Request(url, json.dumps(body).encode(), headers, method=method)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30):
                return ""
        except urllib.error.HTTPError as err:
            answer = err.read().decode(errors="replace")
            try:
                return f"{err.code} {json.loads(answer)['message']}"  # a Status
            except (ValueError, KeyError):
                return f"{err.code} {answer}"

    def apply_status(self, claim: dict[str, Any], entry: dict[str, Any]) -> str:
        """Server-side apply of one `status.devices` entry, as the node plugin marks its devices."""
        meta = claim["metadata"]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": {"devices": [entry]},
        }
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}/status"
            "?fieldManager=fracgpu-kubelet-plugin&force=true"
        )
        return self.request("PATCH", path, body, "application/apply-patch+yaml")

    def write_slice(self, method: str, body: dict[str, Any]) -> str:
        path = "/apis/resource.k8s.io/v1/resourceslices"
        if method == "PUT":
            path += f"/{body['metadata']['name']}"
        return self.request(method, path, body, "application/json")

    def whoami(self) -> dict[str, Any]:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        req = urllib.request.Request(
            f"{self.cluster.server}/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json.dumps(review).encode(),
            {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
            method="POST",
        )
        with urllib.request.urlopen(req, context=self.context, timeout=30) as answer:
            info: dict[str, Any] = json.load(answer)["status"]["userInfo"]
            return info


def plugin_identity(cluster: MultiNodeCluster, node: ClusterNode) -> Identity:
    """The node plugin of `node`: the projected service-account token of its DaemonSet pod, read on that node."""
    (pod,) = w.get(
        cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=kubelet-plugin",
        f"--field-selector=spec.nodeName={node.name}",
    )["items"]  # fmt: skip
    (volume,) = [v["name"] for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    projected = node.kubelet_dir / "pods" / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~projected"
    return Identity(cluster, node.read_file(projected / volume / "token"))


def _ready_entry(result: dict[str, Any]) -> dict[str, Any]:
    keys = {k: result[k] for k in ("driver", "pool", "device", "shareID") if k in result}
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    return keys | {"conditions": [condition]}


def test_each_plugin_is_refused_the_other_nodes_slices_and_claims_and_other_drivers_entries(
    two_nodes: ClusterInstallation, ns: str
) -> None:
    cluster = two_nodes.cluster
    plugins = {n.name: plugin_identity(cluster, n) for n in cluster.nodes}
    for node, plugin in plugins.items():
        me = plugin.whoami()
        assert me["username"] == f"system:serviceaccount:{NAMESPACE}:fracgpu-kubelet-plugin", me
        assert me["extra"]["authentication.kubernetes.io/node-name"] == [node], me

    # ResourceSlices: replacing (unchanged) or creating one of the other node is refused, one's own is not
    slices = {s["spec"]["nodeName"]: s for s in w.get(cluster, "resourceslices")["items"]}
    assert set(slices) == set(plugins), slices.keys()
    for node, plugin in plugins.items():
        (other,) = set(plugins) - {node}
        assert plugin.write_slice("PUT", slices[node]) == ""
        refused = plugin.write_slice("PUT", slices[other])
        assert refused.startswith("403 ") and (
            f"the node plugin on node '{node}' may only write ResourceSlices of its own node, not of node '{other}'"
            in refused
        ), refused
        forged = {**slices[other], "metadata": {"name": f"forged-{other}"}}
        refused = plugin.write_slice("POST", forged)
        assert refused.startswith("403 ") and "may only write ResourceSlices of its own node" in refused, refused

    # status.devices of our driver on a claim allocated on node A: node A's plugin may mark it, node B's not
    w.apply(cluster, ns, w.claim_template("share-1gi", "1Gi"), w.on_node(w.gpu_pod("on-h100", "share-1gi"), H100_NODE))
    w.wait_running(cluster, ns, ["on-h100"])
    claim = w.claim_of(cluster, ns, "on-h100")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert plugins[H100_NODE].apply_status(claim, _ready_entry(result)) == ""
    refused = plugins[A100_NODE].apply_status(claim, _ready_entry(result))
    assert 'requires resource="resourceclaims/driver", verb="[arbitrary-node:patch]"' in refused, refused

    # another driver's entry on a claim of node A (allocated by hand: no such driver runs): the administrator may
    # write it, so what refuses node A's plugin is its authorization, not the entry
    other_claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "other-driver", "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "other", "exactly": {"deviceClassName": OTHER_DRIVER}}]}},
    }
    w.apply(cluster, ns, other_claim)
    other_result = {"request": "other", "driver": OTHER_DRIVER, "pool": H100_NODE, "device": "dev-0"}
    on_a = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [H100_NODE]}]}]
    allocation = {"devices": {"results": [other_result]}, "nodeSelector": {"nodeSelectorTerms": on_a}}
    cluster.kubectl(
        "patch", "resourceclaim", "-n", ns, "other-driver", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"allocation": allocation}}),
    )  # fmt: skip
    assert Identity(cluster).apply_status(other_claim, _ready_entry(other_result)) == ""
    refused = plugins[H100_NODE].apply_status(other_claim, _ready_entry(other_result))
    assert (
        'requires resource="resourceclaims/driver", verb="[associated-node:patch arbitrary-node:patch]"' in refused
    ), refused
    assert f'"{OTHER_DRIVER}" is forbidden' in refused, refused


# ----- node lifecycle (the node deletion test must stay last: the deleted node does not come back) -------------


def _until(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """`check()` once it is truthy, polled every second up to `timeout` s; else fail saying `what`."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(1)
    return found


def _of_node(cluster: MultiNodeCluster, kind: str, node: str, field: str) -> dict[str, dict[str, Any]]:
    """Objects of `kind` whose `field` (spec.nodeName, spec.node) is `node`, by name."""
    section, key = field.split(".")
    return {o["metadata"]["name"]: o for o in w.get(cluster, kind)["items"] if o[section].get(key) == node}


def _reporting(gpu: dict[str, Any]) -> dict[str, Any]:
    conditions = gpu.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PluginReporting"), {})


def _plugin_pods(cluster: MultiNodeCluster, node: str) -> list[dict[str, Any]]:
    selector = ("-l", "app.kubernetes.io/component=kubelet-plugin", f"--field-selector=spec.nodeName={node}")
    pods: list[dict[str, Any]] = w.get(cluster, "pods", "-n", NAMESPACE, *selector)["items"]
    return pods


def test_a_silent_plugin_keeps_its_slices_and_its_gpus_say_not_reporting_until_it_is_back(
    two_nodes: ClusterInstallation,
) -> None:
    cluster = two_nodes.cluster

    def statuses() -> dict[str, str]:
        return {
            n: _reporting(g).get("status", "") for n, g in _of_node(cluster, "gpus", A100_NODE, "spec.node").items()
        }

    def h100_reporting() -> bool:
        return all(
            _reporting(g).get("status") == "True" for g in _of_node(cluster, "gpus", H100_NODE, "spec.node").values()
        )

    _until(lambda: statuses() and set(statuses().values()) == {"True"} and h100_reporting(), 60, "every GPU reporting")
    slices = {
        n: s["metadata"]["uid"] for n, s in _of_node(cluster, "resourceslices", A100_NODE, "spec.nodeName").items()
    }
    assert slices
    # the plugin's node agent goes away: the DaemonSet deletes its pod from a node it no longer selects
    cluster.kubectl("label", "node", A100_NODE, "nvidia.com/gpu.present-")
    try:
        silent = _until(lambda: s if set((s := statuses()).values()) == {"False"} else None, 60, "A100 not reporting")
        (gpu, *_) = _of_node(cluster, "gpus", A100_NODE, "spec.node").values()
        message = _reporting(gpu)["message"]
        assert f"has not renewed its heartbeat Lease {NAMESPACE}/fracgpu-plugin-{A100_NODE}" in message, message
        assert h100_reporting(), "the other node's plugin still reports"
        _until(lambda: not _plugin_pods(cluster, A100_NODE), 90, "the A100 plugin pod gone")
        kept = {
            n: s["metadata"]["uid"] for n, s in _of_node(cluster, "resourceslices", A100_NODE, "spec.nodeName").items()
        }
        assert kept == slices, "a plugin that stops must leave its node's ResourceSlices published"
        assert set(statuses()) == set(silent), "its GPU objects stay"
    finally:
        cluster.kubectl("label", "node", A100_NODE, "nvidia.com/gpu.present=true", "--overwrite")
    _until(lambda: set(statuses().values()) == {"True"}, 120, "the A100 GPUs reporting again")
    kept = {n: s["metadata"]["uid"] for n, s in _of_node(cluster, "resourceslices", A100_NODE, "spec.nodeName").items()}
    assert kept == slices


def test_a_drained_node_frees_its_claims_as_its_pods_go_and_keeps_its_slices_and_gpus(
    two_nodes: ClusterInstallation, ns: str
) -> None:
    cluster = two_nodes.cluster
    w.apply(cluster, ns, w.claim_template("share-5gi", "5Gi"), w.on_node(w.gpu_pod("drained", "share-5gi"), A100_NODE))
    w.wait_running(cluster, ns, ["drained"])
    claim = w.claim_of(cluster, ns, "drained")["metadata"]["name"]

    def a100_gpus() -> dict[str, dict[str, Any]]:
        return _of_node(cluster, "gpus", A100_NODE, "spec.node")

    _until(
        lambda: {g["status"].get("allocatedMemory") for g in a100_gpus().values()} == {"5Gi"}, 30, "5Gi in the ledger"
    )
    gpus = {n: g["metadata"]["uid"] for n, g in a100_gpus().items()}
    slices = {
        n: s["metadata"]["uid"] for n, s in _of_node(cluster, "resourceslices", A100_NODE, "spec.nodeName").items()
    }
    try:
        cluster.kubectl(
            "drain", A100_NODE, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=120s"
        )
        _until(
            lambda: cluster.kubectl("get", "resourceclaim", "-n", ns, claim, check=False).returncode != 0,
            60,
            "the drained pod's claim deleted",
        )
        _until(
            lambda: (
                {(g["status"].get("allocatedMemory"), g["status"].get("shares")) for g in a100_gpus().values()}
                == {("0", 0)}
            ),
            30,
            "the claim's share gone from the ledger",
        )
        assert {n: g["metadata"]["uid"] for n, g in a100_gpus().items()} == gpus, "a drained node keeps its GPUs"
        kept = _of_node(cluster, "resourceslices", A100_NODE, "spec.nodeName")
        assert {n: s["metadata"]["uid"] for n, s in kept.items()} == slices, "and its slices"
        assert w.get(cluster, "node", A100_NODE)["spec"].get("unschedulable") is True
    finally:
        cluster.kubectl("uncordon", A100_NODE)


def test_a_deleted_node_takes_its_slices_and_gpus_and_its_claims_are_told_nothing_else_is_touched(
    two_nodes: ClusterInstallation, ns: str
) -> None:
    cluster = two_nodes.cluster
    w.apply(
        cluster,
        ns,
        w.claim_template("share-2gi", "2Gi"),
        w.on_node(w.gpu_pod("stays", "share-2gi"), H100_NODE),
        w.on_node(w.gpu_pod("goes", "share-2gi"), A100_NODE),
    )
    w.wait_running(cluster, ns, ["stays", "goes"])

    def settled(pod: str) -> dict[str, Any] | None:
        claim = w.claim_of(cluster, ns, pod)
        entries = claim["status"].get("devices") or []
        ready = entries and all(
            "data" in e and any(c["type"] == "Ready" for c in e.get("conditions", [])) for e in entries
        )
        return claim if ready else None

    stays = _until(lambda: settled("stays"), 30, "the H100 claim's status complete")
    goes = _until(lambda: settled("goes"), 30, "the A100 claim's status complete")
    node_uid = w.get(cluster, "node", A100_NODE)["metadata"]["uid"]
    owner = [{"apiVersion": "v1", "kind": "Node", "name": A100_NODE, "uid": node_uid}]
    for kind, field in (("resourceslices", "spec.nodeName"), ("gpus", "spec.node")):
        objects = _of_node(cluster, kind, A100_NODE, field)
        assert objects and all(
            [{k: r[k] for k in ("apiVersion", "kind", "name", "uid")} for r in o["metadata"].get("ownerReferences", [])]
            == owner
            for o in objects.values()
        ), (kind, objects)

    def untouched() -> dict[str, str]:
        """The resource versions of everything of the H100 node: its slices, GPU objects and claim."""
        out = {
            f"slice {n}": s["metadata"]["resourceVersion"]
            for n, s in _of_node(cluster, "resourceslices", H100_NODE, "spec.nodeName").items()
        }
        out |= {
            f"gpu {n}": g["metadata"]["resourceVersion"]
            for n, g in _of_node(cluster, "gpus", H100_NODE, "spec.node").items()
        }
        claim = w.get(cluster, "resourceclaim", "-n", ns, stays["metadata"]["name"])
        return out | {"claim": claim["metadata"]["resourceVersion"]}

    before = untouched()
    cluster.kubectl("delete", "node", A100_NODE, "--wait=false")
    _until(lambda: not _of_node(cluster, "resourceslices", A100_NODE, "spec.nodeName"), 60, "the A100 slices gone")
    _until(lambda: not _of_node(cluster, "gpus", A100_NODE, "spec.node"), 60, "the A100 GPU objects gone")

    def told() -> list[dict[str, Any]] | None:
        claim = w.get(cluster, "resourceclaim", "-n", ns, goes["metadata"]["name"])
        gone = [
            c
            for e in claim["status"].get("devices") or []
            for c in e.get("conditions", [])
            if c["type"] == "AllocatedDeviceGone"
        ]
        return gone if gone and len(gone) == len(claim["status"]["devices"]) else None

    (condition,) = _until(told, 30, "AllocatedDeviceGone on the A100 claim")
    assert (condition["status"], condition["reason"]) == ("True", "NodeDeleted"), condition
    assert f"node {A100_NODE} was deleted" in condition["message"], condition
    name = goes["metadata"]["name"]

    def event() -> list[str]:
        events = w.get(cluster, "events", "-n", ns, f"--field-selector=involvedObject.name={name}")["items"]
        return [e["message"] for e in events if e["reason"] == "AllocatedDeviceGone"]

    (message,) = _until(event, 30, "the AllocatedDeviceGone Event")
    assert message.startswith(f"node {A100_NODE} was deleted: the {w.DEVICE_CLASS} devices allocated"), message
    assert untouched() == before, "the other node's slices, GPU objects and claim must not change"
    assert "AllocatedDeviceGone" not in json.dumps(w.get(cluster, "resourceclaim", "-n", ns, stays["metadata"]["name"]))
