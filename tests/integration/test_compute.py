"""GPU compute as consumable capacity against the real control plane (issue 39): the node plugin (a process, one
simulated A100 40GB, HAMi-core enforcement) publishes `compute` 100 beside `memory`; the real kube-scheduler places
two pods of `compute: 50` on the GPU and leaves a third Pending while memory-only pods still land beside them, and
the controller tells the third pod that compute is what is short (`GpuRoomWaiting`, an Event on the pod); the plugin, spoken to as the kubelet would, gives each of the two a 50 % ceiling (CUDA_DEVICE_SM_LIMIT, HAMi-core's SM
limit) and reports it in the claim's ComputeEnforcement condition, and a memory-only share gets none, as before.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import COMPUTE_CONDITION, GPU_CRD_NAME
from api.names import COMPUTE_CAPACITY
from controller.core.rbac import cluster_role_rules
from harness import kube, mocknvml
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KubeletClient
from harness.nodeplugin import DRIVER, NodePluginProcess
from kubelet_plugin.state import cdi

pytestmark = pytest.mark.integration
PROFILE = mocknvml.PROFILES / "a100-40gb-x1.profile"


@dataclass
class ComputeNode:
    process: NodePluginProcess
    kubelet: KubeletClient
    node: str


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient) -> Iterator[ComputeNode]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated GPUs' device nodes are made with mknod")
    name = kube.unique("computenode")
    kube.create_fake_node(api_client, name)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgcompute-", dir="/tmp"))
    library = workdir / "hami" / "libvgpu.so"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF")  # the plugin mounts it; nothing here loads it
    nvml = mocknvml.build(workdir / "nvml")
    process = NodePluginProcess(
        workdir, name, control_plane.kubeconfig, PROFILE, nvml, "--enforcement=hami-core",
        f"--hami-core-library={library}", f"--hami-core-lock-dir={workdir / 'vgpulock'}",
    )  # fmt: skip
    found = ComputeNode(process, process.start(), name)
    selector = f"spec.nodeName={name},spec.driver={DRIVER}"
    resource = client.ResourceV1Api(api_client)
    kube.wait_for(lambda: resource.list_resource_slice(field_selector=selector).items, 30, what="the plugin's slice")
    try:
        yield found
    finally:
        found.kubelet.close()
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        # the control plane is the session's: leave no hami-core A100 published for the modules after this one
        resource.delete_collection_resource_slice(field_selector=selector)
        client.CoreV1Api(api_client).delete_node(name)


@pytest.fixture
def controller(
    control_plane: ControlPlane, api_client: client.ApiClient, tmp_path: Path
) -> Iterator[kube.ControllerProcess]:
    """The controller process with its RBAC only (no admission: this is about its ledger and Events)."""
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kubeconfig = kube.service_account_kubeconfig(
        api_client, server=control_plane.server, ca_cert=control_plane.ca_cert, namespace="fracgpu-system",
        name="fracgpu-controller-compute-it", rules=cluster_role_rules(), path=tmp_path / "controller.kubeconfig",
    )  # fmt: skip
    proc = kube.ControllerProcess(tmp_path, kubeconfig, "--no-admission", "--ledger-delay=0.2")
    proc.start()
    try:
        yield proc
    finally:
        proc.terminate()


def _template(name: str, capacity: dict[str, str]) -> dict[str, Any]:
    body = kube.claim_template(name, DRIVER, None)
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": capacity}
    return body


def _spec_env(process: NodePluginProcess, claim: dict[str, Any]) -> dict[str, str]:
    spec = json.loads(cdi.spec_path(process.cdi_dir, DRIVER, claim["metadata"]["uid"]).read_text())
    (device,) = spec["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


def test_three_pods_of_compute_50_two_land_on_the_gpu_each_capped_at_50_and_memory_only_pods_still_land(
    node: ComputeNode,
    controller: kube.ControllerProcess,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    slices = client.ResourceV1Api(api_client).list_resource_slice(field_selector=f"spec.nodeName={node.node}").items
    (device,) = [d for s in slices for d in s.spec.devices]
    assert device.capacity[COMPUTE_CAPACITY].value == "100"
    core = client.CoreV1Api(api_client)
    templates = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
    claims_api = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")
    pods = {p: kube.unique(p) for p in ("half-a", "half-b", "half-c", "memory-only")}
    for role, pod in pods.items():
        capacity = {"memory": "4Gi"} if role == "memory-only" else {"memory": "4Gi", COMPUTE_CAPACITY: "50"}
        templates.create(namespace=namespace, body=_template(pod, capacity))
    for role in ("half-a", "half-b", "half-c", "memory-only"):  # one after the other: each the scheduler's choice
        core.create_namespaced_pod(namespace, kube.pod_with_claim(pods[role], pods[role], node.node))

    def claims() -> dict[str, dict[str, Any]]:
        items = claims_api.get(namespace=namespace).to_dict()["items"]
        return {
            c["metadata"]["ownerReferences"][0]["name"]: c for c in items if (c.get("status") or {}).get("allocation")
        }

    def three() -> dict[str, dict[str, Any]] | None:
        found = claims()
        return found if len(found) >= 3 else None

    allocated = kube.wait_for(three, 60, what="three allocations")
    halves = sorted(p for p in allocated if p != pods["memory-only"])
    assert pods["memory-only"] in allocated, "a memory-only share reserves no compute and lands beside them"
    assert len(halves) == 2, f"two of the three compute-50 pods, not {halves}"
    (waiting,) = {pods["half-a"], pods["half-b"], pods["half-c"]} - set(halves)

    def unschedulable() -> str | None:
        conditions = core.read_namespaced_pod(waiting, namespace).status.conditions or []
        return next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

    assert "cannot allocate all claims" in kube.wait_for(unschedulable, 60, what="the third pod's reason")

    def told() -> list[str]:
        selector = f"involvedObject.kind=Pod,involvedObject.name={waiting},reason=GpuRoomWaiting"
        return [e.message for e in core.list_namespaced_event(namespace, field_selector=selector).items]

    try:
        (message,) = kube.wait_for(told, 60, what="GpuRoomWaiting on the third pod")
    except AssertionError as err:
        raise AssertionError(f"{err}\n--- controller log:\n{controller.log_tail()}") from None
    assert message.startswith("claim 'gpu' (ResourceClaim "), message
    assert "asks for 4Gi of memory and compute 50 (percent of a GPU)" in message, message
    assert f"the most free compute 0, on gpu-0 of node {node.node}; compute is short" in message, message
    assert waiting not in claims(), "the third stays unallocated"
    for pod in halves:
        (result,) = allocated[pod]["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"][COMPUTE_CAPACITY] == "50"
    (memory_result,) = allocated[pods["memory-only"]]["status"]["allocation"]["devices"]["results"]
    assert memory_result["consumedCapacity"][COMPUTE_CAPACITY] == "0"

    prepared = [allocated[p] for p in (*halves, pods["memory-only"])]
    refs = [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in prepared]
    response = node.kubelet.prepare(refs)
    assert all(r.error == "" for r in response.claims.values()), response
    for claim in prepared[:2]:
        assert _spec_env(node.process, claim)["CUDA_DEVICE_SM_LIMIT"] == "50"
    assert "CUDA_DEVICE_SM_LIMIT" not in _spec_env(node.process, prepared[2]), "memory-only: no ceiling, as before"

    def conditions(claim: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
        body = claims_api.get(namespace=namespace, name=claim["metadata"]["name"]).to_dict()
        entries = (body.get("status") or {}).get("devices") or []
        found = {c["type"]: c for e in entries for c in e.get("conditions") or []}
        return found if "Ready" in found else None

    for claim in prepared[:2]:
        compute = kube.wait_for(partial(conditions, claim), 30, what="the claim's conditions")[COMPUTE_CONDITION]
        assert (compute["status"], compute["reason"]) == ("True", "HamiCore")
        assert "ceiling 50 %" in compute["message"], compute["message"]
    assert COMPUTE_CONDITION not in kube.wait_for(lambda: conditions(prepared[2]), 30, what="memory-only conditions")
    node.kubelet.unprepare(refs)
