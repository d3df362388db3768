"""Upgrade and rollback with live claims (issue #13 item 3), on two nodes (2x H100 80GB, 1x A100 40GB).

The previous release (e2e/upgrade/previous-release.env: tag v0.1.0, its commit pinned) is exported from git and
built by its own image build; its chart is installed, pods holding claims run on every node, and then, while
pods are created and deleted on both nodes, `helm upgrade` to this tree's chart and image and `helm rollback` to
the previous release. Afterwards: no pod restarted (restart count 0, the same container IDs), every pod created
meanwhile ran, each live claim's CDI spec, info files and checkpoint entry are byte for byte what the previous
release wrote (nothing re-prepared them), each node's CDI specs, checkpoint and info files are those of exactly
the claims allocated on it, and the ledger lists exactly the live claims. The cluster is this module's own.
"""

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e import workloads as w
from e2e.install import (
    CHART,
    NAMESPACE,
    RELEASE,
    ClusterInstallation,
    cluster_values,
    install_cluster,
    state_dir,
    tear_down,
    wait_serving,
)
from e2e.rollout import PLUGIN_SELECTOR
from e2e.upgrade import release
from harness.cluster import binaries
from harness.cluster.multinode import A100X1, H100X2, ClusterNode, MultiNodeCluster, NodeProfile
from harness.image.build import build_image

H100_NODE, A100_NODE = "fracgpu-h100", "fracgpu-a100"
DRIVER = w.DEVICE_CLASS
SPEC_PREFIX = f"k8s.{DRIVER}-claim_"
UID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
HELM_TIMEOUT_S = 180


@dataclass(frozen=True)
class Upgrade:
    """The previous release installed on two nodes, and what upgrading to this tree needs."""

    installed: ClusterInstallation
    previous: release.Release
    previous_image: str
    current_image: str
    state_dir: Path

    @property
    def cluster(self) -> MultiNodeCluster:
        return self.installed.cluster

    def helm(self, *args: str) -> None:
        argv = [str(binaries.binary("helm")), f"--kubeconfig={self.cluster.kubeconfig}", *args, "-n", NAMESPACE]
        argv += ["--wait", f"--timeout={HELM_TIMEOUT_S}s"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=HELM_TIMEOUT_S + 60, check=False)
        assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def upgrade() -> Iterator[Upgrade]:
    """The previous release built from its tag and installed by its own chart on a fresh two-node cluster; this
    tree's image built and imported on every node (not yet used)."""
    if os.geteuid() != 0:
        pytest.skip("the e2e cluster needs root: network and mount namespaces, mounts, mknod and runc")
    previous = release.find()  # fails, saying how to fetch it, when the clone lacks the release
    with state_dir("fracgpu-e2e-upgrade-") as files:
        cluster = MultiNodeCluster(files, [NodeProfile(H100_NODE, H100X2), NodeProfile(A100_NODE, A100X1)])
        installed: ClusterInstallation | None = None
        try:
            tree = release.export(previous, files / "previous-src")
            old = release.build_image(previous, tree, files / "previous-image")
            current = build_image(files / "image")
            cluster.start()
            cluster.import_image(current.archive.path)
            installed = install_cluster(
                cluster, image_out=files / "unused", chart=tree / "charts" / "fracgpu", image=(old.name, old.archive)
            )
            yield Upgrade(installed, previous, old.name, current.name, files)
        finally:
            tear_down(cluster, installed)


@pytest.fixture
def ns(upgrade: Upgrade) -> Iterator[str]:
    with w.fresh_namespace(upgrade.cluster) as name:
        yield name


def _plugin_dir(node: ClusterNode) -> Path:
    return node.host_path(node.kubelet_dir / "plugins" / DRIVER)


@dataclass(frozen=True)
class NodeFiles:
    """What one node's plugin has on disk: spec file bytes, checkpoint entries and info files, by claim UID."""

    specs: dict[str, tuple[bytes, int]]  # bytes and inode (an atomic rewrite, even of the same bytes, is a new one)
    checkpoint: dict[str, Any]
    info: dict[str, dict[str, tuple[bytes, int]]]  # claim UID -> relative path -> bytes, inode (whatever the layout)


def node_files(node: ClusterNode) -> NodeFiles:
    cdi = node.host_path(node.cdi_dir)
    specs = {
        p.name[len(SPEC_PREFIX) : -len(".json")]: (p.read_bytes(), p.stat().st_ino)
        for p in cdi.iterdir()
        if p.name.startswith(SPEC_PREFIX) and p.name.endswith(".json")
    }
    checkpoint = json.loads((_plugin_dir(node) / "checkpoint.json").read_text())
    info: dict[str, dict[str, tuple[bytes, int]]] = {}
    root = _plugin_dir(node) / "claim-info"
    for path in sorted(root.rglob("*")) if root.is_dir() else []:
        rel = str(path.relative_to(root))
        uid = UID_RE.search(rel)
        if path.is_file() and uid is not None:
            info.setdefault(uid[0], {})[rel] = (path.read_bytes(), path.stat().st_ino)
    return NodeFiles(specs, checkpoint["claims"], info)


