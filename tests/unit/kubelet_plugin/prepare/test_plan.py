"""Unit tests of claim planning: allocated ResourceClaim -> CDI spec + kubelet answer (kubelet_plugin/prepare/plan.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from api.names import DRIVER_NAME
from api.quantity import MiB
from kubelet_plugin.core import devicenodes
from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.enforcement.tiers import GpuTiers, NodeFacts, NvmlLimits, gpu_tiers
from kubelet_plugin.kinds.gpu.plan import HAMI_CACHE_IN_CONTAINER, HAMI_LIBRARY_IN_CONTAINER
from kubelet_plugin.kinds.gpu.publish import usable_memory
from kubelet_plugin.prepare.plan import LAST_WINS_ENV, ClaimPlan, HostFacts, plan_claim
from kubelet_plugin.state import cdi
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import container_info as info
from kubelet_plugin.state import device_metadata as meta
from kubelet_plugin.state.cdi import ContainerEdits, Device
from kubelet_plugin.state.container_info import hami_cache_dir, hami_preload_file
from kubelet_plugin.state.spec_rebuild import entry_from_spec
from tests.unit.plugin_host import NODE, NODES, SHARE_A, SHARE_B, UUID0, UUID1, gpu_info
from tests.unit.plugin_host import UID_A as UID
from tests.unit.scheduler_claims import extended_resource_claim

CONFIG_API = "fracgpu.dev/v1alpha1"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A driver root; its device nodes are those of two GPUs (NODES), given to the planner as a snapshot."""
    r = tmp_path / "driver-root"
    (r / "dev").mkdir(parents=True)
    return r


def planned(
    allocated: dict[str, Any],
    settings: Settings,
    gpus: dict[str, GpuInfo],
    driver_edits: ContainerEdits | None = None,
    tiers: Mapping[str, GpuTiers] | None = None,
    *,
    nodes: dict[str, tuple[int, int]] | DeviceNodeSnapshot | None = None,
    hami_core_installed: bool = False,
) -> ClaimPlan:
    """`plan_claim` with the tests' defaults: the device nodes NODES (or `nodes`) under the driver root, and the
    tiers a node without nvml offers (HAMi-core where its library is), as the plugin detects them."""
    if tiers is None:
        tiers = EnforcementDetector.without_nvml(settings, list(gpus.values()), "nvml was not detected").tiers()
    if not isinstance(nodes, DeviceNodeSnapshot):
        nodes = DeviceNodeSnapshot.of(settings.driver_root, NODES if nodes is None else nodes)
    facts = HostFacts(
        gpus=gpus, nodes=nodes, tiers=tiers, driver_edits=driver_edits, hami_core_installed=hami_core_installed
    )
    return plan_claim(allocated, settings, facts)


def without(name: str) -> dict[str, tuple[int, int]]:
    """NODES without `name`."""
    return {k: v for k, v in NODES.items() if k != name}


def make_settings(root: Path, **overrides: Any) -> Settings:
    fields: dict[str, Any] = {
        "node_name": NODE,
        "driver_root": root,
        "kubelet_dir": root.parent / "kubelet",
        "cdi_dir": root.parent / "cdi",
        "dev_char_dir": root.parent / "dev-char",
        "hami_core_lock_dir": root.parent / "vgpulock",
    }
    fields.update(overrides)
    return Settings(**fields)


@pytest.fixture
def settings(root: Path) -> Settings:
    return make_settings(root)


GPUS: dict[str, GpuInfo] = {"gpu-0": gpu_info(0, UUID0), "gpu-1": gpu_info(1, UUID1)}


def result(
    device: str = "gpu-0",
    *,
    request: str = "gpu",
    share: str | None = SHARE_A,
    memory: str | None = "10Gi",
    driver: str = DRIVER_NAME,
    pool: str = NODE,
) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share is not None:
        r["shareID"] = share
    if memory is not None:
        r["consumedCapacity"] = {"memory": memory}
    return r


def config(
    parameters: Any, requests: list[str] | None = None, source: str = "FromClaim", driver: str = DRIVER_NAME
) -> dict[str, Any]:
    c: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        c["requests"] = requests
    return c


def gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": CONFIG_API, "kind": "GpuConfig", **fields}


def claim(
    results: list[dict[str, Any]],
    configs: list[dict[str, Any]] | None = None,
    *,
    uid: str = UID,
    name: str = "my-claim",
) -> dict[str, Any]:
    devices: dict[str, Any] = {"results": results}
    if configs is not None:
        devices["config"] = configs
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid, "generation": 1},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}},
        "status": {"allocation": {"devices": devices}},
    }


def env_of(edits: ContainerEdits) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in edits.env:
        key, _, value = entry.partition("=")
        assert key not in out, f"duplicate env {key}"
        out[key] = value
    return out


def own_vars(device: Device) -> dict[str, str]:
    """The device's FRACGPU_DEV_<KEY>_* variables by suffix; asserts no other device's names are present."""
    prefix = info.env_prefix(device.name)
    env = env_of(device.container_edits)
    assert all(k.startswith(prefix) for k in env if k.startswith(info.ENV_PREFIX)), env
    return {k.removeprefix(prefix): v for k, v in env.items() if k.startswith(prefix)}


