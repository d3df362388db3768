"""The nvml enforcement tier end to end: NVIDIA's real `nvidia-cdi-hook apply-cuda-memory-limits`, run by runc for
a container started from a fracgpu claim spec, and the real plugin on this cgroup-v1 node offering no nvml.

What is real in the hook test: the claim spec (plan_claim, written by store.write_spec), NVIDIA's
nvidia-container-runtime v1.20.2 in CDI mode applying it to the bundle's config.json (the CDI library upstream
runtimes use), runc creating the container (its process in a real cgroup v2 directory) and running the
createRuntime hook, the hook itself (reads the OCI state on stdin and the bundle's env, checks cgroup v2 by
statfs of /sys/fs/cgroup, resolves the container's cgroup from /proc/<pid>/cgroup, finds libnvidia-ml.so.1 in
the driver root, calls NVML through go-nvml). What is not: the driver (our mock NVML, compiled into a fake driver
root, records the call instead of capping memory), and the cgroup v2 view: this machine is hybrid v1, so runc
and the hook run in a private mount namespace where the host's real cgroup2 hierarchy
(/sys/fs/cgroup/unified, hugetlb only) is bind-mounted at /sys/fs/cgroup and /dev is a tmpfs holding the
GPU's device node (the mock enumerates GPUs whose node it can open, as the real driver does). The tiers of
the GPU are given to plan_claim as a cgroup-v2 node would detect them; the v1 test shows the hook refusing
this machine's real layout, and the plugin test that the plugin never offers nvml here.
"""

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api.quantity import MiB
from harness import kube, mocknvml
from harness.cluster import binaries
from harness.cluster.controlplane import ControlPlane
from harness.mocknvml import PROFILES, read_profile
from harness.mocknvml.driver_root import LIBDIR, DriverInstall, install_driver, make_faithful_driver_root
from harness.nodeplugin import DRIVER, NodePluginProcess, toolkit_args
from kubelet_plugin.core.devicenodes import snapshot
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.tiers import NodeFacts, NvmlLimits, gpu_tiers
from kubelet_plugin.kinds.gpu.plan import NVML_HOOK
from kubelet_plugin.prepare.plan import HostFacts, plan_claim
from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state import claim_files as store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mount namespaces, mknod, runc"),
]

PROFILE = PROFILES / "gpu80x2.profile"
UNIFIED = Path("/sys/fs/cgroup/unified")
CGROUP_PARENT = "fracgpu-nvml-test"
CLAIM_UID = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"
SHARE = "a671734a-e8e5-11e4-8fde-42010af09327"
GRANT = "10Gi"
GRANT_MIB = 10240

# Run in a private mount namespace (unshare -m): cgroup2 where the hook looks, a /dev with the GPU's node, then
# the real runtime creates the container; the container's cgroup is saved before it is deleted.
NAMESPACE_SCRIPT = r"""
set -eu
mount --make-rprivate /
if [ "$CGROUP_V2" = 1 ]; then mount --bind /sys/fs/cgroup/unified /sys/fs/cgroup; fi
stat -f -c %T /sys/fs/cgroup > "$BASE/fstype"
mount -t tmpfs -o mode=755,nosuid tmpfs /dev
for n in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=: read -r name major minor <<<"$n"; mknod -m 666 "/dev/$name" c "$major" "$minor"
done
mknod -m 666 "/dev/nvidia$GPU_MINOR" c 195 "$GPU_MINOR"; mknod -m 666 /dev/nvidiactl c 195 255
NVIDIA_CTK_CONFIG_FILE_PATH="$BASE/runtime.toml" "$RUNTIME" --root "$BASE/runc" create --bundle "$BASE/bundle" ctr
runc --root "$BASE/runc" state ctr > "$BASE/state.json"
pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$BASE/state.json")
grep '^0::' "/proc/$pid/cgroup" > "$BASE/cgroup.txt"
if [ -d "/sys/fs/cgroup$(cut -d: -f3- "$BASE/cgroup.txt")" ]; then echo yes > "$BASE/cgroup-dir"; fi
runc --root "$BASE/runc" delete -f ctr
"""


@dataclass(frozen=True)
class Node:
    base: Path
    driver: DriverInstall
    record: Path
    settings: Settings
    gpu: GpuInfo
    runtime: Path