@dataclass(frozen=True)
class LivePod:
    name: str
    node: str
    claim_uid: str
    gpu: str  # UUID recorded by the controller
    containers: dict[str, str]  # container name -> container ID


def live_pod(cluster: MultiNodeCluster, namespace: str, name: str) -> LivePod:
    pod = w.get(cluster, "pod", "-n", namespace, name)
    statuses = pod["status"]["containerStatuses"]
    restarts = {s["name"]: s["restartCount"] for s in statuses if s["restartCount"]}
    assert not restarts, f"{name} restarted: {restarts}"
    claim = w.claim_of(cluster, namespace, name)
    return LivePod(
        name,
        pod["spec"]["nodeName"],
        claim["metadata"]["uid"],
        w.recorded_gpu(claim)["uuid"],
        {s["name"]: s["containerID"] for s in statuses},
    )


@dataclass
class Churn:
    """Light load: one pod at a time, alternating nodes, created, waited for until Running, deleted."""

    cluster: MultiNodeCluster
    namespace: str
    ran: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # creation to Running (polled each second), per pod that ran
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        w.apply(self.cluster, self.namespace, w.claim_template("churn-1gi", "1Gi"))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            name, node = f"churn-{i}", (H100_NODE, A100_NODE)[i % 2]
            i += 1
            try:
                created = time.monotonic()
                w.apply(self.cluster, self.namespace, w.on_node(w.gpu_pod(name, "churn-1gi"), node))
                w.wait_running(self.cluster, self.namespace, [name], timeout=150)
                self.seconds.append(round(time.monotonic() - created, 1))
                self.ran.append(name)
            except Exception as err:  # reported by stop(); the load goes on
                self.failed.append(f"{name} on {node}: {err}")
            self.cluster.kubectl("delete", "pod", "-n", self.namespace, name, "--wait=false", check=False)
            time.sleep(1)

    def stop(self) -> None:
        """Stop creating pods; wait until every churn pod is gone (their claims unprepared and deleted)."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=200)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = w.get(self.cluster, "pods", "-n", self.namespace)["items"]
            if not [p for p in pods if p["metadata"]["name"].startswith("churn-")]:
                return
            time.sleep(1)
        raise AssertionError(f"churn pods not gone after 120 s: {[p['metadata']['name'] for p in pods]}")


def plugin_images(cluster: MultiNodeCluster) -> dict[str, str]:
    """Node -> image of its (one, Ready, not terminating) plugin pod."""
    pods = w.get(cluster, "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR)["items"]
    return {p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"] for p in pods}


def wait_plugins(cluster: MultiNodeCluster, image: str, timeout: float = 120) -> None:
    """Until every node runs exactly one plugin pod, of `image`, Ready."""
    deadline = time.monotonic() + timeout
    want = {n.name: image for n in cluster.nodes}
    while time.monotonic() < deadline:
        pods = w.get(cluster, "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR)["items"]
        ready = all(
            c["type"] != "Ready" or c["status"] == "True" for p in pods for c in p["status"].get("conditions", [])
        )
        if plugin_images(cluster) == want and len(pods) == len(want) and ready:
            return
        time.sleep(1)
    raise AssertionError(f"plugin pods are not all of {image}: {plugin_images(cluster)}")


def allocated_claims(cluster: MultiNodeCluster) -> dict[str, dict[str, str]]:
    """Node -> claim UID -> `namespace/name` of every allocated ResourceClaim in the cluster."""
    out: dict[str, dict[str, str]] = {}
    for claim in w.get(cluster, "resourceclaims", "-A")["items"]:
        allocation = claim.get("status", {}).get("allocation")
        if not allocation:
            continue
        (term,) = allocation["nodeSelector"]["nodeSelectorTerms"]
        (node,) = term["matchFields"][0]["values"]
        meta = claim["metadata"]
        out.setdefault(node, {})[meta["uid"]] = f"{meta['namespace']}/{meta['name']}"
    return out


def ledger(cluster: MultiNodeCluster) -> dict[str, set[str]]:
    """GPU UUID -> `namespace/name` of the claims the ledger lists on it (GPUs without claims left out)."""
    listed = {
        g["status"]["uuid"]: {f"{c['namespace']}/{c['name']}" for c in g["status"].get("claims", [])}
        for g in w.get(cluster, "gpus")["items"]
        if g.get("status")
    }
    return {uuid: claims for uuid, claims in listed.items() if claims}


def test_upgrade_and_rollback_keep_live_claims_under_load(upgrade: Upgrade, ns: str) -> None:
    cluster = upgrade.cluster
    started = time.monotonic()
    assert plugin_images(cluster) == {n.name: upgrade.previous_image for n in cluster.nodes}

    # pods holding claims on every node, prepared by the previous release
    w.apply(cluster, ns, w.claim_template("keep-1gi", "1Gi"))
    names = [f"keep-{node.removeprefix('fracgpu-')}-{i}" for node in (H100_NODE, A100_NODE) for i in range(2)]
    w.apply(cluster, ns, *(w.on_node(w.gpu_pod(n, "keep-1gi"), H100_NODE if "h100" in n else A100_NODE) for n in names))
    w.wait_running(cluster, ns, names)
    before = {n: live_pod(cluster, ns, n) for n in names}
    assert {p.node for p in before.values()} == {H100_NODE, A100_NODE}
    files_before = {n.name: node_files(n) for n in cluster.nodes}
    for pod in before.values():
        files = files_before[pod.node]
        assert pod.claim_uid in files.specs and pod.claim_uid in files.checkpoint and pod.claim_uid in files.info

    churn = Churn(cluster, ns)
    churn.start()
    try:
        time.sleep(3)  # a churn pod is on its way while the upgrade starts
        # Helm does not upgrade crds/: the documented upgrade applies the chart's CRDs first (docs/operations.md "Upgrading")
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
        values = upgrade.state_dir / "current-values.json"
        values.write_text(json.dumps(cluster_values(cluster, upgrade.current_image)))
        upgrade.helm("upgrade", RELEASE, str(CHART), "--values", str(values))
        wait_plugins(cluster, upgrade.current_image)
        wait_serving(cluster, 120, frozenset(n.name for n in cluster.nodes))
        upgraded_at = len(churn.ran)
        upgrade.helm("rollback", RELEASE, "1")
        wait_plugins(cluster, upgrade.previous_image)
        wait_serving(cluster, 120, frozenset(n.name for n in cluster.nodes))
        time.sleep(2)  # one more churn pod prepared by the rolled-back plugin
    finally:
        churn.stop()
    assert not churn.failed, f"pods created during the upgrade or rollback did not run: {churn.failed}"
    assert len(churn.ran) >= 2 and len(churn.ran) > upgraded_at, (churn.ran, upgraded_at)

    # no pod restarted, each kept its containers and its GPU
    after = {n: live_pod(cluster, ns, n) for n in names}
    assert after == before, "a live pod's containers, claim or GPU changed"
    for pod in after.values():
        assert w.report(cluster, ns, pod.name).uuids() == {pod.gpu}

    # nothing re-prepared the live claims: their spec, info files and checkpoint entry are as first written
    # (same bytes, and the same files: not even rewritten with the same content)
    files_after = {n.name: node_files(n) for n in cluster.nodes}
    for pod in after.values():
        old, new = files_before[pod.node], files_after[pod.node]
        assert new.specs.get(pod.claim_uid) == old.specs[pod.claim_uid], f"{pod.name}'s CDI spec changed"
        assert new.checkpoint.get(pod.claim_uid) == old.checkpoint[pod.claim_uid], f"{pod.name}'s entry changed"
        assert new.info.get(pod.claim_uid) == old.info[pod.claim_uid], f"{pod.name}'s info files changed"

    # each node's specs, checkpoint and info files are those of exactly the claims allocated on it
    allocated = allocated_claims(cluster)
    for node in cluster.nodes:
        live = set(allocated.get(node.name, {}))
        files = files_after[node.name]
        want = {p.claim_uid for p in after.values() if p.node == node.name}
        assert live == want, (node.name, allocated)
        assert set(files.specs) == live, f"{node.name}: CDI specs {sorted(files.specs)} for claims {sorted(live)}"
        assert set(files.checkpoint) == live, f"{node.name}: checkpoint {sorted(files.checkpoint)} vs {sorted(live)}"
        assert set(files.info) == live, f"{node.name}: info files {sorted(files.info)} vs {sorted(live)}"
        for uid, entry in files.checkpoint.items():
            assert entry["state"] == "PrepareCompleted" and entry["devices"], (node.name, uid, entry)

    # the ledger lists exactly the live claims, each on its GPU
    want_ledger: dict[str, set[str]] = {}
    for pod in after.values():
        want_ledger.setdefault(pod.gpu, set()).add(allocated[pod.node][pod.claim_uid])
    deadline = time.monotonic() + 30
    while (got := ledger(cluster)) != want_ledger and time.monotonic() < deadline:
        time.sleep(1)
    assert got == want_ledger
    print(
        f"upgrade test: {upgrade.previous.tag} ({upgrade.previous.commit[:7]}, found by {upgrade.previous.found_by})"
        f" -> {upgrade.current_image} -> rollback; {len(churn.ran)} pods created and deleted meanwhile (to Running:"
        f" {churn.seconds} s); "
        f"{time.monotonic() - started:.0f} s after install"
    )
