"""Unit tests of GPU health as data and plans: the XID table, the health book (clear only on the driver's word
of a reset), taint planning, the health stream's source, slices with taints and the coalescer (fake clock)."""

from __future__ import annotations

import threading
import types
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kubelet_plugin.core.coalesce import Coalescer
from kubelet_plugin.health.book import (
    LOST_TAINT,
    RECOVERY_TAINT,
    XID_TAINT,
    Effects,
    GpuHealth,
    HealthBook,
    Placement,
    SliceFault,
    plan_taints,
)
from kubelet_plugin.health.events import message
from kubelet_plugin.health.metrics import HealthMetrics
from kubelet_plugin.health.nvml_watcher import NvmlHealthWatcher
from kubelet_plugin.health.source import ReportedHealth, with_reported_health
from kubelet_plugin.health.watch import CLEAR_PREFIX, from_record, plan_clears, to_record
from kubelet_plugin.health.xid_catalog import XIDS, classify_action, classify_xid
from kubelet_plugin.publishing.slices import MAX_TAINTED_DEVICES_PER_SLICE, build_slices
from kubelet_plugin.state import health_faults
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointDevice, ClaimEntry, read_claims_on
from tests.unit.plugin_host import gpu_info

NODE = "node-a"
NODE_UID = "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
STEP = 256 << 20

GPU_RESET = 1
DRAIN_P2P = 3


class Clock:
    """A fake RFC 3339 clock: every call one second later."""

    def __init__(self) -> None:
        self.seconds = 0

    def __call__(self) -> str:
        self.seconds += 1
        return f"2026-12-01T10:00:{self.seconds:02d}Z"


def book() -> HealthBook:
    return HealthBook(["gpu-0", "gpu-1"], clock=Clock())


# --- the XID table ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xid", "cls"),
    [(13, "ignore"), (31, "ignore"), (43, "ignore"), (63, "degraded"), (74, "degraded"), (92, "degraded"),
     (94, "degraded"), (48, "fatal"), (64, "fatal"), (79, "fatal"), (95, "fatal"), (999, "degraded"),
     (12345, "degraded")],
)  # fmt: skip
def test_xid_classes(xid: int, cls: str) -> None:
    assert classify_xid(xid).cls == cls


def test_the_allow_list_ignores_any_xid_and_keeps_its_name() -> None:
    assert classify_xid(48, frozenset({48})) == ("ignore", "double-bit-ecc-error")
    assert classify_xid(48, frozenset({13})).cls == "fatal"


def test_xid_names_are_taint_values() -> None:
    for xid, entry in XIDS.items():
        value = f"{xid}-{entry.name}"
        assert len(value) <= 63 and value.replace("-", "").isalnum(), value


def test_recovery_actions() -> None:
    assert [classify_action(a).cls for a in range(8)] == [
        "ignore", "fatal", "fatal", "degraded", "fatal", "degraded", "fatal", "fatal"
    ]  # fmt: skip
    assert classify_action(99).cls == "fatal"


# --- the book: transitions and clearing ------------------------------------------------------------------------


def test_ignored_xids_change_nothing() -> None:
    b = book()
    assert b.record_xid("gpu-1", 13, frozenset(), None) is None
    assert b.record_xid("gpu-1", 94, frozenset({94}), 0) is None
    assert b.snapshot()["gpu-1"] == GpuHealth()


def test_a_fatal_xid_is_one_transition_and_a_flood_of_the_same_adds_none() -> None:
    b = book()
    t = b.record_xid("gpu-1", 48, frozenset(), GPU_RESET)
    assert t is not None and (t.device, t.before, t.after) == ("gpu-1", "healthy", "fatal")
    assert t.what == "XID 48 (double-bit-ecc-error, fatal); driver asks for recovery action gpu-reset"
    assert [b.record_xid("gpu-1", x, frozenset(), GPU_RESET) for x in (48, 63, 94, 13) * 2500] == [None] * 10_000
    assert b.snapshot()["gpu-0"].state == "healthy"


def test_a_worse_xid_replaces_a_milder_one() -> None:
    b = book()
    assert b.record_xid("gpu-0", 63, frozenset(), None) is not None
    t = b.record_xid("gpu-0", 79, frozenset(), None)
    assert t is not None and (t.before, t.after) == ("degraded", "fatal") and b.snapshot()["gpu-0"].xid == 79


