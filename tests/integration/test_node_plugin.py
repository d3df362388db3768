"""The node plugin against the real control plane (issue #3).

The plugin runs as a process with simulated GPUs (mock NVML, mknod-made nodes) for a fake Node; the real
scheduler allocates claims of pods onto the devices the plugin published; this test then speaks to the
plugin exactly as the kubelet would.
"""

import contextlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api.names import NUMA_NODE_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE
from harness import kube, mocknvml
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KubeletClient
from harness.nodeplugin import DRIVER, NodePluginProcess
from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state import claim_files as store

pytestmark = pytest.mark.integration
PROFILE = mocknvml.PROFILES / "gpu80x2.profile"


@dataclass
class Plugin:
    process: NodePluginProcess
    kubelet: KubeletClient
    node: str

    def restart(self, kill: bool = False) -> None:
        self.kubelet.close()
        if kill:
            self.process.kill()
        else:
            self.process.stop()
        self.kubelet = self.process.start()

    def slices(self, api_client: client.ApiClient) -> list[Any]:
        selector = f"spec.nodeName={self.node},spec.driver={DRIVER}"
        return list(client.ResourceV1Api(api_client).list_resource_slice(field_selector=selector).items)


@pytest.fixture(scope="module")
def plugin(control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient) -> Iterator[Plugin]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated GPUs' device nodes are made with mknod")
    node = kube.unique("gpunode")
    kube.create_fake_node(api_client, node)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgnp-", dir="/tmp"))  # short: unix socket paths ≤ 107 bytes
    nvml = mocknvml.build(workdir / "nvml")
    process = NodePluginProcess(workdir, node, control_plane.kubeconfig, PROFILE, nvml)
    plugin = Plugin(process, process.start(), node)
    kube.wait_for(lambda: plugin.slices(api_client), 30, what="ResourceSlices of the plugin")
    try:
        yield plugin
    finally:
        plugin.kubelet.close()
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _refs(claims: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]


def _spec(plugin: Plugin, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cdi.spec_path(plugin.process.cdi_dir, DRIVER, uid).read_text())
    return data


def _env(edits: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edits["env"])


def _gpus_by_device(plugin: Plugin, api_client: client.ApiClient) -> dict[str, dict[str, Any]]:
    devices = {}
    for s in plugin.slices(api_client):
        for d in api_client.sanitize_for_serialization(s)["spec"]["devices"]:
            devices[d["name"]] = d
    return devices


