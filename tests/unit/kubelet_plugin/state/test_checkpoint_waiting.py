"""Unit tests of a claim's waiting checkpoint entry (kubelet_plugin/state/checkpoint.py): a claim waiting for its
MPS GPU's daemon to serve its trust domain is ``PrepareStarted`` with ``mpsSwitchUntil``, holds its GPU for its
domain until then, and is written so that an entry without it reads as before."""

from __future__ import annotations

import json
from pathlib import Path

from kubelet_plugin.core.model import PreparedDevice
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointDevice, CheckpointStore, ClaimEntry

UID = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"
UUID0 = "GPU-11111111-2222-4333-8444-555555555550"


def prepared(domain: str | None = "namespace/team-b") -> ClaimEntry:
    device = PreparedDevice(
        request_names=("gpu",), pool_name="node-1", device_name="gpu-0", cdi_device_ids=("k8s.x/claim=y",),
        share_id="s1",
    )  # fmt: skip
    return ClaimEntry(
        namespace="team-b", name="b", state="PrepareCompleted", devices=[CheckpointDevice.from_prepared(device, UUID0)],
        mps_trust_domain=domain,
    )  # fmt: skip


def test_a_waiting_entry_is_started_with_its_time_and_survives_a_save(tmp_path: Path) -> None:
    waiting = prepared().waiting_until(1_900_000_000.25)
    assert (waiting.state, waiting.mps_switch_until, waiting.devices) == ("PrepareStarted", 1_900_000_000.25,
                                                                          prepared().devices)  # fmt: skip
    store = CheckpointStore(tmp_path / "checkpoint.json", current_boot_id="boot")
    store.save(Checkpoint.empty("boot").with_claim(UID, waiting))
    written = json.loads(store.path.read_text())["claims"][UID]
    assert (written["state"], written["mpsSwitchUntil"], written["mpsTrustDomain"]) == (
        "PrepareStarted", 1_900_000_000.25, "namespace/team-b")  # fmt: skip
    loaded = CheckpointStore(store.path, current_boot_id="boot").load()
    assert loaded.checkpoint.claims[UID] == waiting and loaded.unknown_fields == ()
    assert loaded.checkpoint.prepared_count() == 0


def test_an_entry_that_waits_for_nothing_is_written_as_before(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", current_boot_id="boot")
    store.save(Checkpoint.empty("boot").with_claim(UID, prepared(None)))
    assert set(json.loads(store.path.read_text())["claims"][UID]) == {"namespace", "name", "state", "devices"}
    assert store.load().checkpoint.prepared_count() == 1


def test_a_waiting_entry_holds_its_domain_until_its_time_and_a_prepared_one_always() -> None:
    waiting = prepared().waiting_until(100.0)
    assert waiting.holds_domain(100.0) and not waiting.holds_domain(100.5)
    assert prepared().holds_domain(1e12)
    assert not prepared(None).holds_domain(0.0), "no domain, nothing held"
