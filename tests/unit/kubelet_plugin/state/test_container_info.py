"""Unit tests of the per-device names and per-request files a container gets (kubelet_plugin/state/container_info.py)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import container_info as info
from tests.unit.fs_calls import record_renames

UID = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"
SHARE = "a671734a-e8e5-11e4-8fde-42010af09327"


def request_info(request: str = "gpu", uid: str = UID) -> info.RequestInfo:
    device = info.DeviceInfo(
        uuid="GPU-1",
        memory_mib=1024,
        share_id=SHARE,
        device="gpu-0",
        pci_bus_id="0000:01:00.0",
        minor=0,
        cdi_device=f"k8s.gpu.fracgpu.dev/claim={uid}-gpu-0-{SHARE}",
        env_prefix=info.env_prefix(f"{uid}-gpu-0-{SHARE}"),
    )
    claim = info.ClaimName(namespace="ns", name="c", uid=uid)
    return info.RequestInfo(claim=claim, request=request, enforcement="none", devices=[device])


def test_env_names_of_different_devices_never_collide() -> None:
    names = [f"{UID}-gpu-{i}" for i in range(3)] + [f"{UID}-gpu-{i}-{SHARE}" for i in range(3)]
    names += [f"{UID[:-1]}c-gpu-0", f"{UID}-gpu-1-0"]
    env_names = [f"{info.env_prefix(n)}{suffix}" for n in names for suffix in info.ENV_SUFFIXES]
    assert len(set(env_names)) == len(env_names)
    for a, b in itertools.permutations(info.ENV_SUFFIXES, 2):
        assert not a.endswith("_" + b), (a, b)


@pytest.mark.parametrize("name", [f"{UID}-GPU-0", f"{UID}-gpu_0", f"{UID}-gpu.0", f"{UID}-gpu-0:1"])
def test_a_name_that_cannot_be_keyed_is_refused(name: str) -> None:
    with pytest.raises(info.InfoNameError, match="unique environment variable name"):
        info.env_prefix(name)


def test_file_paths() -> None:
    f = info.info_file(Path("/var/lib/kubelet/plugins/d"), request_info("train"))
    assert f.host_path == Path(f"/var/lib/kubelet/plugins/d/claim-info/{UID}/train.json")
    assert f.container_path == f"/run/fracgpu/{UID}_train.json"
    with pytest.raises(info.InfoNameError, match="not a DNS label"):
        info.info_file(Path("/p"), request_info("../x"))


def test_json_uses_the_documented_names() -> None:
    data = json.loads(request_info().to_json())
    assert set(data) == {"version", "claim", "request", "enforcement", "devices"}
    assert data["version"] == 1 < info.INFO_SCHEMA_VERSION  # a file without a MIG device is written in schema 1
    assert set(data["devices"][0]) == {
        "uuid",
        "memoryMiB",
        "shareID",
        "device",
        "pciBusID",
        "minor",
        "cdiDevice",
        "envPrefix",
        "enforcement",
    }


# A request's file as fracgpu 0.1.0 wrote it (no `version`: schema 1).
V0_1_0_FILE = (
    '{"claim":{"namespace":"ns","name":"c","uid":"UID"},"request":"gpu","enforcement":"none","devices":[{"uuid":'
    '"GPU-1","memoryMiB":1024,"shareID":null,"device":"gpu-0","pciBusID":"0000:01:00.0","minor":0,"cdiDevice":'
    '"k8s.gpu.fracgpu.dev/claim=UID-gpu-0","envPrefix":"FRACGPU_DEV_X_","enforcement":"none"}]}\n'
).replace("UID", UID)


def test_a_file_of_fracgpu_0_1_0_reads_as_schema_1() -> None:
    read = info.RequestInfo.model_validate_json(V0_1_0_FILE)
    assert read.version == 1 and read.devices[0].memory_mib == 1024
    assert json.loads(read.to_json()) == {"version": 1, **json.loads(V0_1_0_FILE)}


def test_a_file_of_a_newer_schema_is_refused_by_name() -> None:
    newer = json.loads(request_info().to_json()) | {"version": info.INFO_SCHEMA_VERSION + 1}
    with pytest.raises(ValueError, match=rf"info file of schema {info.INFO_SCHEMA_VERSION + 1} was written by a newer"):
        info.RequestInfo.model_validate(newer)


def test_write_keeps_unchanged_files_and_drops_stale_ones(tmp_path: Path) -> None:
    directory = info.claim_info_dir(tmp_path, UID)
    gpu = info.info_file(tmp_path, request_info("gpu"))
    store.write_claim_files(directory, [gpu, info.info_file(tmp_path, request_info("old"))])
    assert gpu.host_path.stat().st_mode & 0o777 == 0o644
    inode = gpu.host_path.stat().st_ino
    store.write_claim_files(directory, [gpu])
    assert gpu.host_path.stat().st_ino == inode, "an unchanged file keeps its inode (bind mounts see it)"
    assert sorted(p.name for p in directory.iterdir()) == ["gpu.json"]
    assert json.loads(gpu.host_path.read_text())["request"] == "gpu"


def test_files_of_a_new_directory_are_written_in_place_and_changed_ones_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a directory the call creates, no temp file and no rename (nothing can read it yet); in an existing
    one a changed file is replaced by rename (a new inode, the old one left whole for its bind mounts); the
    mode is 0644 whatever the umask."""
    renames = record_renames(monkeypatch)
    old_umask = os.umask(0o077)
    try:
        directory = info.claim_info_dir(tmp_path, UID)
        gpu = info.info_file(tmp_path, request_info("gpu"))
        store.write_claim_files(directory, [gpu, info.info_file(tmp_path, request_info("other"))])
        assert renames == []
        assert sorted(p.name for p in directory.iterdir()) == ["gpu.json", "other.json"]
        assert gpu.host_path.stat().st_mode & 0o777 == 0o644
        assert gpu.host_path.read_bytes() == gpu.info.to_json()
        inode = gpu.host_path.stat().st_ino
        changed = info.InfoFile(
            gpu.host_path, gpu.container_path, request_info("gpu").model_copy(update={"enforcement": "nvml"})
        )
        store.write_claim_files(directory, [changed])
        assert [dst for _, dst in renames] == ["gpu.json"]
        assert gpu.host_path.stat().st_ino != inode
        assert gpu.host_path.stat().st_mode & 0o777 == 0o644
        assert json.loads(gpu.host_path.read_text())["enforcement"] == "nvml"
        assert sorted(p.name for p in directory.iterdir()) == ["gpu.json"]
    finally:
        os.umask(old_umask)