def only_device(plan: ClaimPlan) -> Device:
    assert plan.spec is not None
    assert len(plan.spec.devices) == 1
    return plan.spec.devices[0]


def node_paths(device: Device) -> list[str]:
    return [n.path for n in device.container_edits.device_nodes]


# --- env -------------------------------------------------------------------------------------------


def test_env_of_one_share(settings: Settings) -> None:
    plan = planned(claim([result()]), settings, GPUS)
    device = only_device(plan)
    env = env_of(device.container_edits)
    assert env["NVIDIA_VISIBLE_DEVICES"] == UUID0
    assert own_vars(device) == {
        "UUID": UUID0,
        "MEMORY_LIMIT_MIB": "10240",
        "CLAIM": "team-a/my-claim",
        "REQUEST": "gpu",
        "ENFORCEMENT": "none",
        "SHARE_ID": SHARE_A,
    }
    assert (
        info.env_prefix(device.name)
        == f"FRACGPU_DEV_{UID.upper().replace('-', '_')}_GPU_0_{SHARE_A.upper().replace('-', '_')}_"
    )
    assert env["FRACGPU_INFO_DIR"] == "/run/fracgpu"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # single-valued names would be wrong with two claims in one container: gone
    assert not {"FRACGPU_MEMORY_LIMIT_MIB", "FRACGPU_CLAIM", "FRACGPU_SHARE_ID"} & set(env)
    assert not any(k.startswith("CUDA_") for k in env if k != "CUDA_DEVICE_ORDER")  # no enforcement configured


def test_env_names_the_allocated_gpu(settings: Settings) -> None:
    device = only_device(planned(claim([result("gpu-1", memory="512Mi")]), settings, GPUS))
    assert env_of(device.container_edits)["NVIDIA_VISIBLE_DEVICES"] == UUID1
    assert (own_vars(device)["UUID"], own_vars(device)["MEMORY_LIMIT_MIB"]) == (UUID1, "512")


