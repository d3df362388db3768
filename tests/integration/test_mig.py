"""MIG against the real control plane: the node plugin (a process, simulated H100s: GPU 0 whole, GPU 1 a MIG GPU
with MIG mode on, GPU 2 one with it off) publishes partitions consuming shared counters, the real kube-scheduler
picks the smallest partition that holds a memory request, and the plugin, spoken to as the kubelet would, makes
and destroys the partitions (the mock driver's MIG state, harness/mocknvml/mock_mig.h) even when killed mid-call.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api import mig
from api.crds import CRD_DIR
from api.gpu import GPU_CRD_NAME
from api.names import MIG_DEVICE_CLASS_NAME
from controller.core.rbac import cluster_role_rules
from harness import kube, mocknvml
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KubeletClient
from harness.nodeplugin import DRIVER, NodePluginProcess
from kubelet_plugin.state import cdi
from kubelet_plugin.state import claim_files as store

pytestmark = pytest.mark.integration
PROFILE = mocknvml.PROFILES / "h100-mig-x3.profile"
GPU1 = mocknvml.read_profile(PROFILE)["gpu.1.uuid"]
MIG_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": MIG_DEVICE_CLASS_NAME},
    "spec": {"selectors": [  # as the chart's (charts/fracgpu/templates/deviceclass.yaml)
        {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
        {"cel": {"expression": f'"type" in device.attributes["{DRIVER}"] && device.attributes["{DRIVER}"].type == "mig"'}},
    ]},
}  # fmt: skip


@dataclass
class MigNode:
    process: NodePluginProcess
    kubelet: KubeletClient
    node: str
    state: Path

    def restart(self, kill: bool = False) -> None:
        self.kubelet.close()
        if kill:
            self.process.kill()
        else:
            self.process.stop()
        self.kubelet = self.process.start()

    def slices(self, api_client: client.ApiClient) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={self.node},spec.driver={DRIVER}"
        items = client.ResourceV1Api(api_client).list_resource_slice(field_selector=selector).items
        return [api_client.sanitize_for_serialization(s) for s in items]

    def instances(self) -> set[tuple[int, int]]:
        """(GPU instance id, placement start) of every GPU instance on GPU 1, as the (mock) driver holds them."""
        path = self.state / f"mig.{GPU1}"
        lines = path.read_text().splitlines() if path.exists() else []
        return {(int(f[1]), int(f[3])) for f in (line.split() for line in lines) if f[0] == "gi"}

    def recorded(self) -> set[tuple[int, int]]:
        """The partitions the plugin's checkpoint owns: (GPU instance id, placement start)."""
        checkpoint = json.loads(self.process.checkpoint.read_text())
        return {
            (d["mig"]["gpuInstance"], d["mig"]["placementStart"])
            for e in checkpoint["claims"].values()
            for d in e["devices"]
            if d.get("mig")
        }


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient) -> Iterator[MigNode]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated GPUs' device nodes are made with mknod")
    name = kube.unique("mignode")
    kube.create_fake_node(api_client, name)
    classes = kube.resource(dyn, "resource.k8s.io/v1", "DeviceClass")
    created = False
    with contextlib.suppress(ApiException):
        classes.create(body=MIG_CLASS)
        created = True
    workdir = Path(tempfile.mkdtemp(prefix="fgmig-", dir="/tmp"))
    state = workdir / "driver-state"
    state.mkdir()
    nvml = mocknvml.build(workdir / "nvml")
    process = NodePluginProcess(
        workdir, name, control_plane.kubeconfig, PROFILE, nvml, "--mig-gpus=1,2",
        f"--mig-minors-file={workdir / 'driver-root' / mocknvml.MIG_MINORS}",
        env={"FRACGPU_MOCK_NVML_STATE_DIR": str(state)},
    )  # fmt: skip
    found = MigNode(process, process.start(), name, state)
    kube.wait_for(lambda: found.slices(api_client), 30, what="ResourceSlices of the plugin")
    try:
        yield found
    finally:
        found.kubelet.close()
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        if created:  # the chart's own install (test_chart.py) must not find it in the shared control plane
            with contextlib.suppress(ApiException):
                classes.delete(name=MIG_DEVICE_CLASS_NAME)


