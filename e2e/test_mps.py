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
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import workloads as w
from e2e.install import CHART, NAMESPACE, PROFILE, RELEASE, Installation
from harness.mocknvml import read_profile

MPS_CLASS = "mps.gpu.fracgpu.dev"
UUID = read_profile(PROFILE)["gpu.0.uuid"]
SMS = int(read_profile(PROFILE)["gpu.0.sm_count"])
SUPERVISOR = "app.kubernetes.io/component=mps"
PLUGIN = "app.kubernetes.io/component=kubelet-plugin"


def mps_root(installation: Installation) -> Path:
    return installation.cluster.short_dir / "mps"


def _upgrade(installation: Installation, gpus: str) -> None:
    """`helm upgrade --reuse-values` with `mps.gpus` = `gpus`, then until the plugin has rolled."""
    root = mps_root(installation)
    values = [
        f"mps.gpus={gpus}", f"mps.root={root}", "mps.hostNetwork=true", "mps.metricsPort=0",
        "deviceClass.mps.create=true",
        f"mps.extraEnv[0].name=FRACGPU_MOCK_NVML_PROFILE,mps.extraEnv[0].value=/opt/fracgpu/nvml-host/{PROFILE.name}",
        # the mock driver's "kernel" state (compute modes, which server holds a GPU) and its device nodes
        f"mps.extraEnv[1].name=FRACGPU_MOCK_NVML_STATE_DIR,mps.extraEnv[1].value={root}",
        "mps.extraEnv[2].name=FRACGPU_MOCK_NVML_DEV_ROOT,mps.extraEnv[2].value=/driver-root",
        "mps.extraEnv[3].name=FRACGPU_REFRESH,mps.extraEnv[3].value=1",
    ]  # fmt: skip
    installation.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
        *[arg for v in values for arg in ("--set-string" if v.startswith(("mps.gpus", "mps.extraEnv")) else "--set", v)],
        "--wait", "--timeout=300s",
    )  # fmt: skip
    installation.cluster.kubectl("rollout", "status", "-n", NAMESPACE, plugin_daemonset(installation), "--timeout=300s")


def plugin_daemonset(installation: Installation) -> str:
    (name,) = installation.cluster.kubectl(
        "get", "daemonset", "-n", NAMESPACE, "-l", PLUGIN, "-o", "name"
    ).stdout.split()
    return name


def status(installation: Installation) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((mps_root(installation) / UUID / "status.json").read_text())
    return found


def wait_for(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"not within {timeout} s: {what}")


def compute_mode(installation: Installation) -> int:
    path = mps_root(installation) / f"compute_mode.{UUID}"
    return int(path.read_text().strip()) if path.exists() else 0


@pytest.fixture(scope="module")
def mps_gpu0(installation: Installation) -> Iterator[None]:
    """The release with both GPUs MPS GPUs (GPU 0 takes the first namespace's pods); MPS off again afterwards,
    whatever happened."""
    try:
        _upgrade(installation, "all")
        wait_for("GPU 0's daemon running", lambda: status(installation)["state"] == "running")
        yield
    finally:
        _upgrade(installation, "")
        cluster = installation.cluster
        wait_for(
            "the fracgpu-mps pod gone",
            lambda: not cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", SUPERVISOR, "-o", "name").stdout,
        )


def control(installation: Installation, *commands: str) -> str:
    """The host's (mock) driver control client against GPU 0's daemon."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps_root(installation) / UUID / "pipe"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(installation.driver.mps_control)], input="".join(f"{c}\n" for c in commands), env=env,
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return done.stdout


def mps_template(name: str, memory: str, percent: int) -> dict[str, Any]:
    config = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": percent}
    template = w.claim_template(name, memory, config)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = MPS_CLASS
    return template


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


def mps_gpu_of(installation: Installation, namespace: str, pod: str) -> tuple[str, str]:
    """(device, UUID) of the MPS GPU the pod's claim got."""
    claim = w.claim_of(installation.cluster, namespace, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = str(result["device"])
    return device, read_profile(PROFILE)[f"gpu.{device.removeprefix('gpu-')}.uuid"]


def gpu_status(installation: Installation, uuid: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((mps_root(installation) / uuid / "status.json").read_text())
    return found


def control_of(installation: Installation, uuid: str, *commands: str) -> list[str]:
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps_root(installation) / uuid / "pipe"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(installation.driver.mps_control)], input="".join(f"{c}\n" for c in commands), env=env,
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return done.stdout.split()


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
