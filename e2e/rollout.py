"""Node plugin rollouts in a local cluster: restart the DaemonSet, follow its pods, time new GPU pods meanwhile.

Shared by e2e/test_handover.py and e2e/bench/handover_bench.py.
"""

import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from e2e import workloads as w
from e2e.install import NAMESPACE
from harness.cluster import binaries

PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
NOT_REGISTERED = "is not registered"


def plugin_pods(cluster: w.Cluster) -> list[dict[str, Any]]:
    return list(w.get(cluster, "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR)["items"])


def daemonset_name(cluster: w.Cluster) -> str:
    (ds,) = w.get(cluster, "daemonsets", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR)["items"]
    return str(ds["metadata"]["name"])


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def wait_rolled(cluster: w.Cluster, old_uids: set[str], timeout: float) -> None:
    """Until no pod of `old_uids` exists and a new plugin pod is Ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = plugin_pods(cluster)
        if not {p["metadata"]["uid"] for p in pods} & old_uids and any(_ready(p) for p in pods):
            return
        time.sleep(0.5)
    raise TimeoutError(
        f"the plugin DaemonSet did not roll within {timeout}s: {[p['metadata'] for p in plugin_pods(cluster)]}"
    )


class LogFollower:
    """`kubectl logs -f` of one pod's plugin container, collected until it exits."""

    def __init__(self, kubeconfig: Path, pod: str) -> None:
        self._proc = subprocess.Popen(
            [
                str(binaries.binary("kubectl")),
                f"--kubeconfig={kubeconfig}",
                "logs",
                "-f",
                "-n",
                NAMESPACE,
                pod,
                "-c",
                "plugin",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.text = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        self.text = self._proc.stdout.read()

    def result(self, timeout: float) -> str:
        """The log once the container exited (or `timeout` passed)."""
        self._reader.join(timeout)
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        return self.text


@dataclass
class PodTimes:
    """Creation-to-Running seconds of the pods created during one rollout, and their events' messages."""

    seconds: dict[str, float] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def create_pods(cluster: w.Cluster, namespace: str, prefix: str, count: int, interval: float) -> list[str]:
    """`count` pods of one 1Gi share each (template `share-1gi`, created here), `interval` seconds apart."""
    w.apply(cluster, namespace, w.claim_template("share-1gi", "1Gi"))
    names = []
    for i in range(count):
        name = f"{prefix}-{i}"
        w.apply(cluster, namespace, w.gpu_pod(name, "share-1gi"))
        names.append(name)
        time.sleep(interval)
    return names


def pod_times(cluster: w.Cluster, namespace: str, pods: list[str], timeout: float) -> PodTimes:
    """Wait until every pod runs; creation to container start (the kubelet's own timestamps), and events."""
    w.wait_running(cluster, namespace, pods, timeout)
    out = PodTimes()
    for name in pods:
        pod = w.get(cluster, "pod", "-n", namespace, name)
        started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        out.seconds[name] = _ts(started) - _ts(pod["metadata"]["creationTimestamp"])
    events = w.get(cluster, "events", "-n", namespace)["items"]
    out.messages = [str(e.get("message", "")) for e in events]
    return out


def delete_pods(cluster: w.Cluster, namespace: str, pods: list[str]) -> None:
    cluster.kubectl("delete", "pod", "-n", namespace, *pods, "--wait=true", "--timeout=120s")
