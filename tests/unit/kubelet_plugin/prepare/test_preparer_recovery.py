"""Crash safety of the Preparer's checkpoint and CDI specs (issue 9): crash points, recovery, schema refusal."""

from __future__ import annotations

import copy
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from api.kube_errors import ApiError, api_error
from api.kube_rest import KubeRest
from api.names import DRIVER_NAME
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import container_info
from kubelet_plugin.state.checkpoint import SCHEMA_VERSION, Checkpoint, CheckpointStore, ClaimEntry
from tests.unit.plugin_host import (
    NS,
    SHARE_B,
    UID_A,
    UID_B,
    UID_C,
    UUID0,
    UUID1,
    Env,
    gpu_info,
    make_claim,
    make_env,
    ref,
)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    return make_env(tmp_path, monkeypatch)


class Crash(BaseException):
    """Stands for SIGKILL: nothing after it runs, no `except Exception` sees it."""


def assert_invariant(env: Env) -> None:
    """What recover() guarantees: completed entries only, specs == claims with devices, no temp files."""
    checkpoint = env.checkpoint()
    assert {e.state for e in checkpoint.claims.values()} <= {"PrepareCompleted"}
    with_devices = {uid for uid, e in checkpoint.claims.items() if e.devices}
    assert store.list_spec_claim_uids(env.settings.cdi_dir, DRIVER_NAME) == with_devices
    temp = [p.name for d in (env.settings.cdi_dir, env.store.path.parent) if d.exists() for p in d.glob(".*.tmp")]
    assert temp == []


