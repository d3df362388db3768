"""The mps tier on the e2e node: the chart's fracgpu-mps DaemonSet runs the (mock) driver's MPS control daemon for
GPU 0, and pods of MPS claims run CUDA (the mock libcuda, an MPS client as NVIDIA documents it) in containers
made from their claim specs.

What is real: the chart, the supervisor (kubelet_plugin/mps_supervisor) setting the compute mode through NVML and running
the daemon binary from the driver root, the node plugin reading its status, setting the GPU's ceiling through the
driver's control client and writing CDI specs, containerd applying them, the kubelet and the scheduler. What is
not: the driver (harness/mocknvml: the daemon, the server and libcuda enforce the limits themselves).
"""

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import workloads as w
from e2e.install import NAMESPACE, Installation
from e2e.mps import (
    MPS_CLASS,
    PLUGIN,
    SMS,
    SUPERVISOR,
    UUID,
    compute_mode,
    control,
    control_of,
    gpu_status,
    mps_gpu_of,
    mps_root,
    mps_template,
    plugin_daemonset,
    status,
    upgrade,
    wait_for,
)


@pytest.fixture(scope="module")
def mps_gpu0(installation: Installation) -> Iterator[None]:
    """The release with both GPUs MPS GPUs (GPU 0 takes the first namespace's pods); MPS off again afterwards,
    whatever happened."""
    try:
        upgrade(installation, "all")
        wait_for("GPU 0's daemon running", lambda: status(installation)["state"] == "running")
        yield
    finally:
        upgrade(installation, "")
        cluster = installation.cluster
        wait_for(
            "the fracgpu-mps pod gone",
            lambda: not cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", SUPERVISOR, "-o", "name").stdout,
        )


def probe_script(grant_mib: int, raised_mib: int, above_mib: int) -> str:
    """Tagged lines: the env; a probe over the grant; with the env raised to 40Gi, probes of `raised_mib` and
    `above_mib`; then one holding 1 GiB under its grant, alive until the container stops."""
    raise_env = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"
    return f"""
echo "ENV $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ${{CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-}}"
echo "OVER $(cuda-probe {grant_mib + 1024} 2>&1 | tr '\\n' ' ')"
echo "RAISED $({raise_env} cuda-probe {raised_mib} 2>&1 | tr '\\n' ' ')"
echo "ABOVE $({raise_env} cuda-probe {above_mib} 2>&1 | tr '\\n' ' ')"
cuda-probe {grant_mib - 1024} 100000 > /tmp/hold.json 2>&1 &
while [ ! -s /tmp/hold.json ]; do sleep 0.2; done
echo "HOLD $(head -n1 /tmp/hold.json)"
echo END
wait
"""


def alloc(seen: dict[str, list[str]], tag: str) -> tuple[str, dict[str, Any]]:
    probe: dict[str, Any] = json.loads(seen[tag][0])
    return probe["alloc"]["result"], probe