def _refs(claims: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]


def _device(claim: dict[str, Any]) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def _release(api_client: client.ApiClient, dyn: DynamicClient, namespace: str) -> None:
    """Delete the namespace's pods and wait until their claims are gone (the scheduler frees the partitions)."""
    client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")
    kube.wait_for(lambda: not claims.get(namespace=namespace).to_dict()["items"] or None, 60, what="claims deleted")


def test_mig_gpus_publish_their_partitions_and_never_themselves(node: MigNode, api_client: client.ApiClient) -> None:
    slices = node.slices(api_client)
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    types = {n: d["attributes"]["type"]["string"] for n, d in devices.items()}
    assert types["gpu-0"] == "gpu" and types["gpu-1"] == types["gpu-2"] == "mig-parent"
    assert [n for n, t in types.items() if t == "gpu"] == ["gpu-0"], "a MIG GPU is never offered whole"
    assert any(t["key"] == mig.PARENT_TAINT_KEY for t in devices["gpu-1"]["taints"])
    assert devices["gpu-2"]["attributes"]["migState"]["string"] == "disabled"
    partitions = [n for n, t in types.items() if t == "mig"]
    assert len(partitions) == 7 + 4 + 3 + 2 + 1 + 1 and all(n.startswith("gpu-1-mig-") for n in partitions)
    (counters,) = [s for s in slices if s["spec"].get("sharedCounters")]
    assert [cs["name"] for cs in counters["spec"]["sharedCounters"]] == ["gpu-1"]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    core = client.CoreV1Api(api_client)
    events = kube.wait_for(
        lambda: (
            core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={node.node},reason=MigUnavailable"
            ).items
        ),
        30,
        what="MigUnavailable event",
    )
    assert "GPU 2" in events[0].message and "nvidia-smi -i 2 -mig 1" in events[0].message


def test_the_scheduler_takes_the_smallest_partition_that_holds_the_request(
    node: MigNode, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    # one after the other, so that each is the scheduler's choice among what is free then
    got = [
        _device(kube.allocate_claims(api_client, dyn, namespace, node.node, device_class=MIG_DEVICE_CLASS_NAME,
                                     memories=[memory])[0])
        for memory in ("9984Mi", "10Gi", "30Gi")
    ]  # fmt: skip
    assert got == [mig.partition_device_name(1, "1g.10gb", 6), mig.partition_device_name(1, "1g.20gb", 4),
                   mig.partition_device_name(1, "3g.40gb", 0)], "the smallest, filling the GPU from the top"  # fmt: skip
    # 10Gi did not fit the 1g.10gb's 9984 MiB (a grant is never below its request) and got a 1g.20gb, not the
    # 2g.20gb of the same memory (fewer compute slices); what is left (memory slice 7, two compute slices) holds
    # no partition: a 5Gi request stays Pending with the scheduler's reason
    pending = kube.unique("pending")
    templates = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
    templates.create(namespace=namespace, body=kube.claim_template(pending, MIG_DEVICE_CLASS_NAME, "5Gi"))
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, kube.pod_with_claim(pending, pending, node.node))

    def unschedulable() -> str | None:
        conditions = core.read_namespaced_pod(pending, namespace).status.conditions or []
        return next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

    assert "cannot allocate all claims" in kube.wait_for(unschedulable, 60, what="the scheduler's reason")
    _release(api_client, dyn, namespace)
    # by name, as NVIDIA's users write it: `profile == "4g.40gb"`, no memory asked
    templates = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
    body = kube.claim_template("byname", MIG_DEVICE_CLASS_NAME, None)
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "4g.40gb"'}}
    ]
    templates.create(namespace=namespace, body=body)
    client.CoreV1Api(api_client).create_namespaced_pod(namespace, kube.pod_with_claim("byname", "byname", node.node))
    claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")
    allocated = kube.wait_for(
        lambda: [
            c for c in claims.get(namespace=namespace).to_dict()["items"] if (c.get("status") or {}).get("allocation")
        ],
        60,
        what="the claim by name",
    )
    assert _device(allocated[0]) == mig.partition_device_name(1, "4g.40gb", 0)
    _release(api_client, dyn, namespace)


