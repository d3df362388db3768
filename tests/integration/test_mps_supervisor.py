"""The MPS supervisor (python -m kubelet_plugin.mps_supervisor) and the node plugin's side of the mps tier against
the mock driver's real binaries: the control daemon and server (harness/mocknvml/mock_mps_control.c), NVML's compute mode
and libcuda as an MPS client, run by the CUDA probe. Root: the supervisor mounts each GPU's /dev/shm tmpfs and runs
the daemon in a mount namespace of its own.

Shown: the supervisor sets EXCLUSIVE_PROCESS through NVML and starts the daemon with its own /dev/shm; the plugin's
ceiling (kubelet_plugin/kinds/mps/limits.py) caps a client whose environment asks for more, while a client's own grant
holds below it; a process outside MPS cannot use the GPU; a killed daemon is reported down and restarted; SIGTERM
quits it and restores the compute mode; a GPU taken off the list gets its mode back at the next start. Trust
domains: a daemon takes its first domain as it is and is replaced (fresh pipe directory and /dev/shm) for the
next; a control socket removed or replaced restarts it. The control client: a refused command raises with the
daemon's words; limits a client changed are read back and repaired.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import mocknvml
from harness.mocknvml import PROFILES, read_profile
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.kinds.mps.control import Limits, MpsControl, MpsControlError
from kubelet_plugin.kinds.mps.limits import MpsLimits
from kubelet_plugin.state import mps_files as mps

pytestmark = pytest.mark.integration


def require_root(why: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"needs root ({why}); the integration tier runs as root in CI: run it with sudo")


PROFILE = PROFILES / "gpu80x2.profile"
UUID = read_profile(PROFILE)["gpu.0.uuid"]
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0
EXCLUSIVE_PROCESS = 3


@pytest.fixture(scope="module")
def built() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="fracgpu-mps-supervisor-"))
    try:
        mocknvml.build(base)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Node:
    """One node's MPS root and mock driver state; starts supervisors and probes against them."""

    def __init__(self, built: Path, root: Path) -> None:
        self.built = built
        self.root = root
        self.state = root / "driver-state"
        self.state.mkdir(parents=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("FRACGPU_", "CUDA_"))}
        self.env |= {
            "LD_LIBRARY_PATH": str(built),
            "FRACGPU_MOCK_NVML_PROFILE": str(PROFILE),
            "FRACGPU_MOCK_NVML_STATE_DIR": str(self.state),
        }
        self.supervisors: list[subprocess.Popen[bytes]] = []

    def supervise(self, gpus: str = "0") -> subprocess.Popen[bytes]:
        env = self.env | {
            "FRACGPU_MPS_GPUS": gpus,
            "FRACGPU_MPS_ROOT": str(self.root),
            "FRACGPU_MPS_CONTROL": str(self.built / "nvidia-cuda-mps-control"),
            "FRACGPU_REFRESH": "0.2",
            "FRACGPU_METRICS_PORT": "0",
            "FRACGPU_LOG_FORMAT": "text",
            "PYTHONPATH": str(REPO),
        }
        log = (self.root.parent / f"supervisor-{len(self.supervisors)}.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "kubelet_plugin.mps_supervisor"], env=env, stderr=log)
        log.close()
        self.supervisors.append(proc)
        return proc

    def status(self) -> mps.DaemonStatus | None:
        return mps.read_status(self.root, UUID)[0]

    def compute_mode(self) -> int:
        path = self.state / f"compute_mode.{UUID}"
        return int(path.read_text().strip()) if path.exists() else 0

    def probe(self, mib: int, env: dict[str, str] | None = None, pipe: Path | None = None) -> dict[str, Any]:
        """cuda-probe allocating `mib` MiB as a client of GPU 0's daemon with `env` (`pipe`: another pipe
        directory)."""
        run_env = self.env | {"CUDA_MPS_PIPE_DIRECTORY": str(pipe or mps.pipe_dir(self.root, UUID))} | (env or {})
        done = subprocess.run(
            [str(self.built / "cuda-probe"), str(mib)],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        found: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
        return found

    def settings(self) -> Settings:
        return Settings(
            node_name="node-a", mps_gpus="0", mps_root=self.root, mps_control=self.built / "nvidia-cuda-mps-control"
        )

    def control(self) -> MpsControl:
        return MpsControl(self.built / "nvidia-cuda-mps-control", self.root)

    def ask(self, domain: str) -> None:
        """What the node plugin writes when a claim of `domain` is prepared on GPU 0."""
        mps.tenant_path(self.root, UUID).write_bytes(mps.TenantRequest(domain=domain).to_json())


def wait_for(what: str, check: Callable[[], object]) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def node(built: Path) -> Iterator[Node]:
    short = Path(tempfile.mkdtemp(prefix="fg-mps-", dir="/tmp"))  # a socket path has at most 107 bytes
    n = Node(built, short / "mps")
    try:
        yield n
    finally:
        for proc in n.supervisors:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        status = n.status()
        if status is not None and status.pid is not None:  # a daemon orphaned by a killed supervisor
            with contextlib.suppress(ProcessLookupError):
                os.kill(status.pid, signal.SIGKILL)
        for mount in mounts_under(short):  # the /dev/shm tmpfs of a killed supervisor
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        shutil.rmtree(short, ignore_errors=True)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this mount namespace, deepest first."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if p == str(path) or p.startswith(f"{path}/")), key=len, reverse=True)


def mount_options(path: Path) -> tuple[str, set[str]]:
    """(filesystem type, mount and superblock options) of the mount at `path`."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            after = fields[fields.index("-") + 1 :]
            return after[0], set(fields[5].split(",")) | set(after[2].split(","))
    raise AssertionError(f"nothing mounted at {path}")


def running(node: Node) -> mps.DaemonStatus | None:
    status = node.status()
    return status if status is not None and status.state == "running" else None


def test_the_daemon_caps_what_a_client_may_raise_at_the_ceiling_the_plugin_sets(node: Node) -> None:
    node.supervise()
    status = wait_for("the daemon running", lambda: running(node))
    assert status.compute_mode == "EXCLUSIVE_PROCESS" and node.compute_mode() == EXCLUSIVE_PROCESS
    assert status.multi_user and mps.read_status(node.root, UUID)[1] is None  # what the plugin reads: up
    node.control().apply(UUID, Limits(20480, 50))  # the largest grant and percentage on GPU 0

    mine = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    over = node.probe(11264, mine)
    assert over["alloc"]["result"] == "CUDA_ERROR_OUT_OF_MEMORY", over
    assert over["devices"][0]["free_mib"] <= 10240 and over["devices"][0]["multiprocessor_count"] == 132 * 30 // 100
    assert node.probe(9216, mine)["alloc"]["result"] == "CUDA_SUCCESS"

    raised = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}
    within = node.probe(15360, raised)
    assert within["alloc"]["result"] == "CUDA_SUCCESS", "a raised env gets up to the ceiling"
    assert within["devices"][0]["multiprocessor_count"] == 132 * 50 // 100, "the thread ceiling holds"
    beyond = node.probe(25600, raised)
    assert beyond["alloc"]["result"] == "CUDA_ERROR_OUT_OF_MEMORY", "no environment lifts the ceiling"

    # a process that leaves MPS (another pipe directory, no daemon there) cannot use the EXCLUSIVE_PROCESS GPU
    outside = node.probe(1024, pipe=node.root / "elsewhere")
    assert outside.get("result") == "CUDA_ERROR_DEVICES_UNAVAILABLE" or (
        outside.get("alloc", {}).get("result") == "CUDA_ERROR_DEVICES_UNAVAILABLE"
    ), outside


def test_a_killed_daemon_is_reported_down_then_restarted(node: Node) -> None:
    node.supervise()
    first = wait_for("the daemon running", lambda: running(node))
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    down = wait_for("the daemon down", lambda: (s := node.status()) is not None and s.state == "down" and s)
    assert "nvidia-cuda-mps-control exited with status -9" in down.reason, down
    problem = mps.read_status(node.root, UUID)[1] if down.state == "down" else None
    assert problem is not None and "is down" in problem
    again = wait_for("restarted", lambda: (s := running(node)) is not None and s.restarts == 1 and s)
    assert again.pid != first.pid
    assert node.probe(1024)["alloc"]["result"] == "CUDA_SUCCESS"
    # the probe's server (it outlives its last client): killed, it counts as a server exit
    (server,) = wait_for("a server listed", lambda: (s := node.status()) is not None and s.servers)
    os.kill(server, signal.SIGKILL)
    wait_for("the server exit counted", lambda: (s := node.status()) is not None and s.server_exits == 1)


def test_sigterm_quits_the_daemon_and_restores_the_compute_mode(node: Node) -> None:
    proc = node.supervise()
    wait_for("the daemon running", lambda: running(node))
    assert node.compute_mode() == EXCLUSIVE_PROCESS
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT) == 0
    status = node.status()
    assert status is not None and (status.state, status.reason) == ("down", "the MPS supervisor stopped")
    assert node.compute_mode() == 0, "the mode the GPU had (DEFAULT) is back"
    quit_ = subprocess.run(
        [str(node.built / "nvidia-cuda-mps-control")],
        input="get_server_list\n",
        check=False,
        env=node.env | {"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir(node.root, UUID))},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert quit_.returncode == 1, "no daemon answers any more"


def test_a_gpu_taken_off_the_list_gets_its_mode_back_at_the_next_start(node: Node) -> None:
    proc = node.supervise()
    daemon = wait_for("the daemon running", lambda: running(node))
    proc.kill()  # no shutdown: the mode stays EXCLUSIVE_PROCESS, as after a node crash of the pod
    proc.wait()
    assert daemon.pid is not None
    os.kill(daemon.pid, signal.SIGKILL)
    assert node.compute_mode() == EXCLUSIVE_PROCESS
    node.supervise(gpus="1")
    wait_for("GPU 0's mode restored", lambda: node.compute_mode() == 0)


def test_the_daemon_has_its_own_shm_and_each_trust_domain_a_fresh_daemon_pipe_and_shm(node: Node) -> None:
    require_root("the supervisor mounts tmpfs and runs the daemon in a mount namespace of its own")
    node.supervise()
    first = wait_for("the daemon running", lambda: running(node))
    assert first.trust_domains and first.trust_domain is None and first.pid is not None
    shm = mps.shm_dir(node.root, UUID)
    fstype, options = mount_options(shm)
    assert fstype == "tmpfs" and {"nosuid", "nodev", "noexec"} <= options, options
    assert f"size={8 * 1024 * 1024}k" in options, "the --shm-size limit (8Gi by default)"
    assert os.stat(f"/proc/{first.pid}/root/dev/shm").st_dev == os.stat(shm).st_dev, "the daemon's /dev/shm"
    assert os.stat("/dev/shm").st_dev != os.stat(shm).st_dev, "not the host's"

    node.ask("namespace/team-a")  # the first domain: a daemon that never had a client takes it as it is
    adopted = wait_for(
        "domain a", lambda: (s := running(node)) is not None and s.trust_domain == "namespace/team-a" and s
    )
    assert adopted.pid == first.pid
    assert node.probe(1024)["alloc"]["result"] == "CUDA_SUCCESS"
    (shm / "team-a-secret").write_text("a's")

    node.ask("namespace/team-b")  # team-a's claims are gone (the plugin checked): a fresh daemon, pipe and shm
    fresh = wait_for(
        "domain b", lambda: (s := running(node)) is not None and s.trust_domain == "namespace/team-b" and s
    )
    assert fresh.pid != first.pid and fresh.restarts == first.restarts, "a switch is not a crash restart"
    assert not (shm / "team-a-secret").exists(), "team-b sees nothing team-a left in /dev/shm"
    assert os.stat(f"/proc/{fresh.pid}/root/dev/shm").st_dev == os.stat(shm).st_dev
    assert sorted(p.name for p in mps.pipe_dir(node.root, UUID).iterdir()) == ["control"]
    assert node.probe(1024)["alloc"]["result"] == "CUDA_SUCCESS"


def test_a_removed_or_replaced_control_socket_restarts_the_daemon(node: Node) -> None:
    require_root("the supervisor mounts tmpfs")
    node.supervise()
    first = wait_for("the daemon running", lambda: running(node))
    path = mps.control_socket(node.root, UUID)
    path.unlink()
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(str(path))
    impostor.listen(1)
    try:
        wait_for(
            "restarted",
            lambda: (s := running(node)) is not None and s.socket_replacements == 1 and s.pid != first.pid and s,
        )
    finally:
        impostor.close()
    assert node.control().servers(UUID) == [], "the daemon's own socket answers again"
    assert node.probe(1024)["alloc"]["result"] == "CUDA_SUCCESS"


def test_a_refused_command_raises_with_the_daemons_words(node: Node) -> None:
    require_root("the supervisor mounts tmpfs")
    node.supervise()
    wait_for("the daemon running", lambda: running(node))
    with pytest.raises(MpsControlError, match=r"refused .*10GB.*: Error: "):
        node.control().run(UUID, ["set_default_device_pinned_mem_limit 0 10GB"])
    with pytest.raises(MpsControlError, match="with status 1"):
        MpsControl(node.built / "nvidia-cuda-mps-control", node.root / "nowhere").servers(UUID)


def test_limits_changed_through_the_control_socket_are_read_back_and_repaired(node: Node) -> None:
    require_root("the supervisor mounts tmpfs")
    node.supervise()
    status = wait_for("the daemon running", lambda: running(node))
    limits, ceiling = MpsLimits(node.control()), Limits(10240, 30)
    limits.ensure(UUID, ceiling, status.pid)
    assert limits.repair(UUID, ceiling, status.pid) == []
    # what any client of the GPU's domain can send: there is no access check
    node.control().run(
        UUID, ["set_default_device_pinned_mem_limit 0 81920M", "set_default_active_thread_percentage 100"]
    )
    raised = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M"}
    assert node.probe(30720, raised)["alloc"]["result"] == "CUDA_SUCCESS", "the tampered defaults let it through"
    changed = limits.repair(UUID, ceiling, status.pid)
    assert len(changed) == 2 and "81920M" in changed[0] and "server" in changed[1], changed
    reading = node.control().read(UUID)
    assert (reading.defaults.memory, reading.defaults.percentage) == ("10240M", "30.0")
    assert all((r.memory, r.percentage) == ("10240M", "30.0") for r in reading.servers.values()) and reading.servers
    assert node.probe(30720, raised)["alloc"]["result"] == "CUDA_ERROR_OUT_OF_MEMORY", "held to the ceiling again"
    assert limits.repair(UUID, ceiling, status.pid) == []