def test_two_mps_shares_run_at_once_within_their_limits_and_outlive_a_plugin_restart(
    installation: Installation, mps_gpu0: None, ns: str
) -> None:
    """10Gi/30 % and 20Gi/50 % MPS shares of GPU 0, pods of two UIDs: each reads back its own limits, an
    allocation beyond its grant fails, a raised environment gets at most the GPU's ceiling (the largest grant),
    both hold memory at once as clients of one daemon, and `kubectl rollout restart` of the plugin cuts neither
    them nor the daemon."""
    cluster = installation.cluster
    assert compute_mode(installation) == 3, "the supervisor set EXCLUSIVE_PROCESS through NVML"
    w.apply(cluster, ns, mps_template("mps-10", "10Gi", 30), mps_template("mps-20", "20Gi", 50))
    big = w.pod("big", {"gpu": "mps-20"}, {"app": ["gpu"]}, 2000, image=installation.workload_image,
                script=probe_script(20480, 15360, 25600))  # fmt: skip
    w.apply(cluster, ns, big)  # first: the ceiling is 20Gi when the small one starts
    w.wait_running(cluster, ns, ["big"])
    seen_big = w.cuda_report(cluster, ns, "big", timeout=60)
    small = w.pod("small", {"gpu": "mps-10"}, {"app": ["gpu"]}, 1000, image=installation.workload_image,
                  script=probe_script(10240, 15360, 25600))  # fmt: skip
    w.apply(cluster, ns, small)
    w.wait_running(cluster, ns, ["small"])
    seen_small = w.cuda_report(cluster, ns, "small", timeout=60)

    for seen, grant, percent in ((seen_small, 10240, 30), (seen_big, 20480, 50)):
        assert seen["ENV"] == [f"/run/fracgpu-mps/pipe 0={grant}M {percent}"], seen
        result, over = alloc(seen, "OVER")
        assert result == "CUDA_ERROR_OUT_OF_MEMORY", f"an allocation beyond the {grant} MiB grant: {over}"
        (device,) = over["devices"]
        assert device["uuid"] == UUID and device["free_mib"] <= grant, over
        assert device["multiprocessor_count"] == SMS * percent // 100, over
        assert alloc(seen, "ABOVE")[0] == "CUDA_ERROR_OUT_OF_MEMORY", f"25Gi with a raised env: {seen}"
        held, hold = alloc(seen, "HOLD")
        assert held == "CUDA_SUCCESS", hold
    # the documented outcome of a raised environment: up to the GPU's ceiling, the largest grant (20Gi)
    assert alloc(seen_small, "RAISED")[0] == "CUDA_SUCCESS", "15Gi in the 10Gi share with its env raised to 40Gi"
    assert alloc(seen_big, "RAISED")[0] == "CUDA_SUCCESS"
    assert control(installation, "get_default_device_pinned_mem_limit 0").strip() == "20480M"
    assert control(installation, "get_default_active_thread_percentage").strip() == "50.0"

    def clients() -> list[str]:
        (server,) = control(installation, "get_server_list").split()
        return control(installation, f"get_client_list {server}").split()

    assert len(clients()) == 2, "both holding probes are clients of GPU 0's one server"
    daemon = status(installation)
    supervisor = w.get(cluster, "pods", "-n", NAMESPACE, "-l", SUPERVISOR)["items"][0]["metadata"]["uid"]

    cluster.kubectl("rollout", "restart", "-n", NAMESPACE, plugin_daemonset(installation))
    cluster.kubectl("rollout", "status", "-n", NAMESPACE, plugin_daemonset(installation), "--timeout=300s")
    after = status(installation)
    assert (after["pid"], after["restarts"]) == (daemon["pid"], daemon["restarts"]), "the daemon was restarted"
    assert w.get(cluster, "pods", "-n", NAMESPACE, "-l", SUPERVISOR)["items"][0]["metadata"]["uid"] == supervisor
    assert len(clients()) == 2, "the clients lost their server across the plugin's restart"
    for name in ("small", "big"):
        state = w.get(cluster, "pod", "-n", ns, name)["status"]["containerStatuses"][0]
        assert state["restartCount"] == 0 and "running" in state["state"], state


