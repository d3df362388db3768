"""The Preparer on a MIG GPU: partitions made at prepare and recorded, reused, destroyed at unprepare, and every
crash repaired at the next start (orphans destroyed, gone partitions made again). The MIG manager is
``FakeMig`` (tests/unit/fake_mig.py), with the driver's semantics; ``NvmlMig`` on the mock NVML is tested apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api.mig import PARTITION_CONDITION, partition_device_name
from api.names import DRIVER_NAME
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.kinds.mig.publish import mig_catalog, partition_entry
from kubelet_plugin.prepare.preparer import Preparer
from kubelet_plugin.state import device_metadata
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointStore
from tests.unit.fake_apiserver import connection, refused_url
from tests.unit.fake_mig import H100_MIG, FakeMig, profile
from tests.unit.plugin_host import (
    GPUS,
    NODE,
    NODES,
    UID_A,
    UID_B,
    UUID1,
    Env,
    HostNodes,
    make_claim,
    make_env,
    make_preparer,
    ref,
)

CAPS_MAJOR = 508
SMALL = partition_device_name(1, "1g.10gb", 6)
LARGE = partition_device_name(1, "3g.40gb", 0)
HALF = partition_device_name(1, "3g.40gb", 4)


def cap_minor(gpu: int, gi: int, ci: int | None = None) -> int:
    return 3 + 135 * gpu + 9 * gi + (0 if ci is None else 1 + ci)


class Crash(BaseException):
    """Stands for SIGKILL."""


@pytest.fixture
def mig() -> FakeMig:
    return FakeMig()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mig: FakeMig) -> Env:
    minors = tmp_path / "mig-minors"
    minors.write_text(
        "config 1\nmonitor 2\n"
        + "".join(
            f"gpu{g}/gi{i}/access {cap_minor(g, i)}\n"
            + "".join(f"gpu{g}/gi{i}/ci{c}/access {cap_minor(g, i, c)}\n" for c in range(8))
            for g in range(2)
            for i in range(60)
        )
    )
    env = make_env(tmp_path, monkeypatch, mig_gpus="1", mig_minors_file=minors)
    env.nodes.nodes.update(
        {
            f"nvidia-caps/nvidia-cap{m}": (CAPS_MAJOR, m)
            for g in range(2)
            for m in range(cap_minor(g, 0), cap_minor(g, 60))
        }
    )
    env.preparer = _preparer(env, mig)
    return env


def _preparer(env: Env, mig: FakeMig, boot: str = "boot-1") -> Preparer:
    env.store = CheckpointStore(env.store.path, current_boot_id=boot)
    env.metrics = PluginMetrics()
    return make_preparer(
        connection(refused_url()), env.settings, env.store, env.metrics, nodes=env.nodes,
        mig={"gpu-1": H100_MIG}, mig_manager=mig,
    )  # fmt: skip


def mig_claim(uid: str, name: str, device: str) -> dict[str, Any]:
    """A claim allocated one partition: a device without shares or consumed capacity."""
    claim = make_claim(uid, name, device=device)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    del result["shareID"], result["consumedCapacity"]
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "mig.gpu.fracgpu.dev"
    return claim


def spec(env: Env, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(env.spec_file(uid).read_text())
    return data


def env_of(spec_: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec_["devices"][0]["containerEdits"]["env"])


def record(env: Env, uid: str) -> Any:
    (device,) = env.checkpoint().claims[uid].devices
    return device.mig


def test_prepare_makes_the_partition_and_gives_the_container_only_it(env: Env, mig: FakeMig) -> None:
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    result = env.preparer.prepare([ref(claim)])[UID_A]
    assert result.error == ""
    assert mig.calls == ["create 1g.10gb@6"]
    made = record(env, UID_A)
    assert (made.parent_uuid, made.profile, made.placement_start, made.memory_mib) == (UUID1, "1g.10gb", 6, 9984)
    edits = spec(env, UID_A)["devices"][0]["containerEdits"]
    nodes = sorted(n["path"] for n in edits["deviceNodes"])
    caps = [f"/dev/nvidia-caps/nvidia-cap{cap_minor(1, made.gpu_instance)}",
            f"/dev/nvidia-caps/nvidia-cap{cap_minor(1, made.gpu_instance, 0)}"]  # fmt: skip
    assert nodes == sorted(["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", *caps])
    assert "/dev/nvidia0" not in nodes, "only the partition's GPU"
    env_vars = env_of(spec(env, UID_A))
    prefix = next(k for k in env_vars if k.endswith("_MIG_DEVICE")).removesuffix("MIG_DEVICE")
    assert env_vars[f"{prefix}MIG_DEVICE"] == made.uuid
    assert env_vars[f"{prefix}MIG_PROFILE"] == "1g.10gb"
    assert env_vars[f"{prefix}UUID"] == UUID1, "UUID stays the physical GPU's"
    assert env_vars[f"{prefix}MEMORY_LIMIT_MIB"] == "9984", "the partition's own memory, what CUDA sees"
    assert env_vars[f"{prefix}ENFORCEMENT"] == "mig"
    assert env_vars["NVIDIA_VISIBLE_DEVICES"] == made.uuid, "driver edits none: the MIG UUID for an nvidia runtime"
    info = json.loads((env.settings.plugin_data_dir / "claim-info" / UID_A / "gpu.json").read_text())
    assert info["version"] == 2 and info["devices"][0]["mig"]["uuid"] == made.uuid
    published = partition_entry(mig_catalog(GPUS, {"gpu-1": H100_MIG})[SMALL])["capacity"]["memory"]["value"]
    assert published == f"{info['devices'][0]['memoryMiB']}Mi" == "9984Mi", "the grant is the capacity published"
    env.preparer.wait_ready_writes(5)
    (patch,) = env.api.status_patches
    (entry,) = patch["body"]["status"]["devices"]
    partition = next(c for c in entry["conditions"] if c["type"] == PARTITION_CONDITION)
    assert (partition["status"], partition["message"]) == ("True", made.uuid)
    enforcement = next(c for c in entry["conditions"] if c["type"] == "MemoryEnforcement")
    assert enforcement["reason"] == "Mig"


def test_the_device_metadata_names_the_partition_with_its_published_attributes(env: Env, mig: FakeMig) -> None:
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    host = env.settings.plugin_data_dir / "claim-info" / UID_A / "gpu.metadata"
    beta, alpha = device_metadata.read_stream(host.read_text())
    assert beta.requests == alpha.requests
    ((device,),) = [r.devices for r in beta.requests]
    assert (device.driver, device.pool, device.name) == (DRIVER_NAME, NODE, SMALL)
    attributes = {k: v.model_dump(by_alias=True, exclude_none=True) for k, v in device.attributes.items()}
    assert attributes == partition_entry(mig_catalog(GPUS, {"gpu-1": H100_MIG})[SMALL])["attributes"]
    assert (attributes["type"], attributes["profile"], attributes["uuid"]) == (
        {"string": "mig"},
        {"string": "1g.10gb"},
        {"string": UUID1},
    )
    mounts = spec(env, UID_A)["devices"][0]["containerEdits"]["mounts"]
    assert {"hostPath": str(host), "containerPath": (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/small/gpu/{DRIVER_NAME}-metadata.json"
    ), "options": ["ro", "nosuid", "nodev", "noexec", "rbind", "rprivate"]} in mounts  # fmt: skip
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}
    assert not host.exists()


def test_with_driver_edits_the_container_is_told_void(tmp_path: Path, env: Env, mig: FakeMig) -> None:
    env.settings = env.settings.model_copy(update={"driver_edits": "toolkit"})

    class Edits:
        def current(self) -> Any:
            from kubelet_plugin.state import cdi

            return cdi.ContainerEdits(
                mounts=[cdi.Mount(host_path="/d/libcuda.so.1.2", container_path="/usr/lib/libcuda.so.1.2")]
            )

    env.preparer = make_preparer(
        connection(refused_url()), env.settings, env.store, env.metrics, nodes=env.nodes,
        mig={"gpu-1": H100_MIG}, mig_manager=mig, driver_edits=Edits(),
    )  # fmt: skip
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert env_of(spec(env, UID_A))["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_repeated_prepare_reuses_the_partition(env: Env, mig: FakeMig) -> None:
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    env.preparer.prepare([ref(claim)])
    first = record(env, UID_A)
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert mig.calls == ["create 1g.10gb@6"] and record(env, UID_A) == first


def test_unprepare_destroys_the_partition_then_forgets_the_claim(env: Env, mig: FakeMig) -> None:
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    env.preparer.prepare([ref(claim)])
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}
    assert mig.count() == 0 and UID_A not in env.checkpoint().claims
    assert not env.spec_file(UID_A).exists()


def test_a_partition_still_in_use_fails_its_unprepare_and_stays_prepared(env: Env, mig: FakeMig) -> None:
    a = env.api.add(mig_claim(UID_A, "small", SMALL))
    b = env.api.add(mig_claim(UID_B, "large", LARGE))
    env.preparer.prepare([ref(a), ref(b)])
    mig.in_use.add(record(env, UID_A).uuid)
    errors = env.preparer.unprepare([ref(a), ref(b)])
    assert "a process still uses it" in errors[UID_A] or "In use" in errors[UID_A]
    assert errors[UID_B] == ""
    assert set(env.checkpoint().claims) == {UID_A} and env.spec_file(UID_A).exists()
    mig.in_use.clear()
    assert env.preparer.unprepare([ref(a)]) == {UID_A: ""}, "the kubelet's retry"
    assert mig.count() == 0


def test_a_taken_placement_fails_the_prepare_with_what_takes_it(env: Env, mig: FakeMig) -> None:
    mig.create(GPUS[1], profile("3g.40gb"), 4)  # someone else's instance on slices 4-7
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    error = env.preparer.prepare([ref(claim)])[UID_A].error
    assert "cannot create MIG partition 1g.10gb at placement 6 of GPU 1" in error and "Insufficient" in error
    assert not env.spec_file(UID_A).exists() and UID_A not in env.checkpoint().claims


def test_the_mig_gpu_itself_is_never_prepared(env: Env, mig: FakeMig) -> None:
    claim = env.api.add(make_claim(UID_A, "whole", device="gpu-1"))
    error = env.preparer.prepare([ref(claim)])[UID_A].error
    assert "is MIG GPU" in error and "allocated only by its partitions" in error
    assert mig.calls == []


def test_compute_limit_percent_is_refused_on_a_partition(env: Env, mig: FakeMig) -> None:
    claim = mig_claim(UID_A, "small", SMALL)
    claim["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER_NAME, "parameters": {
            "apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": 50}}}
    ]  # fmt: skip
    error = env.preparer.prepare([ref(env.api.add(claim))])[UID_A].error
    assert "computeLimitPercent does not apply" in error
    assert mig.count() == 0, "the partition made for it is destroyed again"


def test_a_failed_checkpoint_save_destroys_the_partitions_it_would_record(
    env: Env, mig: FakeMig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: CheckpointStore, checkpoint: Checkpoint) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(CheckpointStore, "save", fail)
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    assert "cannot save the checkpoint" in env.preparer.prepare([ref(claim)])[UID_A].error
    assert mig.count() == 0


def test_a_crash_before_the_checkpoint_leaves_an_orphan_the_next_start_destroys(
    env: Env, mig: FakeMig, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))

    def crash(self: CheckpointStore, checkpoint: Checkpoint) -> None:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(CheckpointStore, "save", crash)
        with pytest.raises(Crash):
            env.preparer.prepare([ref(claim)])
    assert mig.count() == 1, "the kill came after the partition was made"
    _preparer(env, mig).recover()
    assert mig.count() == 0 and mig.calls[-1].startswith("destroy-orphan")
    assert not env.spec_file(UID_A).exists()
    assert env.preparer.prepare([ref(claim)])[UID_A].error == "", "the kubelet's retry makes it again"
    assert mig.count() == 1


def test_a_crash_between_destroy_and_save_at_unprepare_is_repaired(
    env: Env, mig: FakeMig, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    env.preparer.prepare([ref(claim)])

    def crash(self: CheckpointStore, checkpoint: Checkpoint) -> None:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(CheckpointStore, "save", crash)
        with pytest.raises(Crash):
            env.preparer.unprepare([ref(claim)])
    assert mig.count() == 0 and UID_A in env.checkpoint().claims
    del env.api.claims[claim["metadata"]["namespace"], "small"]  # the pod and its claim are gone
    _preparer(env, mig).recover()
    assert UID_A not in env.checkpoint().claims and mig.count() == 0, "a claim that is gone is not made again"
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}, "the kubelet's retry"


def test_a_partition_gone_while_its_claim_stays_is_made_again_at_the_next_start(env: Env, mig: FakeMig) -> None:
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    env.preparer.prepare([ref(claim)])
    before = record(env, UID_A)
    mig.live.clear()  # a GPU reset or a reboot: every instance gone
    _preparer(env, mig).recover()
    after = record(env, UID_A)
    assert after is not None and after.uuid != before.uuid and mig.count() == 1
    assert env_of(spec(env, UID_A))[next(k for k in env_of(spec(env, UID_A)) if k.endswith("MIG_DEVICE"))] == after.uuid


def test_unowned_instances_are_destroyed_and_owned_ones_kept_at_start(env: Env, mig: FakeMig) -> None:
    a = env.api.add(mig_claim(UID_A, "half", HALF))
    env.preparer.prepare([ref(a)])
    mig.create(GPUS[1], profile("1g.10gb"), 0)  # left by a prepare that never completed
    _preparer(env, mig).recover()
    assert [(i.profile.name, i.start) for i in mig.live[UUID1].values()] == [("3g.40gb", 4)]


def test_a_node_without_caps_nodes_refuses_clearly(env: Env, mig: FakeMig) -> None:
    env.nodes.nodes = dict(NODES)  # the driver made no /dev/nvidia-caps nodes and the kernel lists no major
    env.preparer = _preparer(env, mig)
    claim = env.api.add(mig_claim(UID_A, "small", SMALL))
    error = env.preparer.prepare([ref(claim)])[UID_A].error
    assert "MIG capability node" in error and "does not exist" in error
    assert mig.count() == 0


def test_the_other_gpu_is_still_shared_by_memory(env: Env, mig: FakeMig) -> None:
    claim = env.api.add(make_claim(UID_A, "share", device="gpu-0"))
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert mig.calls == []


def test_hostnodes_table_is_not_shared_between_tests() -> None:
    assert "nvidia-caps/nvidia-cap3" not in HostNodes(Path("/")).nodes
