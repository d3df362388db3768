"""The real-GPU check's MPS step on GPU 0: the driver's own MPS control daemon, two MPS shares planned by fracgpu
(10Gi at 30 % and 20Gi at 50 % of the SMs), the GPU's ceiling kept as the node plugin keeps it, and what a share
can and cannot do to the daemons.

The daemon runs as the MPS supervisor runs it (``-f -multiuser-server``, ``CUDA_VISIBLE_DEVICES=<UUID>``, its
own pipe and log directories), in a mount namespace of its own whose ``/dev/shm`` is the directory the claim
specs mount as the clients' ``/dev/shm``. The compute mode is left as it is: the check never changes a lent
machine's GPU settings (EXCLUSIVE_PROCESS is the supervisor's job on a node). Each part prints what it saw:

1. the ceiling (``MpsLimits.ensure``, as the plugin sets it), ``get_default_device_pinned_mem_limit 0`` as the
   daemon prints it, and ``MpsLimits.repair`` twice right after (it compares readings as printed: both must find
   nothing, or every refresh would repair);
2. each share's container allocating 20 % over and under its grant, with what the client sees; its pipe
   directory's mount options, a write into it, and a client held open through it that the daemon lists (the pipe
   directory is read-only, the client works); then the running server's limits as printed, and the repair twice;
3. control commands from a share's container (``get_default_device_pinned_mem_limit 0``,
   ``set_default_active_thread_percentage 100``): the daemon's answers, and what ``MpsLimits.repair`` then finds
   changed and sets back;
4. the client cap: clients of a share, each holding 1 MiB, until one is refused; at least as many as the plugin
   publishes (``mpsClients``) must be taken;
5. a second trust domain: a second daemon for the GPU with its own pipe and shm directories, a share of it that
   sets ``set_default_device_pinned_mem_limit 0 81920M`` on its daemon and runs a client; the first domain's
   daemon must read as before.
"""

import ctypes
import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid as uuids
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from api.names import DRIVER_NAME
from harness.gpu import container, mps_report, report
from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.kinds.mps.control import CONTROL_IN_DRIVER_ROOT, DaemonReading, Limits, MpsControl, MpsControlError
from kubelet_plugin.kinds.mps.limits import MpsLimits
from kubelet_plugin.kinds.mps.publish import mps_clients
from kubelet_plugin.prepare.plan import ClaimPlan, HostFacts, plan_claim
from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import mps_files as mps

SHARES = (("10Gi", 10240, 30), ("20Gi", 20480, 50))
"""(memory, MiB, computeLimitPercent) of the two MPS shares."""
NAMESPACE, OTHER_NAMESPACE = "gpu-check", "gpu-check-other"
"""The shares' namespaces: each its own trust domain (the default scope, ``namespace``)."""
GET_DEFAULT_MEMORY = "get_default_device_pinned_mem_limit 0"
SHARE_COMMANDS = (
    GET_DEFAULT_MEMORY,
    "set_default_active_thread_percentage 100",
    "get_default_active_thread_percentage",
)
OTHER_COMMANDS = ("set_default_device_pinned_mem_limit 0 81920M", GET_DEFAULT_MEMORY)
CAP_BOUND = 64
"""At most this many clients in the cap step (more than any documented cap: 48 from Volta on, 16 before)."""
CAP_DEADLINE_S = 60
"""The cap step stops starting clients after this long."""
_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18
_COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


class MpsStepError(Exception):
    """The step could not run; the message says why."""


@dataclass(frozen=True)
class Tools:
    """Paths inside the check's container: busybox, the CUDA probe, and what the driver edits mount."""

    busybox: str
    probe: str
    nvidia_smi: str | None
    mps_control: str | None


@dataclass(frozen=True)
class Daemon:
    """One running MPS control daemon of the step: its MPS root, pid and control client."""

    root: Path
    pid: int
    control: MpsControl
    domain: str


