"""Unit tests of the mps tier in a claim's plan: the client's environment, mounts and info, and the refusals
(kubelet_plugin/prepare/plan.py), with the tiers read as the plugin reads them (status files of
kubelet_plugin/state/mps_files.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.enforcement.tiers import GpuTiers
from kubelet_plugin.kinds.mps.plan import MPS_MEMORY_ENV, MPS_PIPE_ENV, MPS_THREADS_ENV
from kubelet_plugin.state import mps_files as mps
from tests.unit.kubelet_plugin.prepare.test_plan import (
    GPUS,
    claim,
    config,
    env_of,
    gpu_config,
    make_settings,
    only_device,
    planned,
    result,
)
from tests.unit.plugin_host import SHARE_B, UUID0, UUID1


def write_status(root: Path, uuid: str, state: mps.DaemonState = "running", age: float = 0.0, reason: str = "") -> None:
    path = mps.status_path(root, uuid)
    path.parent.mkdir(parents=True, exist_ok=True)
    status = mps.DaemonStatus(uuid=uuid, state=state, reason=reason, updated=time.time() - age, refresh_seconds=5)
    path.write_bytes(status.to_json())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "driver-root"
    (r / "dev").mkdir(parents=True)
    return r


@pytest.fixture
def mps_settings(root: Path, tmp_path: Path) -> Settings:
    settings = make_settings(root, mps_gpus="0", mps_root=tmp_path / "mps")
    write_status(settings.mps_root, UUID0)
    return settings


def tiers_of(settings: Settings) -> dict[str, GpuTiers]:
    return dict(EnforcementDetector.without_nvml(settings, list(GPUS.values()), "no nvml").tiers())


def test_an_mps_share_is_a_client_of_its_gpus_daemon_with_its_grant_and_percentage(mps_settings: Settings) -> None:
    configs = [config(gpu_config(computeLimitPercent=30))]
    plan = planned(claim([result(memory="10Gi")], configs), mps_settings, GPUS, tiers=tiers_of(mps_settings))
    device = only_device(plan)
    env = env_of(device.container_edits)
    assert env[MPS_PIPE_ENV] == mps.PIPE_IN_CONTAINER
    assert env[MPS_MEMORY_ENV] == "0=10240M"
    assert env[MPS_THREADS_ENV] == "30"
    assert env["FRACGPU_ENFORCEMENT"] == "mps"
    assert env["CUDA_VISIBLE_DEVICES"] == UUID0, "an image's own CUDA_VISIBLE_DEVICES cannot hide the GPU"
    mounts = {m.container_path: m for m in device.container_edits.mounts}
    pipe, shm = mounts[mps.PIPE_IN_CONTAINER], mounts[mps.SHM_IN_CONTAINER]
    assert pipe.host_path == str(mps.pipe_dir(mps_settings.mps_root, UUID0))
    assert "ro" in pipe.options and "rw" not in pipe.options, "the client only connects: its pipe dir is read-only"
    assert shm.host_path == str(mps.shm_dir(mps_settings.mps_root, UUID0)), "the GPU's own /dev/shm, not a shared one"
    assert {"nosuid", "nodev", "noexec"} <= set(shm.options) and {"nosuid", "nodev", "noexec"} <= set(pipe.options)
    assert [t[3] for t in plan.tiers] == ["mps"]
    assert plan.mps_domain is not None and plan.mps_domain.id == "namespace/team-a"
    (file,) = plan.files
    written = json.loads(file.info.to_json())
    assert written["enforcement"] == "mps"
    assert written["devices"][0]["activeThreadPercentage"] == 30 and written["devices"][0]["memoryMiB"] == 10240
    prefix = file.info.devices[0].env_prefix
    assert env[f"{prefix}ACTIVE_THREAD_PERCENTAGE"] == "30" and env[f"{prefix}ENFORCEMENT"] == "mps"


def test_without_a_percentage_the_client_gets_no_thread_variable(mps_settings: Settings) -> None:
    device = only_device(planned(claim([result()]), mps_settings, GPUS, tiers=tiers_of(mps_settings)))
    env = env_of(device.container_edits)
    assert MPS_THREADS_ENV not in env and env[MPS_MEMORY_ENV] == "0=10240M"
    assert not any(k.endswith("ACTIVE_THREAD_PERCENTAGE") for k in env)


def test_a_whole_gpu_claim_on_an_mps_gpu_is_a_client_with_the_whole_usable_memory(mps_settings: Settings) -> None:
    plan = planned(claim([result(share=None, memory=None)]), mps_settings, GPUS, tiers=tiers_of(mps_settings))
    env = env_of(only_device(plan).container_edits)
    assert env[MPS_MEMORY_ENV] == f"0={plan.files[0].info.devices[0].memory_mib}M"
    assert plan.files[0].info.devices[0].memory_mib > 80000


def test_a_share_on_another_gpu_is_no_client(mps_settings: Settings) -> None:
    device = only_device(planned(claim([result("gpu-1")]), mps_settings, GPUS, tiers=tiers_of(mps_settings)))
    env = env_of(device.container_edits)
    assert MPS_PIPE_ENV not in env and MPS_MEMORY_ENV not in env


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        (("down", 0.0, "nvidia-cuda-mps-control exited with status 1"), "its MPS control daemon is down: nvidia-cuda"),
        (("running", 60.0, ""), "last wrote"),
        (None, "has no status file"),
    ],
)
def test_a_share_on_an_mps_gpu_whose_daemon_is_not_up_is_refused_with_the_cause(
    root: Path, tmp_path: Path, written: tuple[mps.DaemonState, float, str] | None, expected: str
) -> None:
    settings = make_settings(root, mps_gpus=UUID0, mps_root=tmp_path / "mps")
    if written is not None:
        write_status(settings.mps_root, UUID0, *written)
    with pytest.raises(PrepareError) as refused:
        planned(claim([result()]), settings, GPUS, tiers=tiers_of(settings))
    assert refused.value.kind == ErrorKind.ENFORCEMENT_UNAVAILABLE
    assert "is an MPS GPU, where every share is an MPS client" in str(refused.value)
    assert expected in str(refused.value)


def test_a_claim_with_an_mps_share_and_a_second_gpu_is_refused(root: Path, tmp_path: Path) -> None:
    settings = make_settings(root, mps_gpus="all", mps_root=tmp_path / "mps")
    write_status(settings.mps_root, UUID0)
    write_status(settings.mps_root, UUID1)
    two = claim([result(request="a"), result("gpu-1", request="b", share=SHARE_B)])
    with pytest.raises(PrepareError) as refused:
        planned(two, settings, GPUS, tiers=tiers_of(settings))
    assert refused.value.kind == ErrorKind.INVALID_CONFIG
    assert "one CUDA_MPS_PIPE_DIRECTORY" in str(refused.value) and "claim of its own" in str(refused.value)


def test_mps_gpus_accepts_all_or_indices_and_uuids_and_names_what_is_wrong(root: Path) -> None:
    assert make_settings(root, mps_gpus=" 0, GPU-1 ").mps_gpus == "0,GPU-1"
    for bad in ("all,0", "gpu0"):
        with pytest.raises(ValueError, match=r"MPS GPUs are|cannot be combined"):
            make_settings(root, mps_gpus=bad)


def test_with_a_label_scope_the_domain_is_the_one_the_controller_recorded(root: Path, tmp_path: Path) -> None:
    settings = make_settings(
        root, mps_gpus="0", mps_root=tmp_path / "mps", mps_trust_scope="namespaceLabel", mps_trust_label="team"
    )
    write_status(settings.mps_root, UUID0)
    allocated = claim([result()])
    with pytest.raises(PrepareError) as refused:
        planned(allocated, settings, GPUS, tiers=tiers_of(settings))
    assert "has not recorded this claim's MPS trust domain" in str(refused.value), "no guess when the data is absent"
    entry = {
        "driver": "gpu.fracgpu.dev",
        "pool": "node-a",
        "device": "gpu-0",
        "data": {"mpsTrustDomain": "label/team=ml"},
    }
    allocated["status"]["devices"] = [entry]
    plan = planned(allocated, settings, GPUS, tiers=tiers_of(settings))
    assert plan.mps_domain is not None and plan.mps_domain.describe() == "the namespaces labelled team=ml"
    entry["data"] = {"mpsTrustDomain": "namespace/elsewhere"}
    with pytest.raises(PrepareError) as mismatch:
        planned(allocated, settings, GPUS, tiers=tiers_of(settings))
    assert "but the claim is in namespace team-a" in str(mismatch.value)
