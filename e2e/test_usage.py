"""End to end (issue #11): GPU memory use of a pod's container, from NVML (the mock, reporting the container's
real host PID) through the node plugin's cgroup mapping to its claim: the metric, `USED` in `kubectl get gpus -o wide`
and, over the grant, an Event on the claim and the pod; when the pod ends, its series go."""

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e import workloads as w
from e2e.install import USAGE_INTERVAL_S, Installation
from kubelet_plugin.usage.cgroups import CgroupUnreadableError, pod_of_pid

pytestmark = pytest.mark.e2e
GiB = 1 << 30
DEADLINE = 2 * USAGE_INTERVAL_S + 10  # two sample intervals, plus the scrape, kubectl and a ledger write


@pytest.fixture
def ns(ns: str, installation: Installation) -> Iterator[str]:
    """The session's fresh namespace (conftest), with the mock NVML's process list emptied before it goes."""
    yield ns
    installation.usage_control.write_text("")


def _pids_of_pod(pod_uid: str) -> list[int]:
    """Host PIDs whose cgroup names the pod (the container's processes, as the plugin finds them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                owner = pod_of_pid(Path("/proc"), int(entry.name))
            except CgroupUnreadableError:
                continue
            if owner is not None and owner.pod_uid == pod_uid and owner.container_id:
                found.append(int(entry.name))
    return sorted(found)


def _metric(installation: Installation, name: str, **labels: str) -> float | None:
    url = f"http://{installation.cluster.netns.address}:8082/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    want = tuple(sorted(labels.items()))
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and tuple(sorted(s.labels.items())) == want:
                return float(s.value)
    return None


def _wait(probe: object, what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not within {timeout:g} s"
        time.sleep(0.5)


def test_a_containers_gpu_memory_reaches_metric_ledger_and_event(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, w.claim_template("share-4gi", "4Gi"), w.gpu_pod("user", "share-4gi"))
    w.wait_running(cluster, ns, ["user"])
    pod = w.get(cluster, "pod", "-n", ns, "user")
    claim = w.claim_of(cluster, ns, "user")
    gpu = w.recorded_gpu(claim)
    pids = _pids_of_pod(pod["metadata"]["uid"])
    assert pids, "the container's processes are in a cgroup of its pod"
    labels = {"namespace": ns, "claim": claim["metadata"]["name"], "pod": "user", "gpu_uuid": gpu["uuid"]}
    used = "fracgpu_plugin_claim_memory_used_bytes"

    tmp = installation.usage_control.with_suffix(".tmp")
    tmp.write_text(f"{gpu['uuid']} {pids[0]} {6 * GiB}\n")  # over its 4Gi grant, which nothing enforces here
    tmp.rename(installation.usage_control)
    _wait(lambda: _metric(installation, used, **labels) == 6 * GiB, "the claim's used memory")
    assert _metric(installation, "fracgpu_plugin_claim_memory_granted_bytes", **labels) == 4 * GiB

    def used_in_ledger() -> bool:
        table = cluster.kubectl("get", "gpu", gpu["gpu"], "-o", "wide").stdout.splitlines()
        return len(table) == 2 and table[1][table[0].index("USED") :].split()[0] == "6Gi"

    _wait(used_in_ledger, "USED in kubectl get gpus -o wide")

    def over_grant_events() -> list[tuple[str, str]]:
        events = json.loads(cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
        return sorted(
            (e["involvedObject"]["kind"], e["message"]) for e in events if e.get("reason") == "OverMemoryGrant"
        )

    _wait(lambda: len(over_grant_events()) == 2, "OverMemoryGrant Events on the claim and the pod")
    (on_pod, on_claim) = over_grant_events()
    assert (on_pod[0], on_claim[0]) == ("Pod", "ResourceClaim")
    assert f"uses 6Gi of GPU {gpu['uuid']}, more than its grant of 4Gi (pods user)" in on_claim[1]

    cluster.kubectl("delete", "pod", "-n", ns, "user", "--wait=true", "--timeout=60s")
    _wait(lambda: _metric(installation, used, **labels) is None, "the claim's series gone with the pod", 60)
    assert _metric(installation, "fracgpu_plugin_claim_memory_granted_bytes", **labels) is None

    def share_gone() -> bool:
        claims = w.get(cluster, "gpu", gpu["gpu"])["status"].get("claims") or []
        return not [c for c in claims if c["name"] == claim["metadata"]["name"]]

    _wait(share_gone, "the claim's share gone from the ledger", 60)