@dataclass(frozen=True)
class _Kept:
    """The first domain's daemon and the ceiling the plugin's MpsLimits keeps on it."""

    daemon: Daemon
    limits: MpsLimits
    ceiling: Limits

    def repair(self, uuid: str) -> list[str]:
        return self.limits.repair(uuid, self.ceiling, self.daemon.pid)


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
def daemon(driver_root: Path, gpu: GpuInfo, domain: str = f"namespace/{NAMESPACE}") -> Iterator[Daemon]:
    """The driver's MPS control daemon for `gpu` and trust domain `domain`, with a pipe, log and shm directory of
    its own under a fresh MPS root, running until the block ends (then quit, and the root removed)."""
    binary = driver_root / CONTROL_IN_DRIVER_ROOT
    if not binary.exists():
        raise MpsStepError(f"the driver has no {binary}")
    root = Path(tempfile.mkdtemp(prefix="fgm-", dir="/tmp"))  # a unix socket path has at most 107 bytes
    for directory in (mps.pipe_dir(root, gpu.uuid), mps.log_dir(root, gpu.uuid), mps.shm_dir(root, gpu.uuid)):
        directory.mkdir(parents=True)
    mps.shm_dir(root, gpu.uuid).chmod(0o1777)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")} | {
        "CUDA_VISIBLE_DEVICES": gpu.uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir(root, gpu.uuid)),
        "CUDA_MPS_LOG_DIRECTORY": str(mps.log_dir(root, gpu.uuid)),
    }
    stderr_path = mps.log_dir(root, gpu.uuid) / "daemon.stderr"
    with stderr_path.open("wb") as stderr:
        try:
            process = subprocess.Popen(
                [str(binary), "-f", "-multiuser-server"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                preexec_fn=_private_shm(mps.shm_dir(root, gpu.uuid)),  # noqa: PLW1509 - no thread of the check runs now
            )
        except (OSError, subprocess.SubprocessError) as err:
            said = stderr_path.read_text(errors="replace").strip()
            shutil.rmtree(root, ignore_errors=True)
            raise MpsStepError(f"cannot start {binary}: {err}: {said}") from None
    control = MpsControl(binary, root)
    try:
        deadline = time.monotonic() + 15
        while process.poll() is None and time.monotonic() < deadline:
            try:
                control.servers(gpu.uuid)  # it answers (and its defaults stay as the driver has them)
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
            refresh_seconds=5, trust_domains=True, trust_domain=domain,
        )  # fmt: skip
        mps.status_path(root, gpu.uuid).write_bytes(status.to_json())
        yield Daemon(root, process.pid, control, domain)
    finally:
        if process.poll() is None:
            subprocess.run([str(binary)], input=b"quit\n", env=env, capture_output=True, timeout=10, check=False)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(root, ignore_errors=True)