def test_a_killed_daemon_is_reported_restarted_and_a_stopped_one_refuses_new_shares(
    installation: Installation, mps_gpu0: None, ns: str
) -> None:
    """SIGKILL of GPU 0's daemon: the supervisor restarts it and the plugin posts MpsDaemonDown or
    MpsDaemonRestarted on the Node. The supervisor's pod stopped (its DaemonSet kept off the node): the compute
    mode is restored, the device is tainted, a share that tolerates the taint is refused at prepare with the
    cause; back on the node, the daemon runs again and the waiting pod starts."""
    cluster = installation.cluster
    node = cluster.node_name
    before = status(installation)
    os.kill(int(before["pid"]), signal.SIGKILL)
    wait_for("the daemon restarted", lambda: status(installation)["restarts"] > before["restarts"])
    wait_for("running again", lambda: status(installation)["state"] == "running")

    def node_events(*reasons: str) -> list[str]:
        listed = w.get(cluster, "events", "-n", "default", f"--field-selector=involvedObject.name={node}")
        return [e["reason"] for e in listed["items"] if e["reason"] in reasons]

    try:
        wait_for("an MPS Event on the Node", lambda: node_events("MpsDaemonDown", "MpsDaemonRestarted"), 60)
    except TimeoutError as err:
        logs = cluster.kubectl("logs", "-n", NAMESPACE, "-l", PLUGIN, "--tail=40", check=False).stdout
        listed = cluster.kubectl("get", "events", "-A", check=False).stdout
        raise AssertionError(
            f"{err}\nplugin:\n{logs}\nevents:\n{listed[-4000:]}\nstatus: {status(installation)}"
        ) from None

    off = '{"spec":{"template":{"spec":{"nodeSelector":{"fracgpu.dev/e2e-no-node":"x"}}}}}'
    (supervisor_ds,) = cluster.kubectl(
        "get", "daemonset", "-n", NAMESPACE, "-l", SUPERVISOR, "-o", "name"
    ).stdout.split()
    cluster.kubectl("patch", "-n", NAMESPACE, supervisor_ds, "--type=merge", "-p", off)
    try:
        wait_for("the daemon down", lambda: status(installation)["state"] == "down")
        assert status(installation)["reason"] == "the MPS supervisor stopped"
        assert compute_mode(installation) == 0, "the compute mode the GPU had is restored"

        def tainted() -> bool:
            slices = w.get(cluster, "resourceslices")["items"]
            devices = [d for s in slices for d in s["spec"].get("devices", []) if d["name"] == "gpu-0"]
            return any(t["key"] == "gpu.fracgpu.dev/mps-daemon-down" for d in devices for t in d.get("taints", []))

        wait_for("gpu-0 tainted", tainted)
        template = mps_template("mps-5", "5Gi", 20)
        exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        exactly["tolerations"] = [{"key": "gpu.fracgpu.dev/mps-daemon-down", "operator": "Exists"}]
        waiting = w.pod("waiting", {"gpu": "mps-5"}, {"app": ["gpu"]}, image=installation.workload_image,
                        script="echo END; sleep 100000")  # fmt: skip
        w.apply(cluster, ns, template, waiting)

        def refused() -> str:
            events = w.get(cluster, "events", "-n", ns, "--field-selector=involvedObject.name=waiting")["items"]
            # the kubelet's own transient failures (the node authorizer's "no relationship found" race) come first
            return next(
                (
                    e["message"]
                    for e in events
                    if e["reason"] == "FailedPrepareDynamicResources" and "MPS" in e["message"]
                ),
                "",
            )

        message = wait_for("the prepare refused", refused)
        assert "is an MPS GPU, where every share is an MPS client" in message, message
        assert "the MPS supervisor stopped" in message, message
        assert node_events("MpsDaemonDown")
    finally:
        cluster.kubectl("patch", "-n", NAMESPACE, supervisor_ds, "--type=json",
                        "-p", '[{"op":"remove","path":"/spec/template/spec/nodeSelector/fracgpu.dev~1e2e-no-node"}]')  # fmt: skip
    wait_for("running again", lambda: status(installation)["state"] == "running")
    assert compute_mode(installation) == 3
    assert wait_for("recovered", lambda: node_events("MpsDaemonRecovered"))
    w.wait_running(cluster, ns, ["waiting"], timeout=240)


TENANT_SCRIPT = """
echo "SHM $(grep ' /dev/shm ' /proc/self/mounts)"
echo "PIPE $(grep ' /run/fracgpu-mps/pipe ' /proc/self/mounts)"
echo "CUDA_VISIBLE_DEVICES ${CUDA_VISIBLE_DEVICES-}"
echo "secret of $(hostname)" > /dev/shm/secret-$(hostname)
echo "SHMLS $(ls /dev/shm | tr '\\n' ' ')"
echo "UNLINK $(rm -f /run/fracgpu-mps/pipe/control 2>&1 || true)"
echo "CREATE $(touch /run/fracgpu-mps/pipe/impostor 2>&1 || true)"
echo "PROBE $(cuda-probe 1024 2>&1 | tr '\\n' ' ')"
echo END
sleep 100000
"""


