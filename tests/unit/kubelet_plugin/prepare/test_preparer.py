"""Unit tests of the stateful Preparer (kubelet_plugin/prepare/preparer.py) against a fake Kubernetes API; no root."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from api.kube_errors import api_error
from api.kube_rest import KubeRest
from api.names import DRIVER_NAME
from kubelet_plugin.core.model import ClaimRef
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.enforcement.tiers import GpuTiers, NvmlLimits
from kubelet_plugin.health.source import DeviceHealth
from kubelet_plugin.prepare.ready import FIELD_MANAGER
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import container_info, device_metadata
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointDevice, ClaimEntry
from kubelet_plugin.state.container_info import hami_cache_dir
from tests.unit.fake_apiserver import connection, refused_url
from tests.unit.plugin_host import (
    GPUS,
    NODE,
    NODES,
    NS,
    SHARE_A,
    SHARE_B,
    UID_A,
    UID_B,
    UID_C,
    UUID0,
    UUID1,
    Env,
    completed_entry,
    gpu_info,
    make_claim,
    make_env,
    make_preparer,
    ready_only_entry,
    ref,
)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    return make_env(tmp_path, monkeypatch)


# --- prepare ---------------------------------------------------------------------------------------


def test_prepare_writes_spec_and_checkpoint(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    results = env.preparer.prepare([ref(claim)])
    assert set(results) == {UID_A}
    res = results[UID_A]
    assert res.error == ""
    (device,) = res.devices
    assert device.pool_name == NODE
    assert device.device_name == "gpu-0"
    assert device.share_id == SHARE_A
    assert device.request_names == ("gpu",)
    assert device.cdi_device_ids == (f"k8s.{DRIVER_NAME}/claim={UID_A}-gpu-0-{SHARE_A}",)

    spec = json.loads(env.spec_file(UID_A).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{UID_A}-gpu-0-{SHARE_A}"]
    assert f"NVIDIA_VISIBLE_DEVICES={UUID0}" in spec["devices"][0]["containerEdits"]["env"]

    checkpoint = env.checkpoint()
    assert checkpoint.node_boot_id == "boot-1"
    entry = checkpoint.claims[UID_A]
    assert (entry.namespace, entry.name, entry.state) == (NS, "claim-a", "PrepareCompleted")
    assert entry.devices == [CheckpointDevice.from_prepared(device, UUID0)]


def test_reprepare_is_identical_and_rewrites_deleted_spec(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    first = env.preparer.prepare([ref(claim)])
    content = env.spec_file(UID_A).read_bytes()
    checkpoint = env.checkpoint()
    assert env.preparer.prepare([ref(claim)]) == first
    env.spec_file(UID_A).unlink()
    assert env.preparer.prepare([ref(claim)]) == first
    assert env.spec_file(UID_A).read_bytes() == content
    assert env.checkpoint() == checkpoint


def test_unprepare_removes_spec_and_entry(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    other = env.api.add(make_claim(UID_B, "claim-b", device="gpu-1", share=SHARE_B))
    env.preparer.prepare([ref(claim), ref(other)])
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}
    assert not env.spec_file(UID_A).exists()
    assert env.spec_file(UID_B).exists()
    assert set(env.checkpoint().claims) == {UID_B}
    # repeat and claims never prepared are fine too; the claim may be gone from the API server
    del env.api.claims[NS, "claim-a"]
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}


def test_prepare_writes_the_request_files_the_spec_mounts_and_unprepare_removes_them(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a", memory="3Gi"))
    other = env.api.add(make_claim(UID_B, "claim-b", device="gpu-1", share=SHARE_B))
    assert env.preparer.prepare([ref(claim), ref(other)])[UID_A].error == ""
    spec = json.loads(env.spec_file(UID_A).read_text())
    mount, metadata_mount = spec["devices"][0]["containerEdits"]["mounts"]
    host = Path(mount["hostPath"])
    assert host == container_info.claim_info_dir(env.settings.plugin_data_dir, UID_A) / "gpu.json"
    assert mount["containerPath"] == f"/run/fracgpu/{UID_A}_gpu.json"
    data = json.loads(host.read_text())
    assert data["claim"] == {"namespace": NS, "name": "claim-a", "uid": UID_A}
    assert [(d["uuid"], d["memoryMiB"], d["shareID"]) for d in data["devices"]] == [(UUID0, 3072, SHARE_A)]
    metadata_host = Path(metadata_mount["hostPath"])
    assert metadata_host == host.parent / "gpu.metadata"
    assert metadata_mount["containerPath"] == (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/claim-a/gpu/{DRIVER_NAME}-metadata.json"
    )
    assert "ro" in metadata_mount["options"]
    beta, alpha = device_metadata.read_stream(metadata_host.read_text())
    assert (beta.metadata.uid, alpha.metadata.uid) == (UID_A, UID_A)
    assert [(d.name, d.attributes["uuid"].string) for d in beta.requests[0].devices] == [("gpu-0", UUID0)]
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}
    assert not host.parent.exists(), "unprepare removes the claim's info and metadata files"
    assert (container_info.claim_info_dir(env.settings.plugin_data_dir, UID_B) / "gpu.metadata").is_file()


def test_no_spec_when_the_request_file_cannot_be_written(env: Env) -> None:
    root = container_info.claim_info_root(env.settings.plugin_data_dir)
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("a file where the directory should be")
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    result = env.preparer.prepare([ref(claim)])[UID_A]
    assert "cannot write CDI spec or info files" in result.error
    assert not env.spec_file(UID_A).exists(), "a spec must never mount a file that is not there"


def test_unprepare_unknown_claim(env: Env) -> None:
    unknown = ClaimRef(namespace=NS, name="never", uid=UID_C)
    assert env.preparer.unprepare([unknown]) == {UID_C: ""}
    assert env.checkpoint().claims == {}


def test_per_claim_errors_beside_a_success(env: Env) -> None:
    good = env.api.add(make_claim(UID_A, "good"))
    replaced = env.api.add(make_claim(UID_B, "replaced"))
    unallocated = make_claim(UID_C, "unallocated")
    unallocated["status"] = {}
    env.api.add(unallocated)
    missing = ClaimRef(namespace=NS, name="missing", uid="3e9c6f51-8a4d-4eb1-a0a2-5d4a6b7c8d9e")
    refs = [ref(good), missing, ref(replaced, uid="4fad7062-9b5e-4fc2-b1b3-6e5b7c8d9eaf"), ref(unallocated)]
    results = env.preparer.prepare(refs)
    assert set(results) == {r.uid for r in refs}
    assert results[UID_A].error == ""
    assert len(results[UID_A].devices) == 1
    assert "not found" in results[missing.uid].error
    assert "replaced" in results[refs[2].uid].error
    assert "not allocated" in results[UID_C].error
    for r in refs[1:]:
        assert results[r.uid].devices == ()
    assert set(env.checkpoint().claims) == {UID_A}
    assert store.list_spec_claim_uids(env.settings.cdi_dir, DRIVER_NAME) == {UID_A}


def test_plan_error_leaves_no_half_prepared_entry(env: Env) -> None:
    bad = env.api.add(make_claim(UID_A, "bad", device="gpu-9"))
    results = env.preparer.prepare([ref(bad)])
    assert "gpu-9" in results[UID_A].error
    assert env.checkpoint().claims == {}
    assert not env.spec_file(UID_A).exists()


# --- Ready condition -------------------------------------------------------------------------------


def test_ready_applied_once_with_field_manager(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    env.preparer.prepare([ref(claim)])
    assert env.preparer.wait_ready_writes(10)  # written after the answer
    assert len(env.api.status_patches) == 1
    patch = env.api.status_patches[0]
    assert (patch["name"], patch["namespace"]) == ("claim-a", NS)
    assert patch["field_manager"] == FIELD_MANAGER == "fracgpu-kubelet-plugin"
    (entry,) = patch["body"]["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"], entry["shareID"]) == (DRIVER_NAME, NODE, "gpu-0", SHARE_A)
    assert [(c["type"], c["status"], c["reason"]) for c in entry["conditions"]] == [
        ("Ready", "True", "Prepared"),
        ("MemoryEnforcement", "False", "None"),  # no HAMi-core library, no nvml: the grant is advisory
    ]

    # the API server now has the condition: a repeat does not apply it again
    claim["status"]["devices"] = [{**entry}]
    env.preparer.prepare([ref(claim)])
    assert env.preparer.wait_ready_writes(10)
    assert len(env.api.status_patches) == 1


def test_ready_not_applied_when_already_ready(env: Env) -> None:
    claim = make_claim(UID_A, "claim-a")
    claim["status"]["devices"] = [
        {
            "driver": DRIVER_NAME,
            "pool": NODE,
            "device": "gpu-0",
            "shareID": SHARE_A,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Prepared", "message": ""},
                {"type": "MemoryEnforcement", "status": "False", "reason": "None", "message": ""},
            ],
        }
    ]
    env.api.add(claim)
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert env.preparer.wait_ready_writes(10)
    assert env.api.status_patches == []


def test_enforcement_condition_added_to_an_entry_that_is_only_ready(env: Env) -> None:
    """A claim made Ready by a plugin that did not report enforcement gets the condition at its next prepare."""
    claim = make_claim(UID_A, "claim-a")
    claim["status"]["devices"] = [ready_only_entry(SHARE_A)]
    env.api.add(claim)
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert env.preparer.wait_ready_writes(10)
    (patch,) = env.api.status_patches
    (entry,) = patch["body"]["status"]["devices"]
    assert {c["type"]: c["reason"] for c in entry["conditions"]} == {"Ready": "Prepared", "MemoryEnforcement": "None"}


def test_ready_applied_when_another_share_not_ready(env: Env) -> None:
    claim = make_claim(UID_A, "claim-a")
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "request": "b", "shareID": SHARE_B})
    claim["status"]["devices"] = [ready_only_entry(SHARE_A)]
    env.api.add(claim)
    env.preparer.prepare([ref(claim)])
    assert env.preparer.wait_ready_writes(10)
    assert len(env.api.status_patches) == 1
    assert len(env.api.status_patches[0]["body"]["status"]["devices"]) == 2


def test_no_ready_when_prepare_failed(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a", device="gpu-9"))
    env.preparer.prepare([ref(claim)])
    assert env.preparer.wait_ready_writes(10)
    assert env.api.status_patches == []


# --- metrics ---------------------------------------------------------------------------------------


def test_metrics_move(env: Env) -> None:
    a = env.api.add(make_claim(UID_A, "a"))
    b = env.api.add(make_claim(UID_B, "b", device="gpu-1", share=SHARE_B))
    missing = ClaimRef(namespace=NS, name="missing", uid=UID_C)
    env.preparer.prepare([ref(a), ref(b), missing])
    total = "fracgpu_plugin_claims_total"
    errors = "fracgpu_plugin_errors_total"
    assert env.sample(total, operation="prepare", result="ok") == 2
    assert env.sample(total, operation="prepare", result="error") == 1
    assert env.sample(errors, operation="prepare", type="claim_not_found") == 1
    assert env.sample("fracgpu_plugin_prepared_claims") == 2
    assert env.sample("fracgpu_plugin_request_duration_seconds_count", operation="prepare") == 1
    assert env.sample("fracgpu_plugin_requests_in_flight", operation="prepare") == 0

    env.api.add(make_claim(UID_C, "replaced"))
    env.preparer.prepare([ClaimRef(namespace=NS, name="replaced", uid="5abe8173-ac6f-40d3-82c4-7f6c8d9eafb0")])
    assert env.sample(errors, operation="prepare", type="uid_mismatch") == 1
    assert env.sample(total, operation="prepare", result="error") == 2

    env.preparer.unprepare([ref(a)])
    assert env.sample(total, operation="unprepare", result="ok") == 1
    assert env.sample("fracgpu_plugin_prepared_claims") == 1


# --- /dev/char -------------------------------------------------------------------------------------


def test_dev_char_links_point_at_host_nodes(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    env.preparer.prepare([ref(claim)])
    root = env.settings.driver_root / "dev"
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        major, minor = NODES[name]
        link = env.settings.dev_char_dir / f"{major}:{minor}"
        assert link.is_symlink(), link
        assert Path(os.readlink(link)) == root / name
    assert not (env.settings.dev_char_dir / "195:1").exists()  # the other GPU's node is not ours to link


# --- recover ---------------------------------------------------------------------------------------


def test_recover_removes_orphan_specs_keeps_completed(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "done"))
    env.preparer.prepare([ref(claim)])
    done_spec = env.spec_file(UID_A).read_bytes()
    env.spec_file(UID_C).write_bytes(done_spec)  # no checkpoint entry at all
    foreign = env.settings.cdi_dir / "nvidia.com-gpu.json"
    foreign.write_text("{}")

    reads = len(env.api.reads)
    env.new_preparer().recover()
    assert set(env.checkpoint().claims) == {UID_A}
    assert env.checkpoint().claims[UID_A].state == "PrepareCompleted"
    assert env.spec_file(UID_A).read_bytes() == done_spec
    assert not env.spec_file(UID_C).exists()
    assert foreign.exists()
    assert len(env.api.reads) == reads  # same boot: nothing to fetch


def test_recover_removes_temp_files_of_interrupted_writes(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "done"))
    env.preparer.prepare([ref(claim)])
    spec_tmp = env.spec_file(UID_C).with_name(f".{env.spec_file(UID_C).name}.k1l2.tmp")
    spec_tmp.write_text('{"half": ')
    checkpoint_tmp = env.store.path.with_name(f".{env.store.path.name}.x9.tmp")
    checkpoint_tmp.write_text("{")
    other = env.settings.cdi_dir / ".nvidia.com-gpu.json.zz.tmp"  # another writer's temp file: not ours
    other.write_text("{")
    env.new_preparer().recover()
    assert not spec_tmp.exists()
    assert not checkpoint_tmp.exists()
    assert other.exists()
    assert env.spec_file(UID_A).exists()
    assert env.sample("fracgpu_plugin_prepared_claims") == 1


def test_recover_drops_prepare_started_entry_and_its_spec(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "done"))
    env.preparer.prepare([ref(claim)])
    done_spec = env.spec_file(UID_A).read_bytes()
    # a prepare that died between PrepareStarted and PrepareCompleted, with its spec already written
    env.store.save(env.checkpoint().with_claim(UID_B, ClaimEntry(namespace=NS, name="half", state="PrepareStarted")))
    env.spec_file(UID_B).write_bytes(done_spec)

    env.new_preparer().recover()
    assert set(env.checkpoint().claims) == {UID_A}
    assert env.spec_file(UID_A).read_bytes() == done_spec
    assert not env.spec_file(UID_B).exists()
    assert env.sample("fracgpu_plugin_prepared_claims") == 1


def test_corrupt_checkpoint_moved_aside_with_event(env: Env) -> None:
    env.store.path.write_text("{ not json")
    env.preparer.recover()
    assert env.sample("fracgpu_plugin_checkpoint_corruptions_total") == 1
    assert [p.name for p in env.store.path.parent.iterdir() if p.name.startswith("ckpt.json.corrupt-")]
    assert len(env.api.events) == 1
    event = env.api.events[0]["body"]
    assert event["reason"] == "CheckpointCorrupt"
    assert event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["name"] == NODE
    assert event["type"] == "Warning"
    # the plugin continues: a fresh checkpoint, and prepare works
    assert env.checkpoint().claims == {}
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert len(env.api.events) == 1


def test_corrupt_checkpoint_keeps_the_specs_of_running_claims(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    env.preparer.prepare([ref(claim)])
    spec = env.spec_file(UID_A).read_bytes()
    env.store.path.write_text('{"version": 1, "claims": {"x": ')  # truncated while pods run
    env.new_preparer().recover()
    assert env.spec_file(UID_A).read_bytes() == spec, "a live claim's CDI spec must survive"
    entry = env.checkpoint().claims[UID_A]
    assert (entry.namespace, entry.name, entry.state) == (NS, "claim-a", "PrepareCompleted")
    assert "recovered 1 prepared claims" in env.api.events[0]["body"]["message"]
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}
    assert not env.spec_file(UID_A).exists()


def test_unreachable_api_server_is_a_claim_error_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env(tmp_path, monkeypatch, api_timeout_seconds=2.5)  # two retries after 1 s each fit
    monkeypatch.undo()  # the real KubeRest, on a connection to a port where nothing listens
    results = env.preparer.prepare([ClaimRef(namespace=NS, name="x", uid=UID_A)])
    assert re.fullmatch(
        r"cannot read ResourceClaim team-a/x: API server unreachable: cannot connect to 127\.0\.0\.1:\d+: "
        r"connection refused; tried 3 times in 2\.\d s; the kubelet retries",
        results[UID_A].error,
    ), results[UID_A].error


def test_a_device_that_became_another_gpu_is_refused(env: Env) -> None:
    claim = env.api.add(make_claim(UID_A, "claim-a"))  # on gpu-0
    env.preparer.prepare([ref(claim)])
    assert env.checkpoint().claims[UID_A].devices[0].uuid == UUID0
    swapped = [gpu_info(0, UUID1), gpu_info(1, UUID0)]  # NVML indices shifted after a GPU change
    result = env.new_preparer(gpus=swapped).prepare([ref(claim)])[UID_A]
    assert "gpu-0 was GPU" in result.error and "delete the pod" in result.error
    assert not result.devices
    assert env.sample("fracgpu_plugin_errors_total", operation="prepare", type="device_changed") == 1


def test_a_spec_a_power_loss_tore_on_a_persistent_cdi_dir_is_rewritten_after_the_reboot(env: Env) -> None:
    """Specs are not fsynced: on a persistent CDI dir a power loss may leave one torn. The boot ID changed, so
    recovery re-writes it (the property that makes the fsync unnecessary)."""
    env.api.add(make_claim(UID_A, "a"))
    env.store.save(Checkpoint.empty("boot-0").with_claim(UID_A, completed_entry(UID_A, "a")))
    env.settings.cdi_dir.mkdir(parents=True)
    env.spec_file(UID_A).write_bytes(b'{"cdiVersion": "0.6.0", "kind": "k8s.gpu.fra')  # torn by the power loss

    env.preparer.recover()
    spec = json.loads(env.spec_file(UID_A).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{UID_A}-gpu-0-{SHARE_A}"]
    assert env.checkpoint().node_boot_id == "boot-1"


def test_reboot_rewrites_specs_and_stamps_boot_id(env: Env) -> None:
    a = env.api.add(make_claim(UID_A, "a"))
    env.api.add(make_claim(UID_B, "gone"))
    previous = (
        Checkpoint.empty("boot-0")
        .with_claim(UID_A, completed_entry(UID_A, "a"))
        .with_claim(UID_B, completed_entry(UID_B, "gone"))
    )
    del env.api.claims[NS, "gone"]  # deleted while the node was down
    env.store.save(previous)
    assert not env.settings.cdi_dir.exists()  # /var/run/cdi is tmpfs: wiped by the reboot

    env.preparer.recover()
    assert (NS, "a") in env.api.reads
    checkpoint = env.checkpoint()
    assert checkpoint.node_boot_id == "boot-1"
    assert set(checkpoint.claims) == {UID_A}
    spec = json.loads(env.spec_file(UID_A).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{UID_A}-gpu-0-{SHARE_A}"]
    assert not env.spec_file(UID_B).exists()
    # and the restored claim answers as before
    results = env.preparer.prepare([ref(a)])
    before = checkpoint.claims[UID_A].devices
    assert before == [
        CheckpointDevice.from_prepared(d, b.uuid) for d, b in zip(results[UID_A].devices, before, strict=True)
    ]


def test_recover_same_boot_does_not_fetch(env: Env) -> None:
    env.preparer.prepare([ref(env.api.add(make_claim(UID_A, "a")))])
    reads = len(env.api.reads)
    env.new_preparer().recover()
    assert len(env.api.reads) == reads  # every spec is there: nothing to restore
    assert set(env.checkpoint().claims) == {UID_A}


# --- health ----------------------------------------------------------------------------------------


def test_health_follows_the_preparers_device_nodes(env: Env) -> None:
    health = DeviceHealth(NODE, GPUS, env.preparer.device_nodes)
    assert health() == [(NODE, "gpu-0", True, ""), (NODE, "gpu-1", True, "")]
    del env.nodes.nodes["nvidia1"]
    missing = "its device node /dev/nvidia1 is missing (GPU or driver gone)"
    assert health() == [(NODE, "gpu-0", True, ""), (NODE, "gpu-1", False, missing)]


# --- API failures ----------------------------------------------------------------------------------


def test_status_update_failure_does_not_fail_prepare(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_self: Any, path: str, body: Any, field_manager: str, force: bool = True) -> None:
        raise api_error(403, "Forbidden")

    monkeypatch.setattr(KubeRest, "apply", refuse)
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert env.checkpoint().claims[UID_A].state == "PrepareCompleted"
    assert env.preparer.wait_ready_writes(10)
    assert env.sample("fracgpu_plugin_errors_total", operation="prepare", type="status_update") == 1


def test_api_error_is_a_claim_error(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_self: Any, path: str, **query: Any) -> Any:
        raise api_error(500, "Internal Server Error")

    monkeypatch.setattr(KubeRest, "get", broken)
    results = env.preparer.prepare([ClaimRef(namespace=NS, name="x", uid=UID_A)])
    assert "500" in results[UID_A].error
    assert env.sample("fracgpu_plugin_errors_total", operation="prepare", type="api_error") == 1


def test_recover_removes_the_hami_core_cache_of_a_claim_it_does_not_know(env: Env) -> None:
    env.preparer.prepare([ref(env.api.add(make_claim(UID_A, "a")))])
    kept, orphan = hami_cache_dir(env.settings, UID_A), hami_cache_dir(env.settings, UID_C)
    kept.mkdir(parents=True)
    orphan.mkdir(parents=True)
    (orphan / "vgpu.cache").write_bytes(b"x")
    env.new_preparer().recover()
    assert kept.is_dir()
    assert not orphan.exists()


class CountingDetector(EnforcementDetector):
    """The enforcement tiers as the plugin would detect them without NVML; counts how often they are read."""

    reads = 0

    def tiers(self) -> Mapping[str, GpuTiers]:
        self.reads += 1
        return super().tiers()


def test_a_batch_reads_the_offered_tiers_once(env: Env) -> None:
    nvml = {g.uuid: NvmlLimits(problem="no NVML in this test") for g in GPUS}
    detector = CountingDetector(env.settings, GPUS, cgroup_problem=None, driver_edits_problem=None, nvml=nvml)
    preparer = make_preparer(
        connection(refused_url()), env.settings, env.store, env.metrics, nodes=env.nodes, enforcement=detector
    )
    claims = [env.api.add(make_claim(uid, name)) for uid, name in ((UID_A, "a"), (UID_B, "b"), (UID_C, "c"))]
    results = preparer.prepare([ref(c) for c in claims])
    assert [r.error for r in results.values()] == ["", "", ""]
    assert detector.reads == 1, "read once per call, not once per claim"
