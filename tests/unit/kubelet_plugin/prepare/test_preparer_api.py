"""The Preparer against bad objects, a hanging API server and a held node lock (issue 9), through the real
`KubeRest` and a fake API server on 127.0.0.1 (tests/unit/fake_apiserver.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from api.kube_rest import KubeRest, claim_path
from api.names import DRIVER_NAME
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import ClaimRef
from kubelet_plugin.core.settings import KUBELET_CALL_TIMEOUT_S, Settings
from kubelet_plugin.prepare.preparer import Preparer
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state.checkpoint import CheckpointStore
from tests.unit.fake_apiserver import FakeApiServer, connection, serve, throttled
from tests.unit.plugin_host import NS, SHARE_B, UID_A, UID_B, host_root, host_settings, make_claim, make_preparer, ref

REPO_ROOT = Path(__file__).resolve().parents[4]
#: Opaque parameters nested as deep as kube-apiserver stores them: 10 KiB of `[` and `]` in `{"a": …}`.
DEEPEST = 5117
PLACEHOLDER = "__raw__"


def deep_parameters(depth: int) -> bytes:
    return b'{"a":' + b"[" * depth + b"]" * depth + b"}"


def claim_bytes(claim: dict[str, Any], parameters: bytes | None = None) -> bytes:
    """The claim as the API server sends it, with `parameters` (raw JSON) as its opaque config."""
    if parameters is None:
        return json.dumps(claim).encode()
    claim = {**claim, "spec": {"devices": {**claim["spec"]["devices"]}}}
    opaque = {"driver": DRIVER_NAME, "parameters": PLACEHOLDER}
    claim["spec"]["devices"]["config"] = [{"requests": ["gpu"], "opaque": opaque}]
    return json.dumps(claim).encode().replace(json.dumps(PLACEHOLDER).encode(), parameters)


@pytest.fixture
def api_server() -> Iterator[tuple[FakeApiServer, str]]:
    with serve() as running:
        yield running


def add(api: FakeApiServer, claim: dict[str, Any], parameters: bytes | None = None) -> ClaimRef:
    """Serve `claim` (with raw opaque `parameters`) at its path; its ClaimRef."""
    api.objects[claim_path(NS, claim["metadata"]["name"])] = claim_bytes(claim, parameters)
    return ref(claim)


def node_settings(tmp_path: Path, **overrides: Any) -> Settings:
    return host_settings(tmp_path, host_root(tmp_path), **overrides)


@dataclass
class Node:
    settings: Settings
    store: CheckpointStore
    metrics: PluginMetrics
    preparer: Preparer

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def node(tmp_path: Path, host: str, **overrides: Any) -> Node:
    settings = node_settings(tmp_path, **overrides)
    store = CheckpointStore(tmp_path / "ckpt.json", current_boot_id="boot-1")
    metrics = PluginMetrics()
    return Node(settings, store, metrics, make_preparer(connection(host, metrics.api), settings, store, metrics))


def timed_prepare(preparer: Preparer, refs: list[ClaimRef]) -> tuple[dict[str, Any], float]:
    """prepare() in a thread, given the kubelet's 45 s: its answer and how long it took. Fails on no answer."""
    out: dict[str, Any] = {}
    raised: list[BaseException] = []

    def call() -> None:
        try:
            out.update(preparer.prepare(refs))
        except BaseException as err:
            raised.append(err)

    start = time.monotonic()
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(KUBELET_CALL_TIMEOUT_S)
    assert not caller.is_alive(), "no answer within the kubelet's deadline"
    assert not raised, f"prepare raised {raised[0]!r} instead of answering each claim"
    return out, time.monotonic() - start


# --- decoding ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "problem"),
    [
        (deep_parameters(DEEPEST), "nested deeper"),
        (b'{"env": {"A": "\xff"}}', "not valid UTF-8"),
    ],
)
def test_an_undecodable_claim_fails_alone(
    api_server: tuple[FakeApiServer, str], tmp_path: Path, parameters: bytes, problem: str
) -> None:
    api, host = api_server
    plugin = node(tmp_path, host)
    bad = add(api, make_claim(UID_A, "bad"), parameters)
    good = add(api, make_claim(UID_B, "good", device="gpu-1", share=SHARE_B))
    results, _ = timed_prepare(plugin.preparer, [bad, good])
    assert results[UID_B].error == "" and len(results[UID_B].devices) == 1
    error = results[UID_A].error
    assert "ResourceClaim team-a/bad cannot be read" in error and problem in error
    assert "delete the claim and create it again" in error
    assert not results[UID_A].devices
    assert plugin.sample("fracgpu_plugin_errors_total", operation="prepare", type="undecodable") == 1
    assert set(plugin.store.load().checkpoint.claims) == {UID_B}
    assert store.list_spec_claim_uids(plugin.settings.cdi_dir, DRIVER_NAME) == {UID_B}


