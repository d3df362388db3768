"""The mig tier on the e2e node (two simulated H100 80GB): GPU 1 turned into a MIG GPU as an operator does (MIG mode on
through NVML, then `mig.gpus=1`), pods asking `mig.gpu.fracgpu.dev` for memory get the smallest partition, made
when their claim is prepared, and each container sees that partition only.

What is real: the chart, the scheduler (partitionable devices), the controller, the kubelet calling the plugin,
containerd applying the claim specs, NVIDIA's toolkit's driver edits. What is not: the driver (harness/mocknvml: its
MIG state is a directory, the "kernel", which the test pods mount read-only, as every process reaches the real
kernel's through /dev/nvidiactl; what a container sees still follows from the capability nodes it was given).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import workloads as w
from e2e.install import CHART, NAMESPACE, PROFILE, RELEASE, Installation
from harness import mocknvml

pytestmark = pytest.mark.e2e
MIG_CLASS = "mig.gpu.fracgpu.dev"
GPU1 = mocknvml.read_profile(PROFILE)["gpu.1.uuid"]
PLUGIN = "app.kubernetes.io/component=kubelet-plugin"
# profile -> (memory MiB, SMs) of an H100 80GB's partitions (harness/mocknvml/mock_mig.c)
PARTITIONS = {"1g.10gb": (9984, 16), "1g.20gb": (20096, 26), "3g.40gb": (40448, 60)}
MIG_REPORT = w.REPORT.replace(
    'echo "UID $(id -u)"',
    'echo "UID $(id -u)"\nnvidia-smi -L 2>&1 | sed "s/^/SMI /"\necho "PROBE $(cuda-probe 2>&1 | tr \'\\n\' \' \')"',
)


def state_dir(installation: Installation) -> Path:
    return installation.cluster.short_dir / "mig-state"


def driver(installation: Installation, code: str) -> Any:
    """Run pynvml `code` on the host against the node's (mock) driver, as an operator's nvidia-smi would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_MOCK_")}
    env |= {
        "LD_LIBRARY_PATH": str(installation.nvml_dir),
        "FRACGPU_MOCK_NVML_PROFILE": str(installation.nvml_dir / PROFILE.name),
        "FRACGPU_MOCK_NVML_STATE_DIR": str(state_dir(installation)),
    }
    prelude = "import ctypes, json, pynvml as n\nn.nvmlInit()\nh = n.nvmlDeviceGetHandleByIndex(1)\n"
    done = subprocess.run([sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout) if done.stdout.strip() else None


def instances(installation: Installation) -> set[tuple[int, int]]:
    """(GPU instance id, placement start) of GPU 1's instances, as the driver holds them."""
    path = state_dir(installation) / f"mig.{GPU1}"
    lines = path.read_text().splitlines() if path.exists() else []
    return {(int(f[1]), int(f[3])) for f in (line.split() for line in lines) if f and f[0] == "gi"}


def recorded(installation: Installation) -> set[tuple[int, int]]:
    """The partitions the node plugin's checkpoint owns."""
    path = installation.cluster.kubelet_dir / "plugins" / "gpu.fracgpu.dev" / "checkpoint.json"
    claims = json.loads(path.read_text())["claims"].values()
    return {(d["mig"]["gpuInstance"], d["mig"]["placementStart"]) for c in claims for d in c["devices"] if d.get("mig")}


def _upgrade(installation: Installation, values: dict[str, Any]) -> None:
    path = installation.cluster.state_dir / "fracgpu-values-mig.json"
    path.write_text(json.dumps(values))
    installation.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(path), "--wait",
                      "--timeout=300s")  # fmt: skip
    (daemonset,) = installation.cluster.kubectl(
        "get", "daemonset", "-n", NAMESPACE, "-l", PLUGIN, "-o", "name"
    ).stdout.split()
    installation.cluster.kubectl("rollout", "status", "-n", NAMESPACE, daemonset, "--timeout=300s")


def wait_for(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError, subprocess.CalledProcessError):
            if value := check():
                return value
        time.sleep(0.5)
    raise TimeoutError(f"not within {timeout} s: {what}")