def test_remove_and_orphans(tmp_path: Path) -> None:
    other = "1c7a4d3f-6e2b-4c9f-8d80-3b2e4f5a6b7c"
    for uid in (UID, other):
        store.write_claim_files(info.claim_info_dir(tmp_path, uid), [info.info_file(tmp_path, request_info(uid=uid))])
    stray = info.claim_info_root(tmp_path) / "README"
    stray.write_text("not a claim")
    assert store.remove_orphan_claim_files(tmp_path, keep={UID}) == [other]
    assert info.claim_info_dir(tmp_path, UID).is_dir() and stray.exists()
    assert not info.claim_info_dir(tmp_path, other).exists()
    assert store.remove_claim_files(tmp_path, UID) is True
    assert store.remove_claim_files(tmp_path, UID) is False
    assert store.remove_orphan_claim_files(tmp_path / "nothing", keep=set()) == []


def test_remove_takes_temp_files_and_anything_else_in_the_claim_directory(tmp_path: Path) -> None:
    directory = info.claim_info_dir(tmp_path, UID)
    store.write_claim_files(directory, [info.info_file(tmp_path, request_info())])
    (directory / ".gpu.json.tmp123").write_text("an interrupted write")
    (directory / "sub" / "deeper").mkdir(parents=True)
    (directory / "sub" / "deeper" / "file").write_text("not ours")
    assert store.remove_claim_files(tmp_path, UID) is True
    assert not directory.exists()
    assert info.claim_info_root(tmp_path).is_dir()
