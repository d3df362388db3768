"""GPU health through the real pynvml against the mock libnvidia-ml.so.1: the mock's event API (its control file,
harness/mocknvml/mock_nvml_events.c) behaves as nvml.h documents, and the plugin's NVML watcher turns it into health.

Each NVML run is a subprocess: the dynamic loader reads LD_LIBRARY_PATH only at process start.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import mocknvml

REPO = Path(__file__).resolve().parents[4]
PROFILE = mocknvml.PROFILES / "gpu80x2.profile"
GPU1 = "GPU-1d492704-49c3-5be7-977e-269165e18e2c"

EVENT_API = """
import json, os, threading, time, pynvml as n
ctl = os.environ["FRACGPU_MOCK_NVML_EVENTS"]
def write(text):
    with open(ctl, "a") as f:
        f.write(text)
def code(fn, *args):
    try:
        fn(*args)
        return 0
    except n.NVMLError as err:
        return err.value
out = {}
n.nvmlInit()
h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
out["lost_from_history"] = code(n.nvmlDeviceGetUUID, h[0])
write("0 reset\\n")
out["supported"] = n.nvmlDeviceGetSupportedEventTypes(h[1])
s = n.nvmlEventSetCreate()
out["unsupported"] = code(n.nvmlDeviceRegisterEvents, h[1], n.nvmlEventTypeXidCriticalError | n.nvmlEventTypePState, s)
write("1 xid 31\\n")  # before registration: not recorded
for x in h:
    n.nvmlDeviceRegisterEvents(x, n.nvmlEventTypeXidCriticalError, s)
t = time.monotonic()
out["timeout"] = code(n.nvmlEventSetWait_v2, s, 300)
out["waited_ms"] = (time.monotonic() - t) * 1000
write(f"1 xid 48 gpu_reset\\n{os.environ['GPU1']} xid 63\\n0 xid 13\\nnot a line\\n")
events = []
for _ in range(3):
    d = n.nvmlEventSetWait_v2(s, 1000)
    events.append([n.nvmlDeviceGetIndex(d.device), d.eventType, d.eventData, d.gpuInstanceId, d.computeInstanceId])
