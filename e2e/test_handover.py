"""Node plugin handover (issue #13 item 4) with the real kubelet: a SIGTERMed plugin serves until its replacement
has registered (then exits) or its handover timeout passed, so GPU pods created meanwhile start without "driver is
not registered". Runs on the session cluster (e2e/conftest.py); the chart's handover timeout is 25 s."""

import json
import time

from e2e import rollout as r
from e2e import workloads as w
from e2e.install import NAMESPACE, Installation

HANDED_OVER = "a replacement instance is registered; handing over"
TIMED_OUT = "no replacement instance registered within the handover timeout"


def test_rollout_restart_hands_over_to_the_new_plugin_without_a_gap(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    (old,) = r.plugin_pods(cluster)
    follower = r.LogFollower(cluster.kubeconfig, old["metadata"]["name"])
    cluster.kubectl("rollout", "restart", f"daemonset/{r.daemonset_name(cluster)}", "-n", NAMESPACE)
    pods = r.create_pods(cluster, ns, "during", 4, 1.5)  # while the old plugin terminates and the new one starts
    r.wait_rolled(cluster, {old["metadata"]["uid"]}, timeout=90)
    log = follower.result(timeout=30)
    times = r.pod_times(cluster, ns, pods, timeout=120)
    assert HANDED_OVER in log, f"the old plugin did not wait for its replacement:\n{log[-3000:]}"
    assert TIMED_OUT not in log
    refused = [m for m in times.messages if r.NOT_REGISTERED in m]
    assert not refused, f"pods created during the rollout met an unregistered driver: {refused}"
    for name in pods:
        assert [d["MEMORY_LIMIT_MIB"] for d in w.report(cluster, ns, name).device_vars().values()] == ["1024"]
    r.delete_pods(cluster, ns, pods)


def test_a_plugin_without_replacement_serves_until_its_handover_timeout(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    ds = r.daemonset_name(cluster)
    (old,) = r.plugin_pods(cluster)
    follower = r.LogFollower(cluster.kubeconfig, old["metadata"]["name"])
    unschedulable = {"spec": {"template": {"spec": {"nodeSelector": {"fracgpu.test/no-node": "x"}}}}}
    cluster.kubectl("patch", "daemonset", ds, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(unschedulable))
    try:
        start = time.monotonic()
        pods = r.create_pods(cluster, ns, "orphaned", 1, 0)  # only the terminating plugin can prepare it
        times = r.pod_times(cluster, ns, pods, timeout=22)
        log = follower.result(timeout=60)
        lived = time.monotonic() - start
    finally:
        back = {"spec": {"template": {"spec": {"nodeSelector": {"fracgpu.test/no-node": None}}}}}
        cluster.kubectl("patch", "daemonset", ds, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(back))
    assert TIMED_OUT in log and HANDED_OVER not in log, log[-3000:]
    assert lived >= 20, f"the plugin stopped {lived:.0f} s after SIGTERM, before its 25 s handover timeout"
    assert not [m for m in times.messages if r.NOT_REGISTERED in m]
    r.wait_rolled(cluster, {old["metadata"]["uid"]}, timeout=90)
    r.delete_pods(cluster, ns, pods)