def test_two_namespaces_are_two_trust_domains_that_cannot_reach_each_other(
    installation: Installation, mps_gpu0: None, ns: str
) -> None:
    """Pods of two namespaces on the node's two MPS GPUs (kept apart by the scheduler, the controller's binding
    conditions and taints). From a root container of the first: its pipe directory is read-only (the control socket
    can be neither removed nor replaced), its /dev/shm is a tmpfs of its own, and the control commands it sends
    (`set_default_*`, then `quit`) reach its own domain's daemon only; the other domain's daemon, limits and /dev/shm
    stay as they were. The change within the first domain is read back, set back, and reported (MpsLimitsChanged)."""
    cluster = installation.cluster
    with w.fresh_namespace(cluster) as other:
        for namespace, name in ((ns, "tenant-a"), (other, "tenant-b")):
            w.apply(cluster, namespace, mps_template("mps-10", "10Gi", 30))
            body = w.pod(name, {"gpu": "mps-10"}, {"app": ["gpu"]}, image=installation.workload_image,
                         script=TENANT_SCRIPT)  # fmt: skip
            w.apply(cluster, namespace, body)
        w.wait_running(cluster, ns, ["tenant-a"])
        w.wait_running(cluster, other, ["tenant-b"])
        seen_a, seen_b = w.cuda_report(cluster, ns, "tenant-a", 60), w.cuda_report(cluster, other, "tenant-b", 60)
        (device_a, uuid_a), (device_b, uuid_b) = (
            mps_gpu_of(installation, ns, "tenant-a"),
            mps_gpu_of(installation, other, "tenant-b"),
        )
        assert device_a != device_b, "two namespaces on one MPS GPU's daemon"
        assert gpu_status(installation, uuid_a)["trustDomain"] == f"namespace/{ns}"
        assert gpu_status(installation, uuid_b)["trustDomain"] == f"namespace/{other}"
        for seen, uuid in ((seen_a, uuid_a), (seen_b, uuid_b)):
            (shm,) = seen["SHM"]
            assert shm.split()[2] == "tmpfs" and {"nosuid", "nodev", "noexec"} <= set(shm.split()[3].split(",")), shm
            (pipe,) = seen["PIPE"]
            assert "ro" in pipe.split()[3].split(","), f"the pipe directory is writable: {pipe}"
            assert seen["CUDA_VISIBLE_DEVICES"] == [uuid]
            assert "Read-only file system" in seen["UNLINK"][0] and "Read-only file system" in seen["CREATE"][0]
            assert json.loads(seen["PROBE"][0])["alloc"]["result"] == "CUDA_SUCCESS", seen["PROBE"]
        assert "secret-tenant-a" not in seen_b["SHMLS"][0] and "secret-tenant-b" not in seen_a["SHMLS"][0]
        assert (mps_root(installation) / uuid_a / "pipe" / "control").is_socket(), "a's socket is still the daemon's"

        before_b = gpu_status(installation, uuid_b)
        limits_b = control_of(installation, uuid_b, "get_default_device_pinned_mem_limit 0",
                              "get_default_active_thread_percentage")  # fmt: skip
        assert limits_b == ["10240M", "30.0"]
        raise_them = (
            "printf 'set_default_device_pinned_mem_limit 0 81920M\\nset_default_active_thread_percentage 100\\n'"
        )
        cluster.kubectl("exec", "-n", ns, "tenant-a", "--", "sh", "-c", f"{raise_them} | nvidia-cuda-mps-control")

        def repaired() -> bool:
            events = w.get(cluster, "events", "-n", ns, "--field-selector=reason=MpsLimitsChanged")["items"]
            limits = control_of(installation, uuid_a, "get_default_device_pinned_mem_limit 0",
                                "get_default_active_thread_percentage")  # fmt: skip
            return bool(events) and limits == ["10240M", "30.0"]

        wait_for("a's changed limits set back and reported on its claim", repaired, 60)
        restarts_a = gpu_status(installation, uuid_a)["restarts"]
        cluster.kubectl("exec", "-n", ns, "tenant-a", "--", "sh", "-c", "echo quit | nvidia-cuda-mps-control")

        def restarted() -> bool:
            now = gpu_status(installation, uuid_a)
            return bool(now["restarts"] > restarts_a and now["state"] == "running")

        wait_for("a's daemon restarted", restarted)
        after_b = gpu_status(installation, uuid_b)
        assert (after_b["pid"], after_b["restarts"]) == (before_b["pid"], before_b["restarts"]), (
            "b's daemon was touched"
        )
        assert control_of(installation, uuid_b, "get_default_device_pinned_mem_limit 0",
                          "get_default_active_thread_percentage") == limits_b  # fmt: skip
        again = cluster.kubectl("exec", "-n", other, "tenant-b", "--", "cuda-probe", "1024").stdout
        assert json.loads(again.splitlines()[0])["alloc"]["result"] == "CUDA_SUCCESS", "b lost its MPS server"


MIGRATING = Path(__file__).resolve().parents[1] / "docs" / "migrating.md"
COMPUTE_SCRIPT = """
echo "PERCENT ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-}"
echo "PROBE $(cuda-probe 1024 2>&1 | tr '\\n' ' ')"
echo END
sleep 100000
"""


def compute_template(name: str, percent: int) -> dict[str, Any]:
    """A 10Gi MPS share of GPU 0 (a selector on its index) reserving `percent` of its compute."""
    template = w.claim_template(name, "10Gi")
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["deviceClassName"] = MPS_CLASS
    exactly["capacity"]["requests"]["compute"] = str(percent)
    exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{w.DEVICE_CLASS}"].index == 0'}}]
    return template


