"""The real-GPU check's MPS step on GPU 0: the driver's own MPS control daemon, two MPS shares planned by fracgpu
(10Gi at 30 % and 20Gi at 50 % of the SMs), the GPU's ceiling set as the node plugin sets it, and each share's
container run under nvidia-container-runtime, allocating 20 % over and under its grant.

The daemon runs as the MPS supervisor runs it (``-f -multiuser-server``, ``CUDA_VISIBLE_DEVICES=<UUID>``, its
own pipe and log directories), in a mount namespace of its own whose ``/dev/shm`` is the directory the claim
specs mount as the clients' ``/dev/shm``. The compute mode is left as it is: the check never changes a lent
machine's GPU settings (EXCLUSIVE_PROCESS is the supervisor's job on a node). What each client sees (memory
total and free, multiprocessor count, the allocations' results) is printed: it answers what NVIDIA's documents
leave open (``cuMemGetInfo`` under a pinned limit, whether the limit is enforced at allocation).
"""

import ctypes
import os
import shutil
import subprocess
import tempfile
import time
import uuid as uuids
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.names import DRIVER_NAME
from api.quantity import MiB
from harness.gpu import container, report
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement import mps
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.prepare import cdi, container_info, store
from kubelet_plugin.prepare.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.prepare.mps_ceiling import CONTROL_IN_DRIVER_ROOT, MpsControl, MpsControlError
from kubelet_plugin.prepare.plan import plan_claim

SHARES = (("10Gi", 10240, 30), ("20Gi", 20480, 50))
"""(memory, MiB, computeLimitPercent) of the two MPS shares."""
_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18


class MpsStepError(Exception):
    """The step could not run; the message says why."""


def _private_shm(shm: Path) -> Callable[[], None]:
    """A preexec function: a mount namespace of its own whose /dev/shm is `shm`."""

    def enter() -> None:
        try:
            _enter()
        except BaseException as err:  # a preexec failure reaches the parent as a bare SubprocessError: say why
            os.write(2, f"fracgpu gpu-check: MPS daemon namespace: {err!r}\n".encode())
            raise

    def _enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
        os.makedirs("/dev/shm", exist_ok=True)  # a /dev without one (a tmpfs /dev, say) gets the mount point
        if libc.mount(str(shm).encode(), b"/dev/shm", None, _MS_BIND, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --bind <shm> /dev/shm")

    return enter


@contextmanager
def daemon(driver_root: Path, gpu: GpuInfo) -> Iterator[Path]:
    """The driver's MPS control daemon for `gpu`, running until the block ends; yields the MPS root."""
    control = driver_root / CONTROL_IN_DRIVER_ROOT
    if not control.exists():
        raise MpsStepError(f"the driver has no {control}")
    root = Path(tempfile.mkdtemp(prefix="fgm-", dir="/tmp"))  # a unix socket path has at most 107 bytes
    for directory in (mps.pipe_dir(root, gpu.uuid), mps.log_dir(root, gpu.uuid), mps.shm_dir(root)):
        directory.mkdir(parents=True)
    mps.shm_dir(root).chmod(0o1777)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")} | {
        "CUDA_VISIBLE_DEVICES": gpu.uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir(root, gpu.uuid)),
        "CUDA_MPS_LOG_DIRECTORY": str(mps.log_dir(root, gpu.uuid)),
    }
    stderr_path = mps.log_dir(root, gpu.uuid) / "daemon.stderr"
    with stderr_path.open("wb") as stderr:
        try:
            process = subprocess.Popen(
                [str(control), "-f", "-multiuser-server"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                preexec_fn=_private_shm(mps.shm_dir(root)),  # noqa: PLW1509 - no thread of the check runs now
            )
        except (OSError, subprocess.SubprocessError) as err:
            said = stderr_path.read_text(errors="replace").strip()
            shutil.rmtree(root, ignore_errors=True)
            raise MpsStepError(f"cannot start {control}: {err}: {said}") from None
    try:
        settings = Settings(node_name="gpu-check", mps_gpus=gpu.uuid, mps_root=root, mps_control=control)
        deadline = time.monotonic() + 15
        while process.poll() is None and time.monotonic() < deadline:
            try:
                MpsControl(settings).apply(gpu.uuid, gpu.memory_total_bytes // MiB, 100)  # answers: it runs
                break
            except MpsControlError:
                time.sleep(0.2)
        else:
            log = (
                (mps.log_dir(root, gpu.uuid) / "control.log").read_text(errors="replace")[-1500:]
                if (mps.log_dir(root, gpu.uuid) / "control.log").exists()
                else "(no control.log)"
            )
            raise MpsStepError(f"the MPS control daemon did not answer (exit {process.poll()}): {log}")
        status = mps.DaemonStatus(
            uuid=gpu.uuid, state="running", pid=process.pid, multi_user=True, updated=time.time() + 3600,
            refresh_seconds=5,
        )  # fmt: skip
        mps.status_path(root, gpu.uuid).write_bytes(status.to_json())
        yield root
    finally:
        if process.poll() is None:
            subprocess.run([str(control)], input=b"quit\n", env=env, capture_output=True, timeout=10, check=False)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(root, ignore_errors=True)


def mps_claim(gpu: GpuInfo, memory: str, percent: int) -> dict[str, Any]:
    """An allocated claim for one MPS share of `gpu`, as the scheduler writes it."""
    parameters = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": percent}
    return {
        "metadata": {"name": f"mps-{memory.lower()}", "namespace": "gpu-check", "uid": str(uuids.uuid4())},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER_NAME, "pool": "gpu-check", "device": gpu.device_name,
                         "shareID": str(uuids.uuid4()), "consumedCapacity": {"memory": memory}}
                    ],
                    "config": [{"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}],
                }
            }
        },
    }  # fmt: skip