@pytest.fixture
def node() -> Iterator[Node]:
    """A fake driver root whose mock NVML records limits calls (path in its compiled-in profile: the runtime
    starts hooks with the hook's env only), NVIDIA's hook installed where driver edits put it, plugin dirs."""
    toolkit = binaries.ensure_built("nvidia-cdi-hook", "nvidia-container-runtime")
    base = Path(tempfile.mkdtemp(prefix="fracgpu-nvml-", dir="/tmp"))
    base.chmod(0o755)
    record = base / "limits.jsonl"
    profile = base / "recording.profile"
    profile.write_text(PROFILE.read_text() + f"\nmemory_limits_record = {record}\n")
    try:
        driver = make_faithful_driver_root(base / "root", profile, base / "build")
        settings = Settings(
            node_name="node-a",
            driver_root=driver.root,
            kubelet_dir=base / "kubelet",
            cdi_dir=base / "cdi",
            dev_char_dir=base / "dev-char",
            driver_edits="toolkit",
        )
        settings.cdi_hook_path.parent.mkdir(parents=True)
        shutil.copy2(toolkit["nvidia-cdi-hook"], settings.cdi_hook_path)
        values = read_profile(PROFILE)
        gpu = GpuInfo(
            index=1,
            uuid=values["gpu.1.uuid"],
            product_name=values["gpu.1.name"],
            memory_total_bytes=int(values["gpu.1.memory_mib"]) * MiB,
            minor=int(values["gpu.1.minor"]),
            pci_bus_id=values["gpu.1.pci_bus_id"],
            architecture="Hopper",
            cuda_compute_capability="9.0",
            driver_version=driver.version,
        )
        yield Node(base, driver, record, settings, gpu, toolkit["nvidia-container-runtime"])
    finally:
        subprocess.run(["runc", "--root", str(base / "runc"), "delete", "-f", "ctr"], capture_output=True, check=False)
        for parent in (UNIFIED / CGROUP_PARENT, *(Path("/sys/fs/cgroup") / c / CGROUP_PARENT for c in _v1())):
            for child in parent.glob("*") if parent.is_dir() else []:
                if child.is_dir():
                    child.rmdir()
            if parent.is_dir():
                parent.rmdir()
        shutil.rmtree(base, ignore_errors=True)


def _v1() -> list[str]:
    root = Path("/sys/fs/cgroup")
    return [p.name for p in root.iterdir() if p.is_dir() and p.name != "unified"] if root.is_dir() else []


def driver_edits(driver: DriverInstall) -> cdi.ContainerEdits:
    """Driver edits as the toolkit gives them, cut to the two libraries (the generated ldcache/symlink hooks
    need a libc in the container; this container is a static program)."""
    options = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    return cdi.ContainerEdits(
        mounts=[
            cdi.Mount(host_path=str(driver.libdir / lib), container_path=f"/{LIBDIR}/{lib}", options=options)
            for lib in (f"libnvidia-ml.so.{driver.version}", f"libcuda.so.{driver.version}")
        ]
    )


def write_claim_spec(node: Node) -> tuple[str, Any]:
    """Plan and write the claim's spec and info file as the plugin does, on a node that offers nvml."""
    result = {
        "driver": DRIVER,
        "pool": node.settings.node_name,
        "device": node.gpu.device_name,
        "request": "gpu",
        "shareID": SHARE,
        "consumedCapacity": {"memory": GRANT},
    }
    claim = {
        "metadata": {"uid": CLAIM_UID, "name": "claim", "namespace": "team-a"},
        "status": {"allocation": {"devices": {"results": [result], "config": []}}},
    }
    every_fact = NodeFacts(cgroup_problem=None, driver_edits_problem=None, hami_core_problem="no HAMi-core here")
    tiers = {node.gpu.device_name: gpu_tiers(every_fact, NvmlLimits(problem=None))}
    nodes = snapshot(node.settings.driver_root, [node.gpu.minor])
    facts = HostFacts(
        gpus={node.gpu.device_name: node.gpu}, nodes=nodes, tiers=tiers, driver_edits=driver_edits(node.driver)
    )
    plan = plan_claim(claim, node.settings, facts)
    assert plan.spec is not None
    assert plan.tiers == ((node.settings.node_name, node.gpu.device_name, SHARE, "nvml"),)
    store.write_claim_files(container_info.claim_info_dir(node.settings.plugin_data_dir, CLAIM_UID), plan.claim_files())
    store.write_spec(node.settings.cdi_dir, CLAIM_UID, plan.spec, DRIVER)
    return plan.devices[0].cdi_device_ids[0], plan