@pytest.fixture(scope="module")
def mig_gpu1(installation: Installation) -> Iterator[None]:
    """GPU 1 a MIG GPU (MIG mode on, mig.gpus=1); a whole GPU again afterwards, whatever happened."""
    state = state_dir(installation)
    state.mkdir(exist_ok=True)
    before = json.loads(installation.helm("get", "values", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    plugin = before["kubeletPlugin"]
    values = {
        **before,
        "mig": {"gpus": "1"},
        "kubeletPlugin": {
            **plugin,
            "extraEnv": [
                *plugin["extraEnv"],
                {"name": "FRACGPU_MOCK_NVML_STATE_DIR", "value": str(state)},
                {"name": "FRACGPU_MIG_MINORS_FILE", "value": str(installation.driver_root / mocknvml.MIG_MINORS)},
            ],
            "extraVolumes": [{"name": "mig-state", "hostPath": {"path": str(state)}}],
            "extraVolumeMounts": [{"name": "mig-state", "mountPath": str(state)}],
        },
    }
    try:
        driver(installation, "n.nvmlDeviceSetMigMode(h, n.NVML_DEVICE_MIG_ENABLE)")
        _upgrade(installation, values)
        wait_for(
            "GPU 1's partitions published",
            lambda: any("-mig-" in d["name"] for s in w.get(installation.cluster, "resourceslices")["items"]
                        for d in s["spec"].get("devices") or []),
        )  # fmt: skip
        yield
    finally:
        _upgrade(installation, before)
        driver(installation, "n.nvmlDeviceSetMigMode(h, n.NVML_DEVICE_MIG_DISABLE)")


def mig_template(name: str, memory: str) -> dict[str, Any]:
    body = w.claim_template(name, memory)
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = MIG_CLASS
    return body


def mig_pod(installation: Installation, name: str) -> dict[str, Any]:
    """A glibc pod that reports its env, files, nodes, nvidia-smi -L and the CUDA probe; it mounts the driver's
    MIG state (the "kernel") read-only."""
    body = w.pod(name, {"gpu": name}, {"app": ["gpu"]}, image=installation.workload_image, script=MIG_REPORT)
    state = str(state_dir(installation))
    body["spec"]["volumes"] = [{"name": "kernel", "hostPath": {"path": state}}]
    container = body["spec"]["containers"][0]
    container["volumeMounts"] = [{"name": "kernel", "mountPath": state, "readOnly": True}]
    container["env"] = [{"name": "FRACGPU_MOCK_NVML_STATE_DIR", "value": state}]
    return body


def seen(installation: Installation, ns: str, pod: str) -> tuple[w.Seen, list[str], dict[str, Any]]:
    """What the container reported: the tagged report, its nvidia-smi -L lines and its CUDA probe."""
    report = w.report(installation.cluster, ns, pod)
    tagged = w.cuda_report(installation.cluster, ns, pod)
    return report, tagged.get("SMI", []), json.loads(tagged["PROBE"][0])


def test_three_partitions_at_once_each_container_sees_only_its_own(
    installation: Installation, mig_gpu1: None, ns: str
) -> None:
    cluster = installation.cluster
    # a grant is never below its request: 10Gi does not fit a 1g.10gb (9984 MiB) and gets the 1g.20gb (fewer
    # compute slices than a 2g.20gb of the same memory); a 1g.10gb is asked for by its exact memory
    memories = {"small": "9984Mi", "medium": "10Gi", "large": "30Gi"}
    for name, memory in memories.items():
        w.apply(cluster, ns, mig_template(name, memory), mig_pod(installation, name))
    w.wait_running(cluster, ns, list(memories))
    profiles = {}
    for pod, expected in zip(memories, PARTITIONS, strict=True):
        report, smi, probe = seen(installation, ns, pod)
        data = w.recorded_gpu(w.claim_of(cluster, ns, pod))
        assert data["profile"] == expected and data["uuid"] == GPU1, data
        (device,) = probe["devices"]
        assert (
            probe["device_count"] == 1 and (device["total_mib"], device["multiprocessor_count"]) == PARTITIONS[expected]
        )
        (variables,) = report.device_vars().values()
        assert variables["MIG_PROFILE"] == expected and variables["ENFORCEMENT"] == "mig"
        assert variables["MIG_DEVICE"] == device["mig_uuid"], "the container is told the MIG device CUDA sees"
        assert variables["MEMORY_LIMIT_MIB"] == str(PARTITIONS[expected][0])
        assert report.env["NVIDIA_VISIBLE_DEVICES"] == "void"
        gpu_nodes = {n for n in report.nodes if n.startswith("nvidia") and n[6:].isdigit()}
        assert gpu_nodes == {"nvidia1"}, report.nodes
        assert len(smi) == 2 and smi[1].strip().startswith(f"MIG {expected}") and device["mig_uuid"] in smi[1]
        migs = wait_for("the controller's copy of the MIG UUID",
                        lambda p=pod: w.recorded_gpu(w.claim_of(cluster, ns, p)).get("migUUID"))  # fmt: skip
        assert migs == device["mig_uuid"]
        profiles[pod] = expected
    assert profiles == dict(zip(memories, PARTITIONS, strict=True))
    ledger = w.get(cluster, "gpus")["items"]
    (gpu1,) = [g for g in ledger if g["spec"]["device"] == "gpu-1"]
    assert gpu1["status"]["mig"]["summary"] == "5/7 compute, 7/8 memory slices, 3 partitions"
    assert gpu1["status"]["allocatedMemory"] == f"{sum(m for m, _ in PARTITIONS.values())}Mi", "each partition's own"
    assert len(instances(installation)) == 3 == len(recorded(installation))
    for pod in memories:
        cluster.kubectl("delete", "pod", "-n", ns, pod, "--wait=true", "--timeout=120s")
    wait_for("every partition destroyed", lambda: instances(installation) == set())


def test_a_request_no_partition_holds_stays_pending_and_is_reported(
    installation: Installation, mig_gpu1: None, ns: str
) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, mig_template("huge", "100Gi"), mig_pod(installation, "huge"))
    assert "cannot allocate all claims" in w.unschedulable(cluster, ns, "huge")
    message = w.claim_event(cluster, ns, "huge", "UnsatisfiableGpuRequest")
    assert "asks for 100Gi" in message and "81152Mi" in message, "the largest partition's exact memory"


def test_killing_the_plugin_mid_prepare_leaves_no_orphan_partition(
    installation: Installation, mig_gpu1: None, ns: str
) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, mig_template("victim", "10Gi"), mig_pod(installation, "victim"))
    wait_for("the partition created", lambda: instances(installation), timeout=120)
    killed = [pid for pid in _plugin_pids() if _kill(pid)]  # right after the instances, before or after the save
    assert killed, "no node plugin process found"
    w.wait_running(cluster, ns, ["victim"], timeout=300)  # the restarted plugin recovers, the kubelet retries
    wait_for(
        "the driver's partitions equal the checkpoint's", lambda: instances(installation) == recorded(installation)
    )
    assert len(instances(installation)) == 1, "no orphan: one partition, the claim's"
    cluster.kubectl("delete", "pod", "-n", ns, "victim", "--wait=true", "--timeout=120s")
    wait_for("the partition destroyed", lambda: instances(installation) == set())


def _plugin_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and b"fracgpu-kubelet-plugin" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
