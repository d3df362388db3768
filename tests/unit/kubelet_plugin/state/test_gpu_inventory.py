"""The GPU inventory (what NVML said at the last discovery) and how discovery uses it for a GPU lost at start."""

from pathlib import Path

import pytest

from harness.kube import simulated_gpus
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.publishing.discovery import resolve_lost
from kubelet_plugin.state import gpu_inventory

GPUS: list[GpuInfo] = simulated_gpus("node-a", 3)
LOST = {1: "NVML UUID of GPU 1 failed: GPU is lost"}


def test_the_inventory_round_trips_and_a_missing_or_corrupt_one_is_no_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "plugin" / gpu_inventory.INVENTORY_FILE_NAME
    assert gpu_inventory.load(path) == []
    gpu_inventory.save(path, GPUS)
    assert gpu_inventory.load(path) == GPUS
    path.write_text('[{"index": "one"}]')
    assert gpu_inventory.load(path) == []
    assert "ignoring the GPU inventory" in caplog.text


def test_a_lost_gpu_keeps_the_identity_remembered_at_its_index() -> None:
    answered = [GPUS[0], GPUS[2]]
    found = resolve_lost(answered, LOST, GPUS, "590.1.2")
    assert [g.uuid for g in found.gpus] == [g.uuid for g in GPUS]
    assert found.gpus[1].driver_version == "590.1.2", "the driver it is on now"
    assert found.lost == ("gpu-1",) and found.unknown == ()


def test_a_record_that_no_longer_matches_the_node_identifies_nothing() -> None:
    swapped = GPUS[2].model_copy(update={"uuid": "GPU-00000000-0000-0000-0000-000000000000"})
    found = resolve_lost([GPUS[0], swapped], LOST, GPUS, "590.1.2")
    assert [g.index for g in found.gpus] == [0, 2] and found.lost == ()
    (unknown,) = found.unknown
    assert unknown.index == 1
    assert unknown.reason == f"{LOST[1]}; the earlier record of this node's GPUs differs for gpu-2"
