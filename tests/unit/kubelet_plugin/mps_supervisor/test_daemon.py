"""One MPS GPU's daemon record and the runner's bookkeeping: a daemon that exits or cannot start is down with its
reason and restarts after a backoff, and its status file says so (kubelet_plugin/mps_supervisor/daemon.py). The
processes themselves are tests/integration/test_mps_supervisor.py's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kubelet_plugin.mps_supervisor import supervisor
from kubelet_plugin.mps_supervisor.daemon import MAX_BACKOFF_S, DaemonRunner, GpuDaemon
from kubelet_plugin.mps_supervisor.settings import MpsSettings, parse_mps_settings
from kubelet_plugin.state import mps_files as mps

UUID = "GPU-0"


def runner(root: Path) -> tuple[DaemonRunner, CollectorRegistry]:
    registry = CollectorRegistry()
    return DaemonRunner(MpsSettings(mps_gpus="0", mps_root=root, refresh_seconds=2.0), registry), registry


def metric(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"uuid": UUID})


def test_an_exited_daemon_is_down_with_its_stderr_and_restarts_after_a_backoff(tmp_path: Path) -> None:
    run, registry = runner(tmp_path)
    mps.log_dir(tmp_path, UUID).mkdir(parents=True)
    (mps.log_dir(tmp_path, UUID) / "supervisor.stderr").write_text("no GPU\n")
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    daemon = GpuDaemon(UUID, process=process, servers=[7], socket=(1, 0), restarts=2)
    run.check(daemon, now=100.0)
    assert (daemon.process, daemon.servers, daemon.socket, daemon.state) == (None, [], None, "down")
    assert daemon.reason == "nvidia-cuda-mps-control exited with status 3: no GPU"
    assert (daemon.next_start, daemon.restarts) == (104.0, 3)
    assert metric(registry, "fracgpu_mps_daemon_restarts_total") == 1.0
    assert metric(registry, "fracgpu_mps_daemon_up") == 0.0


def test_a_daemon_that_cannot_start_backs_off_doubling_up_to_thirty_seconds(tmp_path: Path) -> None:
    run, _ = runner(tmp_path)
    daemon = GpuDaemon(UUID)
    waits = []
    for _ in range(7):
        run.failed(daemon, 0.0, "no mount")
        waits.append(daemon.next_start)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert (daemon.state, daemon.reason, daemon.restarts) == ("down", "no mount", 7)


def test_the_status_file_says_what_the_record_holds(tmp_path: Path) -> None:
    run, _ = runner(tmp_path)
    daemon = GpuDaemon(UUID, state="running", reason="", compute_mode="EXCLUSIVE_PROCESS", domain="ns/a", servers=[9])
    run.write_status(daemon)
    written, why = mps.read_status(tmp_path, UUID)  # as the node plugin reads it: fresh and running
    assert written is not None and why is None
    assert (written.state, written.compute_mode, written.trust_domain, written.servers) == (
        "running",
        "EXCLUSIVE_PROCESS",
        "ns/a",
        [9],
    )
    assert (written.multi_user, written.trust_domains, written.refresh_seconds) == (True, True, 2.0)


def test_the_supervisor_module_still_offers_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert supervisor.MpsSettings is MpsSettings and supervisor.parse_mps_settings is parse_mps_settings
    monkeypatch.delenv("FRACGPU_MPS_GPUS", raising=False)
    assert parse_mps_settings(["--mps-gpus", " 0 , GPU-1"]).mps_gpus == "0,GPU-1"
