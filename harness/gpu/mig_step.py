"""The real-GPU check's MIG step: on the first GPU whose MIG mode is on, the smallest partition fracgpu publishes,
made as prepare makes it, given to a container, seen there, and destroyed again.

The MIG mode of a lent machine's GPUs is left as it is (switching it needs the GPU idle and often a reset: an
operator's step, never the plugin's nor the check's), so on a GPU whose mode is off the step only reports the
mode and is skipped (no failure). Otherwise: fracgpu's MIG discovery (``kinds/mig/discovery.py``) reads the
GPU's profiles and placements; the first published partition (``kinds/mig/publish.py``'s order, the smallest
profile first) whose placement is free is made through ``kinds/mig/partitions.py`` (a GPU instance at the placement,
then the compute instance of the GPU instance's full size) and planned as prepare plans it; the container
(``nvidia-smi -L`` and the CUDA probe) must see exactly that MIG device (count 1, the MIG UUID, the profile's
multiprocessors, no more memory than the profile's), ``NVIDIA_VISIBLE_DEVICES=void`` and only its GPU's node.
The partition is destroyed whatever happened, and must be gone afterwards.
"""

import re
import uuid as uuids
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from api.names import DRIVER_NAME
from harness.gpu import container, report
from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.core.errors import PrepareError
from kubelet_plugin.core.model import GpuInfo, MigGpu
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.tiers import GpuTiers
from kubelet_plugin.kinds.mig.discovery import discover_mig
from kubelet_plugin.kinds.mig.nvml import MigManager, NvmlMig
from kubelet_plugin.kinds.mig.partitions import Partitioner
from kubelet_plugin.kinds.mig.publish import MigDevice, mig_devices
from kubelet_plugin.kinds.share import PreparedPartition
from kubelet_plugin.prepare.plan import HostFacts, plan_claim
from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state import claim_files as store

MIG_MINORS = Path("proc/driver/nvidia-caps/mig-minors")
_SMI_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-fA-F-]+)\)$")
_SMI_GPU = re.compile(r"^GPU (\d+): .* \(UUID: (GPU-[0-9a-fA-F-]+)\)$")


class MigStepError(Exception):
    """The step could not run; the message says why."""


def mig_claim(device: MigDevice, node: str) -> dict[str, Any]:
    """An allocated claim for one published partition, as the scheduler writes it (a whole device: no share)."""
    result = {"request": "gpu", "driver": DRIVER_NAME, "pool": node, "device": device.name}
    return {
        "metadata": {"name": "mig", "namespace": "gpu-check", "uid": str(uuids.uuid4())},
        "status": {"allocation": {"devices": {"results": [result], "config": []}}},
    }


def minors_file(driver_root: Path) -> Path:
    """The driver's MIG capability table: under the driver root where it is there (a simulated driver), else the
    kernel's ``/proc``."""
    under_root = driver_root / MIG_MINORS
    return under_root if under_root.exists() else Path("/") / MIG_MINORS


def mode_line(gpu: GpuInfo, mig: MigGpu) -> str:
    """``MIG gpu-1: enabled, 19 profiles (1g.10gb, ...)`` or the state and NVML's words."""
    if mig.state == "enabled":
        names = ", ".join(dict.fromkeys(p.name for p in mig.profiles))
        return f"MIG {gpu.device_name}: enabled, {mig.memory_slices} memory / {mig.compute_slices} compute slices; " + (
            f"profiles {names}"
        )
    return f"MIG {gpu.device_name}: {mig.state}{': ' + mig.detail if mig.detail else ''}"


