"""GPU health of the node plugin against the real API server (issue #14): the plugin as a process with simulated
GPUs whose mock NVML reads XIDs, lost GPUs and resets from a control file; the real kube-apiserver stores the
device taints (its validation of `devices[].taints`), the kubelet's health stream and the Node's Events follow.
"""

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from harness import kube, mocknvml
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KubeletClient
from harness.nodeplugin import DRIVER, NodePluginProcess

pytestmark = pytest.mark.integration
PROFILE = mocknvml.PROFILES / "gpu80x2.profile"
GPU1 = mocknvml.read_profile(PROFILE)["gpu.1.uuid"]


@dataclass
class Plugin:
    process: NodePluginProcess
    kubelet: KubeletClient
    node: str
    control: Path

    def devices(self, api_client: client.ApiClient) -> dict[str, dict[str, Any]]:
        selector = f"spec.nodeName={self.node},spec.driver={DRIVER}"
        slices = client.ResourceV1Api(api_client).list_resource_slice(field_selector=selector).items
        return {
            d["name"]: d for s in slices for d in api_client.sanitize_for_serialization(s)["spec"]["devices"]
        }  # fmt: skip

    def inject(self, line: str) -> None:
        with self.control.open("a") as f:
            f.write(f"{line}\n")


@pytest.fixture(scope="module")
def plugin(control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient) -> Iterator[Plugin]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated GPUs' device nodes are made with mknod")
    node = kube.unique("healthnode")
    kube.create_fake_node(api_client, node)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgnh-", dir="/tmp"))  # short: unix socket paths ≤ 107 bytes
    nvml = mocknvml.build(workdir / "nvml")
    control = workdir / "events"
    control.write_text("")
    process = NodePluginProcess(
        workdir, node, control_plane.kubeconfig, PROFILE, nvml,
        "--health-probe-interval=0.5", "--health-coalesce=0.5", "--health-interval=0.5",
        env={"FRACGPU_MOCK_NVML_EVENTS": str(control)},
    )  # fmt: skip
    plugin = Plugin(process, process.start(), node, control)
    kube.wait_for(lambda: plugin.devices(api_client), 30, what="ResourceSlices of the plugin")
    try:
        yield plugin
    finally:
        plugin.kubelet.close()
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _node_events(api_client: client.ApiClient, node: str, reason: str) -> list[str]:
    events = client.CoreV1Api(api_client).list_namespaced_event("default").items
    return [e.message for e in events if e.involved_object.name == node and e.reason == reason]


def test_a_fatal_xid_is_a_taint_an_unhealthy_device_and_an_event_until_the_reset(
    plugin: Plugin, api_client: client.ApiClient
) -> None:
    assert "taints" not in plugin.devices(api_client)["gpu-1"]
    assert plugin.kubelet.health() == {"gpu-0": True, "gpu-1": True}

    plugin.inject(f"{GPU1} xid 95 drain_and_reset")  # uncontained ECC error; the driver asks to drain and reset
    taints = kube.wait_for(lambda: plugin.devices(api_client)["gpu-1"].get("taints"), 30, what="gpu-1 tainted")
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
        ("gpu.fracgpu.dev/xid", "95-uncontained-ecc-error", "NoExecute"),
        ("gpu.fracgpu.dev/recovery-action", "drain-and-reset", "NoExecute"),
    ]
    assert taints[0]["timeAdded"], "the time the GPU turned fatal, set by the plugin"
    assert "taints" not in plugin.devices(api_client)["gpu-0"]
    kube.wait_for(lambda: plugin.kubelet.health() == {"gpu-0": True, "gpu-1": False}, 10, what="health stream")
    what = "XID 95 (uncontained-ecc-error, fatal); driver asks for recovery action drain-and-reset"
    assert plugin.kubelet.health_report() == {"gpu-0": (True, ""), "gpu-1": (False, what)}  # the pod status shows it
    (message,) = kube.wait_for(lambda: _node_events(api_client, plugin.node, "GpuUnhealthy"), 30, what="Event")
    assert message == f"GPU gpu-1 is fatal: {what}"

    time.sleep(2)  # probes every 0.5 s see the GPU answering with its action pending: no clearing
    assert plugin.devices(api_client)["gpu-1"].get("taints") == taints

    plugin.inject(f"{GPU1} reset")
    kube.wait_for(lambda: "taints" not in plugin.devices(api_client)["gpu-1"], 30, what="gpu-1 untainted")
    kube.wait_for(lambda: plugin.kubelet.health() == {"gpu-0": True, "gpu-1": True}, 10, what="healthy again")
    kube.wait_for(lambda: _node_events(api_client, plugin.node, "GpuHealthy"), 30, what="GpuHealthy Event")