def make_bundle(node: Node, cdi_device: str) -> Path:
    """An OCI bundle (runc spec) running a static pause, asking for the claim's CDI device by annotation."""
    bundle = node.base / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    pause = Path(__file__).resolve().parents[2] / "harness" / "image" / "pause.c"
    subprocess.run(["gcc", "-static", "-O2", "-o", str(bundle / "rootfs" / "pause"), str(pause)], check=True)
    subprocess.run(["runc", "spec", "-b", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"].update(args=["/pause"], terminal=False)
    config["linux"]["cgroupsPath"] = f"/{CGROUP_PARENT}/{node.base.name}"
    config["annotations"] = {"cdi.k8s.io/fracgpu": cdi_device}
    (bundle / "config.json").write_text(json.dumps(config))
    (node.base / "runtime.toml").write_text(
        "[nvidia-container-runtime]\n"
        'mode = "cdi"\n'
        'runtimes = ["runc"]\n'
        "[nvidia-container-runtime.modes.cdi]\n"
        f'spec-dirs = ["{node.settings.cdi_dir}"]\n'
        'annotation-prefixes = ["cdi.k8s.io/"]\n'
        'default-kind = "nvidia.com/gpu"\n'
    )
    return bundle


def run_container(node: Node, *, cgroup_v2: bool) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "BASE": str(node.base),
        "RUNTIME": str(node.runtime),
        "GPU_MINOR": str(node.gpu.minor),
        "CGROUP_V2": "1" if cgroup_v2 else "0",
    }
    return subprocess.run(
        ["unshare", "-m", "bash", "-c", NAMESPACE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_nvidia_hook_caps_the_container_cgroup_at_the_claims_grant(node: Node) -> None:
    if not (UNIFIED / "cgroup.procs").is_file():
        pytest.fail(f"{UNIFIED} is not a cgroup2 mount on this machine: the test needs the host's unified hierarchy")
    cdi_device, _ = write_claim_spec(node)
    bundle = make_bundle(node, cdi_device)
    done = run_container(node, cgroup_v2=True)
    assert done.returncode == 0, done.stderr
    assert (node.base / "fstype").read_text().strip() == "cgroup2fs"

    # what the CDI library put into the container's OCI spec: our hook for this GPU and the grant as env
    config = json.loads((bundle / "config.json").read_text())
    (hook,) = config["hooks"]["createRuntime"]
    assert hook["path"] == str(node.settings.cdi_hook_path)
    assert hook["args"] == [
        *("nvidia-cdi-hook", NVML_HOOK, "--driver-root", str(node.driver.root), "--gpu-id", node.gpu.uuid)
    ]
    env = config["process"]["env"]
    assert f"NVIDIA_GPU_MEMORY_REQUEST={GRANT_MIB}" in env and f"NVIDIA_GPU_MEMORY_LIMIT={GRANT_MIB}" in env
    prefix = container_info.env_prefix(cdi_device.partition("=")[2])
    assert f"{prefix}ENFORCEMENT=nvml" in env

    # the hook called the driver once: this GPU, this container's cgroup, this claim's grant
    cgroup = (node.base / "cgroup.txt").read_text().strip().removeprefix("0::")
    assert cgroup == f"/{CGROUP_PARENT}/{node.base.name}"
    assert (node.base / "cgroup-dir").read_text().strip() == "yes"  # a real cgroup v2 directory
    calls = [json.loads(line) for line in node.record.read_text().splitlines()]
    assert calls == [
        {
            "uuid": node.gpu.uuid,
            "cgroup": f"/sys/fs/cgroup{cgroup}",
            "soft": GRANT_MIB * MiB,
            "hard": GRANT_MIB * MiB,
            "return": 0,
        }
    ]


def test_the_hook_refuses_this_nodes_cgroup_v1(node: Node) -> None:
    """Without the cgroup2 view the same container fails to start: the hook refuses v1 (and never calls NVML)."""
    cdi_device, _ = write_claim_spec(node)
    make_bundle(node, cdi_device)
    done = run_container(node, cgroup_v2=False)
    assert (node.base / "fstype").read_text().strip() == "tmpfs"
    assert done.returncode != 0
    assert "setting GPU memory limits is only supported in cgroup v2" in done.stderr, done.stderr
    assert not node.record.exists()


def test_plugin_on_this_cgroup_v1_node_offers_no_nvml(
    toolkit: dict[str, Path],
    control_plane: ControlPlane,
    *,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    """The real plugin with driver edits on this hybrid-v1 machine: GPUs publish memoryEnforcement none, a claim
    gets no hook and says none (env, file, MemoryEnforcement condition), a claim demanding nvml is refused."""
    node_name = kube.unique("nvmlnode")
    kube.create_fake_node(api_client, node_name)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgnv-", dir="/tmp"))  # short: unix socket paths
    workdir.chmod(0o755)
    enforced = f"enforced-{namespace}"
    core = client.CoreV1Api(api_client)
    process = NodePluginProcess(
        workdir,
        node_name,
        control_plane.kubeconfig,
        PROFILE,
        mocknvml.build(workdir / "nvml"),
        *toolkit_args(toolkit),
    )
    install_driver(process.driver_root, PROFILE, workdir / "build")
    kubelet = process.start()
    try:
        slices = kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice")

        def published() -> list[Any] | None:
            items = slices.get(field_selector=f"spec.nodeName={node_name}").to_dict()["items"]
            return [d for s in items for d in s["spec"]["devices"]] or None

        devices = kube.wait_for(published, 30, what="ResourceSlices")
        assert {d["attributes"]["memoryEnforcement"]["string"] for d in devices} == {"none"}

        (plain,) = kube.allocate_claims(api_client, dyn, namespace, node_name, device_class=DRIVER, memories=["4Gi"])
        uid = plain["metadata"]["uid"]
        response = kubelet.prepare([(namespace, uid, plain["metadata"]["name"])])
        assert response.claims[uid].error == "", process.log()
        text = cdi.spec_path(process.cdi_dir, DRIVER, uid).read_text()
        assert NVML_HOOK not in text and "NVIDIA_GPU_MEMORY_" not in text
        (device,) = cdi.Spec.model_validate_json(text).devices
        assert f"{container_info.env_prefix(device.name)}ENFORCEMENT=none" in device.container_edits.env
        (info_file,) = (process.kubelet_dir / "plugins" / DRIVER / "claim-info" / uid).glob("*.json")
        info = json.loads(info_file.read_text())
        assert (info["enforcement"], info["devices"][0]["enforcement"]) == ("none", "none")
        claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")

        def condition() -> dict[str, Any] | None:
            status = claims.get(namespace=namespace, name=plain["metadata"]["name"]).to_dict()["status"]
            for entry in status.get("devices") or []:
                for c in entry.get("conditions") or []:
                    if c["type"] == "MemoryEnforcement":
                        return dict(c)
            return None

        found = kube.wait_for(condition, 30, what="MemoryEnforcement condition")
        assert (found["status"], found["reason"]) == ("False", "None")

        config = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "enforcement": "nvml"}
        (strict,) = kube.allocate_claims(
            api_client, dyn, namespace, node_name, device_class=DRIVER, memories=["4Gi"], config=config
        )
        uid = strict["metadata"]["uid"]
        error = kubelet.prepare([(namespace, uid, strict["metadata"]["name"])]).claims[uid].error
        assert "the claim's GpuConfig asks for enforcement 'nvml'" in error, error
        assert "no cgroup v2 unified hierarchy at /sys/fs/cgroup" in error, error
        assert not cdi.spec_path(process.cdi_dir, DRIVER, uid).exists()
        kubelet.unprepare([(namespace, plain["metadata"]["uid"], plain["metadata"]["name"])])

        # the chart's DeviceClass of enforced GPUs: no GPU here enforces, so the real scheduler leaves the pod
        # Pending and says why
        expression = (
            f'"memoryEnforcement" in device.attributes["{DRIVER}"] && '
            f'device.attributes["{DRIVER}"].memoryEnforcement != "none"'
        )
        kube.resource(dyn, "resource.k8s.io/v1", "DeviceClass").create(
            body={
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": enforced},
                "spec": {
                    "selectors": [
                        {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                        {"cel": {"expression": expression}},
                    ]
                },
            }
        )
        pod = kube.unique("pod")
        templates = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
        templates.create(namespace=namespace, body=kube.claim_template(pod, enforced, "4Gi"))
        core.create_namespaced_pod(namespace, kube.pod_with_claim(pod, pod, node_name))

        def unschedulable() -> str | None:
            conditions = core.read_namespaced_pod(pod, namespace).status.conditions or []
            return next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

        reason = kube.wait_for(unschedulable, 60, what="the enforced pod's PodScheduled=False")
        assert "cannot allocate all claims" in reason, reason
        assert core.read_namespaced_pod(pod, namespace).status.phase == "Pending"
    finally:
        kubelet.close()
        process.stop()
        resource_api = client.ResourceV1Api(api_client)
        if kube.exists(lambda: resource_api.read_device_class(enforced)):
            resource_api.delete_device_class(enforced)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def toolkit() -> dict[str, Path]:
    return binaries.ensure_built("nvidia-ctk", "nvidia-cdi-hook")