def test_an_unexpected_error_reading_one_claim_is_that_claims_error(
    api_server: tuple[FakeApiServer, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, host = api_server
    plugin = node(tmp_path, host)
    bad = add(api, make_claim(UID_A, "bad"))
    good = add(api, make_claim(UID_B, "good", device="gpu-1", share=SHARE_B))
    real_get = KubeRest.get

    def get(self: KubeRest, path: str, **query: Any) -> dict[str, Any]:
        if path.endswith("/bad"):
            raise KeyError("metadata")
        return real_get(self, path, **query)

    monkeypatch.setattr(KubeRest, "get", get)
    results, _ = timed_prepare(plugin.preparer, [bad, good])
    assert results[UID_B].error == ""
    assert results[UID_A].error == "cannot read ResourceClaim team-a/bad: KeyError: 'metadata'"
    assert plugin.sample("fracgpu_plugin_errors_total", operation="prepare", type="internal") == 1


# --- a hanging API server ---------------------------------------------------------------------------


def test_a_hanging_read_fails_its_claim_only_and_does_not_delay_the_others(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    plugin = node(tmp_path, host, api_timeout_seconds=2)
    slow = add(api, make_claim(UID_A, "slow"))
    good = add(api, make_claim(UID_B, "good", device="gpu-1", share=SHARE_B))
    slow_path, good_path = claim_path(NS, "slow"), claim_path(NS, "good")
    api.hang.add(slow_path)
    results, _ = timed_prepare(plugin.preparer, [slow, good])  # the slow one first: read in order, it blocks
    assert results[UID_B].error == "" and len(results[UID_B].devices) == 1
    where = host.removeprefix("http://")
    assert re.fullmatch(
        f"cannot read ResourceClaim team-a/slow: timed out: the API server at {where} did not answer within 1 s; "
        r"tried 2 times in 2\.\d s; the kubelet retries",
        results[UID_A].error,
    ), results[UID_A].error
    assert plugin.sample("fracgpu_plugin_errors_total", operation="prepare", type="api_timeout") == 1
    with api.lock:
        good_answered = api.log.index(("answer", "GET", good_path))
        slow_attempts = [i for i, e in enumerate(api.log) if e == ("start", "GET", slow_path)]
        # the slow read times out after half the budget and is tried once more: the good claim was answered
        # before that retry (a sequential read would have waited out the slow read's attempts first)
        assert len(slow_attempts) == 2 and good_answered < slow_attempts[1]
        assert not any(e == ("answer", "GET", slow_path) for e in api.log)


def test_an_api_server_that_never_answers_gives_each_claim_an_error_in_time(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    plugin = node(tmp_path, host, api_timeout_seconds=3)
    refs = [add(api, make_claim(UID_A, "a")), add(api, make_claim(UID_B, "b", device="gpu-1", share=SHARE_B))]
    api.hang.update(api.objects)
    results, elapsed = timed_prepare(plugin.preparer, refs)
    for r in refs:
        assert re.search(
            r"timed out: the API server .*did not answer within 1\.5 s; tried 2 times in 3\.\d s", results[r.uid].error
        )
    assert elapsed < KUBELET_CALL_TIMEOUT_S
    assert plugin.store.load().checkpoint.claims == {}


def test_a_throttled_read_waits_as_asked_and_a_wait_past_the_budget_fails_with_the_throttled_message(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    plugin = node(tmp_path, host, api_timeout_seconds=10)
    patient, hurried = add(api, make_claim(UID_A, "a")), add(api, make_claim(UID_B, "b", device="gpu-1", share=SHARE_B))
    api.script[claim_path(NS, "a")] = [throttled("1")]
    api.script[claim_path(NS, "b")] = [throttled("60")]  # past the kubelet's deadline
    results, elapsed = timed_prepare(plugin.preparer, [patient, hurried])
    assert results[UID_A].error == "" and len(results[UID_A].devices) == 1, "prepared after waiting 1 s"
    assert re.fullmatch(
        r"cannot read ResourceClaim team-a/b: throttled by the API server \(429 Too Many Requests; it asked to wait "
        r"60 s\); tried once; the wait did not fit in the call's 3[45]\.\d s; the kubelet retries",
        results[UID_B].error,
    ), results[UID_B].error
    assert 1 <= elapsed < 5, "b failed at once: 60 s do not fit in the 35 s a prepare's reads may wait"
    assert plugin.sample("fracgpu_plugin_errors_total", operation="prepare", type="api_throttled") == 1
    assert plugin.sample("fracgpu_plugin_api_throttled_total", resource="resourceclaims", verb="GET") == 2
    assert plugin.sample("fracgpu_plugin_api_retries_total", kind="throttled", verb="GET") == 1
    assert plugin.sample("fracgpu_plugin_api_gave_up_total", kind="throttled", verb="GET") == 1
    assert set(plugin.store.load().checkpoint.claims) == {UID_A}


def test_the_ready_write_does_not_hold_up_the_answer_and_is_retried(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    plugin = node(tmp_path, host, api_timeout_seconds=4)  # 2 s per try: time for the second on a loaded machine
    claim = add(api, make_claim(UID_A, "a"))
    status = claim_path(NS, "a") + "/status"
    api.hang_once.add(status)  # the first write gets no answer, as from a stopped API server
    results, _ = timed_prepare(plugin.preparer, [claim])
    assert results[UID_A].error == ""
    # No wall-clock bound (fsyncs on a shared disk vary): had the answer waited for the write, it would be done
    # (idle), or had it waited for the first try, that try's timeout would be counted.
    assert not plugin.preparer.wait_ready_writes(0), "the answer waited for the Ready write"
    assert plugin.sample("fracgpu_plugin_errors_total", operation="prepare", type="status_update") == 0
    assert plugin.preparer.wait_ready_writes(30)
    assert api.answered("PATCH", status) == 1  # the second try
    assert plugin.sample("fracgpu_plugin_errors_total", operation="prepare", type="status_update") == 1


# --- the node lock ----------------------------------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from kubelet_plugin.core.filelock import serialize_lock
with serialize_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_held_node_lock_fails_every_claim_in_time(api_server: tuple[FakeApiServer, str], tmp_path: Path) -> None:
    api, host = api_server
    plugin = node(tmp_path, host, node_lock_timeout_seconds=0.5)
    refs = [add(api, make_claim(UID_A, "a")), add(api, make_claim(UID_B, "b", device="gpu-1", share=SHARE_B))]
    missing = ClaimRef(namespace=NS, name="missing", uid="3e9c6f51-8a4d-4eb1-a0a2-5d4a6b7c8d9e")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(plugin.settings.lock_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        results, _ = timed_prepare(plugin.preparer, [*refs, missing])
    finally:
        holder.kill()
        holder.wait()
    for r in refs:
        assert results[r.uid].error == (
            "another fracgpu plugin instance held the node lock for 0.5 s; the kubelet retries"
        )
    assert "not found" in results[missing.uid].error  # its own problem, not the lock's
    assert plugin.sample("fracgpu_plugin_node_lock_timeouts_total") == 1
    assert plugin.sample("fracgpu_plugin_errors_total", operation="prepare", type="lock_timeout") == 2
    assert not plugin.store.path.exists()
    assert not store.list_spec_claim_uids(plugin.settings.cdi_dir, DRIVER_NAME)
    again, _ = timed_prepare(plugin.preparer, refs)  # the holder is gone
    assert all(r.error == "" for r in again.values())


def test_a_call_of_this_plugin_holding_the_lock_times_out_the_next(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    plugin = node(tmp_path, host, node_lock_timeout_seconds=0.5)
    claim = add(api, make_claim(UID_A, "a"))
    with plugin.preparer.node_lock.hold():  # another call of this process in the middle of its writes
        results, _ = timed_prepare(plugin.preparer, [claim])
    assert (
        results[UID_A].error == "another call of this fracgpu plugin held the node lock for 0.5 s; the kubelet retries"
    )
    assert plugin.sample("fracgpu_plugin_node_lock_timeouts_total") == 1
