"""The real-GPU check: fracgpu's own discovery, driver edits and claim spec, then a container under them.

    python -m harness.gpu.check --work DIR [--driver-root /] [--memory 10Gi]

``DIR`` holds the unpacked bundle (``bin/``, ``rootfs/``, see bundle.py) and receives everything the check
writes. Steps, each printed with what it saw:

1. GPUs through NVML (``kubelet_plugin.publishing.discovery``, real ``pynvml``; ``libnvidia-ml.so.1`` from the loader path);
   the memory-enforcement tiers each GPU offers (``kubelet_plugin.enforcement.probe``: cgroup v2 at the cgroup
   root, the ``nvmlDeviceSetMemoryLimits_v1`` probe, here run even where cgroup v1 already rules nvml out, and
   HAMi-core's library), with the reason for each tier that is missing;
2. driver edits (``kubelet_plugin.prepare.driver_edits``: the bundled ``nvidia-ctk`` on the driver root, the hook installed
   under the plugin directory as the plugin does);
3. the claim spec for one share of GPU 0, planned and written as prepare does (``prepare.plan.plan_claim``,
   ``container_info``, ``store.write_spec``) from an allocated claim as the scheduler writes it, at the tier the
   node's ``auto`` mode gives it (``nvml`` where GPU 0 offers it: the spec then carries NVIDIA's
   ``apply-cuda-memory-limits`` createRuntime hook);
4. a container (bundled busybox rootfs, in its own cgroup ``/fracgpu-gpu-check/<name>``) given the claim's CDI
   device by ``nvidia-container-runtime`` in cdi mode over the bundled runc, running ``nvidia-smi -L`` (as mounted
   by the edits) and the CUDA probe; at the nvml tier also the probe allocating 20% over and under the grant;
5. MPS on GPU 0 (``harness/gpu/mps_step.py``; ``--no-mps`` skips it): the driver's MPS control daemon, two MPS
   shares (10Gi at 30 %, 20Gi at 50 %) planned by fracgpu, the ceiling set as the plugin sets it and its default
   limit as the daemon prints it, each share's container allocating 20 % over and under its grant (with what each
   client sees) through its read-only pipe directory, control commands from a share and the plugin's repair, the
   client cap, and a share of a second trust domain commanding its own daemon;
6. MIG (``harness/gpu/mig_step.py``; ``--no-mig`` skips it): each GPU's MIG mode; on the first GPU whose mode is
   on, the smallest partition fracgpu publishes, made as prepare makes it (GPU instance at its placement, then the
   compute instance), in a container that must see exactly that MIG device, then destroyed; skipped (no failure)
   where no GPU has MIG mode on: the check never switches it;
7. the verdict: PASS when both see exactly the granted GPU and ``NVIDIA_VISIBLE_DEVICES=void``, at the nvml
   tier the allocation over the grant is refused and the one under it allowed, the MPS step's parts held
   (each MPS client's allocation over its grant refused and under it allowed, its pipe directory read-only and
   its client listed by the daemon, the repair finding nothing twice after a set and finding and undoing a
   share's command, at least ``mpsClients`` clients taken, the first domain's daemon unchanged by the second's
   share), and the MIG container sees only its partition; without nvml the verdict says why and that the memory
   cap was not checked (no failure).

Exit status 0 on PASS, 1 on FAIL (the reasons are printed), 2 for bad usage.
"""

import argparse
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.names import DRIVER_NAME, MEMORY_CAPACITY
from api.quantity import MiB, to_bytes
from harness.gpu import container, mig_step, mps_step, report
from kubelet_plugin.core.devicenodes import snapshot
from kubelet_plugin.core.errors import PrepareError
from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector, probe_nvml_limits, static_facts
from kubelet_plugin.enforcement.tiers import GpuTiers
from kubelet_plugin.kinds.gpu.plan import NVML_HOOK
from kubelet_plugin.kinds.mps.control import MpsControlError
from kubelet_plugin.prepare.driver_edits import DriverEditsError, GeneratorConfig, generate_driver_edits, install_hook
from kubelet_plugin.prepare.plan import HostFacts, plan_claim
from kubelet_plugin.publishing.discovery import DiscoveryError, discover_gpus
from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state import claim_files as store

NODE = "gpu-check"
NAMESPACE = "gpu-check"
CLAIM_NAME = "share"
REQUEST = "gpu"
BUSYBOX = "/bin/busybox"
PROBE = "/usr/local/bin/cuda-probe"


class CheckError(Exception):
    """A step failed; the message says which and why."""


def say(message: str) -> None:
    """One labelled line of the check's report."""
    print(f"[gpu-check] {message}", flush=True)