def run(
    base: Settings,
    gpus: list[GpuInfo],
    *,
    edits: cdi.ContainerEdits,
    nodes: DeviceNodeSnapshot,
    runtime: container.Runtime,
    rootfs: Path,
    script: Callable[[tuple[int, int]], str],
    say: Callable[[str], None],
) -> list[str]:
    """The MPS step on GPU 0; the problems it found (empty: the limits held). Raises MpsStepError when it cannot
    run (no daemon binary, the daemon does not answer)."""
    gpu = gpus[0]
    found: list[str] = []
    with daemon(base.driver_root, gpu) as root:
        settings = base.model_copy(update={"mps_gpus": gpu.uuid, "mps_root": root})
        tiers = EnforcementDetector.without_nvml(settings, gpus, "not probed in the MPS step").tiers()
        say(f"MPS: driver control daemon for {gpu.uuid} answers (pipe directory {mps.pipe_dir(root, gpu.uuid)})")
        planned = []
        for memory, mib, percent in SHARES:
            claim = mps_claim(gpu, memory, percent)
            plan = plan_claim(claim, settings, {g.device_name: g for g in gpus}, edits, tiers, nodes=nodes)
            assert plan.spec is not None
            uid = claim["metadata"]["uid"]
            store.write_claim_files(container_info.claim_info_dir(settings.plugin_data_dir, uid), list(plan.files))
            store.write_spec(settings.cdi_dir, uid, plan.spec, settings.driver_name)
            planned.append((plan, mib, percent))
        ceiling = (max(m for _, m, _ in planned), max(p for _, _, p in planned))
        MpsControl(settings).apply(gpu.uuid, *ceiling)
        say(f"MPS: ceiling {ceiling[0]} MiB / {ceiling[1]} % set on the daemon (the largest grant and percentage)")
        for plan, mib, percent in planned:
            device_id = plan.devices[0].cdi_device_ids[0]
            caps = report.cap_sizes(mib)
            output = container.run_with_device(
                runtime, rootfs, ["/bin/busybox", "sh", "-c", script(caps)], device_id, cdi.cdi_kind(DRIVER_NAME)
            )
            view = report.parse_output(output)
            env = view.env
            say(
                f"MPS client {mib} MiB / {percent} %: tier {plan.tiers[0][3]}, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="
                f"{env.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', '(unset)')}, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="
                f"{env.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '(unset)')}"
            )
            for line in _client_lines(view):
                say(f"  {line}")
            above, below = caps
            over, under = view.caps.get(above), view.caps.get(below)
            if over is None or over.alloc_result != "CUDA_ERROR_OUT_OF_MEMORY":
                found.append(
                    f"MPS client of {mib} MiB: {above} MiB was not refused for want of memory "
                    f"({over.alloc_result or over.text.strip() if over else 'no probe output'})"
                )
            if under is None or under.alloc_result != "CUDA_SUCCESS":
                found.append(
                    f"MPS client of {mib} MiB: {below} MiB was not allowed "
                    f"({under.alloc_result or under.text.strip() if under else 'no probe output'})"
                )
            if found:
                say("  container output, as printed:")
                for line in output.splitlines():
                    say(f"  | {line}")
    return found


def _client_lines(view: report.ContainerView) -> list[str]:
    lines = []
    probe = view.probe or {}
    for d in probe.get("devices") or []:
        lines.append(
            f"sees {d.get('uuid')}: memory total {d.get('total_mib')} MiB, free {d.get('free_mib')} MiB, "
            f"multiprocessors {d.get('multiprocessor_count', '?')}"
        )
    if not lines:
        lines.append(view.probe_text.strip() or "(no probe output)")
    for mib, probe_run in sorted(view.caps.items(), reverse=True):
        lines.append(f"cuMemAlloc {mib} MiB: {probe_run.alloc_result or probe_run.text.strip()}")
    return lines
