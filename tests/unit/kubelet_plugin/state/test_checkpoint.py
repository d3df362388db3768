"""Unit tests of the prepared-claims checkpoint (kubelet_plugin/state/checkpoint.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kubelet_plugin.core.model import PreparedDevice
from kubelet_plugin.state import checkpoint as checkpoint_module
from kubelet_plugin.state.checkpoint import (
    SCHEMA_VERSION,
    Checkpoint,
    CheckpointDevice,
    CheckpointStore,
    ClaimEntry,
    NewerSchemaError,
    boot_id,
    migrate,
)

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
    assert entry.devices[0].share_id == "s1"
    assert entry.devices[0].cdi_device_ids == [f"k8s.gpu.fracgpu.dev/claim={CLAIM_UID}-gpu-0-s1"]


def test_an_unchanged_file_is_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store(tmp_path)
    s.save(sample_checkpoint())
    parsed: list[object] = []
    real = Checkpoint.model_validate

    def counted(data: object) -> Checkpoint:
        parsed.append(data)
        return real(data)

    monkeypatch.setattr(Checkpoint, "model_validate", counted)
    assert s.load().checkpoint == sample_checkpoint(), "the bytes it wrote are not parsed"
    assert s.load().checkpoint == sample_checkpoint()
    assert parsed == []
    fresh = store(tmp_path)
    assert fresh.load().checkpoint == sample_checkpoint()
    assert fresh.load().checkpoint == sample_checkpoint()
    assert len(parsed) == 1, "bytes it read once are not parsed again"


def test_a_file_another_writer_replaced_is_read_again(tmp_path: Path) -> None:
    mine, other = store(tmp_path), store(tmp_path)
    mine.save(sample_checkpoint())
    assert mine.load().checkpoint == sample_checkpoint()
    replaced = sample_checkpoint().without_claim("other")
    other.save(replaced)
    assert mine.load().checkpoint == replaced
    same_size = sample_checkpoint(BOOT_B)  # same length, other bytes, written in place
    mine.path.write_text(same_size.to_json())
    result = mine.load()
    assert result.checkpoint == same_size and result.rebooted is True


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
    assert smaller.without_claim("absent") is smaller  # unchanged: unprepare of an unknown claim saves nothing


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
    "no-version": (json.dumps({"nodeBootID": BOOT_A, "claims": {}}).encode(), "unsupported version null"),
    "version-zero": (_with(version=0), "unsupported version 0: the oldest schema this plugin reads is 1"),
    "string-version": (_with(version="1"), 'unsupported version "1"'),
    "bool-version": (_with(version=True), "unsupported version true"),
    "wrong-types": (_with(nodeBootID=42), "nodeBootID"),
    "bad-state": (
        _with(claims={"u": {"namespace": "n", "name": "c", "state": "Done", "devices": []}}),
        "claims.u.state",
    ),
    "missing-field": (json.dumps({"version": 1, "claims": {}}).encode(), "nodeBootID: Field required"),
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


# --- schema versions -------------------------------------------------------------------------------

V1_FIXTURE = (
    Path(__file__).resolve().parents[2] / "fixtures" / "checkpoint-v1.json"
)  # as written by the schema-1 plugin
V1_A = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"
V1_B = "1c7a4d3f-6e2b-4c9f-8d80-3b2e4f5a6b7c"


def _install(s: CheckpointStore, content: bytes) -> None:
    s.path.parent.mkdir(parents=True, exist_ok=True)
    s.path.write_bytes(content)


def test_a_stored_v1_file_loads_with_its_gpu_uuids(tmp_path: Path) -> None:
    s = store(tmp_path)
    _install(s, V1_FIXTURE.read_bytes())
    result = s.load()
    assert (result.corruption, result.too_new, result.migrated_from, result.unknown_fields) == (None, None, None, ())
    claims = result.checkpoint.claims
    assert {uid: [d.uuid for d in e.devices] for uid, e in claims.items()} == {
        V1_A: ["GPU-11111111-2222-4333-8444-555555555550"],
        V1_B: ["GPU-11111111-2222-4333-8444-555555555551"],
    }
    assert claims[V1_B].devices[0].share_id is None
    s.save(result.checkpoint)
    # the same document (the file is compact JSON; the layout is not part of the schema)
    assert json.loads(s.path.read_bytes()) == json.loads(V1_FIXTURE.read_bytes()), (
        "schema 1 is still the format written"
    )


def test_migrate_runs_the_chain_in_order_without_changing_its_input() -> None:
    calls: list[int] = []

    def step(n: int) -> Any:
        def migration(doc: dict[str, Any]) -> dict[str, Any]:
            assert doc["version"] == n
            calls.append(n)
            return {**doc, "trail": [*doc.get("trail", []), n]}

        return migration

    original = {"version": 1, "x": 1}
    migrated = migrate(original, {1: step(1), 2: step(2)}, current=3)
    assert migrated == {"version": 3, "x": 1, "trail": [1, 2]}
    assert calls == [1, 2]
    assert original == {"version": 1, "x": 1}
    assert migrate({"version": 3}, {}, current=3) == {"version": 3}
    with pytest.raises(ValueError, match="no migration from schema 2 to 3"):
        migrate({"version": 1}, {1: step(1)}, current=3)
    with pytest.raises(NewerSchemaError, match=r"schema 4, this plugin reads ≤ 3"):
        migrate({"version": 4}, {}, current=3)
    with pytest.raises(ValueError, match="oldest schema this plugin reads is 2"):
        migrate({"version": 1}, {}, current=3, oldest=2)


def test_the_registry_covers_every_readable_schema() -> None:
    assert set(checkpoint_module.MIGRATIONS) == set(range(checkpoint_module.OLDEST_SCHEMA_VERSION, SCHEMA_VERSION))


def test_an_older_schema_is_migrated_on_load_and_saved_in_the_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the next format change looks like: schema 2 current, the stored v1 file migrated to it."""

    def v1_to_v2(doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "claims": {uid: {**e, "name": e["name"].upper()} for uid, e in doc["claims"].items()}}

    monkeypatch.setattr(checkpoint_module, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(checkpoint_module, "MIGRATIONS", {1: v1_to_v2})
    s = store(tmp_path)
    _install(s, V1_FIXTURE.read_bytes())
    result = s.load()
    assert result.corruption is None and result.too_new is None
    assert result.migrated_from == 1
    assert result.checkpoint.claims[V1_A].name == "SHARED-10GI"
    assert result.checkpoint.claims[V1_A].devices[0].uuid == "GPU-11111111-2222-4333-8444-555555555550"
    s.save(result.checkpoint)
    assert json.loads(s.path.read_text())["version"] == 2
    assert s.load().migrated_from is None


def test_unknown_fields_are_kept_where_they_were_and_listed(tmp_path: Path) -> None:
    doc = json.loads(V1_FIXTURE.read_text())
    doc["writtenBy"] = {"version": "9.9.9"}
    doc["claims"][V1_A]["priority"] = 3
    doc["claims"][V1_A]["devices"][0]["migProfile"] = "1g.10gb"
    s = store(tmp_path)
    _install(s, json.dumps(doc).encode())
    result = s.load()
    assert result.corruption is None
    assert result.unknown_fields == ("writtenBy", f"claims.{V1_A}.priority", f"claims.{V1_A}.devices.0.migProfile")
    assert result.checkpoint.claims[V1_A].devices[0].uuid == "GPU-11111111-2222-4333-8444-555555555550"
    # written back as found, also after an unrelated change
    s.save(result.checkpoint.without_claim(V1_B))
    saved = json.loads(s.path.read_text())
    assert saved["writtenBy"] == {"version": "9.9.9"}
    assert saved["claims"][V1_A]["priority"] == 3
    assert saved["claims"][V1_A]["devices"][0]["migProfile"] == "1g.10gb"
    assert V1_B not in saved["claims"]
    # an entry this plugin rewrites is wholly its own
    entry = ClaimEntry(namespace="team-a", name="shared-10gi", state="PrepareCompleted")
    assert "priority" not in json.loads(result.checkpoint.with_claim(V1_A, entry).to_json())["claims"][V1_A]


def test_a_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    newer = json.dumps({"version": SCHEMA_VERSION + 1, "claims": [{"new": "shape"}], "nodes": {}}).encode()
    s = store(tmp_path)
    _install(s, newer)
    result = s.load()
    assert result.too_new is not None
    assert result.corruption is None and result.moved_to is None
    assert (
        f"checkpoint {s.path} was written by a newer fracgpu (schema {SCHEMA_VERSION + 1}, this plugin reads ≤ {SCHEMA_VERSION})"
        in result.too_new
    )
    assert "upgrade the plugin back" in result.too_new
    assert result.checkpoint.claims == {}
    assert s.path.read_bytes() == newer
    assert files(s.path.parent) == ["checkpoint.json"]