out["events"] = events
out["after"] = code(n.nvmlEventSetWait_v2, s, 50)
field = lambda i: n.nvmlDeviceGetFieldValues(h[i], [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
out["action"] = [field(1).nvmlReturn, field(1).value.uiVal, field(0).value.uiVal]
write("1 lost\\n")
out["lost_wait"] = [code(n.nvmlEventSetWait_v2, s, 500), code(n.nvmlEventSetWait_v2, s, 50)]
out["lost_calls"] = [code(n.nvmlDeviceGetUUID, h[1]), code(n.nvmlDeviceGetMemoryInfo, h[1]), code(n.nvmlDeviceGetUUID, h[0])]
write("1 reset\\n")
out["reset"] = [code(n.nvmlDeviceGetUUID, h[1]), field(1).value.uiVal]
threading.Timer(0.3, write, args=("0 xid 79\\n",)).start()  # while the next wait sleeps
t = time.monotonic()
d = n.nvmlEventSetWait_v2(s, 20000)
out["woken"] = [n.nvmlDeviceGetIndex(d.device), d.eventData, (time.monotonic() - t) * 1000]
n.nvmlEventSetFree(s)
out["freed"] = code(n.nvmlEventSetWait_v2, s, 10)
print(json.dumps(out))
"""

WATCHER = """
import json, os, threading, time
from prometheus_client import CollectorRegistry
from kubelet_plugin.publishing.discovery import discover_gpus
from kubelet_plugin.health.book import Effects, HealthBook, plan_taints
from kubelet_plugin.health.metrics import HealthMetrics
from kubelet_plugin.health.nvml_watcher import NvmlHealthWatcher
ctl = os.environ["FRACGPU_MOCK_NVML_EVENTS"]
gpus = discover_gpus()
book = HealthBook(g.device_name for g in gpus)
transitions = []
metrics = HealthMetrics(CollectorRegistry())
watcher = NvmlHealthWatcher(gpus, book, ignored_xids=frozenset({92}), on_transition=transitions.append,
                            metrics=metrics, probe_interval=0.2)
stop = threading.Event()
thread = threading.Thread(target=watcher.run, args=(stop,))
thread.start()
def step(text, until):
    with open(ctl, "a") as f:
        f.write(text)
    deadline = time.monotonic() + 30
    while not until() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {d: h.state for d, h in book.snapshot().items()}
def xids(gpu, xid):
    return metrics.xid_events.labels(gpu=gpu, xid=str(xid))._value.get()
out = {}
time.sleep(0.5)
out["ignored"] = step("1 xid 13\\n1 xid 92\\n", lambda: xids("gpu-1", 92) == 1)
out["fatal"] = step("1 xid 48 gpu_reset\\n", lambda: book.snapshot()["gpu-1"].state == "fatal")
out["taints"] = plan_taints(book.snapshot(), Effects())
out["reset"] = step("1 reset\\n", lambda: book.snapshot()["gpu-1"].state == "healthy")
out["lost"] = step("0 lost\\n", lambda: book.snapshot()["gpu-0"].lost)
out["back"] = step("0 reset\\n", lambda: book.snapshot()["gpu-0"].state == "healthy")
out["sticky"] = step("0 xid 95\\n", lambda: book.snapshot()["gpu-0"].state == "fatal")
time.sleep(1)  # five probes: the GPU answers, but nothing says it was reset
out["still"] = book.snapshot()["gpu-0"].state
before = len(transitions)
flood = "".join(f"{i % 2} xid {63 if i % 4 < 2 else 48} gpu_reset\\n" for i in range(10000))
out["flood"] = step(flood, lambda: xids("gpu-1", 48) + xids("gpu-1", 63) == 5000 + 1)
out["flood_transitions"] = len(transitions) - before
out["alive"] = thread.is_alive()
out["count"] = [xids("gpu-0", 63), xids("gpu-0", 48), xids("gpu-1", 63), xids("gpu-1", 48)]
stop.set()
thread.join(10)
out["stopped"] = not thread.is_alive()
print(json.dumps(out))
"""

LOST_AT_START = """
import json, os, threading, time
from prometheus_client import CollectorRegistry
from kubelet_plugin.publishing.discovery import DiscoveryError, discover, discover_gpus
from kubelet_plugin.health.book import HealthBook
from kubelet_plugin.health.metrics import HealthMetrics
from kubelet_plugin.health.nvml_watcher import NvmlHealthWatcher
ctl = os.environ["FRACGPU_MOCK_NVML_EVENTS"]
def write(text):
    with open(ctl, "a") as f:
        f.write(text)
out = {}
remembered = discover_gpus()
write("1 lost\\n")
try:
    discover_gpus()
    out["strict"] = "no error"
except DiscoveryError as err:
    out["strict"] = str(err)
found = discover(remembered)
out["found"] = found.model_dump(mode="json")
out["same"] = found.gpus == remembered
out["unknown"] = discover().model_dump(mode="json")
book = HealthBook(g.device_name for g in found.gpus)
for name in found.lost:
    book.record_lost(name)
watcher = NvmlHealthWatcher(found.gpus, book, ignored_xids=frozenset(), on_transition=lambda t: None,
                            metrics=HealthMetrics(CollectorRegistry()), probe_interval=0.2)
stop = threading.Event()
thread = threading.Thread(target=watcher.run, args=(stop,))
thread.start()
time.sleep(1)  # five probes: the GPU stays lost
out["still_lost"] = {d: h.lost for d, h in book.snapshot().items()}
write("1 reset\\n")
deadline = time.monotonic() + 30
while book.snapshot()["gpu-1"].state != "healthy" and time.monotonic() < deadline:
    time.sleep(0.05)
out["after_reset"] = {d: h.state for d, h in book.snapshot().items()}
stop.set()
thread.join(10)
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on this machine: cannot build the mock NVML library")
    return mocknvml.build_nvml_variant(tmp_path_factory.mktemp("health-nvml"))


def _run(lib: Path, script: str, control: Path, **extra: str) -> tuple[Any, str]:
    env = {
        **extra,
        **os.environ,
        "LD_LIBRARY_PATH": str(lib),
        "FRACGPU_MOCK_NVML_PROFILE": str(PROFILE),
        "FRACGPU_MOCK_NVML_EVENTS": str(control),
        "GPU1": GPU1,
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_the_mocks_event_api_follows_nvml(lib: Path, tmp_path: Path) -> None:
    control = tmp_path / "events"
    control.write_text("# history: GPU 0 fell off the bus before this process started\n0 lost\n")
    out, stderr = _run(lib, EVENT_API, control)
    assert out["lost_from_history"] == 15, "NVML_ERROR_GPU_IS_LOST: the file is the GPUs' history"
    assert out["supported"] == 0x8, "nvmlEventTypeXidCriticalError"
    assert out["unsupported"] == 3, "NVML_ERROR_NOT_SUPPORTED, nothing registered"
    assert out["timeout"] == 10 and out["waited_ms"] >= 290, "NVML_ERROR_TIMEOUT after the timeout"
    none = 0xFFFFFFFF
    assert out["events"] == [
        [1, 8, 48, none, none],
        [1, 8, 63, none, none],
        [0, 8, 13, none, none],
    ], "one event per wait, in order, eventData the XID; the XID before registration not recorded"
    assert out["after"] == 10
    assert "skipping malformed or unknown-GPU line: not a line" in stderr
    assert out["action"] == [0, 1, 0], "recovery action gpu_reset on GPU 1 only"
    assert out["lost_wait"] == [15, 10], "a wait returns GPU_IS_LOST once, then waits again"
    assert out["lost_calls"] == [15, 15, 0], "the lost GPU's calls fail, the other GPU answers"
    assert out["reset"] == [0, 0], "reset: usable again, no recovery action"
    assert out["woken"][:2] == [0, 79] and 250 <= out["woken"][2] < 20000, "a wait ends when a line comes"
    assert out["freed"] == 2, "a freed set is an invalid argument"


def test_the_watcher_turns_events_into_health(lib: Path, tmp_path: Path) -> None:
    control = tmp_path / "events"
    control.write_text("")
    out, _ = _run(lib, WATCHER, control)
    assert out["ignored"] == {"gpu-0": "healthy", "gpu-1": "healthy"}, "XID 13 and the allow-listed 92"
    assert out["fatal"] == {"gpu-0": "healthy", "gpu-1": "fatal"}
    assert [t["key"] for t in out["taints"]["gpu-1"]] == ["gpu.fracgpu.dev/xid", "gpu.fracgpu.dev/recovery-action"]
    assert out["reset"]["gpu-1"] == "healthy", "cleared by the driver's reset"
    assert out["lost"]["gpu-0"] == "fatal" and out["back"]["gpu-0"] == "healthy"
    assert out["sticky"]["gpu-0"] == "fatal" and out["still"] == "fatal", "no reset reported: no clearing"
    assert out["flood"] == {"gpu-0": "fatal", "gpu-1": "fatal"}
    # gpu-0 (fatal already) gains the recovery action; gpu-1 turns degraded, then fatal: of 10,000 events
    assert out["flood_transitions"] == 3
    assert out["count"] == [2500, 2500, 2500, 2501], "every event counted"
    assert out["alive"] and out["stopped"]


def test_discovery_keeps_going_past_a_gpu_lost_at_start_and_the_watcher_sees_it_come_back(
    lib: Path, tmp_path: Path
) -> None:
    control = tmp_path / "events"
    control.write_text("")
    out, _ = _run(lib, LOST_AT_START, control)
    assert "NVML_ERROR_GPU_IS_LOST" in out["strict"] or "GPU is lost" in out["strict"], out["strict"]
    found = out["found"]
    assert [g["index"] for g in found["gpus"]] == [0, 1], "the answering GPU and the lost one"
    assert found["lost"] == ["gpu-1"] and found["unknown"] == []
    assert found["gpus"][1]["uuid"] == GPU1, "its identity as NVML gave it before it was lost"
    assert out["same"], "nothing but the lost flag differs from the discovery before the loss"
    unknown = out["unknown"]
    assert [g["index"] for g in unknown["gpus"]] == [0], "no record of GPU 1: not published"
    assert unknown["lost"] == []
    (left_out,) = unknown["unknown"]
    assert left_out["index"] == 1
    assert "GPU is lost" in left_out["reason"] and "no earlier record" in left_out["reason"]
    assert out["still_lost"] == {"gpu-0": False, "gpu-1": True}
    assert out["after_reset"] == {"gpu-0": "healthy", "gpu-1": "healthy"}, "it answers again: healthy"


PARTITIONS = """
import datetime, json, os, threading, time
from pathlib import Path
from prometheus_client import CollectorRegistry
from kubelet_plugin.publishing.discovery import discover_gpus
from kubelet_plugin.health.book import Effects, HealthBook, Placement, plan_taints
from kubelet_plugin.health.events import message
from kubelet_plugin.health.metrics import HealthMetrics
from kubelet_plugin.health.nvml_watcher import NvmlHealthWatcher
from kubelet_plugin.health.watch import CLEAR_PREFIX, OperatorClears, from_record, to_record
from kubelet_plugin.state import health_faults
ctl = os.environ["FRACGPU_MOCK_NVML_EVENTS"]
record = Path(os.environ["RECORD"])
gpus = discover_gpus()
AT6 = "gpu-1-mig-1g-10gb-at-6"
placements = {AT6: Placement("gpu-1", frozenset({6})), "gpu-1-mig-1g-20gb-at-6": Placement("gpu-1", frozenset({6, 7})),
              "gpu-1-mig-7g-80gb-at-0": Placement("gpu-1", frozenset(range(8))),
              "gpu-1-mig-1g-10gb-at-5": Placement("gpu-1", frozenset({5})),
              "gpu-0-mig-1g-10gb-at-6": Placement("gpu-0", frozenset({6}))}
held = {9: (AT6, (6,))}  # the checkpoint: GPU instance 9 of gpu-1 is that partition
transitions = []
def on_transition(t):
    transitions.append(message(t))
    health_faults.save(record, to_record(book.snapshot(), gpus))
def start():
    watcher = NvmlHealthWatcher(gpus, book, ignored_xids=frozenset(), on_transition=on_transition,
                                metrics=HealthMetrics(CollectorRegistry()), probe_interval=0.2,
                                partition_of=lambda gpu, gi: held.get(gi) if gpu == "gpu-1" else None)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    time.sleep(0.5)
    return stop, thread
def step(text, until):
    with open(ctl, "a") as f:
        f.write(text)
    deadline = time.monotonic() + 30
    while not until() and time.monotonic() < deadline:
        time.sleep(0.05)
def tainted():
    return sorted(plan_taints(book.snapshot(), Effects(), placements))
out = {}
book = HealthBook(g.device_name for g in gpus)
stop, thread = start()
step("1/gi9 xid 48\\n", lambda: tainted() != [])
out["fault"] = tainted()
out["taint"] = plan_taints(book.snapshot(), Effects(), placements)[AT6]
out["fault_events"] = list(transitions)
held.clear()  # the partition destroyed (the pod evicted) ...
time.sleep(1)  # five probes
held[3] = (AT6, (6,))  # ... and made again: another GPU instance on the same memory slice
time.sleep(1)
out["recreated"] = tainted()
out["recreated_events"] = transitions[len(out["fault_events"]):]
stop.set(); thread.join(10)
# a plugin restart: a new book from the record on disk
out["record"] = json.loads(record.read_text())
book = HealthBook(g.device_name for g in gpus)
book.restore(from_record(health_faults.load(record), gpus))
stop, thread = start()
time.sleep(1)
out["restarted"] = tainted()
before = len(transitions)
step("1 action gpu_reset\\n", lambda: book.snapshot()["gpu-1"].recovery_action == 1)
out["asked"] = tainted()
step("1 action none\\n", lambda: not book.snapshot()["gpu-1"].slice_faults)
out["reset"] = tainted()
out["reset_events"] = transitions[before:]
# another fault, cleared by the operator
step("1/gi3 xid 48\\n", lambda: tainted() != [])
out["again"] = tainted()
now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
clears = OperatorClears(None, "node-a", book, on_transition, 1.0)
before = len(transitions)
clears.apply({CLEAR_PREFIX + "gpu-1": "2020-01-01T00:00:00Z"})  # written before the fault: clears nothing
out["stale_clear"] = tainted()
clears.apply({CLEAR_PREFIX + "gpu-1": now, CLEAR_PREFIX + "gpu-9": now})
out["cleared"] = tainted()
out["clear_events"] = transitions[before:]
out["record_after"] = json.loads(record.read_text())
stop.set(); thread.join(10)
print(json.dumps(out))
"""


def test_an_xid_on_a_gpu_instance_stays_on_its_memory_slices_until_a_reset_or_an_operator_clears_it(
    lib: Path, tmp_path: Path
) -> None:
    control = tmp_path / "events"
    control.write_text("")
    out, _ = _run(lib, PARTITIONS, control, RECORD=str(tmp_path / "health.json"))
    on_slice_6 = ["gpu-1-mig-1g-10gb-at-6", "gpu-1-mig-1g-20gb-at-6", "gpu-1-mig-7g-80gb-at-0"]
    assert out["fault"] == on_slice_6, "every partition on memory slice 6 of gpu-1; not gpu-1 itself, not slice 5"
    assert out["taint"][0]["key"] == "gpu.fracgpu.dev/xid" and out["taint"][0]["value"] == "48-double-bit-ecc-error"
    assert out["taint"][0]["effect"] == "NoExecute"
    assert out["fault_events"] == [
        "GPU gpu-1-mig-1g-10gb-at-6 is fatal: XID 48 (double-bit-ecc-error, fatal) on GPU instance 9, memory slices "
        "6: kept until the driver reports a GPU reset or an operator clears it"
    ]
    assert out["recreated"] == on_slice_6, "a partition destroyed and made again is no reset"
    assert out["recreated_events"] == [], "no 'healthy again'"
    (gpu,) = out["record"]["gpus"].values()
    assert out["record"]["version"] == 1 and gpu["memorySliceFaults"][0]["memorySlices"] == [6]
    assert out["restarted"] == on_slice_6, "a plugin restart keeps the fault"
    assert out["asked"] == ["gpu-1", *on_slice_6], "the driver asks for a GPU reset: the whole GPU too"
    assert out["reset"] == []
    assert out["reset_events"][-1] == (
        "GPU gpu-1 is healthy again (was fatal): the driver reports a reset: the recovery action it asked for "
        "(gpu-reset) is back to none"
    )
    assert out["again"] == on_slice_6 and out["stale_clear"] == on_slice_6
    assert out["cleared"] == []
    (cleared,) = out["clear_events"]
    assert cleared.startswith("GPU gpu-1 is healthy again (was fatal): an operator cleared what the driver reported")
    assert (
        "Node annotation gpu.fracgpu.dev/clear-faults-gpu-1=" in cleared and "the driver reported no reset" in cleared
    )
    assert out["record_after"]["gpus"] == {}, "nothing left to remember"