def test_publishes_each_gpu_shareable_by_memory(plugin: Plugin, api_client: client.ApiClient) -> None:
    (published,) = plugin.slices(api_client)
    body = api_client.sanitize_for_serialization(published)
    profile = mocknvml.read_profile(PROFILE)
    assert body["spec"]["pool"]["name"] == plugin.node
    assert body["spec"]["pool"]["resourceSliceCount"] == 1
    node_uid = client.CoreV1Api(api_client).read_node(plugin.node).metadata.uid
    assert body["metadata"]["ownerReferences"][0]["uid"] == node_uid
    devices = {d["name"]: d for d in body["spec"]["devices"]}
    assert sorted(devices) == ["gpu-0", "gpu-1"]
    for index in (0, 1):
        device = devices[f"gpu-{index}"]
        assert device["allowMultipleAllocations"] is True
        assert device["attributes"]["uuid"]["string"] == profile[f"gpu.{index}.uuid"]
        assert device["attributes"]["productName"]["string"] == "NVIDIA H100 80GB HBM3"
        assert device["attributes"]["resource.kubernetes.io/pciBusID"]["string"] == profile[f"gpu.{index}.pci_bus_id"]
        # the standard topology attributes, read from the driver root's sysfs (mocknvml.make_sysfs)
        assert device["attributes"][PCIE_ROOT_ATTRIBUTE] == {"string": profile[f"gpu.{index}.pcie_root"]}
        assert device["attributes"][NUMA_NODE_ATTRIBUTE] == {"int": int(profile[f"gpu.{index}.numa_node"])}
        # 81559 MiB rounded down to the 256 MiB step
        assert device["capacity"]["memory"]["value"] == "81408Mi"
        assert device["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "256Mi"


def test_prepare_writes_a_cdi_spec_for_the_allocated_gpu_only(
    plugin: Plugin, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    claims = kube.allocate_claims(
        api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["30Gi", "30Gi", "30Gi"]
    )
    gpus = _gpus_by_device(plugin, api_client)
    minors = {name: d["attributes"]["minor"]["int"] for name, d in gpus.items()}
    response = plugin.kubelet.prepare(_refs(claims))
    assert set(response.claims) == {c["metadata"]["uid"] for c in claims}
    ids = []
    for claim in claims:
        uid = claim["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        answer = response.claims[uid]
        assert answer.error == ""
        (device,) = answer.devices
        assert (device.pool_name, device.device_name, device.share_id) == (
            plugin.node,
            result["device"],
            result["shareID"],
        )
        assert list(device.request_names) == ["gpu"]
        assert list(device.cdi_device_ids) == [f"k8s.{DRIVER}/claim={uid}-{result['device']}-{result['shareID']}"]
        ids.append(device.cdi_device_ids[0])

        spec = _spec(plugin, uid)
        assert spec["kind"] == f"k8s.{DRIVER}/claim"
        (cdi_device,) = spec["devices"]
        env = _env(cdi_device["containerEdits"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpus[result["device"]]["attributes"]["uuid"]["string"]
        own = container_info.env_prefix(cdi_device["name"])
        assert env[f"{own}MEMORY_LIMIT_MIB"] == "30720"
        assert env[f"{own}SHARE_ID"] == result["shareID"]
        assert env[f"{own}CLAIM"] == f"{namespace}/{claim['metadata']['name']}"
        mounts = {m["containerPath"]: m for m in cdi_device["containerEdits"]["mounts"]}
        mount = mounts.pop(f"/run/fracgpu/{uid}_gpu.json")
        (metadata_path,) = mounts  # the other mount: the request's KEP-5304 device metadata, and nothing else
        assert metadata_path.startswith("/var/run/kubernetes.io/dra-device-attributes/"), metadata_path
        assert metadata_path.endswith(f"/gpu/{DRIVER}-metadata.json"), metadata_path
        request_file = json.loads(Path(mount["hostPath"]).read_text())
        assert [(d["uuid"], d["memoryMiB"]) for d in request_file["devices"]] == [(env[f"{own}UUID"], 30720)]
        paths = {n["path"] for n in cdi_device["containerEdits"]["deviceNodes"]}
        own = f"/dev/nvidia{minors[result['device']]}"
        others = {f"/dev/nvidia{m}" for d, m in minors.items() if d != result["device"]}
        assert paths == {own, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
        assert not paths & others
        for node in cdi_device["containerEdits"]["deviceNodes"]:
            assert node["hostPath"] == str(plugin.process.driver_root) + node["path"]
    assert len(set(ids)) == 3, "every share has its own CDI device"
    shared = [r["device"] for c in claims for r in c["status"]["allocation"]["devices"]["results"]]
    assert len(set(shared)) < 3, "three 30Gi shares of two 80Gi GPUs: two share one GPU"

    for claim in claims:  # Ready=True written by the plugin's own field manager, after its answer

        def with_status(name: str = claim["metadata"]["name"]) -> Any:
            fresh = client.ResourceV1Api(api_client).read_namespaced_resource_claim(name, namespace)
            body = api_client.sanitize_for_serialization(fresh)
            return body if (body["status"].get("devices") or []) else None

        body = kube.wait_for(with_status, 30, what="the Ready condition")
        (entry,) = [d for d in body["status"]["devices"] if d["driver"] == DRIVER]
        assert [(c["type"], c["status"], c["reason"]) for c in entry["conditions"]] == [
            ("Ready", "True", "Prepared"),
            ("MemoryEnforcement", "False", "None"),  # no HAMi-core, and this node has no cgroup v2 for nvml
        ]
        managers = {f["manager"] for f in body["metadata"]["managedFields"] if f.get("subresource") == "status"}
        assert "fracgpu-kubelet-plugin" in managers

    again = plugin.kubelet.prepare(_refs(claims))
    assert again == response, "prepare is idempotent"
    for _ in range(2):
        done = plugin.kubelet.unprepare(_refs(claims))
        assert {uid: r.error for uid, r in done.claims.items()} == {c["metadata"]["uid"]: "" for c in claims}
    assert not list(plugin.process.cdi_dir.glob("*.json"))
    assert json.loads(plugin.process.checkpoint.read_text())["claims"] == {}


def test_bad_claims_get_per_claim_errors(
    plugin: Plugin, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    (good,) = kube.allocate_claims(api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["1Gi"])
    (malformed,) = kube.allocate_claims(
        api_client,
        dyn,
        namespace,
        plugin.node,
        device_class=DRIVER,
        memories=["1Gi"],
        config={"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": "fifty"},
    )
    (unknown_field,) = kube.allocate_claims(
        api_client,
        dyn,
        namespace,
        plugin.node,
        device_class=DRIVER,
        memories=["1Gi"],
        config={"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "memoryLimit": "2Gi"},
    )
    unallocated = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim").create(
        namespace=namespace,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "never-allocated"},
            "spec": kube.claim_template("x", DRIVER, "1Gi")["spec"]["spec"],
        },
    )
    refs = [
        *_refs([good, malformed, unknown_field]),
        (namespace, "00000000-0000-0000-0000-000000000001", "does-not-exist"),
        (namespace, "00000000-0000-0000-0000-000000000002", good["metadata"]["name"]),
        (namespace, unallocated.metadata.uid, "never-allocated"),
    ]
    response = plugin.kubelet.prepare(refs)
    errors = {uid: response.claims[uid].error for _, uid, _ in refs}
    assert errors[good["metadata"]["uid"]] == ""
    assert "computeLimitPercent" in errors[malformed["metadata"]["uid"]]
    assert "memoryLimit: unknown field" in errors[unknown_field["metadata"]["uid"]]
    assert "not found" in errors["00000000-0000-0000-0000-000000000001"]
    assert "replaced" in errors["00000000-0000-0000-0000-000000000002"]
    assert "not allocated" in errors[unallocated.metadata.uid]
    for _, uid, _ in refs[1:]:
        assert not response.claims[uid].devices
        assert not cdi.spec_path(plugin.process.cdi_dir, DRIVER, uid).exists()

    missing = plugin.process.driver_root / "dev" / "nvidia-uvm-tools"
    missing.unlink()
    try:
        again = plugin.kubelet.prepare(_refs([good]))
        assert str(missing) in again.claims[good["metadata"]["uid"]].error
    finally:
        mocknvml.make_driver_root(plugin.process.driver_root, PROFILE)
    assert plugin.kubelet.prepare(_refs([good])).claims[good["metadata"]["uid"]].error == ""
    plugin.kubelet.unprepare(refs)


def test_slices_are_recreated_after_the_kubelet_wipes_them(plugin: Plugin, api_client: client.ApiClient) -> None:
    before = {s.metadata.name: s.spec.pool.generation for s in plugin.slices(api_client)}
    client.ResourceV1Api(api_client).delete_collection_resource_slice(
        field_selector=f"spec.nodeName={plugin.node}"  # what the kubelet does at startup
    )
    after = kube.wait_for(lambda: plugin.slices(api_client), 30, what="re-published slices")
    assert {s.metadata.name for s in after} == set(before)
    assert all(s.spec.pool.generation > before[s.metadata.name] for s in after)


def _consistent(plugin: Plugin) -> None:
    """Every spec file belongs to a completed claim, and every completed claim has its spec."""
    checkpoint = json.loads(plugin.process.checkpoint.read_text())
    assert {e["state"] for e in checkpoint["claims"].values()} <= {"PrepareCompleted"}
    specs = store.list_spec_claim_uids(plugin.process.cdi_dir, DRIVER)
    assert specs == set(checkpoint["claims"])
    if plugin.process.cdi_dir.exists():
        assert not [p for p in plugin.process.cdi_dir.iterdir() if p.name.startswith(".")], "no temp files left"


def test_kill_during_prepare_leaves_no_orphan_spec(
    plugin: Plugin, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    claims = kube.allocate_claims(api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["1Gi"] * 6)
    rng = random.Random(7)
    for _ in range(4):
        batch = rng.sample(claims, 4)
        caller = threading.Thread(target=lambda b=batch: _ignore_errors(lambda: plugin.kubelet.prepare(_refs(b))))
        caller.start()
        time.sleep(rng.uniform(0.0, 0.05))
        plugin.restart(kill=True)
        caller.join()
        _consistent(plugin)
    response = plugin.kubelet.prepare(_refs(claims))
    assert all(r.error == "" for r in response.claims.values())
    _consistent(plugin)
    plugin.kubelet.unprepare(_refs(claims))
    _consistent(plugin)


KILL_POINTS = Path(__file__).resolve().parent / "kill_points"


@pytest.mark.parametrize("point", ["before-checkpoint-save", "before-file-removal"])
def test_sigkill_at_the_step_between_files_and_checkpoint_is_repaired(
    control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient, namespace: str, point: str
) -> None:
    """SIGKILL of the real process exactly between a call's file writes and its checkpoint save (prepare), or
    between its checkpoint save and its file removals (unprepare): the restarted plugin removes the orphaned
    specs, and the kubelet's retry recreates them (prepare) or succeeds (unprepare)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated GPUs' device nodes are made with mknod")
    node = kube.unique("killnode")
    kube.create_fake_node(api_client, node)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgkp-", dir="/tmp"))
    control = workdir / "kill-at"
    env = {"PYTHONPATH": os.pathsep.join([str(KILL_POINTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    process = NodePluginProcess(
        workdir,
        node,
        control_plane.kubeconfig,
        PROFILE,
        mocknvml.build(workdir / "nvml"),
        env={**env, "FRACGPU_TEST_KILL_AT": str(control)},
    )
    plugin = Plugin(process, process.start(), node)
    try:
        kube.wait_for(lambda: plugin.slices(api_client), 30, what="ResourceSlices of the plugin")
        claims = kube.allocate_claims(api_client, dyn, namespace, node, device_class=DRIVER, memories=["1Gi"] * 3)
        kept, *batch = claims
        assert plugin.kubelet.prepare(_refs([kept])).claims[kept["metadata"]["uid"]].error == ""
        uids = {c["metadata"]["uid"] for c in batch}
        if point == "before-file-removal":
            assert all(r.error == "" for r in plugin.kubelet.prepare(_refs(batch)).claims.values())
        control.write_text(point)
        call = plugin.kubelet.prepare if point == "before-checkpoint-save" else plugin.kubelet.unprepare
        with pytest.raises(grpc.RpcError):  # the process died in the middle of the call
            call(_refs(batch))
        assert not control.exists(), "the kill point was reached"
        assert plugin.process.procs.procs["plugin"].wait(10) == -9, "killed by SIGKILL"
        specs = store.list_spec_claim_uids(process.cdi_dir, DRIVER)
        assert uids <= specs, "the batch's specs were written (prepare) or not yet removed (unprepare)"
        assert not uids & set(json.loads(process.checkpoint.read_text())["claims"]), "but not in the checkpoint"
        plugin.restart(kill=True)  # the dead process is reaped; the new one runs recover() before it registers
        assert _invariant_problems(plugin) == []
        assert store.list_spec_claim_uids(process.cdi_dir, DRIVER) == {kept["metadata"]["uid"]}, "orphans removed"
        if point == "before-checkpoint-save":  # the kubelet retries the prepare: the specs are written again
            assert all(r.error == "" for r in plugin.kubelet.prepare(_refs(batch)).claims.values())
            assert uids <= store.list_spec_claim_uids(process.cdi_dir, DRIVER)
        else:  # the kubelet retries the unprepare of claims the plugin no longer knows: it succeeds
            assert all(r.error == "" for r in plugin.kubelet.unprepare(_refs(batch)).claims.values())
        assert _invariant_problems(plugin) == []
        plugin.kubelet.unprepare(_refs(claims))
        _consistent(plugin)
    finally:
        plugin.kubelet.close()
        with contextlib.suppress(Exception):
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _ignore_errors(call: Any) -> None:
    with contextlib.suppress(Exception):  # the plugin was killed mid-call: the kubelet sees an error, retries
        call()


def test_corrupt_checkpoint_is_reported_and_replaced(
    plugin: Plugin, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    plugin.process.stop()
    plugin.process.checkpoint.write_text('{"version": 1, "claims": {"x": ')
    plugin.kubelet.close()
    plugin.kubelet = plugin.process.start()
    core = client.CoreV1Api(api_client)
    events = kube.wait_for(
        lambda: (
            core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={plugin.node},reason=CheckpointCorrupt"
            ).items
        ),
        20,
        what="CheckpointCorrupt event",
    )
    assert "not valid JSON" in events[0].message
    assert list(plugin.process.checkpoint.parent.glob("checkpoint.json.corrupt-*"))
    (claim,) = kube.allocate_claims(api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["2Gi"])
    assert plugin.kubelet.prepare(_refs([claim])).claims[claim["metadata"]["uid"]].error == ""
    plugin.kubelet.unprepare(_refs([claim]))
    _consistent(plugin)


KILL_CYCLES = 150  # at most; fewer when KILL_BUDGET_S runs out first
KILL_BUDGET_S = 60.0


def _invariant_problems(plugin: Plugin) -> list[str]:
    """What recover() guarantees, as a list of violations: completed entries only, the claims with devices
    in the checkpoint are exactly the spec files, no temp files."""
    claims = json.loads(plugin.process.checkpoint.read_text())["claims"]
    problems = [f"{uid} is {e['state']}" for uid, e in claims.items() if e["state"] != "PrepareCompleted"]
    specs = store.list_spec_claim_uids(plugin.process.cdi_dir, DRIVER)
    with_devices = {uid for uid, e in claims.items() if e["devices"]}
    problems += [f"{uid}: entry without spec" for uid in sorted(with_devices - specs)]
    problems += [f"{uid}: spec without entry" for uid in sorted(specs - set(claims))]
    for directory in (plugin.process.cdi_dir, plugin.process.checkpoint.parent):
        if directory.exists():
            problems += [f"temp file {p.name}" for p in directory.glob(".*.tmp")]
    return problems


def test_kill_during_unprepare_or_prepare_always_recovers_to_a_consistent_state(
    plugin: Plugin, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """SIGKILL at a random moment inside NodeUnprepareResources / NodePrepareResources, many times; after each
    restart the checkpoint and the specs describe the same claims, and a later prepare of every claim still
    prepared (re)writes its spec."""
    claims = kube.allocate_claims(api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["1Gi"] * 4)
    uids = {c["metadata"]["uid"]: c for c in claims}
    durations = {}
    for op in ("prepare", "unprepare"):  # how long a call takes, to aim the kills inside it
        start = time.perf_counter()
        getattr(plugin.kubelet, op)(_refs(claims))
        durations[op] = time.perf_counter() - start
    rng = random.Random(11)
    bad: list[str] = []
    interrupted = cycles = 0
    deadline = time.monotonic() + KILL_BUDGET_S
    while cycles < KILL_CYCLES and time.monotonic() < deadline:
        op = ("unprepare", "prepare")[cycles % 2]
        setup = plugin.kubelet.prepare(_refs(claims)) if op == "unprepare" else None
        if op == "prepare":
            plugin.kubelet.unprepare(_refs(claims))
        assert setup is None or all(r.error == "" for r in setup.claims.values())
        batch = rng.sample(claims, rng.randint(2, len(claims)))
        failed: list[Exception] = []

        def call(batch: list[dict[str, Any]] = batch, op: str = op, failed: list[Exception] = failed) -> None:
            try:
                getattr(plugin.kubelet, op)(_refs(batch))
            except Exception as err:  # killed mid-call: the kubelet sees an error and retries later
                failed.append(err)

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(rng.uniform(0.0, 1.5 * durations[op]))
        plugin.restart(kill=True)  # the new process runs recover() before it registers
        caller.join()
        interrupted += bool(failed)
        problems = _invariant_problems(plugin)

        still = [uids[uid] for uid in json.loads(plugin.process.checkpoint.read_text())["claims"] if uid in uids]
        if still:
            vanished = rng.choice(still)["metadata"]["uid"]
            with contextlib.suppress(FileNotFoundError):
                cdi.spec_path(plugin.process.cdi_dir, DRIVER, vanished).unlink()
            again = plugin.kubelet.prepare(_refs(still))
            problems += [f"re-prepare of {uid}: {r.error}" for uid, r in again.claims.items() if r.error]
            problems += [
                f"re-prepare did not write the spec of {c['metadata']['uid']}"
                for c in still
                if not cdi.spec_path(plugin.process.cdi_dir, DRIVER, c["metadata"]["uid"]).exists()
            ]
        if problems:
            bad.append(f"cycle {cycles} (kill during {op}): {'; '.join(problems)}")
        cycles += 1
    assert cycles >= 10, f"only {cycles} kill cycles ran in {KILL_BUDGET_S}s"
    assert interrupted > 0, "no kill landed inside a call"
    assert bad == [], f"{len(bad)} of {cycles} kill cycles ({interrupted} interrupted a call) ended inconsistent:\n" + (
        "\n".join(bad[:20])
    )
    plugin.kubelet.unprepare(_refs(claims))
    _consistent(plugin)


def test_a_checkpoint_of_a_newer_schema_holds_the_plugin_unregistered_until_it_is_readable(
    plugin: Plugin, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """A rollback past a checkpoint format change: the older plugin posts the Event, touches nothing and does not
    register (a rolling update keeps the newer instance serving), without exiting; once the file is readable again
    it recovers and serves."""
    (claim,) = kube.allocate_claims(api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["1Gi"])
    assert plugin.kubelet.prepare(_refs([claim])).claims[claim["metadata"]["uid"]].error == ""
    spec = cdi.spec_path(plugin.process.cdi_dir, DRIVER, claim["metadata"]["uid"])
    spec_content = spec.read_bytes()
    saved = plugin.process.checkpoint.read_bytes()
    newer = json.dumps({"version": 99, "claims": {"from": "the future"}}).encode()
    listing = sorted(p.name for p in plugin.process.checkpoint.parent.iterdir())
    plugin.process.stop()
    plugin.process.checkpoint.write_bytes(newer)
    plugin.kubelet.close()
    try:
        plugin.process.launch()
        core = client.CoreV1Api(api_client)
        events = kube.wait_for(
            lambda: (
                core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={plugin.node},reason=CheckpointTooNew"
                ).items
            ),
            20,
            what="CheckpointTooNew event",
        )
        expected = "was written by a newer fracgpu (schema 99, this plugin reads ≤ 1): upgrade the plugin back"
        assert expected in events[0].message
        held_until = time.monotonic() + 6  # longer than the gate's re-check interval
        while time.monotonic() < held_until:
            plugin.process.procs.check_alive("plugin")  # no crash loop
            assert not plugin.process.registration_socket.exists(), "registered with a checkpoint it cannot read"
            time.sleep(0.2)
        assert "not serving the kubelet: this node's state is of a newer schema" in plugin.process.log()
        assert plugin.process.checkpoint.read_bytes() == newer
        assert spec.read_bytes() == spec_content
        now = {p.name for p in plugin.process.checkpoint.parent.iterdir()}
        assert now <= set(listing), f"nothing moved aside or added: {sorted(now - set(listing))}"
        assert not {"dra.sock", "dra.registered"} & now, "not serving the kubelet"
    finally:  # upgraded back: the schema-1 file this plugin wrote; the same process goes on and serves
        plugin.process.checkpoint.write_bytes(saved)
    plugin.kubelet = plugin.process.register(timeout=30)
    assert plugin.kubelet.prepare(_refs([claim])).claims[claim["metadata"]["uid"]].error == ""
    plugin.kubelet.unprepare(_refs([claim]))
    _consistent(plugin)
