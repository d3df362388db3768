"""Whole GPUs through DRA extended resources (issue #14): a pod asking `resources.limits: {gpu.fracgpu.dev/gpu: 1}`
and no claim gets a whole GPU from the real kube-scheduler's own claim, prepared by our plugin like any claim;
shares and whole GPUs never meet on one GPU. Simulated GPUs (2 x 80Gi), the chart's defaults."""

import time
from typing import Any

import pytest

from api.quantity import MiB, to_bytes
from e2e import workloads as w
from e2e.install import Installation
from harness.cluster.node import RUNC

pytestmark = pytest.mark.e2e

WHOLE_MIB = 81920  # sim80gi-x2: all of a GPU's memory, step-aligned


def _minor(cluster: w.Cluster, device: str) -> int:
    for item in w.get(cluster, "resourceslices")["items"]:
        for d in item["spec"]["devices"]:
            if d["name"] == device:
                return int(d["attributes"]["minor"]["int"])
    raise AssertionError(f"{device} not published")


def _held(cluster: w.Cluster) -> dict[str, tuple[str, list[tuple[str | None, str]]]]:
    """GPU UUID -> (allocatedMemory, [(pod, memory) per claim]) from the ledger."""
    return {
        g["status"]["uuid"]: (
            g["status"]["allocatedMemory"],
            [(c.get("pod"), c["memory"]) for c in g["status"].get("claims", [])],
        )
        for g in w.get(cluster, "gpus")["items"]
    }


def _scheduler_claim(cluster: w.Cluster, ns: str, pod: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scheduler's claim for `pod`, checked to be the one it makes, and its one allocation result."""
    claim = w.extended_claim_of(cluster, ns, pod)
    meta = claim["metadata"]
    assert meta["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    assert meta["name"].startswith(f"{pod}-extended-resources-")
    assert [(o["kind"], o["name"], o.get("controller")) for o in meta["ownerReferences"]] == [("Pod", pod, True)]
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["name"] == "container-0-request-0"
    assert request["exactly"]["deviceClassName"] == w.DEVICE_CLASS and "capacity" not in request["exactly"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert to_bytes(result["consumedCapacity"]["memory"]) // MiB == WHOLE_MIB, "the requestPolicy default: all of it"
    return claim, result


def test_extended_resource_pods_get_whole_gpus_that_no_share_can_join(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    # `cuda`: a glibc container under plain runc, whose mock nvidia-smi lists the GPUs it can open
    cuda = w.on_runtime(w.extended_pod("cuda", image=installation.workload_image, script=w.CUDA_REPORT), RUNC)
    w.apply(cluster, ns, cuda, w.extended_pod("plain"))
    w.wait_running(cluster, ns, ["cuda", "plain"])

    claims = {p: _scheduler_claim(cluster, ns, p) for p in ("cuda", "plain")}
    uuid = {p: w.recorded_gpu(claim)["uuid"] for p, (claim, _) in claims.items()}
    assert uuid["cuda"] != uuid["plain"], "each pod holds one GPU whole"
    assert all(w.recorded_gpu(claim)["memory"] == "80Gi" for claim, _ in claims.values())

    smi = w.cuda_report(cluster, ns, "cuda")
    assert smi.get("SMI") == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuid['cuda']})"], smi
    assert smi["ENV"] == ["NVIDIA_VISIBLE_DEVICES=void"], "driverEdits: toolkit: no NVIDIA runtime may inject"
    seen = w.report(cluster, ns, "plain")
    assert seen.uuids() == {uuid["plain"]}
    assert [(d["uuid"], d["memoryMiB"]) for f in seen.files.values() for d in f["devices"]] == [
        (uuid["plain"], WHOLE_MIB)
    ]
    assert [f["request"] for f in seen.files.values()] == ["container-0-request-0"]
    minor = _minor(cluster, claims["plain"][1]["device"])
    assert f"nvidia{minor}" in seen.nodes and f"nvidia{1 - minor}" not in seen.nodes, seen.nodes

    expected = {uuid[p]: ("80Gi", [(p, "80Gi")]) for p in ("cuda", "plain")}
    deadline = time.monotonic() + 30
    while _held(cluster) != expected and time.monotonic() < deadline:
        time.sleep(1)
    assert _held(cluster) == expected, "the ledger names the pod holding each GPU whole"

    # both GPUs are held whole: neither a third whole GPU nor a 10Gi share fits
    w.apply(
        cluster, ns, w.extended_pod("third"), w.claim_template("share-10gi", "10Gi"), w.gpu_pod("share", "share-10gi")
    )
    message = w.unschedulable(cluster, ns, "third")
    assert message.startswith("0/1 nodes are available: 1 cannot allocate all claims"), message
    assert "cannot allocate all claims" in w.unschedulable(cluster, ns, "share")

    # free `plain`'s GPU: the share takes it; a whole GPU then fits nowhere, not beside the share either
    cluster.kubectl("delete", "pod", "-n", ns, "third", "plain", "--wait=true", "--timeout=60s")
    w.wait_running(cluster, ns, ["share"], timeout=120)
    assert w.recorded_gpu(w.claim_of(cluster, ns, "share"))["uuid"] == uuid["plain"]
    w.apply(cluster, ns, w.extended_pod("beside"))
    assert "cannot allocate all claims" in w.unschedulable(cluster, ns, "beside")
    time.sleep(3)  # a wrong placement would show by now
    assert w.get(cluster, "pod", "-n", ns, "beside")["status"].get("phase") == "Pending"