def prepare_two(env: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    a = env.api.add(make_claim(UID_A, "claim-a"))
    b = env.api.add(make_claim(UID_B, "claim-b", device="gpu-1", share=SHARE_B))
    results = env.preparer.prepare([ref(a), ref(b)])
    assert {uid: r.error for uid, r in results.items()} == {UID_A: "", UID_B: ""}
    return a, b


# --- prepare: one durable checkpoint write, after the specs ----------------------------------------


def test_prepare_saves_the_checkpoint_once_after_every_spec(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    saved: list[tuple[set[str], set[str]]] = []  # (claims in the saved checkpoint, spec files then)
    real = CheckpointStore.save

    def save(self: CheckpointStore, checkpoint: Checkpoint) -> None:
        saved.append((set(checkpoint.claims), store.list_spec_claim_uids(env.settings.cdi_dir, DRIVER_NAME)))
        real(self, checkpoint)

    monkeypatch.setattr(CheckpointStore, "save", save)
    prepare_two(env)
    assert saved == [({UID_A, UID_B}, {UID_A, UID_B})], "one save, with both specs already written"
    assert {e.state for e in env.checkpoint().claims.values()} == {"PrepareCompleted"}
    saved.clear()
    a = env.api.claims[NS, "claim-a"]
    assert env.preparer.prepare([ref(a)])[UID_A].error == ""
    assert saved == [], "a repeated prepare changes no entry: no checkpoint write"


def _crash_after_first_spec_write(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    real = store.write_spec

    def write_then_crash(*args: Any, **kwargs: Any) -> Path:
        real(*args, **kwargs)
        raise Crash

    monkeypatch.setattr(store, "write_spec", write_then_crash)


def _crash_while_saving_after_the_specs(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(self: CheckpointStore, checkpoint: Any) -> None:
        raise Crash

    monkeypatch.setattr(CheckpointStore, "save", crash)


@pytest.mark.parametrize("crash", [_crash_after_first_spec_write, _crash_while_saving_after_the_specs])
def test_a_crash_during_prepare_leaves_orphans_recover_removes_and_the_retry_recreates(
    env: Env, monkeypatch: pytest.MonkeyPatch, crash: Any
) -> None:
    a = env.api.add(make_claim(UID_A, "claim-a"))
    b = env.api.add(make_claim(UID_B, "claim-b", device="gpu-1", share=SHARE_B))
    c = env.api.add(make_claim(UID_C, "claim-c", share="c0ffee00-0000-4000-8000-000000000000"))
    assert env.preparer.prepare([ref(c)])[UID_C].error == ""  # prepared before: must survive untouched
    spec_c = env.spec_file(UID_C).read_bytes()
    with monkeypatch.context() as patch:
        crash(env, patch)
        with pytest.raises(Crash):
            env.preparer.prepare([ref(a), ref(b)])
    assert env.spec_file(UID_A).exists(), "the crash came after a spec was written"
    assert set(env.checkpoint().claims) == {UID_C}, "the checkpoint is saved only after the specs"
    env.new_preparer().recover()
    assert_invariant(env)
    assert not env.spec_file(UID_A).exists(), "the orphaned spec is removed"
    assert not container_info.claim_info_dir(env.settings.plugin_data_dir, UID_A).exists()
    assert env.spec_file(UID_C).read_bytes() == spec_c
    # the kubelet retries the prepare: it writes the spec again
    results = env.preparer.prepare([ref(a), ref(b)])
    assert {uid: r.error for uid, r in results.items()} == {UID_A: "", UID_B: ""}
    assert_invariant(env)
    assert set(env.checkpoint().claims) == {UID_A, UID_B, UID_C}


def test_a_prepare_started_entry_of_an_older_plugin_is_completed_by_the_next_prepare(env: Env) -> None:
    a = env.api.add(make_claim(UID_A, "claim-a"))
    env.store.save(env.checkpoint().with_claim(UID_A, ClaimEntry(namespace=NS, name="claim-a", state="PrepareStarted")))
    assert env.preparer.prepare([ref(a)])[UID_A].error == ""
    entry = env.checkpoint().claims[UID_A]
    assert entry.state == "PrepareCompleted" and [d.uuid for d in entry.devices] == [UUID0]
    assert_invariant(env)


def test_a_failed_checkpoint_save_fails_the_new_claims_and_removes_their_files(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = prepare_two(env)
    c = env.api.add(make_claim(UID_C, "claim-c", share="c0ffee00-0000-4000-8000-000000000000"))
    monkeypatch.setattr(CheckpointStore, "save", lambda *_: (_ for _ in ()).throw(OSError(28, "No space left")))
    results = env.preparer.prepare([ref(a), ref(c)])
    assert results[UID_A].error == "", "already prepared: its entry did not change"
    assert "cannot save the checkpoint" in results[UID_C].error and "No space left" in results[UID_C].error
    assert not env.spec_file(UID_C).exists()
    assert env.spec_file(UID_A).exists()
    assert env.sample("fracgpu_plugin_errors_total", operation="prepare", type="internal") == 1


def test_one_durable_write_per_prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint file and its directory are fsynced once per call, whatever the CDI dir is on (here a
    persistent one); the spec and info files never (see `kubelet_plugin/state/claim_files.py`: a reboot makes recovery re-write them)."""
    env = make_env(tmp_path, monkeypatch, cdi_dir=tmp_path / "cdi")
    claim = env.api.add(make_claim(UID_A, "claim-a"))
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert env.preparer.prepare([ref(claim)])[UID_A].error == ""
    assert len(calls) == 2, "prepare: the checkpoint file and its directory only"
    calls.clear()
    assert env.preparer.unprepare([ref(claim)]) == {UID_A: ""}
    assert len(calls) == 2, "unprepare: the checkpoint only"


# --- unprepare: crash points -----------------------------------------------------------------------


def _crash_after_first_spec_removal(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    real = store.remove_spec

    def remove_then_crash(cdi_dir: Path, driver: str, claim_uid: str) -> bool:
        real(cdi_dir, driver, claim_uid)
        raise Crash

    monkeypatch.setattr(store, "remove_spec", remove_then_crash)


def _crash_while_saving(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(self: CheckpointStore, checkpoint: Any) -> None:
        raise Crash

    monkeypatch.setattr(CheckpointStore, "save", crash)


@pytest.mark.parametrize("crash", [_crash_after_first_spec_removal, _crash_while_saving])
def test_a_crash_during_unprepare_leaves_a_state_recover_repairs(
    env: Env, monkeypatch: pytest.MonkeyPatch, crash: Any
) -> None:
    a, _ = prepare_two(env)
    spec_b = env.spec_file(UID_B).read_bytes()
    with monkeypatch.context() as patch:
        crash(env, patch)
        with pytest.raises(Crash):
            env.preparer.unprepare([ref(a)])
    env.new_preparer().recover()
    assert_invariant(env)
    assert env.spec_file(UID_B).read_bytes() == spec_b
    # the kubelet retries the unprepare; it succeeds whether or not the claim is still known
    assert env.preparer.unprepare([ref(a)]) == {UID_A: ""}
    assert_invariant(env)
    assert set(env.checkpoint().claims) == {UID_B}


def test_unprepare_drops_the_entry_before_deleting_the_spec(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = prepare_two(env)
    seen: list[set[str]] = []
    real = store.remove_spec

    def remove(cdi_dir: Path, driver: str, claim_uid: str) -> bool:
        seen.append(set(env.checkpoint().claims))  # what the file holds when the spec goes
        return real(cdi_dir, driver, claim_uid)

    monkeypatch.setattr(store, "remove_spec", remove)
    assert env.preparer.unprepare([ref(a)]) == {UID_A: ""}
    assert seen == [{UID_B}]


def test_a_spec_that_cannot_be_removed_is_that_claims_error_and_the_retry_removes_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = prepare_two(env)
    real = store.remove_spec

    def fail_for_a(cdi_dir: Path, driver: str, claim_uid: str) -> bool:
        if claim_uid == UID_A:
            raise OSError(30, "Read-only file system")
        return real(cdi_dir, driver, claim_uid)

    with monkeypatch.context() as patch:
        patch.setattr(store, "remove_spec", fail_for_a)
        errors = env.preparer.unprepare([ref(a), ref(b)])
    assert "Read-only file system" in errors[UID_A] and errors[UID_B] == ""
    assert env.checkpoint().claims == {}
    assert env.preparer.unprepare([ref(a)]) == {UID_A: ""}
    assert not env.spec_file(UID_A).exists()


def test_a_failed_checkpoint_save_fails_the_claims_and_keeps_their_specs(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = prepare_two(env)
    monkeypatch.setattr(CheckpointStore, "save", lambda *_: (_ for _ in ()).throw(OSError(28, "No space left")))
    errors = env.preparer.unprepare([ref(a)])
    assert "cannot save the checkpoint" in errors[UID_A] and "No space left" in errors[UID_A]
    assert env.spec_file(UID_A).exists()
    assert set(env.checkpoint().claims) == {UID_A, UID_B}


# --- recover: completed claims whose spec vanished -------------------------------------------------


def test_recover_rewrites_the_missing_spec_of_a_completed_claim(env: Env) -> None:
    prepare_two(env)
    content = env.spec_file(UID_A).read_bytes()
    entry = env.checkpoint().claims[UID_A]
    env.spec_file(UID_A).unlink()
    env.api.reads.clear()
    env.new_preparer().recover()
    assert env.spec_file(UID_A).read_bytes() == content
    assert env.checkpoint().claims[UID_A] == entry
    assert env.api.reads == [(NS, "claim-a")]  # only the claim that needed it
    assert_invariant(env)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_recover_drops_a_completed_claim_whose_spec_vanished_and_that_is_gone(env: Env, how: str) -> None:
    prepare_two(env)
    env.spec_file(UID_A).unlink()
    if how == "deleted":
        del env.api.claims[NS, "claim-a"]
    else:
        env.api.add(make_claim(UID_C, "claim-a"))  # same name, new object
    env.new_preparer().recover()
    assert set(env.checkpoint().claims) == {UID_B}
    assert_invariant(env)


def test_recover_keeps_the_entry_while_the_api_server_is_unreachable(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = prepare_two(env)
    contents = {uid: env.spec_file(uid).read_bytes() for uid in (UID_A, UID_B)}
    for uid in contents:
        env.spec_file(uid).unlink()
    attempts: list[str] = []

    def unreachable(_self: Any, path: str, **query: Any) -> Any:
        attempts.append(path)
        raise ApiError(status=0, reason="cannot reach the API server: connection refused")

    with monkeypatch.context() as patch:
        patch.setattr(KubeRest, "get", unreachable)
        env.new_preparer().recover()
    assert set(env.checkpoint().claims) == {UID_A, UID_B}, "the claims are still prepared: keep them"
    assert len(attempts) == 1, "after the first failure the others are not fetched"
    # the API server is back: the kubelet's next prepare re-writes the spec, and so does the next recover
    assert env.preparer.prepare([ref(a)])[UID_A].error == ""
    assert env.spec_file(UID_A).read_bytes() == contents[UID_A]
    env.new_preparer().recover()
    assert env.spec_file(UID_B).read_bytes() == contents[UID_B]
    assert_invariant(env)


def test_a_repeated_prepare_rewrites_a_vanished_spec(env: Env) -> None:
    a, _ = prepare_two(env)
    content = env.spec_file(UID_A).read_bytes()
    env.spec_file(UID_A).unlink()
    assert env.preparer.prepare([ref(a)])[UID_A].error == ""
    assert env.spec_file(UID_A).read_bytes() == content
    assert_invariant(env)


# --- corrupt checkpoint: the rebuild keeps the GPU UUIDs -------------------------------------------


def test_the_rebuild_of_a_corrupt_checkpoint_keeps_the_device_guard(env: Env) -> None:
    a, _ = prepare_two(env)
    before = env.checkpoint().claims
    env.store.path.write_text('{"version": 1, "claims": {"x": ')  # truncated
    env.new_preparer().recover()
    rebuilt = env.checkpoint().claims
    assert set(rebuilt) == {UID_A, UID_B}
    for uid in (UID_A, UID_B):
        (old,), (new,) = before[uid].devices, rebuilt[uid].devices
        assert (new.device_name, new.share_id, new.uuid, new.cdi_device_ids, new.pool_name) == (
            old.device_name,
            old.share_id,
            old.uuid,
            old.cdi_device_ids,
            old.pool_name,
        )
    assert [d.uuid for d in rebuilt[UID_A].devices] == [UUID0]
    assert_invariant(env)
    # the GPUs changed under the claims: still refused, as with the original checkpoint
    swapped = [gpu_info(0, UUID1), gpu_info(1, UUID0)]
    result = env.new_preparer(gpus=swapped).prepare([ref(a)])[UID_A]
    assert "gpu-0 was GPU" in result.error


# --- unknown fields and newer schemas --------------------------------------------------------------


def test_unknown_fields_survive_prepare_and_recover(env: Env) -> None:
    a, _ = prepare_two(env)
    doc = json.loads(env.store.path.read_text())
    doc["writtenBy"] = "fracgpu 9.9"
    doc["claims"][UID_B]["priority"] = 3
    env.store.path.write_text(json.dumps(doc))
    env.new_preparer().recover()
    env.preparer.unprepare([ref(a)])
    saved = json.loads(env.store.path.read_text())
    assert saved["writtenBy"] == "fracgpu 9.9"
    assert saved["claims"][UID_B]["priority"] == 3
    assert env.sample("fracgpu_plugin_checkpoint_corruptions_total") == 0


class StrictEvents:
    """POST /api/v1/namespaces/<ns>/events as the API server takes it: the body's namespace must match the
    path's, the name must be new (409 AlreadyExists otherwise), and involvedObject/reason/message are set."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        _, _, _, _, namespace, resource = path.split("/")
        assert resource == "events", path
        meta = body["metadata"]
        if meta.get("namespace", namespace) != namespace:
            raise api_error(400, "BadRequest")
        if not (body.get("involvedObject", {}).get("kind") and body.get("reason") and body.get("message")):
            raise api_error(422, "Invalid")
        if meta["name"] in self.events:
            raise api_error(409, "AlreadyExists")
        self.events[meta["name"]] = copy.deepcopy(body)
        return {**body, "metadata": {**meta, "uid": str(uuid.uuid4())}}


def test_a_newer_schema_is_refused_with_an_event_and_touched_nowhere(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = prepare_two(env)
    newer = json.dumps({"version": SCHEMA_VERSION + 1, "claims": {"anything": {"in": "a new shape"}}}).encode()
    env.store.path.write_bytes(newer)
    specs = {uid: env.spec_file(uid).read_bytes() for uid in (UID_A, UID_B)}
    listing = sorted(p.name for p in env.store.path.parent.iterdir())
    events = StrictEvents()
    monkeypatch.setattr(KubeRest, "create", events.create)

    preparer = env.new_preparer()
    preparer.recover()  # does not raise: the plugin keeps running and registers
    c = env.api.add(make_claim(UID_C, "claim-c", share="c0ffee00-0000-4000-8000-000000000000"))
    prepared = preparer.prepare([ref(a), ref(c)])
    unprepared = preparer.unprepare([ref(b)])

    expected = (
        f"was written by a newer fracgpu (schema {SCHEMA_VERSION + 1}, this plugin reads ≤ {SCHEMA_VERSION}): upgrade"
    )
    assert all(expected in r.error and not r.devices for r in prepared.values()), prepared
    assert set(prepared) == {UID_A, UID_C}
    assert expected in unprepared[UID_B]
    assert env.store.path.read_bytes() == newer, "byte for byte"
    assert sorted(p.name for p in env.store.path.parent.iterdir()) == listing
    assert {uid: env.spec_file(uid).read_bytes() for uid in (UID_A, UID_B)} == specs
    assert not env.spec_file(UID_C).exists()
    (event,) = events.events.values()  # once, not per call
    assert event["reason"] == "CheckpointTooNew" and event["involvedObject"]["name"] == "node-a"
    assert expected in event["message"]
    assert env.sample("fracgpu_plugin_checkpoint_too_new") == 1
    assert env.sample("fracgpu_plugin_errors_total", operation="unprepare", type="checkpoint_too_new") == 1
    assert env.sample("fracgpu_plugin_checkpoint_corruptions_total") == 0

    # the operator removes the file (after deleting the pods): the same process works again
    env.store.path.unlink()
    assert preparer.prepare([ref(c)])[UID_C].error == ""
    assert env.sample("fracgpu_plugin_checkpoint_too_new") == 0