def test_a_compute_request_on_the_mig_class_selects_a_partition_with_at_least_that_share(
    node: MigNode, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """A partition publishes `compute` (its compute slices' share of its GPU, in percent) but is allocated whole: the
    scheduler reads a request's `compute` as a floor, as it reads `memory` there, and the smallest partition that
    has it is the first fit (1g: 14, 2g: 28, 3g: 42 of an H100's 7 slices)."""
    body = kube.claim_template("compute30", MIG_DEVICE_CLASS_NAME, None)
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"compute": "30"}}
    kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate").create(namespace=namespace, body=body)
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, kube.pod_with_claim("compute30", "compute30", node.node))
    claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")
    allocated = kube.wait_for(
        lambda: [
            c for c in claims.get(namespace=namespace).to_dict()["items"] if (c.get("status") or {}).get("allocation")
        ],
        60,
        what="the compute claim",
    )
    assert _device(allocated[0]) == mig.partition_device_name(1, "3g.40gb", 4)
    (result,) = allocated[0]["status"]["allocation"]["devices"]["results"]
    assert not result.get("consumedCapacity"), "a partition is allocated whole: nothing is consumed of it"
    _release(api_client, dyn, namespace)


def test_prepare_makes_the_partition_and_unprepare_destroys_it(
    node: MigNode, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    claims = kube.allocate_claims(api_client, dyn, namespace, node.node, device_class=MIG_DEVICE_CLASS_NAME,
                                  memories=["10Gi", "30Gi"])  # fmt: skip
    response = node.kubelet.prepare(_refs(claims))
    assert all(r.error == "" for r in response.claims.values()), response
    assert node.instances() == node.recorded() and len(node.instances()) == 2
    spec = json.loads(cdi.spec_path(node.process.cdi_dir, DRIVER, claims[0]["metadata"]["uid"]).read_text())
    paths = sorted(n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"])
    assert "/dev/nvidia1" in paths and "/dev/nvidia0" not in paths
    assert len([p for p in paths if p.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2
    node.kubelet.unprepare(_refs(claims))
    assert node.instances() == set(), "unprepare destroys both instances"
    _release(api_client, dyn, namespace)


KILL_CYCLES = 12


def test_kill_9_during_prepare_or_unprepare_leaves_no_orphan_partition(
    node: MigNode, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """SIGKILL at a random moment inside NodePrepareResources / NodeUnprepareResources of partition claims, many
    times: after each restart the partitions the driver holds are exactly those the checkpoint records, and the
    checkpoint and the specs describe the same claims."""
    claims = kube.allocate_claims(api_client, dyn, namespace, node.node, device_class=MIG_DEVICE_CLASS_NAME,
                                  memories=["10Gi", "10Gi", "15Gi", "15Gi"])  # fmt: skip
    start = time.perf_counter()
    node.kubelet.prepare(_refs(claims))
    took = time.perf_counter() - start
    node.kubelet.unprepare(_refs(claims))
    rng = random.Random(28)
    bad: list[str] = []
    interrupted = 0
    for cycle in range(KILL_CYCLES):
        op = ("prepare", "unprepare")[cycle % 2]
        if op == "unprepare":
            node.kubelet.prepare(_refs(claims))
        batch = rng.sample(claims, rng.randint(2, len(claims)))
        failed: list[Exception] = []

        def call(batch: list[dict[str, Any]] = batch, op: str = op, failed: list[Exception] = failed) -> None:
            try:
                getattr(node.kubelet, op)(_refs(batch))
            except Exception as err:  # killed mid-call: the kubelet sees an error and retries
                failed.append(err)

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(rng.uniform(0.0, 1.5 * took))
        node.restart(kill=True)  # the new process runs recover() before it registers
        caller.join()
        interrupted += bool(failed)
        checkpoint = json.loads(node.process.checkpoint.read_text())
        specs = store.list_spec_claim_uids(node.process.cdi_dir, DRIVER)
        if node.instances() != node.recorded():
            bad.append(f"cycle {cycle} ({op}): driver holds {node.instances()}, checkpoint records {node.recorded()}")
        if specs != set(checkpoint["claims"]):
            bad.append(f"cycle {cycle} ({op}): specs {sorted(specs)} != claims {sorted(checkpoint['claims'])}")
        retry = getattr(node.kubelet, op)(_refs(batch))  # the kubelet's retry completes the call
        bad += [f"cycle {cycle} retry of {op}: {r.error}" for r in retry.claims.values() if r.error]
    assert interrupted > 0, "no kill landed inside a call"
    assert bad == [], "\n".join(bad)
    node.kubelet.unprepare(_refs(claims))
    assert node.instances() == set() == node.recorded()
    _release(api_client, dyn, namespace)


@pytest.fixture
def controller(
    control_plane: ControlPlane, api_client: client.ApiClient, tmp_path: Path
) -> Iterator[kube.ControllerProcess]:
    """The controller process with its RBAC only (no admission: this is about its Events)."""
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kubeconfig = kube.service_account_kubeconfig(
        api_client, server=control_plane.server, ca_cert=control_plane.ca_cert, namespace="fracgpu-system",
        name="fracgpu-controller-mig-it", rules=cluster_role_rules(), path=tmp_path / "controller.kubeconfig",
    )  # fmt: skip
    proc = kube.ControllerProcess(tmp_path, kubeconfig, "--no-admission", "--ledger-delay=0.2")
    proc.start()
    try:
        yield proc
    finally:
        proc.terminate()


def _mig_pod(
    api_client: client.ApiClient, dyn: DynamicClient, namespace: str, node: str, memory: str, *, at: int | None = None
) -> str:
    """A pod on `node` with its own claim of the MIG class for `memory`; with `at`, its selector takes only the
    1g.10gb partition at that placement."""
    name = kube.unique("pod")
    body = kube.claim_template(name, MIG_DEVICE_CLASS_NAME, memory)
    if at is not None:
        attrs = f'device.attributes["{DRIVER}"]'
        expression = f'{attrs}.{mig.PROFILE_ATTRIBUTE} == "1g.10gb" && {attrs}.{mig.PLACEMENT_ATTRIBUTE} == {at}'
        body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate").create(namespace=namespace, body=body)
    client.CoreV1Api(api_client).create_namespaced_pod(namespace, kube.pod_with_claim(name, name, node))
    return name


def _claim_of(dyn: DynamicClient, namespace: str, pod: str) -> dict[str, Any] | None:
    for claim in kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim").get(namespace=namespace).to_dict()["items"]:
        if (claim["metadata"].get("ownerReferences") or [{}])[0].get("name") == pod:
            return dict(claim)
    return None


def test_a_mig_request_held_up_by_fragmented_placements_is_told_why_and_lands_when_one_frees(
    node: MigNode, api_client: client.ApiClient, dyn: DynamicClient, namespace: str, controller: kube.ControllerProcess
) -> None:
    """1g.10gb partitions at 2 and 6 leave 6 of the 8 memory slices and 5 of the 7 compute slices free, enough by
    count for a 3g.40gb or 4g.40gb, but each of their placements (0 and 4) overlaps one of them: a 25Gi pod stays
    Pending, the scheduler says only that it cannot allocate the claim, and the controller posts
    `MigPlacementsFragmented` on its claim; deleting the pod holding the partition at 2 frees 3g.40gb at 0 and the
    pod is bound there."""
    core = client.CoreV1Api(api_client)

    def wait(probe: Any, timeout: float, what: str) -> Any:
        try:
            return kube.wait_for(probe, timeout, what=what)
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- controller log:\n{controller.log_tail()}") from None

    def allocated(pod: str) -> dict[str, Any] | None:
        claim = _claim_of(dyn, namespace, pod)
        return claim if claim and (claim.get("status") or {}).get("allocation") else None

    # the first 9984Mi request, unselected, takes the highest 1g.10gb placement (smallest-first publication, a GPU
    # filled from the top); the second one's selector takes the 1g.10gb at 2
    start = time.monotonic()
    at6 = _mig_pod(api_client, dyn, namespace, node.node, "9984Mi")
    claim6 = wait(lambda: allocated(at6), 60, "the 9984Mi claim allocated")
    at2 = _mig_pod(api_client, dyn, namespace, node.node, "9984Mi", at=2)
    claim2 = wait(lambda: allocated(at2), 60, "the 9984Mi claim at placement 2 allocated")
    assert [_device(claim6), _device(claim2)] == [mig.partition_device_name(1, "1g.10gb", 6),
                                                  mig.partition_device_name(1, "1g.10gb", 2)]  # fmt: skip
    print(f"\n1g.10gb at 6 and at 2 allocated in {time.monotonic() - start:.1f} s")

    start = time.monotonic()
    wants = _mig_pod(api_client, dyn, namespace, node.node, "25Gi")
    claim = wait(lambda: _claim_of(dyn, namespace, wants), 30, "the 25Gi pod's claim")
    name = claim["metadata"]["name"]
    selector = f"involvedObject.name={name},reason=MigPlacementsFragmented"
    (event,) = wait(lambda: core.list_namespaced_event(namespace, field_selector=selector).items, 30,
                    "MigPlacementsFragmented on the 25Gi claim")  # fmt: skip
    told = time.monotonic() - start
    print(f"MigPlacementsFragmented {told:.1f} s after the 25Gi pod was created:\n  {event.message}")
    assert event.type == "Warning" and event.involved_object.kind == "ResourceClaim"
    assert "request 'gpu' asks for 25Gi of GPU memory, which a 3g.40gb or 4g.40gb partition would hold" in event.message
    assert f"GPU 1 (gpu-1) of node {node.node} memory slices 0-1, 3-5, 7 are free (6 of 8)" in event.message
    assert "5 of 7 compute slices" in event.message
    names = (claim2["metadata"]["name"], claim6["metadata"]["name"])
    assert f"1g.10gb at 2 (claim {namespace}/{names[0]}), 1g.10gb at 6 (claim {namespace}/{names[1]})" in event.message
    assert f"releasing claim {namespace}/{names[0]} would free 3g.40gb at 0" in event.message

    def unschedulable() -> str | None:
        conditions = core.read_namespaced_pod(wants, namespace).status.conditions or []
        return next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

    assert "cannot allocate all claims" in wait(unschedulable, 30, "the scheduler's reason")
    assert core.read_namespaced_pod(wants, namespace).spec.node_name is None, "Pending, not bound"
    assert not allocated(wants)

    # the pod holding the 1g.10gb at 2 goes: placement 0-3 is free, a 3g.40gb at 0 holds 25Gi
    start = time.monotonic()
    core.delete_namespaced_pod(at2, namespace, grace_period_seconds=0)
    wait(lambda: _claim_of(dyn, namespace, at2) is None or None, 60, "the claim at 2 deleted")
    freed = time.monotonic() - start
    wait(lambda: core.read_namespaced_pod(wants, namespace).spec.node_name == node.node or None, 60,
         "the 25Gi pod bound")  # fmt: skip
    bound = time.monotonic() - start
    print(f"the claim at 2 gone {freed:.1f} s after its pod was deleted, the 25Gi pod bound after {bound:.1f} s")
    landed = allocated(wants)
    assert landed is not None and _device(landed) == mig.partition_device_name(1, "3g.40gb", 0)
    assert len(core.list_namespaced_event(namespace, field_selector=selector).items) == 1, "told once"
    _release(api_client, dyn, namespace)