@contextmanager
def step(name: str) -> Iterator[None]:
    """Time one step; turn its known errors into CheckError naming the step."""
    start = time.monotonic()
    try:
        yield
    except (
        DiscoveryError,
        DriverEditsError,
        PrepareError,
        container.ContainerError,
        OSError,
        mps_step.MpsStepError,
        MpsControlError,
        mig_step.MigStepError,
    ) as err:
        raise CheckError(f"{name}: {err}") from err
    say(f"-- {name} done in {time.monotonic() - start:.1f} s")


def share_claim(gpu: GpuInfo, memory: str) -> dict[str, Any]:
    """An allocated ResourceClaim as the scheduler writes it: one ``memory`` share of ``gpu`` on this node."""
    return {
        "metadata": {"namespace": NAMESPACE, "name": CLAIM_NAME, "uid": str(uuid.uuid4())},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": REQUEST,
                            "driver": DRIVER_NAME,
                            "pool": NODE,
                            "device": gpu.device_name,
                            "shareID": str(uuid.uuid4()),
                            "consumedCapacity": {MEMORY_CAPACITY: memory},
                        }
                    ],
                    "config": [],
                }
            }
        },
    }


def loaded_nvml() -> str:
    """The libnvidia-ml file this process loaded (from /proc/self/maps), for the report."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError as err:
        return f"(unknown: {err})"
    paths = {line.split()[-1] for line in maps.splitlines() if "libnvidia-ml" in line}
    return ", ".join(sorted(paths)) or "(not loaded)"


def summarise_edits(edits: cdi.ContainerEdits) -> list[str]:
    """Lines describing the driver edits: mounts by kind, hooks by name, env."""
    paths = [m.container_path for m in edits.mounts]
    libraries = [p for p in paths if ".so" in Path(p).name]
    binaries = [p for p in paths if "/bin/" in p]
    other = [p for p in paths if p not in libraries and p not in binaries]
    hooks = [h.args[1] if len(h.args) > 1 else h.path for h in edits.hooks]
    return [
        f"driver edits: {len(paths)} mounts: {len(libraries)} libraries, {len(binaries)} binaries, {len(other)} other",
        f"  libraries: {', '.join(Path(p).name for p in libraries) or 'none'}",
        f"  binaries: {', '.join(binaries) or 'none'}",
        f"  other mounts: {', '.join(other) or 'none'}",
        f"  hooks ({len(hooks)}): {', '.join(hooks) or 'none'}",
        f"  env: {' '.join(edits.env)}",
    ]


def detect_tiers(settings: Settings, gpus: list[GpuInfo]) -> Mapping[str, GpuTiers]:
    """The tiers each GPU offers, by our detection; NVML is probed even where the cgroup rules nvml out (the
    plugin skips it there), so the report says what the driver could do."""
    cgroup, edits = static_facts(settings)
    say(f"cgroup v2 at {settings.cgroup_root}: {'yes' if cgroup is None else cgroup}")
    nvml = probe_nvml_limits([g.uuid for g in gpus])
    detector = EnforcementDetector(settings, gpus, cgroup_problem=cgroup, driver_edits_problem=edits, nvml=nvml)
    hami = detector.node_facts().hami_core_problem
    say(f"HAMi-core: {'present at ' + str(settings.hami_core_library) if hami is None else hami}")
    tiers = detector.tiers()
    for g in gpus:
        problem = nvml[g.uuid].problem
        say(f"  {g.device_name}: NVML memory-limits probe: {'supported' if problem is None else problem}")
    for name, t in tiers.items():
        say(tier_line(name, t))
    return tiers


def tier_line(device: str, tiers: GpuTiers) -> str:
    """``enforcement gpu-0: available none, nvml; hami-core not available: ...``."""
    missing = "".join(f"; {tier} not available: {why}" for tier, why in tiers.missing.items())
    return f"enforcement {device}: available {', '.join(tiers.available)}{missing}"


def run(
    work: Path, driver_root: Path, memory: str, *, with_mps: bool = True, with_mig: bool = True
) -> tuple[list[str], str]:
    """Run the steps; the reasons the check fails (empty: PASS) and the memory-cap note for the verdict. Raises
    CheckError when a step cannot finish."""
    bin_dir, rootfs = work / "bin", work / "rootfs"
    settings = Settings(
        node_name=NODE,
        kubelet_dir=work / "kubelet",
        cdi_dir=work / "cdi",
        driver_root=driver_root,
        driver_edits="toolkit",
        nvidia_ctk=bin_dir / "nvidia-ctk",
        nvidia_cdi_hook_source=bin_dir / "nvidia-cdi-hook",
    )
    say(f"driver root: {driver_root}; work dir: {work}; Python {sys.version.split()[0]}")
    with step("NVML discovery"):
        gpus = discover_gpus()
        say(f"NVML driver version: {gpus[0].driver_version if gpus else '(no GPU)'}")
        say(f"NVML library: {loaded_nvml()}")
        say(f"NVML GPUs: {len(gpus)}")
        for g in gpus:
            say(
                f"  {g.device_name}: {g.uuid} {g.product_name}, {g.memory_total_bytes // MiB} MiB, minor {g.minor}, "
                f"PCI {g.pci_bus_id}, {g.architecture} {g.cuda_compute_capability}"
            )
        if not gpus:
            raise CheckError("NVML discovery: NVML reports no GPU")
    with step("memory-enforcement tiers"):
        tiers = detect_tiers(settings, gpus)
    with step("driver edits (nvidia-ctk)"):
        config = GeneratorConfig.from_settings(settings)
        install_hook(settings.nvidia_cdi_hook_source, config.hook_path)
        edits = generate_driver_edits(config)
        for line in summarise_edits(edits):
            say(line)
    gpu = gpus[0]
    with step(f"claim spec ({memory} of {gpu.device_name})"):
        claim = share_claim(gpu, memory)
        uid = claim["metadata"]["uid"]
        nodes = snapshot(settings.driver_root, [g.minor for g in gpus])
        facts = HostFacts(gpus={g.device_name: g for g in gpus}, nodes=nodes, tiers=tiers, driver_edits=edits)
        plan = plan_claim(claim, settings, facts)
        if plan.spec is None:
            raise CheckError("claim spec: the plan has no spec")
        store.write_claim_files(container_info.claim_info_dir(settings.plugin_data_dir, uid), plan.claim_files())
        spec_path = store.write_spec(settings.cdi_dir, uid, plan.spec, settings.driver_name)
        device_id = plan.devices[0].cdi_device_ids[0]
        granted = plan.files[0].info.devices[0]
        say(f"claim spec: {spec_path}")
        say(f"CDI device: {device_id}")
        say(f"granted: {granted.memory_mib} MiB of {granted.uuid} ({to_bytes(memory) // MiB} MiB asked)")
        tier = plan.tiers[0][3]
        hooks = [h for d in plan.spec.devices for h in d.container_edits.hooks if NVML_HOOK in h.args]
        say(f"claim tier: {tier}; spec hooks {NVML_HOOK}: " + (" | ".join(_hook_text(h) for h in hooks) or "none"))
        if tier == "nvml" and not hooks:
            raise CheckError(f"claim spec: the share is at the nvml tier but the spec has no {NVML_HOOK} hook")
    nvml = tier == "nvml"
    cap_note = (
        "" if nvml else report.not_checked(tiers[gpu.device_name].missing.get("nvml", f"the share's tier is {tier}"))
    )
    smi = _mounted(edits, "nvidia-smi")
    simulated = os.environ.get(container.STATE_ENV)  # the mock driver's state (tests only), see container.py
    runtime = container.Runtime(
        bin_dir / "nvidia-container-runtime",
        bin_dir / "runc",
        work,
        simulated_state=Path(simulated) if simulated else None,
    )
    with step("container (nvidia-container-runtime cdi mode + runc)"):
        caps = report.cap_sizes(granted.memory_mib) if nvml else ()
        script = report.container_script(BUSYBOX, smi, PROBE, caps)
        output = container.run_with_device(
            runtime, rootfs, [BUSYBOX, "sh", "-c", script], device_id, cdi.cdi_kind(DRIVER_NAME)
        )
    view = report.parse_output(output)
    say(f"container nvidia-smi -L (exit {view.smi_rc}):")
    for line in view.smi_lines or ["(no output)"]:
        say(f"  {line}")
    say(f"container CUDA probe (exit {view.probe_rc}):")
    for line in _probe_lines(view):
        say(f"  {line}")
    say(f"container NVIDIA_VISIBLE_DEVICES={view.env.get('NVIDIA_VISIBLE_DEVICES', '(unset)')}")
    for key, value in sorted(view.env.items()):
        if key.startswith(("FRACGPU_", "NVIDIA_GPU_MEMORY_")) or key == "CUDA_DEVICE_ORDER":
            say(f"container {key}={value}")
    say(f"container /dev: {' '.join(view.dev) or '(nothing)'}")
    found = report.problems(view, granted.uuid)
    if nvml:
        for mib, probe_run in sorted(view.caps.items(), reverse=True):
            say(
                f"container CUDA probe {mib} MiB, cap {granted.memory_mib} MiB (exit {probe_run.rc}): "
                + (f"cuMemAlloc {probe_run.alloc_result}" if probe_run.alloc_result else probe_run.text.strip())
            )
        found += report.cap_problems(view, granted.memory_mib)
        above, total = report.cap_sizes(granted.memory_mib)[0], gpu.memory_total_bytes // MiB
        if above >= total:  # refused for want of memory, not by the cap: no evidence
            found.append(f"cannot check the cap: {above} MiB is not less than the GPU's {total} MiB; use less --memory")
        cap_note = report.cap_summary(view, granted.memory_mib)
    else:
        say(f"memory cap: {cap_note}")
    if found:  # what the verdict was read from, for the reader of a failed run
        say("container output, as printed:")
        for line in output.splitlines():
            say(f"  | {line}")
    if with_mps:
        with step(f"MPS ({gpu.device_name})"):
            tools = mps_step.Tools(BUSYBOX, PROBE, smi, _mounted(edits, "nvidia-cuda-mps-control"))
            found += mps_step.run(
                settings, gpus, edits=edits, nodes=nodes, runtime=runtime, rootfs=rootfs, tools=tools, say=say
            )
    if with_mig:
        with step("MIG"):
            found += mig_step.run(
                settings, gpus, edits=edits, nodes=nodes, tiers=tiers, runtime=runtime, rootfs=rootfs,
                script=lambda: report.container_script(BUSYBOX, smi, PROBE), say=say,
            )  # fmt: skip
    return found, cap_note


def _mounted(edits: cdi.ContainerEdits, program: str) -> str | None:
    """Where the driver edits mount `program` in the container, if they do."""
    return next((m.container_path for m in edits.mounts if Path(m.container_path).name == program), None)


def _hook_text(hook: cdi.Hook) -> str:
    return f"{hook.hook_name} {hook.path} {' '.join(hook.args[1:])}"


def _probe_lines(view: report.ContainerView) -> list[str]:
    probe = view.probe
    if probe is None or "error" in probe:
        return [view.probe_text.strip() or "(no output)"]
    lines = [f"driver API version {probe.get('driver_version')}, device count {probe.get('device_count')}"]
    for d in probe.get("devices") or []:
        lines.append(
            f"device {d.get('index')}: {d.get('name')} {d.get('uuid')}, "
            f"memory total {d.get('total_mib')} MiB, free {d.get('free_mib')} MiB"
        )
    alloc = probe.get("alloc")
    if alloc:
        lines.append(
            f"cuMemAlloc {alloc.get('mib')} MiB: {alloc.get('result')} "
            f"(free {alloc.get('free_mib_before')} -> {alloc.get('free_mib_after')} MiB)"
        )
    return lines


def _stopped(signum: int, frame: object) -> None:
    say("stopped (SIGTERM): cleaning up")
    raise SystemExit(124)


def main(argv: list[str] | None = None) -> int:
    """Run the check and print the verdict; exit status 0 on PASS, 1 on FAIL."""
    p = argparse.ArgumentParser(prog="python -m harness.gpu.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="the unpacked bundle (bin/, rootfs/); output goes here")
    p.add_argument("--driver-root", type=Path, default=Path("/"), help="where the NVIDIA driver is installed")
    p.add_argument("--memory", default="10Gi", help="the share's memory (a Kubernetes quantity)")
    p.add_argument("--no-mps", action="store_true", help="skip the MPS step")
    p.add_argument("--no-mig", action="store_true", help="skip the MIG step")
    args = p.parse_args(argv)
    try:
        if to_bytes(args.memory) <= 0:
            raise ValueError("must be positive")
    except ValueError as err:
        p.error(f"--memory {args.memory!r} is not a positive Kubernetes quantity such as 10Gi: {err}")
    work: Path = args.work.resolve()
    signal.signal(signal.SIGTERM, _stopped)  # check.sh's deadline: unwind, so every daemon and directory goes
    missing = [str(work / n) for n in ("bin/nvidia-ctk", "bin/runc", "rootfs/bin/busybox") if not (work / n).exists()]
    if missing:
        p.error(f"not an unpacked bundle: {', '.join(missing)} missing (harness/gpu/check.sh unpacks it)")
    try:
        reasons, cap_note = run(
            work, args.driver_root.resolve(), args.memory, with_mps=not args.no_mps, with_mig=not args.no_mig
        )
    except CheckError as err:
        reasons, cap_note = [str(err)], ""
    say(report.verdict(reasons, cap_note))
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