def test_clears_when_the_pending_recovery_action_goes_to_none() -> None:
    b = book()
    b.record_xid("gpu-1", 48, frozenset(), GPU_RESET)
    assert b.record_answer("gpu-1", GPU_RESET) is None  # still waiting for the reset
    t = b.record_answer("gpu-1", 0)
    assert t is not None and (t.before, t.after) == ("fatal", "healthy")
    assert t.what == "the driver reports a reset: the recovery action it asked for (gpu-reset) is back to none"
    assert b.snapshot()["gpu-1"].xid is None


def test_clears_when_a_lost_gpu_answers_again() -> None:
    b = book()
    t = b.record_lost("gpu-0")
    assert t is not None and t.after == "fatal" and b.snapshot()["gpu-0"].lost
    assert b.record_lost("gpu-0") is None
    t = b.record_answer("gpu-0", None)
    assert (
        t is not None and t.after == "healthy" and b.snapshot()["gpu-0"] == GpuHealth(since=b.snapshot()["gpu-0"].since)
    )
    assert t.what == "the driver reports a reset: the GPU answers again after NVML_ERROR_GPU_IS_LOST"


def test_a_lost_gpu_back_with_a_pending_action_stays_until_the_action_clears() -> None:
    b = book()
    b.record_xid("gpu-0", 79, frozenset(), None)
    b.record_lost("gpu-0")
    t = b.record_answer("gpu-0", GPU_RESET)
    assert t is not None and t.after == "fatal" and not b.snapshot()["gpu-0"].lost
    assert b.record_answer("gpu-0", 0) is not None and b.snapshot()["gpu-0"].state == "healthy"


def test_never_clears_without_the_drivers_word() -> None:
    """An XID with no recovery action reported (None) or none pending (0): answering is no proof of a reset."""
    b = book()
    b.record_xid("gpu-0", 48, frozenset(), None)
    b.record_xid("gpu-1", 63, frozenset(), 0)
    for _ in range(100):
        assert b.record_answer("gpu-0", None) is None
        assert b.record_answer("gpu-0", 0) is None
        assert b.record_answer("gpu-1", 0) is None
    assert (b.snapshot()["gpu-0"].state, b.snapshot()["gpu-1"].state) == ("fatal", "degraded")


def test_a_new_xid_after_the_action_was_seen_needs_its_own_reset() -> None:
    b = book()
    b.record_xid("gpu-0", 63, frozenset(), None)
    b.record_answer("gpu-0", DRAIN_P2P)  # the driver asks for something: a reset is now observable
    b.record_xid("gpu-0", 48, frozenset(), DRAIN_P2P)
    assert b.record_answer("gpu-0", 0) is not None  # the action cleared: that was the reset
    assert b.snapshot()["gpu-0"].state == "healthy"


# --- taints ----------------------------------------------------------------------------------------------------


def test_plan_taints_from_health() -> None:
    b = book()
    assert plan_taints(b.snapshot(), Effects()) == {}
    b.record_xid("gpu-1", 48, frozenset(), GPU_RESET)
    b.record_xid("gpu-0", 63, frozenset(), None)
    b.record_lost("gpu-0")
    since0, since1 = b.snapshot()["gpu-0"].since, b.snapshot()["gpu-1"].since
    assert plan_taints(b.snapshot(), Effects()) == {
        "gpu-0": [
            {"key": LOST_TAINT, "value": "gpu-is-lost", "effect": "NoExecute", "timeAdded": since0},
            {"key": XID_TAINT, "value": "63-ecc-page-retirement-or-row-remap", "effect": "NoSchedule",
             "timeAdded": since0},
        ],
        "gpu-1": [
            {"key": XID_TAINT, "value": "48-double-bit-ecc-error", "effect": "NoExecute", "timeAdded": since1},
            {"key": RECOVERY_TAINT, "value": "gpu-reset", "effect": "NoExecute", "timeAdded": since1},
        ],
    }  # fmt: skip
    custom = plan_taints(b.snapshot(), Effects(degraded="None", fatal="NoSchedule"))
    assert [t["effect"] for t in custom["gpu-0"]] == ["NoSchedule", "None"]
    assert plan_taints(b.snapshot(), Effects()) == plan_taints(b.snapshot(), Effects()), "stable across republishes"


