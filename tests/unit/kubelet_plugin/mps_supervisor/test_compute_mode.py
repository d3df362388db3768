"""An MPS GPU's compute mode is set to EXCLUSIVE_PROCESS and restored from its record
(kubelet_plugin/mps_supervisor/compute_mode.py), against a fake NVML."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from kubelet_plugin.mps_supervisor import compute_mode

UUID = "GPU-0"


class FakeNvml:
    """One GPU's compute mode, as NVML's calls see it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
        self.mode = mode
        self.sets: list[int] = []
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", lambda uuid: uuid)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeMode", lambda handle: self.mode)
        monkeypatch.setattr(pynvml, "nvmlDeviceSetComputeMode", self._set)

    def _set(self, handle: object, mode: int) -> None:
        self.sets.append(mode)
        self.mode = mode


def test_exclusive_records_the_mode_before_once_and_sets_exclusive_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml(monkeypatch, pynvml.NVML_COMPUTEMODE_PROHIBITED)
    assert compute_mode.exclusive(tmp_path, UUID) == "EXCLUSIVE_PROCESS"
    record = compute_mode.mode_before_path(tmp_path, UUID)
    assert record.read_text() == f"{pynvml.NVML_COMPUTEMODE_PROHIBITED}\n"
    assert record.name == "compute-mode-before-mps"
    assert compute_mode.exclusive(tmp_path, UUID) == "EXCLUSIVE_PROCESS"  # a restart keeps the first record
    assert record.read_text() == f"{pynvml.NVML_COMPUTEMODE_PROHIBITED}\n"
    assert nvml.sets == [pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS]


def test_restore_sets_the_recorded_mode_and_forgets_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(monkeypatch, pynvml.NVML_COMPUTEMODE_DEFAULT)
    compute_mode.exclusive(tmp_path, UUID)
    compute_mode.restore_mode(tmp_path, UUID)
    assert nvml.mode == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert not compute_mode.mode_before_path(tmp_path, UUID).exists()
    compute_mode.restore_mode(tmp_path, UUID)  # nothing recorded: nothing to do
    assert nvml.sets == [pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, pynvml.NVML_COMPUTEMODE_DEFAULT]


def test_a_record_that_cannot_be_restored_is_kept_for_the_next_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = FakeNvml(monkeypatch, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    record = compute_mode.mode_before_path(tmp_path, UUID)
    record.parent.mkdir(parents=True)
    record.write_text("garbage\n")
    compute_mode.restore_mode(tmp_path, UUID)
    assert record.exists() and nvml.sets == []
    assert [(r.name, r.message) for r in caplog.records] == [
        ("kubelet_plugin.mps_supervisor.supervisor", "cannot restore the compute mode")
    ]
