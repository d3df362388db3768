"""MPS trust domains live on one node (issue 36): the real node plugin process and the real MPS supervisor process
over the mock driver (harness/mocknvml: its NVML and its ``nvidia-cuda-mps-control`` daemon), with ResourceClaims of
the real kube-apiserver whose allocation the test writes, prepared through the plugin's DRA socket as the kubelet
does. The supervisor is made slow on purpose: it looks at the tenant requests (and writes its status files) every
14 s (``--poll`` and ``--refresh``), so a trust-domain switch takes about 14 s, longer than the plugin's node lock
timeout (10 s); the plugin waits up to 20 s for a switch (``--mps-domain-switch-timeout``).

Shown:
- a prepare of a team-b claim on GPU 0, whose daemon serves team-a with no claim left, asks for a switch and waits
  for it outside the node lock: a prepare on GPU 1 started meanwhile succeeds at once, while GPU 0's status file
  still names team-a and the team-b claim still waits; the team-b claim is answered only once the status names
  team-b (a fresh daemon);
- an adminAccess claim of another namespace on GPU 0 while a team-a claim is prepared there is a monitor, not a
  tenant (docs/architecture.md, "Admin access" and "The `mps` tier"): prepared, not refused, with no MPS pipe
  directory or /dev/shm mount, no ``CUDA_MPS_*`` or ``CUDA_VISIBLE_DEVICES``, tier none, the whole GPU's memory in
  ``…_MEMORY_LIMIT_MIB``, ``…_ADMIN_ACCESS=true``, no trust domain in the checkpoint; the GPU's tenant request,
  daemon and limits stay as they were.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from harness import kube, mocknvml
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KubeletClient
from harness.nodeplugin import DRIVER, NodePluginProcess
from kubelet_plugin.kinds.mps.control import MpsControl
from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import mps_files as mps

pytestmark = pytest.mark.integration
PROFILE = mocknvml.PROFILES / "gpu80x2.profile"
UUIDS = [mocknvml.read_profile(PROFILE)[f"gpu.{i}.uuid"] for i in (0, 1)]
SUPERVISOR_POLL_S = 14.0
SWITCH_TIMEOUT_S = 20.0  # API timeout (10 s) + node lock timeout + this: at most 40 s, the plugin checks
NODE_LOCK_TIMEOUT_S = 10.0
WHOLE_GPU_MIB = 81408  # 81559 MiB rounded down to the 256 MiB step: the published capacity
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
Ref = tuple[str, str, str]  # (namespace, uid, name), as the kubelet names a claim


@dataclass
class Node:
    api_client: client.ApiClient
    name: str
    plugin: NodePluginProcess
    kubelet: KubeletClient
    mps_root: Path
    nvml: Path
    team_a: str
    team_b: str
    monitoring: str
    holders: dict[int, Ref]
    """GPU index -> a prepared claim of a team there."""

    def status(self, gpu: int) -> mps.DaemonStatus:
        status, problem = mps.read_status(self.mps_root, UUIDS[gpu])
        assert status is not None and problem is None, problem
        return status

    def served(self, gpu: int) -> str | None:
        """The trust domain GPU `gpu`'s status file names, whatever its state."""
        status = mps.read_status(self.mps_root, UUIDS[gpu])[0]
        return status.trust_domain if status is not None else None

    def tenant(self, gpu: int) -> str | None:
        request = mps.read_tenant(self.mps_root, UUIDS[gpu])
        return request.domain if request is not None else None

    def checkpoint(self) -> dict[str, Any]:
        claims: dict[str, Any] = json.loads(self.plugin.checkpoint.read_text())["claims"]
        return claims

    def claim(self, namespace: str, gpu: int, memory: str, admin: bool = False) -> Ref:
        """A ResourceClaim for `memory` of GPU `gpu`, allocated by this test as the scheduler would."""
        exactly: dict[str, Any] = {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}
        if admin:
            exactly["adminAccess"] = True
        body = {
            "metadata": {"name": kube.unique("c")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        claims = client.ResourceV1Api(self.api_client)
        made = claims.create_namespaced_resource_claim(namespace, body)
        result: dict[str, Any] = {
            "request": "gpu", "driver": DRIVER, "pool": self.name, "device": f"gpu-{gpu}",
            "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": memory},
        }  # fmt: skip
        if admin:
            result["adminAccess"] = True
        status = {"status": {"allocation": {"devices": {"results": [result]}}}}
        claims.patch_namespaced_resource_claim_status(
            made.metadata.name, namespace, status, _content_type="application/merge-patch+json"
        )
        return namespace, made.metadata.uid, made.metadata.name

    def prepare(self, ref: Ref) -> Any:
        """The plugin's answer for claim `ref` (asserted to be no error)."""
        answer = self.kubelet.prepare([ref]).claims[ref[1]]
        assert answer.error == "", f"{answer.error}\n--- plugin log:\n{self.plugin.log()}"
        return answer

    def unprepare(self, ref: Ref) -> None:
        assert self.kubelet.unprepare([ref]).claims[ref[1]].error == ""


def domain(namespace: str) -> str:
    return f"namespace/{namespace}"


def wait_for(check: Callable[[], object], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


def start_supervisor(nvml: Path, root: Path, driver_state: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRACGPU_", "CUDA_"))} | {
        "LD_LIBRARY_PATH": str(nvml), "FRACGPU_MOCK_NVML_PROFILE": str(PROFILE),
        "FRACGPU_MOCK_NVML_STATE_DIR": str(driver_state), "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }  # fmt: skip
    argv = [
        sys.executable, "-m", "kubelet_plugin.mps_supervisor", "--mps-gpus=all", f"--mps-root={root}",
        f"--mps-control={nvml / 'nvidia-cuda-mps-control'}", f"--poll={SUPERVISOR_POLL_S}",
        f"--refresh={SUPERVISOR_POLL_S}", "--metrics-port=0", "--log-format=text",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stderr=out)


def stop_supervisor(proc: subprocess.Popen[bytes], root: Path, workdir: Path) -> None:
    """SIGTERM (it quits its daemons and detaches its tmpfs mounts); whatever a failed stop left, removed."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for gpu in UUIDS:
        status = mps.read_status(root, gpu)[0]
        if status is not None and status.pid is not None and status.state != "down":
            with contextlib.suppress(ProcessLookupError):
                os.kill(status.pid, signal.SIGKILL)
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted((p for p in points if p.startswith(f"{workdir}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient) -> Iterator[Node]:
    """The supervisor and the plugin on a fake node with two MPS GPUs, each GPU's daemon serving team-a with a
    team-a claim prepared there."""
    if os.geteuid() != 0:
        pytest.fail("needs root (the supervisor mounts tmpfs, the plugin mknods device nodes); run it with sudo")
    workdir = Path(tempfile.mkdtemp(prefix="fgsw-", dir="/tmp"))  # short: unix socket paths ≤ 107 bytes
    root, driver_state = workdir / "mps", workdir / "driver-state"
    driver_state.mkdir()
    nvml = mocknvml.build(workdir / "nvml")
    supervisor = start_supervisor(nvml, root, driver_state, workdir / "supervisor.log")
    core = client.CoreV1Api(api_client)
    teams = [kube.unique("team-a"), kube.unique("team-b"), kube.unique("monitoring")]  # monitoring: admin access
    plugin: NodePluginProcess | None = None
    kubelet: KubeletClient | None = None
    try:
        wait_for(lambda: all(mps.read_status(root, u)[1] is None for u in UUIDS), 30, "both daemons running")
        for ns in teams:
            labels = {ADMIN_LABEL: "true"} if ns == teams[2] else {}
            core.create_namespace({"metadata": {"name": ns, "labels": labels}})
        name = kube.unique("mpsnode")
        kube.create_fake_node(api_client, name)
        kube.ensure_device_class(dyn, DRIVER, DRIVER)
        plugin = NodePluginProcess(
            workdir, name, control_plane.kubeconfig, PROFILE, nvml, "--mps-gpus=all", f"--mps-root={root}",
            f"--mps-control={nvml / 'nvidia-cuda-mps-control'}",
            f"--mps-domain-switch-timeout={SWITCH_TIMEOUT_S}", f"--node-lock-timeout={NODE_LOCK_TIMEOUT_S}",
            env={"FRACGPU_MOCK_NVML_STATE_DIR": str(driver_state)},
        )  # fmt: skip
        kubelet = plugin.start()
        selector = f"spec.nodeName={name},spec.driver={DRIVER}"
        slices = client.ResourceV1Api(api_client).list_resource_slice
        kube.wait_for(lambda: slices(field_selector=selector).items, 30, what="the plugin's ResourceSlices")
        node = Node(api_client, name, plugin, kubelet, root, nvml, teams[0], teams[1], teams[2], holders={})
        node.holders = {gpu: node.claim(node.team_a, gpu, "10Gi") for gpu in (0, 1)}
        answers = kubelet.prepare(list(node.holders.values()))  # each daemon takes its first domain: ≤ 14 s
        assert [a.error for a in answers.claims.values()] == ["", ""], f"{answers}\n{plugin.log()}"
        assert [node.status(gpu).trust_domain for gpu in (0, 1)] == [domain(node.team_a)] * 2
        yield node
    finally:
        if kubelet is not None:
            kubelet.close()
        if plugin is not None:
            plugin.stop()
        stop_supervisor(supervisor, root, workdir)
        print(f"supervisor log:\n{''.join((workdir / 'supervisor.log').read_text().splitlines(True)[-30:])}")
        for ns in teams:
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns)
        shutil.rmtree(workdir, ignore_errors=True)


def test_admin_access_on_a_busy_mps_gpu_is_a_monitor_not_a_tenant(node: Node) -> None:
    holder_domain = domain(node.holders[0][0])
    before, tenant = node.status(0), node.tenant(0)
    control = MpsControl(node.nvml / "nvidia-cuda-mps-control", node.mps_root)
    limits = control.read(UUIDS[0])
    assert (before.trust_domain, tenant) == (holder_domain, holder_domain)

    monitor = node.claim(node.monitoring, 0, "0", admin=True)
    try:
        (device,) = node.prepare(monitor).devices  # another namespace on a GPU that serves a team: not refused
        assert device.device_name == "gpu-0"
        spec = json.loads(cdi.spec_path(node.plugin.cdi_dir, DRIVER, monitor[1]).read_text())
        (cdi_device,) = spec["devices"]
        edits = cdi_device["containerEdits"]
        env = dict(e.split("=", 1) for e in edits["env"])
        own = container_info.env_prefix(cdi_device["name"])
        assert (env[f"{own}ADMIN_ACCESS"], env[f"{own}ENFORCEMENT"]) == ("true", "none")
        assert env[f"{own}MEMORY_LIMIT_MIB"] == str(WHOLE_GPU_MIB), "the whole GPU, none of it reserved"
        assert not [k for k in env if k.startswith("CUDA_MPS_") or k == "CUDA_VISIBLE_DEVICES"], env
        assert env.get("FRACGPU_ENFORCEMENT") != "mps", env
        mounts = [m["hostPath"] for m in edits.get("mounts") or []] + [
            m["hostPath"] for m in (spec.get("containerEdits") or {}).get("mounts") or []
        ]
        assert not [m for m in mounts if m.startswith(str(node.mps_root))], "an MPS pipe directory or /dev/shm"
        (info_path,) = store.info_file_paths(node.plugin.kubelet_dir / "plugins" / DRIVER, monitor[1])
        info = json.loads(info_path.read_text())
        (listed,) = info["devices"]
        assert (info["version"], info["enforcement"]) == (3, "none")
        assert (listed["adminAccess"], listed["enforcement"], listed["memoryMiB"]) == (True, "none", WHOLE_GPU_MIB)
        assert "activeThreadPercentage" not in listed
        entry = node.checkpoint()[monitor[1]]
        assert entry["state"] == "PrepareCompleted" and "mpsTrustDomain" not in entry, entry

        after = node.status(0)
        assert (after.trust_domain, after.pid, node.tenant(0)) == (holder_domain, before.pid, holder_domain)
        assert control.read(UUIDS[0]) == limits, "the ceiling moved"
    finally:
        node.unprepare(monitor)


def test_a_slow_domain_switch_on_one_gpu_never_holds_up_a_prepare_on_another(node: Node) -> None:
    old, new = domain(node.team_a), domain(node.team_b)
    assert node.holders[0][0] == node.team_a
    node.unprepare(node.holders.pop(0))  # team-a has no claim left on GPU 0; its daemon still serves team-a
    assert (node.status(0).trust_domain, node.tenant(0)) == (old, old)
    old_pid = node.status(0).pid
    switching, on_gpu1 = node.claim(node.team_b, 0, "20Gi"), node.claim(node.team_a, 1, "10Gi")

    last = node.status(0).updated  # ask just after the supervisor's look: the switch then takes a whole poll
    wait_for(lambda: node.status(0).updated != last, SUPERVISOR_POLL_S + 5, "the supervisor's next look")

    def prepare_switching() -> tuple[Any, float, mps.DaemonStatus | None]:
        answer = node.kubelet.prepare([switching]).claims[switching[1]]
        return answer, time.monotonic(), mps.read_status(node.mps_root, UUIDS[0])[0]

    with ThreadPoolExecutor(1) as pool:
        start = time.monotonic()
        pending = pool.submit(prepare_switching)
        wait_for(lambda: node.tenant(0) == new, 5, "the plugin to ask the supervisor for team-b's daemon")
        asked = time.monotonic()
        node.prepare(on_gpu1)
        gpu1_took = time.monotonic() - asked
        then, still_waiting, waiting_entry = node.status(0), not pending.done(), node.checkpoint()[switching[1]]
        served_at = None
        while not pending.done():
            if served_at is None and node.served(0) == new:
                served_at = time.monotonic()
            time.sleep(0.02)
        answer, answered_at, at_answer = pending.result()

    print(
        f"GPU 1's prepare took {gpu1_took:.2f} s while GPU 0's switch was pending; the switch took "
        f"{(served_at or answered_at) - start:.1f} s, team-b's prepare answered after {answered_at - start:.1f} s"
    )
    assert then.trust_domain == old and still_waiting, "GPU 1's prepare waited for GPU 0's switch"
    assert waiting_entry["state"] == "PrepareStarted" and "mpsSwitchUntil" in waiting_entry, waiting_entry
    assert answer.error == "", f"{answer.error}\n--- plugin log:\n{node.plugin.log()}"
    assert at_answer is not None and (at_answer.trust_domain, at_answer.state) == (new, "running"), at_answer
    assert at_answer.pid != old_pid, "a fresh daemon for team-b"
    assert node.checkpoint()[switching[1]]["mpsTrustDomain"] == new
    node.holders[0] = switching
