"""The mock CUDA MPS (harness/mocknvml/mock_mps_control.c) with the mock libcuda as its client, and the mock NVML's
compute mode: what the driver's `mps` tier relies on, without a GPU.

Integration tier: the tests that switch UIDs (legacy and multi-user servers) and set the compute mode need
root and fail, not skip, without it. Everything lives in a world-readable directory under /tmp so that
clients of other UIDs can run the probe and reach the daemon's socket; each run has a timeout.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import mocknvml

pytestmark = pytest.mark.integration
PROFILE = mocknvml.PROFILES / "gpu80x2.profile"
TOTAL_MIB = 81559  # gpu.0.memory_mib of PROFILE
SM_COUNT = 132  # gpu.0.sm_count of PROFILE
NOBODY, OTHER = 65534, 65533
TIMEOUT = 5.0

# The compute mode through the real pynvml: get, set EXCLUSIVE_PROCESS, the refused modes, and a set without root.
COMPUTE_MODE = """
import json, os, sys, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"before": pynvml.nvmlDeviceGetComputeMode(h)}
def attempt(mode):
    try:
        pynvml.nvmlDeviceSetComputeMode(h, mode)
        return 0
    except pynvml.NVMLError as e:
        return e.value
out["exclusive_thread"] = attempt(pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
os.seteuid(65534)
out["as_nobody"] = attempt(pynvml.NVML_COMPUTEMODE_PROHIBITED)
os.seteuid(0)
out["set"] = attempt(int(sys.argv[1]))
out["after"] = pynvml.nvmlDeviceGetComputeMode(h)
print(json.dumps(out))
"""

# cuGetErrorName for the codes the MPS mock added.
ERROR_NAMES = """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
name = ctypes.c_char_p()
print(json.dumps([name.value.decode() for code in (46, 700, 805, 806, 807, 808, 809) if cu.cuGetErrorName(code, ctypes.byref(name)) == 0]))
"""


def require_root(why: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"needs root ({why}); the integration tier runs as root in CI: run it with sudo")


@pytest.fixture(scope="module")
def built() -> Iterator[Path]:
    """A world-readable directory with the mock driver built in build/ and the profile beside it."""
    base = Path(tempfile.mkdtemp(prefix="fracgpu-mps-", dir="/tmp"))
    base.chmod(0o755)
    try:
        mocknvml.build(base / "build")
        (base / "build").chmod(0o755)
        shutil.copy(PROFILE, base / PROFILE.name)
        (base / PROFILE.name).chmod(0o644)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Mps:
    """One test's pipe, log and state directories and the processes it started (stopped at the end)."""

    build: Path
    root: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    def daemon(self, *flags: str, **env: str) -> subprocess.Popen[str]:
        """The control daemon in the foreground (the mock's environment plus `env`), once its socket answers."""
        proc = subprocess.Popen(
            [str(self.build / "nvidia-cuda-mps-control"), "-f", *flags],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        wait_for(lambda: self.control("get_server_list").returncode == 0, "the daemon's socket")
        return proc

    def control(self, *commands: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.build / "nvidia-cuda-mps-control")],
            input="".join(f"{c}\n" for c in commands),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def servers(self) -> list[int]:
        done = self.control("get_server_list")
        assert done.returncode == 0, done.stderr
        return [int(line) for line in done.stdout.split()]

    def client(self, *args: str, user: int | None = None, **env: str) -> subprocess.Popen[str]:
        """cuda-probe with `args`, the mock's environment plus `env`, as `user` when given."""
        return self._spawn(args, env, user)

    def _spawn(self, args: tuple[str, ...], env: dict[str, str], user: int | None) -> subprocess.Popen[str]:
        ids: dict[str, Any] = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        proc = subprocess.Popen(
            [str(self.build / "cuda-probe"), *args],
            env={**self.env, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **ids,
        )
        self.procs.append(proc)
        return proc

    def probe(self, *args: str, **env: str) -> dict[str, Any]:
        """One cuda-probe run to its end: its JSON line, plus "exit"."""
        out, err = self._spawn(args, env, None).communicate(timeout=TIMEOUT)
        result: dict[str, Any] = json.loads(out.splitlines()[0]) if out else {"stderr": err}
        result["exit"] = self.procs[-1].returncode
        return result

    def log(self) -> str:
        return (self.root / "log" / "control.log").read_text()


def first_line(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> dict[str, Any] | None:
    """The probe's first JSON line, or None when none came within timeout."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return None
    line = proc.stdout.readline()
    assert line, f"the probe ended without output: {proc.stderr.read() if proc.stderr else ''}"
    result: dict[str, Any] = json.loads(line)
    return result


def release(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Ends a holding probe's hold; returns its after_hold result."""
    out, err = proc.communicate(input="\n", timeout=TIMEOUT)
    assert proc.returncode == 0, err
    after: dict[str, Any] = json.loads(out.splitlines()[-1])["after_hold"]
    return after


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def settled_uid(pid: int, expected: int, timeout: float = 2.0) -> int:
    """`pid`'s UID once it is `expected`, or after `timeout` whatever it is: a server the daemon has just listed may
    still be switching from root to its client's UID (fork, then setuid)."""
    deadline = time.monotonic() + timeout
    while (uid := uid_of(pid)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return uid


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


@pytest.fixture
def mps(built: Path) -> Iterator[Mps]:
    root = Path(tempfile.mkdtemp(dir=built))
    root.chmod(0o755)
    (root / "state").mkdir(mode=0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRACGPU_MOCK_", "CUDA_"))}
    env |= {
        "LD_LIBRARY_PATH": str(built / "build"),
        "FRACGPU_MOCK_NVML_PROFILE": str(built / PROFILE.name),
        "FRACGPU_MOCK_NVML_STATE_DIR": str(root / "state"),
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
    }
    m = Mps(built / "build", root, env)
    try:
        yield m
    finally:
        for proc in reversed(m.procs):  # clients first, then the daemon (SIGTERM: it stops its server)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.communicate(timeout=TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()


def test_two_clients_keep_their_own_limits_and_share_the_gpu(mps: Mps) -> None:
    mps.daemon()
    small = mps.client(
        "8192", "10", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=10240M", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="30"
    )
    large = mps.client(
        "16384", "10", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=20480M,1=2G", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50"
    )
    a, b = first_line(small), first_line(large)
    assert a is not None and b is not None
    assert a["mps"] == {
        "pipe_directory": str(mps.pipe),
        "pinned_limit_env": "0=10240M",
        "thread_percentage_env": "30",
    }
    assert (a["devices"][0]["free_mib"], a["devices"][0]["multiprocessor_count"]) == (10240, SM_COUNT * 30 // 100)
    assert (b["devices"][0]["free_mib"], b["devices"][0]["multiprocessor_count"]) == (20480, SM_COUNT * 50 // 100)
    assert b["devices"][1]["free_mib"] == 2048
    assert a["alloc"] == {"mib": 8192, "result": "CUDA_SUCCESS", "free_mib_before": 10240, "free_mib_after": 2048}
    assert b["alloc"] == {"mib": 16384, "result": "CUDA_SUCCESS", "free_mib_before": 20480, "free_mib_after": 4096}
    (server,) = mps.servers()
    assert sorted(map(int, mps.control(f"get_client_list {server}").stdout.split())) == sorted([small.pid, large.pid])
    # A third client without limits: the GPU's memory is shared, its allocations count against all clients'.
    third = mps.probe("60000")
    assert third["alloc"]["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert third["alloc"]["free_mib_before"] == TOTAL_MIB - 8192 - 16384
    # The same allocation again would go past each client's own limit.
    assert release(small) == {"mib": 8192, "result": "CUDA_ERROR_OUT_OF_MEMORY"}
    assert release(large) == {"mib": 16384, "result": "CUDA_ERROR_OUT_OF_MEMORY"}
    log = mps.log()
    assert f"New client {small.pid} (uid {os.geteuid()}) connected" in log
    assert f"Starting new server {server}" in log


def test_a_client_can_only_lower_the_daemon_defaults(mps: Mps) -> None:
    mps.daemon()
    assert mps.control("get_default_device_pinned_mem_limit 0", "get_default_active_thread_percentage").stdout == (
        "0\n100.0\n"
    )
    done = mps.control(
        "set_default_device_pinned_mem_limit 0 10G",
        "set_default_active_thread_percentage 40",
        "set_default_device_pinned_mem_limit 7 1G",
        "get_default_device_pinned_mem_limit 0",
        "get_default_active_thread_percentage",
    )
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Error:") and lines[1:] == ["10240M", "40.0"], done.stdout
    higher = mps.probe("12288", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=20G", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="80")
    assert higher["devices"][0]["free_mib"] == 10240
    assert higher["devices"][0]["multiprocessor_count"] == SM_COUNT * 40 // 100
    assert higher["alloc"]["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    # Per-server values apply to clients that attach afterwards, and lower the defaults.
    (server,) = mps.servers()
    assert (
        mps.control(f"set_device_pinned_mem_limit {server} 0 4G", f"set_active_thread_percentage {server} 25").stdout
        == ""
    )
    lower = mps.probe("1024", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="30")
    assert (lower["devices"][0]["free_mib"], lower["devices"][0]["multiprocessor_count"]) == (4096, SM_COUNT // 4)
    assert mps.control(f"get_device_pinned_mem_limit {server} 0").stdout == "4096M\n"


def test_the_daemon_serves_its_visible_devices_in_their_order(mps: Mps) -> None:
    gpu1 = mocknvml.read_profile(PROFILE)["gpu.1.uuid"]
    mps.daemon(CUDA_VISIBLE_DEVICES=gpu1)
    assert mps.control("set_default_device_pinned_mem_limit 0 3G", "get_default_device_pinned_mem_limit 1").stdout == (
        "Error: unknown command or bad arguments: get_default_device_pinned_mem_limit\n"
    )
    # The client's own ordinals: its GPU 1 is the daemon's device 0; its GPU 0 is not served, so not limited.
    seen = mps.probe("1024", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G,1=2G")["devices"]
    assert [(d["uuid"], d["free_mib"]) for d in seen] == [(seen[0]["uuid"], TOTAL_MIB), (gpu1, 2048)]


def test_a_daemon_without_gpus_refuses_clients(mps: Mps) -> None:
    mps.daemon(CUDA_VISIBLE_DEVICES="GPU-00000000-0000-0000-0000-000000000000")
    refused = mps.probe("1024")
    assert (refused["exit"], refused.get("error"), refused.get("code")) == (1, "cuInit", 805)
    assert refused.get("result") == "CUDA_ERROR_MPS_CONNECTION_FAILED"


def test_without_a_daemon_cuda_runs_without_mps(mps: Mps) -> None:
    plain = mps.probe("2048", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="10")
    assert plain["alloc"]["result"] == "CUDA_SUCCESS"
    assert (plain["devices"][0]["free_mib"], plain["devices"][0]["multiprocessor_count"]) == (TOTAL_MIB, SM_COUNT)
    assert plain["mps"]["pipe_directory"] == str(mps.pipe)
    done = mps.control("get_server_list")
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr
    names = subprocess.run(
        [sys.executable, "-c", ERROR_NAMES], env=mps.env, capture_output=True, text=True, timeout=TIMEOUT, check=True
    )
    assert json.loads(names.stdout) == [
        "CUDA_ERROR_DEVICES_UNAVAILABLE",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_MPS_CONNECTION_FAILED",
        "CUDA_ERROR_MPS_RPC_FAILURE",
        "CUDA_ERROR_MPS_SERVER_NOT_READY",
        "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
        "CUDA_ERROR_MPS_CLIENT_TERMINATED",
    ]


def test_exclusive_process_gpu_held_by_a_server_is_unavailable_to_others(mps: Mps) -> None:
    require_root("nvmlDeviceSetComputeMode needs root")
    nvml = subprocess.run(
        [sys.executable, "-c", COMPUTE_MODE, "3"],
        env=mps.env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert nvml.returncode == 0, nvml.stderr
    # NVML_ERROR_NOT_SUPPORTED (3) for EXCLUSIVE_THREAD, NVML_ERROR_NO_PERMISSION (4) without root.
    assert json.loads(nvml.stdout) == {"before": 0, "exclusive_thread": 3, "as_nobody": 4, "set": 0, "after": 3}
    mps.daemon()
    held = mps.client("1024", "10")
    assert first_line(held) is not None
    outside = mps.probe(CUDA_MPS_PIPE_DIRECTORY=str(mps.root / "elsewhere"))
    assert (outside["exit"], outside.get("error"), outside.get("result")) == (
        1,
        "cuCtxCreate_v2",
        "CUDA_ERROR_DEVICES_UNAVAILABLE",
    )
    assert mps.control("quit").returncode == 0  # stops the server: the GPU is free again
    wait_for(lambda: not (mps.pipe / "control").exists(), "the daemon to quit")
    assert mps.probe(CUDA_MPS_PIPE_DIRECTORY=str(mps.root / "elsewhere"))["exit"] == 0
    assert release(held)["result"] == "CUDA_ERROR_MPS_RPC_FAILURE"  # its daemon and server are gone


def test_a_killed_server_drops_its_clients_and_the_next_client_gets_a_new_one(mps: Mps) -> None:
    mps.daemon()
    held = mps.client("1024", "10")
    assert first_line(held) is not None
    (server,) = mps.servers()
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: mps.servers() == [], "the daemon to notice its server died")
    assert release(held) == {"mib": 1024, "result": "CUDA_ERROR_MPS_RPC_FAILURE"}
    assert mps.probe("1024")["alloc"]["result"] == "CUDA_SUCCESS"
    (new_server,) = mps.servers()
    assert new_server != server
    assert f"Server {server} exited on signal 9" in mps.log()


def test_legacy_server_queues_a_client_of_another_uid(mps: Mps) -> None:
    require_root("clients of two UIDs")
    mps.daemon()
    first = mps.client("1024", "10", user=NOBODY)
    assert first_line(first) is not None
    (server,) = mps.servers()
    assert settled_uid(server, NOBODY) == NOBODY
    second = mps.client("1024", "10", user=OTHER)
    assert first_line(second, timeout=0.5) is None, "a client of another UID ran beside the first one's server"
    assert mps.control(f"get_client_list {server}").stdout.split() == [str(first.pid)]
    assert release(first)["result"] == "CUDA_SUCCESS"
    got = first_line(second)
    assert got is not None and got["alloc"]["result"] == "CUDA_SUCCESS"
    (replacement,) = mps.servers()
    assert replacement != server and settled_uid(replacement, OTHER) == OTHER
    assert release(second)["result"] == "CUDA_SUCCESS"


def test_multiuser_server_takes_clients_of_every_uid(mps: Mps) -> None:
    require_root("clients of two UIDs")
    mps.daemon("-multiuser-server")
    first = mps.client("1024", "10", user=NOBODY)
    second = mps.client("1024", "10", user=OTHER)
    assert first_line(first) is not None and first_line(second) is not None
    (server,) = mps.servers()
    assert sorted(mps.control(f"get_client_list {server}").stdout.split()) == sorted([str(first.pid), str(second.pid)])
    assert release(first)["result"] == "CUDA_SUCCESS" and release(second)["result"] == "CUDA_SUCCESS"


def test_daemonized_control_daemon_and_a_second_one(mps: Mps) -> None:
    control = str(mps.build / "nvidia-cuda-mps-control")
    started = subprocess.run([control, "-d"], env=mps.env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert started.returncode == 0, started.stderr
    try:
        assert mps.servers() == []  # answers as soon as -d returns
        again = subprocess.run(
            [control, "-f"], env=mps.env, capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        mps.control("quit")
    wait_for(lambda: not (mps.pipe / "control").exists(), "the daemon to quit and remove its socket")
    assert "Quitting" in mps.log()


def test_defaults_reach_only_servers_started_after_them(mps: Mps) -> None:
    """NVIDIA: 'If there is already a server spawned, this command will only affect the next server.'"""
    mps.daemon()
    assert mps.control("set_default_device_pinned_mem_limit 0 8G").stdout == ""
    held = mps.client("1024", "10")
    assert first_line(held) is not None
    (server,) = mps.servers()
    assert mps.control(f"get_device_pinned_mem_limit {server} 0").stdout == "8192M\n"
    mps.control("set_default_device_pinned_mem_limit 0 2G", "set_default_active_thread_percentage 10")
    later = mps.probe("4096")
    assert later["alloc"]["result"] == "CUDA_SUCCESS", "a new default reached the running server's next client"
    assert later["devices"][0]["free_mib"] == 8192 and later["devices"][0]["multiprocessor_count"] == SM_COUNT
    assert mps.control(f"get_device_pinned_mem_limit {server} 0", f"get_active_thread_percentage {server}").stdout == (
        "8192M\n100.0\n"
    )
    assert release(held)["result"] == "CUDA_SUCCESS"
    os.kill(server, signal.SIGKILL)  # the next server starts with the defaults of now
    wait_for(lambda: mps.servers() == [], "the server gone")
    assert mps.probe("4096")["alloc"]["result"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_a_rejected_command_answers_error_and_the_client_still_exits_0(mps: Mps) -> None:
    mps.daemon()
    done = mps.control(
        "set_default_device_pinned_mem_limit 0 10GB",  # NVIDIA: an integer followed by G or M, nothing else
        "set_default_device_pinned_mem_limit 0 10240",
        "set_device_pinned_mem_limit 4242 0 1G",  # no such server
        "set_default_active_thread_percentage 0",
        "get_default_device_pinned_mem_limit 0",
    )
    assert done.returncode == 0, "the caller must read the reply: the exit status says nothing"
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["Error"] * 4 and lines[4] == "0", done.stdout


def test_the_server_takes_at_most_its_client_cap(mps: Mps) -> None:
    mps.daemon(FRACGPU_MOCK_MPS_MAX_CLIENTS="2")
    held = [mps.client("1024", "10") for _ in range(2)]
    assert all(first_line(h) is not None for h in held)
    refused = mps.probe("1024")
    assert (refused["exit"], refused.get("error"), refused.get("result")) == (
        1,
        "cuInit",
        "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
    )
    assert release(held[0])["result"] == "CUDA_SUCCESS"
    assert mps.probe("1024")["exit"] == 0, "a place freed by an exited client is taken"
    assert release(held[1])["result"] == "CUDA_SUCCESS"


def test_a_fault_refuses_new_clients_until_the_faulting_client_exits(mps: Mps) -> None:
    mps.daemon()
    other = mps.client("1024", "10")
    assert first_line(other) is not None
    faulting = mps.client("1024", "10", FRACGPU_MOCK_CUDA_FAULT="1")
    faulted = first_line(faulting)
    assert faulted is not None and faulted["alloc"]["result"] == "CUDA_ERROR_ILLEGAL_ADDRESS", faulted
    (server,) = mps.servers()
    assert mps.control(f"get_server_status {server}").stdout == "FAULT\n"
    refused = mps.probe("1024")
    assert (refused.get("error"), refused.get("result")) == ("cuInit", "CUDA_ERROR_MPS_SERVER_NOT_READY"), refused
    assert release(other) == {"mib": 1024, "result": "CUDA_ERROR_MPS_CLIENT_TERMINATED"}
    faulting.kill()
    faulting.communicate(timeout=TIMEOUT)
    wait_for(lambda: mps.control(f"get_server_status {server}").stdout == "ACTIVE\n", "the server ACTIVE again")
    assert mps.probe("1024")["alloc"]["result"] == "CUDA_SUCCESS"


def test_the_multiuser_server_runs_as_root(mps: Mps) -> None:
    require_root("a client of another UID")
    mps.daemon("-multiuser-server")
    held = mps.client("1024", "10", user=NOBODY)
    assert first_line(held) is not None
    (server,) = mps.servers()
    assert uid_of(server) == 0, "NVIDIA: clients of all users appear as clients of the root server"
    assert release(held)["result"] == "CUDA_SUCCESS"