def seen(output: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(GPU index, UUID) and (profile, MIG UUID) of every line ``nvidia-smi -L`` printed in the container."""
    view = report.parse_output(output)
    gpus = [(m.group(1), m.group(2)) for m in map(_SMI_GPU.match, view.smi_lines) if m]
    migs = [(m.group(1), m.group(3)) for m in map(_SMI_MIG.match, view.smi_lines) if m]
    return gpus, migs


def problems(view: report.ContainerView, output: str, gpu: GpuInfo, partition: PreparedPartition) -> list[str]:
    """Why the container did not see exactly `partition` (empty: it did)."""
    record, found = partition.record, []
    gpus, migs = seen(output)
    if view.smi_rc != 0:
        found.append(f"nvidia-smi -L exited with {view.smi_rc}")
    if [u for _, u in gpus] != [gpu.uuid]:
        found.append(f"nvidia-smi -L listed GPUs {[u for _, u in gpus]}, not only the partition's GPU {gpu.uuid}")
    if migs != [(record.profile, record.uuid)]:
        found.append(f"nvidia-smi -L listed MIG devices {migs}, not only {record.profile} {record.uuid}")
    probe = view.probe
    if probe is None or "error" in probe:
        found.append(f"the CUDA probe failed (exit {view.probe_rc}): {view.probe_text.strip() or '(no output)'}")
        return found
    devices = probe.get("devices") or []
    if probe.get("device_count") != 1 or len(devices) != 1:
        found.append(f"the CUDA probe saw {probe.get('device_count')} devices, not the partition alone")
    for d in devices[:1]:
        if d.get("mig_uuid") != record.uuid:
            found.append(f"the CUDA probe's device is {d.get('mig_uuid') or d.get('uuid')}, not {record.uuid}")
        if d.get("multiprocessor_count") != record.multiprocessors:
            found.append(
                f"the CUDA probe's device has {d.get('multiprocessor_count')} multiprocessors, not the "
                f"{record.multiprocessors} of {record.profile}"
            )
        total = d.get("total_mib")
        if not isinstance(total, int) or total > record.memory_mib:
            found.append(f"the CUDA probe's device has {total} MiB, more than the {record.memory_mib} MiB partition")
    alloc = probe.get("alloc") or {}
    if alloc.get("result") != "CUDA_SUCCESS":
        found.append(f"cuMemAlloc of {report.PROBE_ALLOC_MIB} MiB in the partition gave {alloc.get('result')}")
    if view.env.get("NVIDIA_VISIBLE_DEVICES") != "void":
        found.append(f"NVIDIA_VISIBLE_DEVICES is {view.env.get('NVIDIA_VISIBLE_DEVICES')!r}, not 'void'")
    nodes = sorted(n for n in view.dev if n.startswith("nvidia") and n[6:].isdigit())
    if nodes != [f"nvidia{gpu.minor}"]:
        found.append(f"the container's GPU nodes are {nodes}, not nvidia{gpu.minor} alone")
    return found


def _make(
    partitioner: Partitioner, devices: list[MigDevice], node: str
) -> tuple[dict[str, Any], dict[str, PreparedPartition]]:
    """Make the first of `devices` (one profile's placements) whose placement is free; the claim and partition."""
    failures = []
    for device in devices:
        claim = mig_claim(device, node)
        try:
            partitions, _ = partitioner.make(claim, None)
        except PrepareError as err:
            failures.append(str(err))
            continue
        return claim, partitions
    raise MigStepError(f"no placement of {devices[0].profile.name} could be made: " + "; ".join(failures))


def run(
    base: Settings,
    gpus: list[GpuInfo],
    *,
    edits: cdi.ContainerEdits,
    nodes: DeviceNodeSnapshot,
    tiers: Mapping[str, GpuTiers],
    runtime: container.Runtime,
    rootfs: Path,
    script: Callable[[], str],
    say: Callable[[str], None],
    manager: MigManager | None = None,
) -> list[str]:
    """The MIG step; the problems it found (empty: the container saw exactly its partition, or no GPU has MIG on).
    Raises MigStepError when it cannot run (no free placement, the driver refuses)."""
    mig = discover_mig(gpus)
    for g in gpus:
        say(mode_line(g, mig[g.device_name]))
    gpu = next((g for g in gpus if mig[g.device_name].state == "enabled"), None)
    if gpu is None:
        say("MIG: skipped: no GPU has MIG mode on (the check never switches it; nvidia-smi -i <GPU> -mig 1 does)")
        return []
    settings = base.model_copy(update={"mig_gpus": gpu.uuid, "mig_minors_file": minors_file(base.driver_root)})
    facts = {gpu.device_name: mig[gpu.device_name]}
    manager = manager or NvmlMig()
    partitioner = Partitioner(
        gpus, facts, manager, node=base.node_name, driver=DRIVER_NAME, driver_root=base.driver_root,
        minors_file=settings.mig_minors_file, proc_devices=settings.proc_devices_file,
    )  # fmt: skip
    offered = mig_devices(gpus, facts)
    smallest = [d for d in offered if d.profile == offered[0].profile]
    say(
        f"MIG: {len(offered)} partitions published for {gpu.device_name}; the smallest, {smallest[0].profile.name} "
        f"({smallest[0].profile.memory_mib} MiB, {smallest[0].profile.multiprocessors} SMs), at placements "
        + ", ".join(str(d.start) for d in smallest)
    )
    claim, partitions = _make(partitioner, smallest, base.node_name)
    (partition,) = partitions.values()
    record = partition.record
    found: list[str] = []
    try:
        say(
            f"MIG: made {record.profile} at placement {record.placement_start} of {gpu.uuid}: GPU instance "
            f"{record.gpu_instance}, compute instance {record.compute_instance}, {record.uuid}, {record.memory_mib} MiB, "
            f"{record.multiprocessors} SMs, capability minors {', '.join(map(str, partition.cap_minors))}"
        )
        host = HostFacts(
            gpus={g.device_name: g for g in gpus}, nodes=partitioner.with_cap_nodes(nodes, partitions), tiers=tiers,
            driver_edits=edits, mig_devices=partitioner.devices, partitions=partitions,
        )  # fmt: skip
        plan = plan_claim(claim, settings, host)
        assert plan.spec is not None
        uid = claim["metadata"]["uid"]
        store.write_claim_files(container_info.claim_info_dir(settings.plugin_data_dir, uid), plan.claim_files())
        store.write_spec(settings.cdi_dir, uid, plan.spec, settings.driver_name)
        spec_nodes = [n.path for d in plan.spec.devices for n in d.container_edits.device_nodes]
        say(f"MIG: claim tier {plan.tiers[0][3]}; spec device nodes {' '.join(spec_nodes)}")
        output = container.run_with_device(
            runtime, rootfs, ["/bin/busybox", "sh", "-c", script()], plan.devices[0].cdi_device_ids[0],
            cdi.cdi_kind(DRIVER_NAME),
        )  # fmt: skip
        view = report.parse_output(output)
        for line in view.smi_lines or ["(no output)"]:
            say(f"MIG container nvidia-smi -L: {line}")
        for d in (view.probe or {}).get("devices") or []:
            say(
                f"MIG container CUDA probe: device {d.get('index')} {d.get('mig_uuid') or d.get('uuid')}: memory total "
                f"{d.get('total_mib')} MiB, free {d.get('free_mib')} MiB, multiprocessors {d.get('multiprocessor_count')}"
            )
        if not (view.probe or {}).get("devices"):
            say(f"MIG container CUDA probe (exit {view.probe_rc}): {view.probe_text.strip() or '(no output)'}")
        for key, value in sorted(view.env.items()):
            if key.startswith("FRACGPU_") or key == "NVIDIA_VISIBLE_DEVICES":
                say(f"MIG container {key}={value}")
        say(f"MIG container /dev: {' '.join(view.dev) or '(nothing)'}")
        found = problems(view, output, gpu, partition)
        if found:
            say("MIG container output, as printed:")
            for line in output.splitlines():
                say(f"  | {line}")
    finally:
        partitioner.undo([record])
    if manager.alive(record):
        found.append(f"MIG partition {record.uuid} is still there after it was destroyed")
    else:
        say(f"MIG: destroyed {record.uuid}; the GPU instance and compute instance are gone")
    return [f"MIG: {problem}" for problem in found]