def test_taints_go_into_the_slice_which_then_holds_64_devices() -> None:
    gpus = [gpu_info(i, f"GPU-00000000-0000-4000-8000-{i:012d}") for i in range(100)]
    taint = {"key": XID_TAINT, "value": "48-double-bit-ecc-error", "effect": "NoExecute"}
    slices = build_slices(NODE, NODE_UID, "gpu.fracgpu.dev", gpus, step=STEP, reserve=0, generation=1,
                          taints={"gpu-7": [taint]})  # fmt: skip
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_TAINTED_DEVICES_PER_SLICE, 36]
    by_name = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    assert by_name["gpu-7"]["taints"] == [taint] and "taints" not in by_name["gpu-8"]
    untainted = build_slices(NODE, NODE_UID, "gpu.fracgpu.dev", gpus, step=STEP, reserve=0, generation=1)
    assert len(untainted) == 1


def test_the_health_stream_reports_unhealthy_gpus() -> None:
    b = book()
    gone = "its device node /dev/nvidia1 is missing"
    source = with_reported_health(
        lambda: [ReportedHealth("node", "gpu-0", True), ReportedHealth("node", "gpu-1", False, gone)], b
    )
    assert source() == [("node", "gpu-0", True, ""), ("node", "gpu-1", False, gone)]
    b.record_xid("gpu-0", 63, frozenset(), None)
    b.record_xid("gpu-1", 79, frozenset(), None)
    assert source() == [
        ("node", "gpu-0", False, "XID 63 (ecc-page-retirement-or-row-remap, degraded)"),
        ("node", "gpu-1", False, f"{gone}; XID 79 ({classify_xid(79).name}, fatal)"),
    ]
    b.record_answer("gpu-0", 1)  # the driver asks for a GPU reset ...
    b.record_answer("gpu-0", 0)  # ... and reports none pending after it
    assert source()[0] == ("node", "gpu-0", True, "")


# --- coalescing (fake clock) -----------------------------------------------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def flushes_of(notices: list[float], until: float, window: float = 1.0) -> list[float]:
    """When a flusher polling every millisecond flushes, for notices at the times given."""
    clock = FakeTime()
    c = Coalescer(window, clock)
    pending = sorted(notices)
    flushes = []
    for ms in range(int(until * 1000) + 1):
        clock.now = ms / 1000
        while pending and pending[0] <= clock.now:
            pending.pop(0)
            c.notify()
        if c.due_in(clock.now) == 0:
            flushes.append(clock.now)
            c.flushed()
    return flushes


def test_a_flood_of_notices_in_one_second_is_one_flush() -> None:
    assert flushes_of([i / 10_000 for i in range(10_000)], until=5) == [1.0]


def test_a_longer_flood_is_one_flush_per_window() -> None:
    assert flushes_of([i / 4_000 for i in range(10_000)], until=5) == pytest.approx([1.0, 2.0, 3.0], abs=0.005)


def test_the_first_notice_after_a_quiet_period_waits_one_window() -> None:
    clock = FakeTime()
    c = Coalescer(2.0, clock)
    c.notify()
    assert c.due_in(0.0) == 2.0 and c.due_in(1.5) == 0.5 and c.due_in(2.0) == 0
    c.flushed()
    clock.now = 2.1
    c.notify()  # right after a flush: the next one waits for the window
    assert c.due_in(2.1) == pytest.approx(2.0)


def test_wait_due_returns_false_on_stop_and_true_when_due() -> None:
    c = Coalescer(0.0)
    stop = threading.Event()
    stop.set()
    assert c.wait_due(stop) is False
    c.notify()
    assert c.wait_due(threading.Event()) is True


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="coalescing window must be >= 0 seconds, got -1"):
        Coalescer(-1)


# --- Events: the claims on a GPU, from the checkpoint ----------------------------------------------------------