def mps_claim(gpu: GpuInfo, memory: str, percent: int, namespace: str = NAMESPACE) -> dict[str, Any]:
    """An allocated claim for one MPS share of `gpu`, as the scheduler writes it."""
    parameters = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": percent}
    return {
        "metadata": {"name": f"mps-{memory.lower()}", "namespace": namespace, "uid": str(uuids.uuid4())},
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


@dataclass
class _Step:
    """What the step's parts share: the GPU, how to plan a share and run its container, the problems found."""

    gpu: GpuInfo
    gpus: list[GpuInfo]
    base: Settings
    edits: cdi.ContainerEdits
    nodes: DeviceNodeSnapshot
    runtime: container.Runtime
    rootfs: Path
    tools: Tools
    say: Callable[[str], None]
    found: list[str] = dataclasses.field(default_factory=list)

    def plan(self, root: Path, memory: str, percent: int, namespace: str = NAMESPACE) -> ClaimPlan:
        """Plan and write an MPS share's claim files and CDI spec against the daemon under `root`."""
        settings = self.base.model_copy(update={"mps_gpus": self.gpu.uuid, "mps_root": root})
        tiers = EnforcementDetector.without_nvml(settings, self.gpus, "not probed in the MPS step").tiers()
        claim = mps_claim(self.gpu, memory, percent, namespace)
        facts = HostFacts(
            gpus={g.device_name: g for g in self.gpus}, nodes=self.nodes, tiers=tiers, driver_edits=self.edits
        )
        plan = plan_claim(claim, settings, facts)
        if plan.spec is None:
            raise MpsStepError(f"the plan of the {memory} MPS share has no spec")
        uid = claim["metadata"]["uid"]
        store.write_claim_files(container_info.claim_info_dir(settings.plugin_data_dir, uid), plan.claim_files())
        store.write_spec(settings.cdi_dir, uid, plan.spec, settings.driver_name)
        return plan

    def run(self, plan: ClaimPlan, lines: list[str], timeout_s: float | None = None) -> str:
        """Run `lines` as a busybox shell script in a container given the share's CDI device; what it printed."""
        runtime = self.runtime if timeout_s is None else dataclasses.replace(self.runtime, timeout_s=timeout_s)
        args = [self.tools.busybox, "sh", "-c", "\n".join(lines)]
        return container.run_with_device(
            runtime, self.rootfs, args, plan.devices[0].cdi_device_ids[0], cdi.cdi_kind(DRIVER_NAME)
        )

    def dump(self, output: str) -> None:
        self.say("  container output, as printed:")
        for line in output.splitlines():
            self.say(f"  | {line}")


def run(
    base: Settings,
    gpus: list[GpuInfo],
    *,
    edits: cdi.ContainerEdits,
    nodes: DeviceNodeSnapshot,
    runtime: container.Runtime,
    rootfs: Path,
    tools: Tools,
    say: Callable[[str], None],
) -> list[str]:
    """The MPS step on GPU 0; the problems it found (empty: every part held). Raises MpsStepError when it cannot
    run (no daemon binary, a daemon does not answer), MpsControlError when a daemon stops answering, and
    container.ContainerError."""
    gpu = gpus[0]
    step = _Step(gpu, gpus, base, edits, nodes, runtime, rootfs, tools, say)
    with daemon(base.driver_root, gpu) as first:
        say(f"MPS: driver control daemon for {gpu.uuid} answers (pipe directory {mps.pipe_dir(first.root, gpu.uuid)})")
        planned = [(step.plan(first.root, memory, percent), mib, percent) for memory, mib, percent in SHARES]
        ceiling = Limits(max(m for _, m, _ in planned), max(p for _, _, p in planned))
        kept = _Kept(first, MpsLimits(first.control), ceiling)
        kept.limits.ensure(gpu.uuid, ceiling, first.pid)
        say(f"MPS: ceiling {ceiling.describe()} set on the daemon (the largest grant and percentage)")
        reference = _printed_limits(step, kept)
        for plan, mib, percent in planned:
            _share(step, plan, mib, percent)
        _server_limits(step, kept)
        if tools.mps_control is None:
            say("MPS control from a share: the driver edits mount no nvidia-cuda-mps-control; not checked")
        else:
            _control_from_share(step, kept, reference, planned[0][0])
        _client_cap(step, planned[0][0])
        _other_domain(step, first)
    return step.found


def _printed_limits(step: _Step, kept: _Kept) -> DaemonReading:
    """Part 1: the default limit as printed right after the plugin set it, and two repairs that find nothing."""
    uuid = step.gpu.uuid
    printed = kept.daemon.control.run(uuid, [GET_DEFAULT_MEMORY])
    shown = printed[0] if printed else ""
    sent = f"{kept.ceiling.memory_mib}M"
    form = (
        "the form the plugin sends"
        if shown == sent
        else "in G"
        if re.fullmatch(r"\d+G", shown)
        else "another form than the plugin sends"
    )
    step.say(f"MPS: `{GET_DEFAULT_MEMORY}` prints {shown!r} after the plugin set {sent} ({form})")
    _repair_twice(step, kept, "right after the plugin set the ceiling")
    return kept.daemon.control.read(uuid)


def _repair_twice(step: _Step, kept: _Kept, when: str) -> None:
    """MpsLimits.repair twice with nobody changing anything: both must find nothing (readings compared as
    printed; a reading that differs from itself would make every refresh repair and post an Event)."""
    repairs = [kept.repair(step.gpu.uuid) for _ in range(2)]
    step.say(
        f"MPS: MpsLimits.repair twice {when}: " + "; ".join("; ".join(r) if r else "nothing changed" for r in repairs)
    )
    for r in repairs:
        if r:
            step.found.append(f"MpsLimits.repair {when}, with nobody changing anything, found: {'; '.join(r)}")


def _share(step: _Step, plan: ClaimPlan, mib: int, percent: int) -> None:
    """Part 2 for one share: its allocations over and under the grant, its read-only pipe directory and a client
    held open through it."""
    tools = step.tools
    caps = report.cap_sizes(mib)
    script = report.container_script(tools.busybox, tools.nvidia_smi, tools.probe, caps)
    output = step.run(plan, [script, *mps_report.pipe_lines(tools.busybox, tools.probe, tools.mps_control)])
    view = report.parse_output(output)
    env = view.env
    step.say(
        f"MPS client {mib} MiB / {percent} %: tier {plan.tiers[0][3]}, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="
        f"{env.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', '(unset)')}, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="
        f"{env.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '(unset)')}, CUDA_VISIBLE_DEVICES="
        f"{env.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
    )
    for line in _client_lines(view):
        step.say(f"  {line}")
    found: list[str] = []
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
    pipe = mps_report.pipe_view(output)
    for line in _pipe_lines(pipe):
        step.say(f"  {line}")
    pipe_found = mps_report.pipe_problems(pipe, with_control=tools.mps_control is not None)
    found += [f"MPS client of {mib} MiB: {p}" for p in pipe_found]
    if not pipe_found:
        step.say(
            "  read-only pipe directory: the client connected through it and works; the container cannot write there"
        )
    if found:
        step.dump(output)
    step.found += found


def _pipe_lines(view: mps_report.PipeView) -> list[str]:
    held = view.held.result if view.held is not None else None
    alloc = (held or {}).get("alloc") or {}
    listed = "; ".join(f"server {pid}: clients {' '.join(c) or 'none'}" for pid, c in sorted(view.clients.items()))
    entries = [line.strip() for line in view.listing if line.strip() and not line.startswith("total ")]
    write = "refused" if view.write_rc not in (0, None) else "ALLOWED" if view.write_rc == 0 else "not tried"
    return [
        f"pipe directory {mps.PIPE_IN_CONTAINER}: mount options {view.mount_options or '(no such mount)'}; "
        f"a write into it {write}: {view.write_text or '(nothing printed)'}",
        f"pipe directory listing: {' | '.join(entries) or '(empty)'}",
        f"held client (cuMemAlloc 1 MiB: {alloc.get('result') or (view.held.text.strip() if view.held else None)}); "
        f"the daemon's get_server_list: {view.servers_text or '(nothing)'}; {listed or 'no server lists a client'}",
    ]


def _server_limits(step: _Step, kept: _Kept) -> None:
    """Part 2, after the clients: the running server's limits as printed, and two repairs that find nothing."""
    reading = kept.daemon.control.read(step.gpu.uuid)
    for pid, server in sorted(reading.servers.items()):
        step.say(
            f"MPS: server {pid} prints its limits as {server.memory!r} / {server.percentage!r} "
            f"(the defaults as {reading.defaults.memory!r} / {reading.defaults.percentage!r})"
        )
    if not reading.servers:
        step.say("MPS: the daemon lists no server after its clients left")
    _repair_twice(step, kept, "with the shares' server running")


def _control_from_share(step: _Step, kept: _Kept, reference: DaemonReading, plan: ClaimPlan) -> None:
    """Part 3: control commands from a share's container, then the plugin's repair."""
    assert step.tools.mps_control is not None
    output = step.run(
        plan,
        [
            f"echo uid $({step.tools.busybox} id -u)",
            *mps_report.reply_lines(step.tools.busybox, step.tools.mps_control, SHARE_COMMANDS),
        ],
    )
    uid = next((line.split()[1] for line in output.splitlines() if line.startswith("uid ")), "?")
    answers = mps_report.replies(output, SHARE_COMMANDS)
    step.say(f"MPS control from a share's container (uid {uid}, through {mps.PIPE_IN_CONTAINER}):")
    for answer in answers:
        step.say(f"  {answer.describe()}")
    uuid = step.gpu.uuid
    changed = kept.repair(uuid)
    after = kept.daemon.control.read(uuid)
    step.say(
        "  MpsLimits.repair (the node plugin's refresh) found: "
        + ("; ".join(changed) if changed else "nothing changed")
        + (f"; set back: the daemon's defaults are {after.defaults.describe()}" if changed else "")
    )
    setting, found = answers[1], []
    if setting.refused:
        step.say(
            f"  the daemon refused the share's {setting.command!r}: it checks who sends a command (NVIDIA documents "
            "no such check), so a share cannot retune it this way"
        )
    elif not changed:
        found.append(
            f"a share's {setting.command!r} was taken ({setting.describe()}) but MpsLimits.repair found no change"
        )
    if after.defaults != reference.defaults:
        found.append(
            f"after MpsLimits.repair the daemon's defaults are {after.defaults.describe()}, not the ceiling's "
            f"{reference.defaults.describe()}"
        )
    if found:
        step.dump(output)
    step.found += found


def _client_cap(step: _Step, plan: ClaimPlan) -> None:
    """Part 4: clients of one share, each holding 1 MiB, until one is refused."""
    published = mps_clients(step.gpu)
    lines = mps_report.cap_lines(
        step.tools.busybox, step.tools.probe, max_clients=CAP_BOUND, deadline_s=CAP_DEADLINE_S,
        hold_s=CAP_DEADLINE_S + 2 * mps_report.CLIENT_WAIT_S + 30,
    )  # fmt: skip
    output = step.run(plan, lines, timeout_s=CAP_DEADLINE_S + mps_report.CLIENT_WAIT_S + 30)
    view = mps_report.cap_view(output)
    summary = mps_report.cap_summary(view, max_clients=CAP_BOUND, deadline_s=CAP_DEADLINE_S)
    step.say(f"MPS client cap (one share's container, the plugin publishes mpsClients {published}): {summary}")
    problems = mps_report.cap_problems(view, published)
    step.found += problems
    if problems or not view.clients:
        step.dump(output)


def compute_mode(uuid: str) -> str:
    """GPU `uuid`'s compute mode as NVML reports it (read only), or why it cannot be read."""
    try:
        pynvml.nvmlInit()
        try:
            mode = pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid))
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as err:
        return f"unknown ({err})"
    return _COMPUTE_MODES.get(mode, str(mode))


