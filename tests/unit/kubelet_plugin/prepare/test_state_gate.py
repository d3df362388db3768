"""Unit tests of the start-up gate on a node state of a newer schema (kubelet_plugin/prepare/state_gate.py)."""

import json
import threading
from pathlib import Path

from kubelet_plugin.prepare.state_gate import newer_state, wait_until_readable
from kubelet_plugin.state.checkpoint import SCHEMA_VERSION, Checkpoint, CheckpointStore

BOOT = "5a1c7d3e-0000-4000-8000-00000000000a"
NEWER = json.dumps({"version": SCHEMA_VERSION + 1, "claims": {"x": {"new": "shape"}}}).encode()


def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "checkpoint.json", current_boot_id=BOOT)


def test_newer_state_names_the_file_and_what_to_do_and_touches_nothing(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert newer_state(s) is None, "no file: nothing newer"
    s.path.write_bytes(NEWER)
    problem = newer_state(s)
    assert problem is not None
    assert f"schema {SCHEMA_VERSION + 1}, this plugin reads ≤ {SCHEMA_VERSION}" in problem
    assert "upgrade the plugin back" in problem and "does not register with the kubelet" in problem
    assert s.path.read_bytes() == NEWER and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]
    s.save(Checkpoint.empty(BOOT))
    assert newer_state(s) is None


def test_a_readable_state_passes_at_once(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.save(Checkpoint.empty(BOOT))
    assert wait_until_readable(lambda: newer_state(s), threading.Event(), interval=30) == "readable"


def test_a_newer_state_holds_the_plugin_until_the_file_is_readable(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.path.write_bytes(NEWER)
    checks: list[str | None] = []

    def check() -> str | None:
        checks.append(problem := newer_state(s))
        return problem

    outcome: list[str] = []
    waiter = threading.Thread(target=lambda: outcome.append(wait_until_readable(check, threading.Event(), 0.01)))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and outcome == [], "held while the file is of a newer schema"
    assert len(checks) > 1, "re-checked"
    s.save(Checkpoint.empty(BOOT))  # upgraded back, or the operator started the node's claims over
    waiter.join(timeout=5)
    assert outcome == ["waited"]


def test_a_stop_while_held_ends_the_wait(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.path.write_bytes(NEWER)
    stop = threading.Event()
    outcome: list[str] = []
    waiter = threading.Thread(target=lambda: outcome.append(wait_until_readable(lambda: newer_state(s), stop, 30)))
    waiter.start()
    stop.set()
    waiter.join(timeout=5)
    assert outcome == ["stopped"]
    assert s.path.read_bytes() == NEWER