def test_read_claims_on_a_gpu_come_from_the_checkpoint(tmp_path: Path) -> None:
    def entry(name: str, device: str) -> ClaimEntry:
        dev = CheckpointDevice(request_names=["gpu"], pool_name=NODE, device_name=device, cdi_device_ids=["x"])
        return ClaimEntry(namespace="ns", name=name, state="PrepareCompleted", devices=[dev])

    path = tmp_path / "checkpoint.json"
    assert read_claims_on(path, "gpu-1") == [], "no checkpoint: no claims"
    checkpoint = (
        Checkpoint.empty("boot").with_claim("uid-b", entry("b", "gpu-1")).with_claim("uid-a", entry("a", "gpu-1"))
    )
    path.write_text(checkpoint.with_claim("uid-c", entry("c", "gpu-0")).to_json())
    assert read_claims_on(path, "gpu-1") == [("ns", "a", "uid-a"), ("ns", "b", "uid-b")]
    path.write_text("{not json")
    assert read_claims_on(path, "gpu-1") == [], "unreadable: no claims, no exception"


def test_event_messages() -> None:
    b = book()
    t = b.record_xid("gpu-1", 79, frozenset(), None)
    assert t is not None and message(t) == "GPU gpu-1 is fatal: XID 79 (fallen-off-the-bus, fatal)"
    b.record_lost("gpu-1")
    t = b.record_answer("gpu-1", 0)
    assert t is not None and message(t) == (
        "GPU gpu-1 is healthy again (was fatal): the driver reports a reset: the GPU answers again after "
        "NVML_ERROR_GPU_IS_LOST"
    )


# --- faults on the memory slices of a MIG GPU ------------------------------------------------------------------

AT6 = "gpu-1-mig-1g-10gb-at-6"
PLACEMENTS = {
    AT6: Placement("gpu-1", frozenset({6})),
    "gpu-1-mig-1g-20gb-at-6": Placement("gpu-1", frozenset({6, 7})),
    "gpu-1-mig-1g-10gb-at-5": Placement("gpu-1", frozenset({5})),
    "gpu-0-mig-1g-10gb-at-6": Placement("gpu-0", frozenset({6})),
}


def fault(xid: int = 48, instance: int = 9, slices: tuple[int, ...] = (6,), partition: str = AT6) -> SliceFault:
    return SliceFault(xid=xid, xid_class="ignore", slices=slices, instance=instance, partition=partition)


def test_an_instance_xid_taints_every_partition_on_its_memory_slices_and_not_the_gpu() -> None:
    b = book()
    t = b.record_instance_xid("gpu-1", fault(), frozenset(), None)
    assert t is not None and (t.device, t.before, t.after) == (AT6, "healthy", "fatal")
    assert b.snapshot()["gpu-1"].state == "healthy", "the GPU's other memory slices go on"
    since = b.snapshot()["gpu-1"].slice_faults[0].since
    assert since
    taint = {"key": XID_TAINT, "value": "48-double-bit-ecc-error", "effect": "NoExecute", "timeAdded": since}
    assert plan_taints(b.snapshot(), Effects(), PLACEMENTS) == {AT6: [taint], "gpu-1-mig-1g-20gb-at-6": [taint]}
    assert b.record_instance_xid("gpu-1", fault(instance=3), frozenset(), None) is None, "known on those slices"
    assert b.record_instance_xid("gpu-1", fault(xid=13), frozenset(), None) is None, "an application's XID"
    assert b.remembers()


def test_an_instance_xid_clears_on_a_reset_the_driver_reports_never_on_answers_alone() -> None:
    b = book()
    b.record_instance_xid("gpu-1", fault(), frozenset(), 0)
    assert [b.record_answer("gpu-1", 0) for _ in range(50)] == [None] * 50, "no reset reported"
    assert b.record_answer("gpu-1", GPU_RESET) is not None
    t = b.record_answer("gpu-1", 0)
    assert t is not None and (t.device, t.before, t.after) == ("gpu-1", "fatal", "healthy")
    assert "driver reports a reset" in t.what and not b.snapshot()["gpu-1"].slice_faults


def test_an_operator_clears_what_was_reported_until_the_time_written() -> None:
    b = book()
    b.record_instance_xid("gpu-1", fault(), frozenset(), None)  # at 10:00:01
    assert b.clear("gpu-1", "2026-12-01T10:00:00Z", "by hand") is None, "written before the fault"
    assert b.clear("gpu-1", "not a time", "by hand") is None
    b.record_answer("gpu-1", GPU_RESET)  # the driver asks for a reset (10:00:02): that taint is the driver's
    t = b.clear("gpu-1", "2026-12-01T11:30:00+01:00", "Node annotation x")
    assert t is not None and (t.before, t.after) == ("fatal", "fatal")
    assert t.what.startswith("an operator cleared what the driver reported until 2026-12-01T11:30:00+01:00 ")
    assert "the driver reported no reset" in t.what and "driver asks for recovery action gpu-reset" in t.what
    assert plan_taints(b.snapshot(), Effects(), PLACEMENTS).keys() == {"gpu-1"}


