"""Unit tests of the prepared-claims checkpoint (kubelet_plugin/checkpoint.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kubelet_plugin.checkpoint import (
    Checkpoint,
    CheckpointDevice,
    CheckpointStore,
    ClaimEntry,
    boot_id,
)
from kubelet_plugin.model import PreparedDevice

BOOT_A = "5a1c7d3e-0000-4000-8000-00000000000a"
BOOT_B = "5a1c7d3e-0000-4000-8000-00000000000b"
CLAIM_UID = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"


def sample_checkpoint(boot: str = BOOT_A) -> Checkpoint:
    device = PreparedDevice(
        request_names=("gpu",),
        pool_name="node-1",
        device_name="gpu-0",
        cdi_device_ids=(f"k8s.gpu.fracgpu.dev/claim={CLAIM_UID}-gpu-0-s1",),
        share_id="s1",
    )
    return (
        Checkpoint.empty(boot)
        .with_claim(
            CLAIM_UID,
            ClaimEntry(
                namespace="default",
                name="my-claim",
                state="PrepareCompleted",
                devices=[CheckpointDevice.from_prepared(device)],
            ),
        )
        .with_claim("other", ClaimEntry(namespace="ns", name="c2", state="PrepareStarted"))
    )


def store(tmp_path: Path, boot: str = BOOT_A) -> CheckpointStore:
    return CheckpointStore(tmp_path / "plugin" / "checkpoint.json", current_boot_id=boot)


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- roundtrip -------------------------------------------------------------------------------------


def test_missing_file_is_empty_without_corruption(tmp_path: Path) -> None:
    result = store(tmp_path).load()
    assert result.checkpoint == Checkpoint.empty(BOOT_A)
    assert result.corruption is None
    assert result.rebooted is False


def test_roundtrip(tmp_path: Path) -> None:
    s = store(tmp_path)
    cp = sample_checkpoint()
    s.save(cp)
    result = s.load()
    assert result.checkpoint == cp
    assert result.corruption is None
    assert result.rebooted is False
    entry = result.checkpoint.claims[CLAIM_UID]
    assert entry.devices[0].to_prepared().share_id == "s1"
    assert entry.devices[0].to_prepared().cdi_device_ids == (f"k8s.gpu.fracgpu.dev/claim={CLAIM_UID}-gpu-0-s1",)


def test_wire_format_is_camel_case(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.save(sample_checkpoint())
    doc = json.loads(s.path.read_text())
    assert doc["version"] == 1
    assert doc["nodeBootID"] == BOOT_A
    dev = doc["claims"][CLAIM_UID]["devices"][0]
    assert set(dev) == {"requestNames", "poolName", "deviceName", "cdiDeviceIDs", "shareID", "uuid"}
    assert doc["claims"][CLAIM_UID]["state"] == "PrepareCompleted"
    assert stat.S_IMODE(s.path.stat().st_mode) == 0o600


def test_a_checkpoint_without_device_uuids_still_loads(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.save(sample_checkpoint())
    doc = json.loads(s.path.read_text())
    for entry in doc["claims"].values():
        for device in entry["devices"]:
            device.pop("uuid")  # as written before devices recorded their GPU
    s.path.write_text(json.dumps(doc))
    loaded = s.load()
    assert loaded.corruption is None
    assert loaded.checkpoint.claims[CLAIM_UID].devices[0].uuid is None


def test_with_and_without_claim_do_not_mutate() -> None:
    cp = sample_checkpoint()
    smaller = cp.without_claim(CLAIM_UID)
    assert CLAIM_UID in cp.claims
    assert CLAIM_UID not in smaller.claims
    assert smaller.without_claim("absent") == smaller


# --- atomic save -----------------------------------------------------------------------------------


def test_save_leaves_no_temp_files(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.save(sample_checkpoint())
    s.save(sample_checkpoint().without_claim("other"))
    assert files(s.path.parent) == ["checkpoint.json"]
    assert "other" not in s.load().checkpoint.claims


def test_failed_rename_keeps_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store(tmp_path)
    s.save(sample_checkpoint())
    before = s.path.read_bytes()

    def failing_replace(src: Any, dst: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="Input/output"):
        s.save(Checkpoint.empty(BOOT_A))
    assert s.path.read_bytes() == before
    assert files(s.path.parent) == ["checkpoint.json"]


def test_failed_write_midway_keeps_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store(tmp_path)
    s.save(sample_checkpoint())
    before = s.path.read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        s.save(Checkpoint.empty(BOOT_A))
    assert s.path.read_bytes() == before
    assert files(s.path.parent) == ["checkpoint.json"]


def test_failed_serialisation_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store(tmp_path)
    s.save(sample_checkpoint())
    before = s.path.read_bytes()

    def failing_to_json(self: Checkpoint) -> str:
        raise TypeError("cannot serialise")

    monkeypatch.setattr(Checkpoint, "to_json", failing_to_json)
    with pytest.raises(TypeError):
        s.save(Checkpoint.empty(BOOT_A))
    assert s.path.read_bytes() == before
    assert files(s.path.parent) == ["checkpoint.json"]


# --- corruption ------------------------------------------------------------------------------------

_VALID = json.loads(sample_checkpoint().to_json())


def _with(**changes: Any) -> bytes:
    return json.dumps({**_VALID, **changes}).encode()


CORRUPT_FILES: dict[str, tuple[bytes, str]] = {
    "garbage": (b"\x00\xffnot json at all", "not valid JSON"),
    "truncated": (sample_checkpoint().to_json().encode()[:40], "not valid JSON"),
    "empty": (b"", "is empty"),
    "not-an-object": (b"[1, 2]", "not a JSON object"),
    "wrong-version": (_with(version=2), "unsupported version 2; this plugin reads version 1"),
    "no-version": (json.dumps({"nodeBootID": BOOT_A, "claims": {}}).encode(), "unsupported version null"),
    "string-version": (_with(version="1"), 'unsupported version "1"'),
    "bool-version": (_with(version=True), "unsupported version true"),
    "wrong-types": (_with(nodeBootID=42), "nodeBootID"),
    "bad-state": (
        _with(claims={"u": {"namespace": "n", "name": "c", "state": "Done", "devices": []}}),
        "claims.u.state",
    ),
    "unknown-field": (_with(extra=1), "extra"),
    "device-wrong-type": (
        _with(
            claims={
                "u": {
                    "namespace": "n",
                    "name": "c",
                    "state": "PrepareCompleted",
                    "devices": [{"requestNames": "gpu", "poolName": "p", "deviceName": "d", "cdiDeviceIDs": []}],
                }
            }
        ),
        "claims.u.devices.0.requestNames",
    ),
}


@pytest.mark.parametrize("variant", sorted(CORRUPT_FILES))
def test_corrupt_file_is_moved_aside(tmp_path: Path, variant: str) -> None:
    content, expected = CORRUPT_FILES[variant]
    s = store(tmp_path)
    s.path.parent.mkdir(parents=True)
    s.path.write_bytes(content)

    result = s.load()

    assert result.checkpoint == Checkpoint.empty(BOOT_A)
    assert result.rebooted is False
    assert result.corruption is not None
    assert expected in result.corruption
    assert str(s.path) in result.corruption
    assert result.moved_to is not None
    assert str(result.moved_to) in result.corruption
    assert result.moved_to.name.startswith("checkpoint.json.corrupt-")
    assert result.moved_to.read_bytes() == content
    assert not s.path.exists()
    # the plugin carries on: the next load is clean, and saving works
    assert s.load().corruption is None
    s.save(result.checkpoint)
    assert s.load().checkpoint == result.checkpoint


def test_unreadable_path_is_moved_aside(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.path.mkdir(parents=True)  # a directory where the file should be
    result = s.load()
    assert result.corruption is not None
    assert "cannot read checkpoint" in result.corruption
    assert result.checkpoint.claims == {}
    assert result.moved_to is not None and result.moved_to.is_dir()


def test_two_corruptions_get_distinct_names(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.path.parent.mkdir(parents=True)
    moved = set()
    for _ in range(3):
        s.path.write_bytes(b"{")
        result = s.load()
        assert result.moved_to is not None
        moved.add(result.moved_to)
    assert len(moved) == 3


# --- reboot ----------------------------------------------------------------------------------------


def test_reboot_detected_and_entries_kept(tmp_path: Path) -> None:
    store(tmp_path, BOOT_A).save(sample_checkpoint(BOOT_A))
    after_reboot = store(tmp_path, BOOT_B)
    result = after_reboot.load()
    assert result.rebooted is True
    assert result.corruption is None
    assert result.current_boot_id == BOOT_B
    assert result.checkpoint.node_boot_id == BOOT_A  # still says the specs are from the old boot
    assert set(result.checkpoint.claims) == {CLAIM_UID, "other"}
    # once the caller has rewritten the specs it stamps the new boot
    after_reboot.save(result.checkpoint.with_boot_id(result.current_boot_id))
    assert after_reboot.load().rebooted is False


def test_boot_id_helper(tmp_path: Path) -> None:
    fake = tmp_path / "boot_id"
    fake.write_text(BOOT_B + "\n")
    assert boot_id(fake) == BOOT_B
    assert CheckpointStore(tmp_path / "cp.json", current_boot_id=None).current_boot_id  # reads the real one
    with pytest.raises(OSError):
        boot_id(tmp_path / "missing")