def test_without_consumed_capacity_the_whole_usable_memory(settings: Settings) -> None:
    device = only_device(planned(claim([result(memory=None)]), settings, GPUS))
    whole = usable_memory(GPUS["gpu-0"], settings.memory_step_bytes, settings.memory_reserve_bytes)
    assert own_vars(device)["MEMORY_LIMIT_MIB"] == str(whole // MiB) == "81408"


def test_the_schedulers_extended_resource_claim_is_a_whole_gpu_for_its_request(settings: Settings) -> None:
    """`resources.limits: {gpu.fracgpu.dev/gpu: 1}`: the claim the scheduler made and allocated (request
    `container-0-request-0`, all of gpu-1's memory consumed) gives the container gpu-1, all of it, and only it."""
    whole = usable_memory(GPUS["gpu-1"], settings.memory_step_bytes, settings.memory_reserve_bytes)
    made = extended_resource_claim(
        "trainer",
        driver=DRIVER_NAME,
        device_class=DRIVER_NAME,
        pool=NODE,
        devices={"gpu-1": (SHARE_B, f"{whole // MiB}Mi")},
        uid=UID,
    )
    plan = planned(made, settings, GPUS)
    device = only_device(plan)
    assert [(d.request_names, d.device_name, d.share_id) for d in plan.devices] == [
        (("container-0-request-0",), "gpu-1", SHARE_B)
    ], "the kubelet maps the request to the container through pod.status.extendedResourceClaimStatus"
    vars_ = own_vars(device)
    assert (vars_["UUID"], vars_["MEMORY_LIMIT_MIB"], vars_["REQUEST"]) == (UUID1, "81408", "container-0-request-0")
    assert vars_["CLAIM"] == f"ns/{made['metadata']['name']}"
    assert node_paths(device)[0] == "/dev/nvidia1" and "/dev/nvidia0" not in node_paths(device)
    assert [f.info.request for f in plan.files] == ["container-0-request-0"]


def test_without_share_id_no_share_env(settings: Settings) -> None:
    plan = planned(claim([result(share=None)]), settings, GPUS)
    device = only_device(plan)
    assert "SHARE_ID" not in own_vars(device)
    assert device.name == f"{UID}-gpu-0"
    assert plan.devices[0].share_id is None
    assert plan.files[0].info.devices[0].share_id is None


# --- what a container with several requests or claims is told ---------------------------------------

UID_2 = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
SHARE_C = "c0c0c0c0-2222-4333-8444-555566667777"
SHARE_D = "d0d0d0d0-2222-4333-8444-555566667777"


def two_request_claim() -> dict[str, Any]:
    """Request `a` on gpu-0 and request `b` on gpu-1 (distinctAttribute on the UUID), as the allocator writes it."""
    return claim([result("gpu-1", request="b", share=SHARE_B, memory="20Gi"), result(request="a", memory="10Gi")])


def test_devices_that_can_meet_in_a_container_never_set_one_name_to_two_values(settings: Settings) -> None:
    first = planned(two_request_claim(), settings, GPUS)
    second = planned(claim([result("gpu-1", share=SHARE_C, memory="30Gi")], uid=UID_2, name="other"), settings, GPUS)
    devices = [d for p in (first, second) for d in (p.spec.devices if p.spec else [])]
    assert len(devices) == 3
    values: dict[str, set[str]] = {}
    for device in devices:
        for key, value in env_of(device.container_edits).items():
            values.setdefault(key, set()).add(value)
    collisions = {k: v for k, v in values.items() if len(v) > 1}
    assert set(collisions) <= LAST_WINS_ENV, collisions
    mounts = [m.container_path for d in devices for m in d.container_edits.mounts]
    assert len(set(mounts)) == len(mounts) == 6, "each request its own info and metadata file"
    assert sorted(m.split("/")[1] for m in mounts) == ["run"] * 3 + ["var"] * 3


def test_nvidia_visible_devices_names_only_gpus_the_device_brings(settings: Settings) -> None:
    """A request's devices always reach a container together, so listing the request's GPUs never widens."""
    plan = planned(
        claim([result("gpu-1", request="a", share=SHARE_B), result(request="a"), result(request="b", share=SHARE_C)]),
        settings,
        GPUS,
    )
    assert plan.spec is not None
    by_request: dict[str, set[str]] = {}
    for device in plan.spec.devices:
        vars_ = own_vars(device)
        by_request.setdefault(vars_["REQUEST"], set()).add(vars_["UUID"])
    for device in plan.spec.devices:
        visible = env_of(device.container_edits)["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert set(visible) == by_request[own_vars(device)["REQUEST"]]
    assert by_request == {"a": {UUID0, UUID1}, "b": {UUID0}}


def test_request_files_agree_with_the_allocation(settings: Settings) -> None:
    # request `a` got two GPUs (listed out of PCI order), request `b` one share
    allocated = claim(
        [
            result("gpu-1", request="a", share=SHARE_B, memory="20Gi"),
            result(request="a", share=SHARE_A, memory="10Gi"),
            result(request="b/small", share=SHARE_C, memory="1Gi"),
        ]
    )
    plan = planned(allocated, settings, GPUS)
    assert plan.spec is not None
    files = {f.info.request: f for f in plan.files}
    assert set(files) == {"a", "b"}
    a, b = files["a"], files["b"]
    assert a.host_path == settings.plugin_data_dir / "claim-info" / UID / "a.json"
    assert a.container_path == f"/run/fracgpu/{UID}_a.json"
    assert b.container_path == f"/run/fracgpu/{UID}_b.json"
    data = json.loads(a.info.to_json())
    assert data["claim"] == {"namespace": "team-a", "name": "my-claim", "uid": UID}
    assert data["request"] == "a"
    assert data["enforcement"] == "none"
    assert [(d["uuid"], d["memoryMiB"], d["shareID"], d["device"]) for d in data["devices"]] == [
        (UUID0, 10240, SHARE_A, "gpu-0"),  # CUDA order: PCI bus ID 0000:01:00.0 first
        (UUID1, 20480, SHARE_B, "gpu-1"),
    ]
    assert [d["pciBusID"] for d in data["devices"]] == ["0000:01:00.0", "0000:02:00.0"]
    assert [(d["uuid"], d["memoryMiB"]) for d in json.loads(b.info.to_json())["devices"]] == [(UUID0, 1024)]
    answer_ids = {i for d in plan.devices for i in d.cdi_device_ids}
    for device in plan.spec.devices:
        vars_ = own_vars(device)
        mount, metadata_mount = device.container_edits.mounts
        file = files[vars_["REQUEST"]]
        (metadata,) = [m for m in plan.metadata if m.metadata.requests[0].name.split("/")[0] == vars_["REQUEST"]]
        assert (metadata_mount.host_path, metadata_mount.container_path, metadata_mount.options) == (
            str(metadata.host_path),
            metadata.container_path,
            mount.options,
        )
        assert (mount.host_path, mount.container_path) == (str(file.host_path), file.container_path)
        assert "ro" in mount.options
        (entry,) = [d for d in file.info.devices if d.cdi_device == f"{plan.spec.kind}={device.name}"]
        assert entry.cdi_device in answer_ids
        assert entry.env_prefix == info.env_prefix(device.name)
        assert (vars_["UUID"], vars_["MEMORY_LIMIT_MIB"], vars_["SHARE_ID"]) == (
            entry.uuid,
            str(entry.memory_mib),
            entry.share_id,
        )


def test_gpu_config_env_that_differs_between_requests_is_refused(settings: Settings) -> None:
    configs = [
        config(gpu_config(env={"MODE": "train"}), requests=["a"]),
        config(gpu_config(env={"MODE": "eval"}), requests=["b"]),
    ]
    with pytest.raises(PrepareError) as refused:
        planned(claim([result(request="a"), result("gpu-1", request="b", share=SHARE_B)], configs), settings, GPUS)
    assert refused.value.kind == ErrorKind.INVALID_CONFIG
    assert "MODE" in str(refused.value) and "'train'" in str(refused.value) and "'eval'" in str(refused.value)
    same = [config(gpu_config(env={"MODE": "train"}), requests=["a", "b"])]
    assert planned(claim([result(request="a"), result("gpu-1", request="b", share=SHARE_B)], same), settings, GPUS).spec


def test_spec_names_its_claim_for_recovery(settings: Settings) -> None:
    plan = planned(claim([result()]), settings, GPUS)
    assert plan.spec is not None
    path = store.write_spec(settings.cdi_dir, UID, plan.spec, DRIVER_NAME)
    entry = entry_from_spec(path.read_text(), UID, DRIVER_NAME, settings.node_name)
    assert entry is not None
    assert (entry.namespace, entry.name) == ("team-a", "my-claim")
    assert [(d.device_name, d.uuid) for d in entry.devices] == [("gpu-0", GPUS["gpu-0"].uuid)]


# --- device nodes ----------------------------------------------------------------------------------


def test_device_nodes_are_own_gpu_and_control_nodes(root: Path, settings: Settings) -> None:
    for device_name, own, other in (("gpu-0", "nvidia0", "nvidia1"), ("gpu-1", "nvidia1", "nvidia0")):
        device = only_device(planned(claim([result(device_name)]), settings, GPUS))
        paths = node_paths(device)
        assert sorted(paths) == sorted(f"/dev/{n}" for n in (own, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"))
        assert f"/dev/{other}" not in paths
        for node in device.container_edits.device_nodes:
            name = node.path.removeprefix("/dev/")
            assert node.host_path == str(root / "dev" / name)
            assert (node.major, node.minor) == NODES[name]
            assert node.type == "c"


def test_major_minor_come_from_the_real_nodes(root: Path, settings: Settings) -> None:
    device = only_device(planned(claim([result()]), settings, GPUS, nodes={**NODES, "nvidia-uvm": (237, 42)}))
    uvm = next(n for n in device.container_edits.device_nodes if n.path == "/dev/nvidia-uvm")
    assert (uvm.major, uvm.minor) == (237, 42)


def test_modeset_only_when_present(root: Path, settings: Settings) -> None:
    assert "/dev/nvidia-modeset" not in node_paths(only_device(planned(claim([result()]), settings, GPUS)))
    device = only_device(planned(claim([result()]), settings, GPUS, nodes={**NODES, "nvidia-modeset": (195, 254)}))
    modeset = next(n for n in device.container_edits.device_nodes if n.path == "/dev/nvidia-modeset")
    assert (modeset.major, modeset.minor) == (195, 254)
    assert modeset.host_path == str(root / "dev" / "nvidia-modeset")


@pytest.mark.parametrize(("missing", "device"), [("nvidia-uvm", "gpu-0"), ("nvidiactl", "gpu-0"), ("nvidia1", "gpu-1")])
def test_missing_node_is_an_error_naming_the_path(root: Path, settings: Settings, missing: str, device: str) -> None:
    with pytest.raises(PrepareError) as err:
        planned(claim([result(device)]), settings, GPUS, nodes=without(missing))
    assert err.value.kind == ErrorKind.DEVICE_NODE_MISSING
    assert str(root / "dev" / missing) in str(err.value)


def test_other_gpus_missing_node_does_not_matter(root: Path, settings: Settings) -> None:
    assert node_paths(only_device(planned(claim([result("gpu-0")]), settings, GPUS, nodes=without("nvidia1"))))


def test_regular_file_instead_of_node_is_an_error(root: Path, settings: Settings) -> None:
    (root / "dev" / "nvidiactl").write_text("")
    found = {n: v for n, v in DeviceNodeSnapshot.of(root, NODES).found.items() if n != "nvidiactl"}
    seen = DeviceNodeSnapshot(root, {**found, **devicenodes.snapshot(root, []).found})  # nvidiactl as stat finds it
    with pytest.raises(PrepareError) as err:
        planned(claim([result()]), settings, GPUS, nodes=seen)
    assert err.value.kind == ErrorKind.DEVICE_NODE_MISSING
    assert str(root / "dev" / "nvidiactl") in str(err.value)


# --- which results -------------------------------------------------------------------------------


def test_results_of_other_drivers_are_ignored(settings: Settings) -> None:
    foreign = result("gpu-7", request="nic", driver="nic.example.com", pool="elsewhere")
    plan = planned(claim([foreign, result()]), settings, GPUS)
    assert [d.device_name for d in plan.devices] == ["gpu-0"]
    assert plan.devices[0].request_names == ("gpu",)


def test_claim_with_only_foreign_results_has_no_spec(settings: Settings) -> None:
    foreign = result("gpu-0", driver="other.example.com")
    plan = planned(claim([foreign], [config({"anything": 1}, driver="other.example.com")]), settings, GPUS)
    assert plan.spec is None
    assert plan.devices == ()


def test_foreign_configs_are_not_decoded(settings: Settings) -> None:
    plan = planned(claim([result()], [config({"not": "ours"}, driver="other.example.com")]), settings, GPUS)
    assert plan.spec is not None


def test_device_unknown_on_this_node(settings: Settings) -> None:
    with pytest.raises(PrepareError) as err:
        planned(claim([result("gpu-9")]), settings, GPUS)
    assert err.value.kind == ErrorKind.UNKNOWN_DEVICE
    assert "gpu-9" in str(err.value)


def test_pool_of_another_node(settings: Settings) -> None:
    with pytest.raises(PrepareError) as err:
        planned(claim([result(pool="node-b")]), settings, GPUS)
    assert err.value.kind == ErrorKind.UNKNOWN_DEVICE
    assert "node-b" in str(err.value)


# --- CDI names and answer ------------------------------------------------------------------------


def test_cdi_names_and_answer(settings: Settings) -> None:
    plan = planned(claim([result()]), settings, GPUS)
    device = only_device(plan)
    assert device.name == f"{UID}-gpu-0-{SHARE_A}"
    assert plan.spec is not None
    assert plan.spec.kind == f"k8s.{DRIVER_NAME}/claim"
    (answer,) = plan.devices
    assert answer.pool_name == NODE
    assert answer.device_name == "gpu-0"
    assert answer.share_id == SHARE_A
    assert answer.cdi_device_ids == (f"k8s.{DRIVER_NAME}/claim={UID}-gpu-0-{SHARE_A}",)


def test_two_shares_of_one_gpu_in_one_claim(settings: Settings) -> None:
    plan = planned(
        claim([result(request="a", share=SHARE_A, memory="4Gi"), result(request="b", share=SHARE_B, memory="6Gi")]),
        settings,
        GPUS,
    )
    assert plan.spec is not None
    names = [d.name for d in plan.spec.devices]
    assert names == [f"{UID}-gpu-0-{SHARE_A}", f"{UID}-gpu-0-{SHARE_B}"]
    ids = [i for d in plan.devices for i in d.cdi_device_ids]
    assert len(set(ids)) == 2
    assert [d.request_names for d in plan.devices] == [("a",), ("b",)]
    env_a, env_b = (env_of(d.container_edits) for d in plan.spec.devices)
    assert env_a["NVIDIA_VISIBLE_DEVICES"] == env_b["NVIDIA_VISIBLE_DEVICES"] == UUID0
    vars_a, vars_b = (own_vars(d) for d in plan.spec.devices)
    assert (vars_a["MEMORY_LIMIT_MIB"], vars_b["MEMORY_LIMIT_MIB"]) == ("4096", "6144")
    assert (vars_a["SHARE_ID"], vars_b["SHARE_ID"]) == (SHARE_A, SHARE_B)


def test_request_names_are_base_names(settings: Settings) -> None:
    plan = planned(claim([result(request="gpu/large")]), settings, GPUS)
    assert plan.devices[0].request_names == ("gpu",)


# --- config scoping ------------------------------------------------------------------------------


def test_class_config_before_claim_config(settings: Settings) -> None:
    configs = [
        config(gpu_config(env={"MODE": "claim", "CLAIM_ONLY": "1"})),  # listed first, still applied last
        config(gpu_config(env={"MODE": "class", "CLASS_ONLY": "1"}), source="FromClass"),
    ]
    env = env_of(only_device(planned(claim([result()], configs), settings, GPUS)).container_edits)
    assert env["MODE"] == "claim"
    assert env["CLAIM_ONLY"] == env["CLASS_ONLY"] == "1"


def test_config_for_another_request_not_applied(settings: Settings) -> None:
    configs = [config(gpu_config(env={"OTHER": "1"}), requests=["other"])]
    env = env_of(only_device(planned(claim([result()], configs), settings, GPUS)).container_edits)
    assert "OTHER" not in env


def test_invalid_config_for_another_request_not_applied(settings: Settings) -> None:
    configs = [config({"bogus": True}, requests=["other"])]
    assert planned(claim([result()], configs), settings, GPUS).spec is not None


def test_config_for_base_request_applies_to_subrequest(settings: Settings) -> None:
    configs = [
        config(gpu_config(env={"BASE": "1"}), requests=["gpu"]),
        config(gpu_config(env={"SUB": "1"}), requests=["gpu/large"]),
        config(gpu_config(env={"SMALL": "1"}), requests=["gpu/small"]),
    ]
    env = env_of(only_device(planned(claim([result(request="gpu/large")], configs), settings, GPUS)).container_edits)
    assert env["BASE"] == env["SUB"] == "1"
    assert "SMALL" not in env


def test_config_without_requests_applies_to_all(settings: Settings) -> None:
    configs = [config(gpu_config(env={"ALL": "yes"}))]
    plan = planned(claim([result(request="a"), result("gpu-1", request="b", share=SHARE_B)], configs), settings, GPUS)
    assert plan.spec is not None
    assert all(env_of(d.container_edits)["ALL"] == "yes" for d in plan.spec.devices)


def test_gpu_config_env_added(settings: Settings) -> None:
    configs = [config(gpu_config(env={"MY_VAR": "hello world", "EMPTY": ""}))]
    env = env_of(only_device(planned(claim([result()], configs), settings, GPUS)).container_edits)
    assert env["MY_VAR"] == "hello world"
    assert env["EMPTY"] == ""
    assert env["NVIDIA_VISIBLE_DEVICES"] == UUID0


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ([1, 2], "parameters"),
        ("not json at all", "parameters"),
        (gpu_config(apiVersion="fracgpu.dev/v2"), "apiVersion"),
        (gpu_config(colour="blue"), "colour"),
        (gpu_config(computeLimitPercent=150), "computeLimitPercent"),
        (gpu_config(enforcement="strict"), "enforcement"),
        ({"kind": "GpuConfig"}, "apiVersion"),
    ],
)
def test_malformed_config_is_invalid_config(settings: Settings, parameters: Any, field: str) -> None:
    for source in ("FromClaim", "FromClass"):
        with pytest.raises(PrepareError) as err:
            planned(claim([result()], [config(parameters, source=source)]), settings, GPUS)
        assert err.value.kind == ErrorKind.INVALID_CONFIG
        assert field in str(err.value)


# --- HAMi-core -----------------------------------------------------------------------------------


@pytest.fixture
def hami_library(tmp_path: Path) -> Path:
    lib = tmp_path / "vgpu" / "libvgpu.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF")
    return lib


def check_hami(device: Device, settings: Settings, memory_mib: int, sm_limit: int | None) -> None:
    env = env_of(device.container_edits)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{memory_mib}m"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(HAMI_CACHE_IN_CONTAINER + "/")
    if sm_limit is None:
        assert "CUDA_DEVICE_SM_LIMIT" not in env
    else:
        assert env["CUDA_DEVICE_SM_LIMIT"] == str(sm_limit)
    mounts = {m.container_path: m for m in device.container_edits.mounts}
    assert set(mounts) == {
        HAMI_LIBRARY_IN_CONTAINER,
        "/etc/ld.so.preload",
        "/tmp/vgpulock",
        HAMI_CACHE_IN_CONTAINER,
        f"/run/fracgpu/{UID}_gpu.json",
        f"{meta.CONTAINER_DIR}/resourceclaims/my-claim/gpu/{DRIVER_NAME}-metadata.json",
    }
    assert env["FRACGPU_ENFORCEMENT"] == "hami-core"
    assert mounts[HAMI_LIBRARY_IN_CONTAINER].host_path == str(settings.hami_core_library)
    assert mounts["/etc/ld.so.preload"].host_path == str(hami_preload_file(settings))
    assert mounts["/tmp/vgpulock"].host_path == str(settings.hami_core_lock_dir)
    assert mounts[HAMI_CACHE_IN_CONTAINER].host_path == str(hami_cache_dir(settings, UID))
    assert UID in mounts[HAMI_CACHE_IN_CONTAINER].host_path
    assert "ro" in mounts[HAMI_LIBRARY_IN_CONTAINER].options
    assert "ro" in mounts["/etc/ld.so.preload"].options


def test_hami_core_from_settings(root: Path, hami_library: Path) -> None:
    settings = make_settings(root, enforcement="hami-core", hami_core_library=hami_library)
    device = only_device(planned(claim([result()]), settings, GPUS))
    check_hami(device, settings, 10240, None)


def test_hami_core_from_claim_config_with_sm_limit(root: Path, hami_library: Path) -> None:
    settings = make_settings(root, hami_core_library=hami_library)
    configs = [config(gpu_config(enforcement="hami-core", computeLimitPercent=30))]
    device = only_device(planned(claim([result(memory="3Gi")], configs), settings, GPUS))
    check_hami(device, settings, 3072, 30)


def test_hami_core_sm_limit_from_class_config(root: Path, hami_library: Path) -> None:
    settings = make_settings(root, enforcement="hami-core", hami_core_library=hami_library)
    configs = [config(gpu_config(computeLimitPercent=50), source="FromClass")]
    check_hami(only_device(planned(claim([result()], configs), settings, GPUS)), settings, 10240, 50)


def test_claim_config_cannot_turn_node_enforcement_off(root: Path, hami_library: Path) -> None:
    settings = make_settings(root, enforcement="hami-core", hami_core_library=hami_library)
    configs = [config(gpu_config(enforcement="none"))]  # a tenant trying to escape the node's limits
    device = only_device(planned(claim([result()], configs), settings, GPUS))
    check_hami(device, settings, 10240, None)


def test_hami_core_refuses_a_claim_with_two_requests(root: Path, hami_library: Path) -> None:
    settings = make_settings(root, enforcement="hami-core", hami_core_library=hami_library)
    two = claim([result(request="a", share=SHARE_A), result("gpu-1", request="b", share=SHARE_B)])
    with pytest.raises(PrepareError) as refused:
        planned(two, settings, GPUS)
    assert refused.value.kind == ErrorKind.INVALID_CONFIG
    assert "one request per claim" in str(refused.value)


def test_hami_core_limits_follow_pci_order(root: Path, hami_library: Path) -> None:
    settings = make_settings(root, enforcement="hami-core", hami_core_library=hami_library)
    # results listed gpu-1 first; CUDA numbers devices by PCI bus id, so index 0 is gpu-0's grant
    plan = planned(
        claim([result("gpu-1", memory="20Gi"), result("gpu-0", memory="10Gi", share=SHARE_B)]), settings, GPUS
    )
    env = env_of(plan.spec.devices[0].container_edits) if plan.spec else {}
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("10240m", "20480m")
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{UUID0},{UUID1}"


def test_hami_core_missing_library(root: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libvgpu.so"
    settings = make_settings(root, enforcement="hami-core", hami_core_library=missing)
    with pytest.raises(PrepareError) as err:
        planned(claim([result()]), settings, GPUS)
    assert err.value.kind == ErrorKind.ENFORCEMENT_UNAVAILABLE
    assert str(missing) in str(err.value)
    assert "this node's enforcement mode is 'hami-core'" in str(err.value)


def test_only_the_info_and_metadata_files_without_enforcement(settings: Settings) -> None:
    mounts = only_device(planned(claim([result()]), settings, GPUS)).container_edits.mounts
    assert [m.container_path for m in mounts] == [
        f"/run/fracgpu/{UID}_gpu.json",
        f"{meta.CONTAINER_DIR}/resourceclaims/my-claim/gpu/{DRIVER_NAME}-metadata.json",
    ]


# --- the written spec ----------------------------------------------------------------------------


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


@pytest.mark.parametrize("enforcement", ["none", "hami-core"])
def test_written_spec_version_and_content(root: Path, hami_library: Path, enforcement: str) -> None:
    settings = make_settings(root, enforcement=enforcement, hami_core_library=hami_library)
    second = "b/x" if enforcement == "none" else "a"  # HAMi-core: one request per claim
    plan = planned(
        claim([result(request="a", share=SHARE_A), result("gpu-1", request=second, share=SHARE_B)]), settings, GPUS
    )
    assert plan.spec is not None
    path = store.write_spec(settings.cdi_dir, UID, plan.spec, DRIVER_NAME)
    assert path == settings.cdi_dir / f"k8s.{DRIVER_NAME}-claim_{UID}.json"
    data = json.loads(path.read_text())
    # device names start with a digit (the claim UID) and nodes have hostPath: both need >= 0.5.0
    assert _version(data["cdiVersion"]) >= (0, 5, 0)
    assert data["cdiVersion"] in cdi.KNOWN_VERSIONS
    assert data["kind"] == f"k8s.{DRIVER_NAME}/claim"
    assert [d["name"] for d in data["devices"]] == [f"{UID}-gpu-0-{SHARE_A}", f"{UID}-gpu-1-{SHARE_B}"]
    for dev, own in zip(data["devices"], ("nvidia0", "nvidia1"), strict=True):
        nodes = dev["containerEdits"]["deviceNodes"]
        assert {n["path"] for n in nodes} == {
            f"/dev/{own}",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
        }
        assert all(n["hostPath"].startswith(str(root)) for n in nodes)
    ids = [i for d in plan.devices for i in d.cdi_device_ids]
    assert ids == [f"{data['kind']}={d['name']}" for d in data["devices"]]


# --- memory enforcement tiers (kubelet_plugin/enforcement/tiers.py decides, plan applies) ---------------------

LIBS = ContainerEdits(
    mounts=[
        cdi.Mount(host_path=f"/drv/lib/{lib}", container_path=f"/usr/lib/{lib}", options=["ro", "rbind"])
        for lib in ("libcuda.so.615.1", "libnvidia-ml.so.615.1")
    ]
)
ALL_FACTS = NodeFacts(cgroup_problem=None, driver_edits_problem=None, hami_core_problem=None)


def tiers(nvml: dict[str, str | None], hami: bool = False) -> dict[str, GpuTiers]:
    """Per device: the tiers with the NVML probe's problem (None: supported) and HAMi-core present or not."""
    facts = ALL_FACTS.model_copy(update={"hami_core_problem": None if hami else "no HAMi-core library"})
    return {name: gpu_tiers(facts, NvmlLimits(problem=problem)) for name, problem in nvml.items()}


def test_nvml_share_gets_nvidias_hook_and_the_grant_as_env(root: Path) -> None:
    settings = make_settings(root, driver_edits="toolkit", host_driver_root=Path("/run/nvidia/driver"))
    plan = planned(claim([result()]), settings, GPUS, LIBS, tiers({"gpu-0": None, "gpu-1": None}))
    device = only_device(plan)
    (hook,) = device.container_edits.hooks
    assert hook.hook_name == "createRuntime"
    assert hook.path == str(settings.cdi_hook_path)
    assert hook.args == [
        *("nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/run/nvidia/driver", "--gpu-id", UUID0)
    ]
    env = env_of(device.container_edits)
    assert (env["NVIDIA_GPU_MEMORY_REQUEST"], env["NVIDIA_GPU_MEMORY_LIMIT"]) == ("10240", "10240")
    assert own_vars(device)["ENFORCEMENT"] == "nvml"
    assert plan.tiers == ((NODE, "gpu-0", SHARE_A, "nvml"),)
    (file,) = plan.files
    assert file.info.enforcement == "nvml" and file.info.devices[0].enforcement == "nvml"
    assert not any(k.startswith("CUDA_DEVICE_MEMORY") for k in env)


def test_no_hook_where_the_gpu_offers_no_nvml(root: Path) -> None:
    """Never nvml without the hook: a GPU without the tier gets neither the hook nor the env, and says none."""
    settings = make_settings(root, driver_edits="toolkit")
    plan = planned(claim([result()]), settings, GPUS, LIBS, tiers({"gpu-0": "old driver", "gpu-1": None}))
    device = only_device(plan)
    assert device.container_edits.hooks == []
    assert not any(k.startswith("NVIDIA_GPU_MEMORY") for k in env_of(device.container_edits))
    assert own_vars(device)["ENFORCEMENT"] == "none"
    assert plan.tiers == ((NODE, "gpu-0", SHARE_A, "none"),)


def test_tiers_are_per_gpu(root: Path) -> None:
    settings = make_settings(root, driver_edits="toolkit")
    results = [result("gpu-0", request="a", share=SHARE_A), result("gpu-1", request="b", share=SHARE_B)]
    plan = planned(claim(results), settings, GPUS, LIBS, tiers({"gpu-0": None, "gpu-1": "not supported"}))
    assert plan.spec is not None
    by_device = {d.name.split("-gpu-")[1][0]: d for d in plan.spec.devices}
    assert [len(by_device[i].container_edits.hooks) for i in ("0", "1")] == [1, 0]
    assert sorted(t[3] for t in plan.tiers) == ["none", "nvml"]


def test_claim_asking_for_nvml_on_a_gpu_without_it_is_refused(root: Path) -> None:
    settings = make_settings(root, driver_edits="toolkit")
    configs = [config(gpu_config(enforcement="nvml"))]
    problem = "the node has no cgroup v2 unified hierarchy at /sys/fs/cgroup"
    with pytest.raises(PrepareError) as err:
        planned(claim([result()], configs), settings, GPUS, LIBS, tiers({"gpu-0": problem, "gpu-1": problem}))
    assert err.value.kind == ErrorKind.ENFORCEMENT_UNAVAILABLE
    message = str(err.value)
    assert message.startswith("request 'gpu': the claim's GpuConfig asks for enforcement 'nvml', but GPU gpu-0")
    assert problem in message and "driverEdits: toolkit" in message


def test_claim_config_cannot_lower_auto(root: Path) -> None:
    settings = make_settings(root, driver_edits="toolkit")
    configs = [config(gpu_config(enforcement="none"))]
    plan = planned(claim([result()], configs), settings, GPUS, LIBS, tiers({"gpu-0": None, "gpu-1": None}))
    assert plan.tiers[0][3] == "nvml"
    assert len(only_device(plan).container_edits.hooks) == 1


def test_nvml_shares_of_one_claim_must_have_one_size(root: Path) -> None:
    settings = make_settings(root, driver_edits="toolkit")
    results = [
        result("gpu-0", request="a", share=SHARE_A, memory="10Gi"),
        result("gpu-1", request="b", share=SHARE_B, memory="20Gi"),
    ]
    with pytest.raises(PrepareError) as err:
        planned(claim(results), settings, GPUS, LIBS, tiers({"gpu-0": None, "gpu-1": None}))
    assert "nvml-enforced shares of different sizes (10240 MiB, 20480 MiB)" in str(err.value)
    assert "one NVIDIA_GPU_MEMORY_LIMIT per container" in str(err.value)


def test_hami_core_covers_the_claims_unenforced_shares(root: Path, hami_library: Path) -> None:
    """HAMi-core, preloaded for one share, limits every GPU of the container: a none share becomes hami-core."""
    settings = make_settings(root, enforcement="none", hami_core_library=hami_library)
    results = [result("gpu-0", share=SHARE_A), result("gpu-1", share=SHARE_B)]
    configs = [config(gpu_config(enforcement="hami-core"))]
    plan = planned(claim(results, configs), settings, GPUS, None, tiers({"gpu-0": "x", "gpu-1": "x"}, hami=True))
    assert {t[3] for t in plan.tiers} == {"hami-core"}
    (file,) = plan.files
    assert file.info.enforcement == "hami-core"


# --- adminAccess (KEP-5018) ------------------------------------------------------------------------------


def test_an_admin_access_result_reaches_the_whole_gpu_with_no_limit_and_says_so(root: Path) -> None:
    """An adminAccess result (here `memory: 0`, as admission tells monitoring claims to write) on a node where the
    GPU offers nvml and the claim asks for it: no tier limits it, its grant is the whole GPU, and the container is
    told it is admin access, in its variables and its request's file (schema 3)."""
    settings = make_settings(root, driver_edits="toolkit", host_driver_root=Path("/run/nvidia/driver"))
    admin = {**result(memory="0"), "adminAccess": True}
    plan = planned(
        claim([admin], [config(gpu_config(enforcement="nvml"))]),
        settings,
        GPUS,
        LIBS,
        tiers({"gpu-0": None, "gpu-1": None}),
    )
    device = only_device(plan)
    whole = usable_memory(GPUS["gpu-0"], settings.memory_step_bytes, settings.memory_reserve_bytes) // MiB
    assert own_vars(device) | {"SHARE_ID": "-"} == {
        "UUID": UUID0,
        "MEMORY_LIMIT_MIB": str(whole),
        "CLAIM": "team-a/my-claim",
        "REQUEST": "gpu",
        "ENFORCEMENT": "none",
        "SHARE_ID": "-",
        "ADMIN_ACCESS": "true",
    }
    assert device.container_edits.hooks == []
    assert not {"NVIDIA_GPU_MEMORY_LIMIT", "CUDA_MPS_PIPE_DIRECTORY"} & set(env_of(device.container_edits))
    assert plan.tiers == ((NODE, "gpu-0", SHARE_A, "none"),)
    (file,) = plan.files
    data = json.loads(file.info.to_json())
    assert (data["version"], data["devices"][0]["adminAccess"], data["devices"][0]["memoryMiB"]) == (3, True, whole)
    assert (
        "adminAccess"
        not in json.loads(planned(claim([result()]), settings, GPUS, LIBS).files[0].info.to_json())["devices"][0]
    )
