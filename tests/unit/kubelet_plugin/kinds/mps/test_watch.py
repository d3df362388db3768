"""Unit tests of the MPS daemons' health in the node plugin (kubelet_plugin/kinds/mps/watch.py): taints, Events
and the gauge follow the status files the MPS supervisor writes (kubelet_plugin/state/mps_files.py)."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from kubelet_plugin.core.settings import Settings
from kubelet_plugin.kinds.mps.watch import (
    DOWN_REASON,
    LIMITS_REASON,
    MPS_TAINT,
    RESTARTED_REASON,
    SERVER_REASON,
    SOCKET_REASON,
    UP_REASON,
    MpsWatch,
    mps_gpus,
    status_reader,
)
from kubelet_plugin.state import mps_files as mps
from tests.unit.plugin_host import NODE, UUID0, UUID1, gpu_info

GPUS = [gpu_info(0, UUID0), gpu_info(1, UUID1)]


def write(
    root: Path, state: mps.DaemonState, restarts: int = 0, reason: str = "", *, server_exits: int = 0, replaced: int = 0
) -> None:
    path = mps.status_path(root, UUID0)
    path.parent.mkdir(parents=True, exist_ok=True)
    status = mps.DaemonStatus(
        uuid=UUID0, state=state, reason=reason, restarts=restarts, server_exits=server_exits, updated=time.time(),
        refresh_seconds=5, socket_replacements=replaced,
    )  # fmt: skip
    path.write_bytes(status.to_json())


def test_down_restart_and_recovery_give_taints_events_and_the_gauge(tmp_path: Path) -> None:
    settings = Settings(node_name=NODE, mps_gpus="0", mps_root=tmp_path)
    assert [g.device_name for g in mps_gpus(settings, GPUS)] == ["gpu-0"]
    registry = CollectorRegistry()
    watch = MpsWatch(mps_gpus(settings, GPUS), status_reader(settings), registry)

    def up() -> float | None:
        return registry.get_sample_value("fracgpu_mps_daemon_up", {"device": "gpu-0", "uuid": UUID0})

    write(tmp_path, "running")
    assert watch.check() == [] and watch.taints() == {} and up() == 1
    write(tmp_path, "down", 1, "nvidia-cuda-mps-control exited with status 137")
    ((device, reason, message),) = watch.check()
    assert (device, reason) == ("gpu-0", DOWN_REASON)
    assert "new MPS shares there are refused" in message and "exited with status 137" in message
    assert watch.taints() == {"gpu-0": [{"key": MPS_TAINT, "value": "down", "effect": "NoSchedule"}]}
    assert up() == 0 and watch.changes.due_in(time.monotonic()) is not None
    assert watch.check() == [], "a daemon still down is not reported twice"
    write(tmp_path, "running", 1)
    assert [e[1] for e in watch.check()] == [UP_REASON] and watch.taints() == {} and up() == 1
    write(tmp_path, "running", 2)  # restarted between two looks: clients lost their server all the same
    ((_, reason, message),) = watch.check()
    assert reason == RESTARTED_REASON and "lost their MPS server" in message
    write(tmp_path, "running", 2, server_exits=1)  # a server died, the daemon lives on
    ((_, reason, message),) = watch.check()
    assert reason == SERVER_REASON and "its clients lost the GPU" in message
    assert watch.check() == []


def test_a_missing_status_file_is_a_daemon_down_with_the_reason(tmp_path: Path) -> None:
    settings = Settings(node_name=NODE, mps_gpus=UUID0, mps_root=tmp_path)
    watch = MpsWatch(mps_gpus(settings, GPUS), status_reader(settings), CollectorRegistry())
    ((_, reason, message),) = watch.check()
    assert reason == DOWN_REASON and "no status file" in message and "fracgpu-mps" in message


def test_run_posts_each_change_and_asks_for_the_ceiling_when_the_daemon_is_back(tmp_path: Path) -> None:
    import logging
    import threading

    settings = Settings(node_name=NODE, mps_gpus="0", mps_root=tmp_path)
    posted: list[tuple[str, str, str]] = []
    back: list[str] = []
    stop = threading.Event()
    states = iter(["down", "running"])

    def read(gpu: object) -> tuple[mps.DaemonStatus | None, str | None]:
        state = next(states, None)
        if state is None:
            stop.set()
            state = "running"
        write(tmp_path, state)  # type: ignore[arg-type]
        return status_reader(settings)(gpu)  # type: ignore[arg-type]

    watch = MpsWatch(
        mps_gpus(settings, GPUS), read, CollectorRegistry(), interval=0.01,
        post=lambda device, reason, message, type_: posted.append((device, reason, type_)), on_up=back.append,
    )  # fmt: skip
    logging.getLogger("kubelet_plugin.kinds.mps.watch").setLevel(logging.DEBUG)  # logging must not fail either
    watch.run(stop)
    assert posted == [("gpu-0", DOWN_REASON, "Warning"), ("gpu-0", UP_REASON, "Normal")]
    assert back == [UUID0]


def test_a_domain_switch_is_no_fault_and_a_replaced_socket_is_reported(tmp_path: Path) -> None:
    settings = Settings(node_name=NODE, mps_gpus="0", mps_root=tmp_path)
    watch = MpsWatch(mps_gpus(settings, GPUS), status_reader(settings), CollectorRegistry())
    write(tmp_path, "running")
    assert watch.check() == []
    write(tmp_path, "switching", reason="from namespace/a to namespace/b")
    assert watch.check() == [] and watch.taints() == {}, "a fresh daemon for the next domain is not a fault"
    write(tmp_path, "running", replaced=1)
    ((_, reason, message),) = watch.check()
    assert reason == SOCKET_REASON and "removed or replaced" in message and "restarted the daemon" in message


def test_changed_limits_are_repaired_and_reported_for_running_daemons_only(tmp_path: Path) -> None:
    settings = Settings(node_name=NODE, mps_gpus="0", mps_root=tmp_path)
    asked: list[str] = []
    differences = ["the daemon's defaults are pinned memory 81920M, active threads 100.0 %, not ..."]

    def repair(uuid: str) -> list[str]:
        asked.append(uuid)
        return differences

    watch = MpsWatch(mps_gpus(settings, GPUS), status_reader(settings), CollectorRegistry(), repair=repair)
    write(tmp_path, "down", reason="exited")
    watch.check()
    assert watch.repair() == [] and asked == [], "a daemon that is down is not read"
    write(tmp_path, "running", 1)
    watch.check()
    ((device, reason, message),) = watch.repair()
    assert (device, reason, asked) == ("gpu-0", LIMITS_REASON, [UUID0])
    assert "81920M" in message and "set back to the ceiling" in message
    differences.clear()
    assert watch.repair() == []