def _other_domain(step: _Step, first: Daemon) -> None:
    """Part 5: a share of a second trust domain, with a daemon of its own for the GPU, commands that daemon; the
    first domain's daemon reads as before."""
    uuid, tools = step.gpu.uuid, step.tools
    before = first.control.read(uuid)
    with daemon(step.base.driver_root, step.gpu, f"namespace/{OTHER_NAMESPACE}") as other:
        step.say(
            f"MPS second trust domain {other.domain}: its own daemon for {uuid} (pipe directory "
            f"{mps.pipe_dir(other.root, uuid)}, /dev/shm {mps.shm_dir(other.root, uuid)}); the GPU's compute mode is "
            f"{compute_mode(uuid)} (left as it is)"
        )
        memory, mib, percent = SHARES[0]
        plan = step.plan(other.root, memory, percent, OTHER_NAMESPACE)
        lines = [
            f"echo {report.MARKER} probe; {mps_report.bounded(tools.busybox, f'{tools.probe} {report.PROBE_ALLOC_MIB}')} "
            f"2>&1; echo {report.MARKER} probe-rc $?"
        ]
        if tools.mps_control is not None:
            lines += mps_report.reply_lines(tools.busybox, tools.mps_control, OTHER_COMMANDS)
        lines += mps_report.shm_lines(tools.busybox)
        output = step.run(plan, lines)
        view = report.parse_output(output)
        step.say(f"  its client ({mib} MiB / {percent} %): " + "; ".join(_client_lines(view)))
        answers = mps_report.replies(output, OTHER_COMMANDS) if tools.mps_control is not None else []
        for answer in answers:
            step.say(f"  its container: {answer.describe()}")
        if not answers:
            step.say("  the driver edits mount no nvidia-cuda-mps-control: its container sent no command")
        elif answers[0].refused:
            step.say("  its own daemon refused the command: what follows shows only that nothing else changed")
        own = other.control.read(uuid)
        step.say(
            f"  its daemon: defaults {own.defaults.describe()}, servers {sorted(own.servers) or 'none'}; its "
            f"container's /dev/shm: {' '.join(mps_report.shm_names(output)) or '(empty)'}"
        )
        after = first.control.read(uuid)
        first_shm = sorted(p.name for p in mps.shm_dir(first.root, uuid).iterdir())
        same = after.defaults == before.defaults and all(
            after.servers[pid] == reading for pid, reading in before.servers.items() if pid in after.servers
        )
        servers = "; ".join(f"{pid} {r.describe()}" for pid, r in sorted(after.servers.items()))
        step.say(
            f"  the first domain's daemon: defaults {after.defaults.describe()}, servers "
            f"{servers or 'none'}: "
            + ("unchanged" if same else f"CHANGED (before: {before.defaults.describe()})")
            + f"; its /dev/shm: {' '.join(first_shm) or '(empty)'}"
        )
        if not same:
            step.found.append(
                f"a share of trust domain {other.domain} changed the first domain's daemon: defaults "
                f"{after.defaults.describe()}, before {before.defaults.describe()}"
            )
            step.dump(output)


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
    alloc = probe.get("alloc")
    if alloc and not view.caps:
        lines.append(f"cuMemAlloc {alloc.get('mib')} MiB: {alloc.get('result')}")
    for mib, probe_run in sorted(view.caps.items(), reverse=True):
        lines.append(f"cuMemAlloc {mib} MiB: {probe_run.alloc_result or probe_run.text.strip()}")
    return lines