def page_compute_template() -> dict[str, Any]:
    """The migration page's ResourceClaimTemplate that asks for `compute` (HAMi-DRA's `cores`, translated), as the
    page's ```yaml blocks hold it."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", MIGRATING.read_text(), re.MULTILINE | re.DOTALL)
    docs = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict)]
    (found,) = [
        d
        for d in docs
        if d.get("kind") == "ResourceClaimTemplate"
        and any("compute" in r.get("exactly", {}).get("capacity", {}).get("requests", {})
                for r in d["spec"]["spec"]["devices"]["requests"])
    ]  # fmt: skip
    return found


def compute_condition(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim's ComputeEnforcement condition (KeyError while the plugin has not set it)."""
    conditions = {c["type"]: c for d in claim["status"].get("devices", []) for c in d.get("conditions", [])}
    found: dict[str, Any] = conditions["ComputeEnforcement"]
    return found


def test_compute_50_twice_fills_an_mps_gpu_and_the_migration_pages_compute_claim_gets_its_percentage(
    installation: Installation, mps_gpu0: None, ns: str
) -> None:
    """Three pods of `compute: 50` (and 10Gi) aimed at GPU 0, one after the other: two run as MPS clients capped at
    50 % (their environment, the SMs the mock libcuda gives them, the daemon's ceiling, ComputeEnforcement), the
    third stays Pending with its claim unallocated. The migration page's claim (HAMi-DRA's `cores` as `compute`) then lands
    on GPU 1, GPU 0's compute being spent, and runs at the page's percentage (its `enforcement: hami-core` is
    below an MPS GPU's floor, so it runs there as an MPS client)."""
    cluster = installation.cluster
    page = page_compute_template()
    (request,) = page["spec"]["spec"]["devices"]["requests"]
    percent = int(request["exactly"]["capacity"]["requests"]["compute"])
    w.apply(cluster, ns, compute_template("half", 50), page)

    def pod(name: str, template: str) -> dict[str, Any]:
        return w.pod(name, {"gpu": template}, {"app": ["gpu"]}, image=installation.workload_image,
                     script=COMPUTE_SCRIPT)  # fmt: skip

    # one after the other: kube-scheduler v1.37 counts a share's capacity twice while it waits for its binding
    # conditions (docs/architecture.md, how the scheduler tries again), so a second share of the GPU's last compute
    # tried in those seconds would wait for the scheduler's 5-minute flush
    w.apply(cluster, ns, pod("half-a", "half"))
    w.wait_running(cluster, ns, ["half-a"])
    w.apply(cluster, ns, pod("half-b", "half"))
    w.wait_running(cluster, ns, ["half-b"])
    w.apply(cluster, ns, pod("half-c", "half"))
    assert "cannot allocate all claims" in w.unschedulable(cluster, ns, "half-c")
    assert "allocation" not in w.claim_of(cluster, ns, "half-c").get("status", {}), "the third claim is allocated"

    def capped(name: str, share: int) -> str:
        """The UUID of the pod's GPU, once its container and claim say `share` % of it."""
        seen = w.cuda_report(cluster, ns, name, timeout=60)
        assert seen["PERCENT"] == [str(share)], seen
        probe = json.loads(seen["PROBE"][0])
        (device,) = probe["devices"]
        assert probe["alloc"]["result"] == "CUDA_SUCCESS", probe
        assert device["multiprocessor_count"] == SMS * share // 100, probe
        condition = wait_for("ComputeEnforcement", lambda: compute_condition(w.claim_of(cluster, ns, name)), 60)
        assert (condition["status"], condition["reason"]) == ("True", "Mps"), condition
        assert f"ceiling {share} %" in condition["message"], condition
        return str(device["uuid"])

    assert [capped(name, 50) for name in ("half-a", "half-b")] == [UUID, UUID]
    assert control(installation, "get_default_active_thread_percentage").strip() == "50.0"

    w.apply(cluster, ns, pod("page", page["metadata"]["name"]))
    w.wait_running(cluster, ns, ["page"])
    device, uuid = mps_gpu_of(installation, ns, "page")
    assert device == "gpu-1", "GPU 0's compute is all reserved"
    assert capped("page", percent) == uuid
    assert control_of(installation, uuid, "get_default_active_thread_percentage") == [f"{percent}.0"]