def test_the_health_stream_reports_a_partition_on_a_faulty_memory_slice() -> None:
    b = book()
    names = [AT6, "gpu-1-mig-1g-10gb-at-5"]
    source = with_reported_health(lambda: [ReportedHealth("node", n, True) for n in names], b, PLACEMENTS)
    b.record_instance_xid("gpu-1", fault(), frozenset(), None)
    (at6, at5) = source()
    assert not at6.healthy and at6.message.startswith("XID 48 (double-bit-ecc-error, fatal) on GPU instance 9")
    assert at5.healthy


def test_the_record_keeps_faults_across_a_restart_for_the_same_gpus_only(tmp_path: Path) -> None:
    gpus = [gpu_info(0, "GPU-00000000-0000-4000-8000-000000000000"), gpu_info(1, "GPU-1")]
    b = book()
    b.record_instance_xid("gpu-1", fault(), frozenset(), None)
    b.record_xid("gpu-0", 63, frozenset(), GPU_RESET)
    path = tmp_path / "health.json"
    health_faults.save(path, to_record(b.snapshot(), gpus))
    restored = from_record(health_faults.load(path), gpus)
    assert restored == {d: h for d, h in b.snapshot().items() if d in restored} and restored.keys() == {
        "gpu-0",
        "gpu-1",
    }
    swapped = [gpus[0], gpu_info(1, "GPU-another")]
    assert from_record(health_faults.load(path), swapped).keys() == {"gpu-0"}, "another GPU at that index"
    path.write_text('{"version": 2, "gpus": {}}')
    assert health_faults.load(path).gpus == {} and path.exists(), "a newer release's: not read, left"
    path.write_text("{not json")
    assert health_faults.load(path).gpus == {} and not path.exists(), "invalid: moved aside"
    assert list(tmp_path.glob("health.json.corrupt-*"))


def test_plan_clears_from_node_annotations() -> None:
    annotations = {f"{CLEAR_PREFIX}gpu-1": "2026-12-01T10:00:00Z", f"{CLEAR_PREFIX}gpu-7": "x", "other": "y"}
    assert plan_clears(annotations, ["gpu-0", "gpu-1"]) == (
        {"gpu-1": "2026-12-01T10:00:00Z"},
        [f"{CLEAR_PREFIX}gpu-7"],
    )


class _FakeNvml:
    """Just what NvmlHealthWatcher asks about a GPU instance: its placement, or an error (instance gone)."""

    class NVMLError(Exception):
        pass

    def __init__(self, placement: tuple[int, int] | None) -> None:
        self.placement = placement

    def nvmlDeviceGetGpuInstanceById(self, handle: object, instance: int) -> int:  # noqa: N802 (NVML's name)
        if self.placement is None:
            raise self.NVMLError("not found")
        return instance

    def nvmlGpuInstanceGetInfo(self, gi: int) -> object:  # noqa: N802 (NVML's name)
        start, size = self.placement or (0, 0)
        return types.SimpleNamespace(placement=types.SimpleNamespace(start=start, size=size))


@pytest.mark.parametrize(("placement", "slices"), [((4, 2), (4, 5)), (None, None)])
def test_an_instance_no_claim_holds_gets_the_placement_the_driver_reports(
    placement: tuple[int, int] | None, slices: tuple[int, ...] | None
) -> None:
    watcher = NvmlHealthWatcher(
        [gpu_info(1, "GPU-1")], book(), ignored_xids=frozenset(), on_transition=lambda t: None,
        metrics=HealthMetrics(CollectorRegistry()), probe_interval=1, nvml=_FakeNvml(placement),
    )  # fmt: skip
    watcher._handles["gpu-1"] = object()
    got = watcher._instance_fault("gpu-1", 5, 48)
    assert (got.slices if got else None) == slices, "no placement known: the whole GPU's (None)"
    assert got is None or (got.instance, got.partition) == (5, "")
