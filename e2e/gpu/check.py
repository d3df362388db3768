"""The real-GPU check: fracgpu's own discovery, driver edits and claim spec, then a container under them.

    python -m e2e.gpu.check --work DIR [--driver-root /] [--memory 10Gi]

``DIR`` holds the unpacked bundle (``bin/``, ``rootfs/``, see bundle.py) and receives everything the check
writes. Steps, each printed with what it saw:

1. GPUs through NVML (``kubelet_plugin.discovery``, real ``pynvml``; ``libnvidia-ml.so.1`` from the loader path);
2. driver edits (``kubelet_plugin.driver_edits``: the bundled ``nvidia-ctk`` on the driver root, the hook installed
   under the plugin directory as the plugin does);
3. the claim spec for one share of GPU 0, planned and written as prepare does (``claim_spec.plan_claim``,
   ``container_info``, ``cdi.write_spec``) from an allocated claim as the scheduler writes it;
4. a container (bundled busybox rootfs) given the claim's CDI device by ``nvidia-container-runtime`` in cdi mode
   over the bundled runc, running ``nvidia-smi -L`` (as mounted by the edits) and the CUDA probe;
5. the verdict: PASS when both see exactly the granted GPU and ``NVIDIA_VISIBLE_DEVICES=void``.

Exit status 0 on PASS, 1 on FAIL (the reasons are printed), 2 for bad usage.
"""

import argparse
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.names import DRIVER_NAME, MEMORY_CAPACITY
from api.quantity import MiB, to_bytes
from e2e.gpu import container, report
from kubelet_plugin import cdi, container_info
from kubelet_plugin.claim_spec import PrepareError, plan_claim
from kubelet_plugin.discovery import DiscoveryError, discover_gpus
from kubelet_plugin.driver_edits import DriverEditsError, GeneratorConfig, generate_driver_edits, install_hook
from kubelet_plugin.model import GpuInfo
from kubelet_plugin.settings import Settings

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
    except (DiscoveryError, DriverEditsError, PrepareError, container.ContainerError, OSError) as err:
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


def run(work: Path, driver_root: Path, memory: str) -> list[str]:
    """Run the steps; the reasons the check fails (empty: PASS). Raises CheckError when a step cannot finish."""
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
        plan = plan_claim(claim, settings, {g.device_name: g for g in gpus}, edits)
        if plan.spec is None:
            raise CheckError("claim spec: the plan has no spec")
        container_info.write_claim_files(container_info.claim_info_dir(settings.plugin_data_dir, uid), list(plan.files))
        spec_path = cdi.write_spec(settings.cdi_dir, uid, plan.spec, settings.driver_name)
        device_id = plan.devices[0].cdi_device_ids[0]
        granted = plan.files[0].info.devices[0]
        say(f"claim spec: {spec_path}")
        say(f"CDI device: {device_id}")
        say(f"granted: {granted.memory_mib} MiB of {granted.uuid} ({to_bytes(memory) // MiB} MiB asked)")
    smi = next((m.container_path for m in edits.mounts if Path(m.container_path).name == "nvidia-smi"), None)
    runtime = container.Runtime(bin_dir / "nvidia-container-runtime", bin_dir / "runc", work)
    with step("container (nvidia-container-runtime cdi mode + runc)"):
        script = report.container_script(BUSYBOX, smi, PROBE)
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
        if key.startswith("FRACGPU_") or key == "CUDA_DEVICE_ORDER":
            say(f"container {key}={value}")
    say(f"container /dev: {' '.join(view.dev) or '(nothing)'}")
    found = report.problems(view, granted.uuid)
    if found:  # what the verdict was read from, for the reader of a failed run
        say("container output, as printed:")
        for line in output.splitlines():
            say(f"  | {line}")
    return found


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


def main(argv: list[str] | None = None) -> int:
    """Run the check and print the verdict; exit status 0 on PASS, 1 on FAIL."""
    p = argparse.ArgumentParser(prog="python -m e2e.gpu.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="the unpacked bundle (bin/, rootfs/); output goes here")
    p.add_argument("--driver-root", type=Path, default=Path("/"), help="where the NVIDIA driver is installed")
    p.add_argument("--memory", default="10Gi", help="the share's memory (a Kubernetes quantity)")
    args = p.parse_args(argv)
    try:
        if to_bytes(args.memory) <= 0:
            raise ValueError("must be positive")
    except ValueError as err:
        p.error(f"--memory {args.memory!r} is not a positive Kubernetes quantity such as 10Gi: {err}")
    work: Path = args.work.resolve()
    missing = [str(work / n) for n in ("bin/nvidia-ctk", "bin/runc", "rootfs/bin/busybox") if not (work / n).exists()]
    if missing:
        p.error(f"not an unpacked bundle: {', '.join(missing)} missing (e2e/gpu/check.sh unpacks it)")
    try:
        reasons = run(work, args.driver_root.resolve(), args.memory)
    except CheckError as err:
        reasons = [str(err)]
    if reasons:
        say("FAIL: " + "; ".join(reasons))
        return 1
    say("PASS: nvidia-smi -L and the CUDA probe in the container saw exactly the granted GPU (count 1, same UUID)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