def test_a_lost_gpu_is_tainted_until_it_answers_again(plugin: Plugin, api_client: client.ApiClient) -> None:
    plugin.inject(f"{GPU1} lost")
    taints = kube.wait_for(lambda: plugin.devices(api_client)["gpu-1"].get("taints"), 30, what="gpu-1 tainted")
    assert [(t["key"], t["value"]) for t in taints] == [("gpu.fracgpu.dev/gpu-lost", "gpu-is-lost")]
    plugin.inject(f"{GPU1} reset")
    kube.wait_for(lambda: "taints" not in plugin.devices(api_client)["gpu-1"], 30, what="gpu-1 untainted")


def _prepared(process: NodePluginProcess) -> set[str]:
    return set(json.loads(process.checkpoint.read_text())["claims"])


def test_a_gpu_lost_at_start_does_not_stop_the_plugin(
    control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated GPUs' device nodes are made with mknod")
    node = kube.unique("lostnode")
    kube.create_fake_node(api_client, node)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgnl-", dir="/tmp"))
    control = workdir / "events"
    control.write_text("1 lost\n")  # fell off the bus before the plugin first started: nobody knows who it was
    process = NodePluginProcess(
        workdir, node, control_plane.kubeconfig, PROFILE, mocknvml.build(workdir / "nvml"),
        "--health-probe-interval=0.5", "--health-coalesce=0.5", "--health-interval=0.5",
        env={"FRACGPU_MOCK_NVML_EVENTS": str(control)},
    )  # fmt: skip
    plugin = Plugin(process, process.start(), node, control)
    try:
        devices = kube.wait_for(lambda: plugin.devices(api_client), 30, what="ResourceSlices of the plugin")
        assert sorted(devices) == ["gpu-0"], "an unknown identity is not published"
        (message,) = kube.wait_for(lambda: _node_events(api_client, node, "GpuLostUnpublished"), 30, what="Event")
        assert message.startswith("GPU 1 is not published: NVML ") and "no earlier record of this GPU" in message

        plugin.kubelet.close()
        process.stop()
        plugin.inject("1 reset")
        plugin.kubelet = process.start()
        kube.wait_for(lambda: sorted(plugin.devices(api_client)) == ["gpu-0", "gpu-1"], 30, what="both GPUs")
        claims = kube.allocate_claims(
            api_client, dyn, namespace, node, device_class=DRIVER, memories=["81408Mi", "81408Mi"]
        )  # a whole GPU each: one on each GPU
        refs = [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]
        first = plugin.kubelet.prepare(refs)
        assert sorted(first.claims[r[1]].devices[0].device_name for r in refs) == ["gpu-0", "gpu-1"]

        plugin.kubelet.close()
        process.stop()
        plugin.inject("1 lost")  # lost while the plugin was down: its identity is the one NVML gave before
        plugin.kubelet = process.start()
        devices = kube.wait_for(lambda: plugin.devices(api_client), 30, what="ResourceSlices of the plugin")
        assert devices["gpu-1"]["attributes"]["uuid"]["string"] == GPU1
        assert [(t["key"], t["value"], t["effect"]) for t in devices["gpu-1"]["taints"]] == [
            ("gpu.fracgpu.dev/gpu-lost", "gpu-is-lost", "NoExecute")
        ], "tainted from the first publication on"
        assert "taints" not in devices["gpu-0"]
        assert _prepared(process) == {r[1] for r in refs}, "the claims prepared before are kept"
        again = plugin.kubelet.prepare(refs)
        for ref in refs:
            assert again.claims[ref[1]].error == ""
            assert again.claims[ref[1]].devices[0].device_name == first.claims[ref[1]].devices[0].device_name
        kube.wait_for(lambda: plugin.kubelet.health() == {"gpu-0": True, "gpu-1": False}, 10, what="health")

        plugin.inject(f"{GPU1} reset")
        kube.wait_for(lambda: "taints" not in plugin.devices(api_client)["gpu-1"], 30, what="gpu-1 untainted")
        kube.wait_for(lambda: plugin.kubelet.health() == {"gpu-0": True, "gpu-1": True}, 10, what="healthy again")
        assert _prepared(process) == {r[1] for r in refs}
    finally:
        plugin.kubelet.close()
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
