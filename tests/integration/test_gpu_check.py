"""The real-GPU check (harness/gpu/check.sh) run as the device machine runs it, against the simulated driver.

The bundle is built as ``make gpu-check-bundle`` builds it (wheels for this interpreter only: they come from the
wheel cache after the first run), then check.sh unpacks it, makes a fresh venv from its wheels and runs our
discovery, driver edits and claim spec, and a container through nvidia-container-runtime and the bundled runc.
The faithful fake driver root has two GPUs, and its NVML, libcuda and nvidia-smi enumerate only the device
nodes a process can open, so a container that sees one GPU got exactly the spec's device. Needs root.

This machine is hybrid cgroup v1, so the check reports no nvml tier and checks no memory cap. The nvml branch
runs in a private mount namespace where the host's cgroup2 hierarchy (/sys/fs/cgroup/unified) is bind-mounted
at /sys/fs/cgroup (as tests/integration/test_nvml_enforcement.py does): the check then plans the share at the
nvml tier, NVIDIA's real hook runs for the container and calls the mock NVML (which records the call and caps
nothing), so the check must fail with "memory cap not enforced": it catches a driver that ignores the limit.

The MIG step: the plain profile's GPU 1 is MIG-capable with MIG mode off, so the step reports the modes and is
skipped; a second driver root has GPU 1's MIG mode on and a state directory (the mock's MIG instances, its
stand-in for the kernel), which the check's containers get read-only (harness/gpu/container.py): the step makes the
smallest partition, the container sees exactly it, and it is destroyed.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness import lock
from harness.gpu import bundle as gpu_bundle
from harness.mocknvml import PROFILES, make_driver_root, read_profile
from harness.mocknvml.driver_root import LIBDIR, DriverInstall, make_faithful_driver_root

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mknod'd device nodes and runc"),
]

CHECK = Path(gpu_bundle.REPO) / "harness" / "gpu" / "check.sh"
PROFILE = PROFILES / "sim80gi-x2.profile"
GPU0, GPU1 = (read_profile(PROFILE)[f"gpu.{i}.uuid"] for i in (0, 1))
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
V1_REASON = (
    "the node has no cgroup v2 unified hierarchy at /sys/fs/cgroup (it is tmpfs (cgroup v1 or hybrid)), "
    "and NVIDIA's hook needs one"
)
UNIFIED = Path("/sys/fs/cgroup/unified")
# A private mount namespace: cgroup2 where the hook and our detection look, and a /dev holding the GPUs' nodes
# (the hook runs with its own env, so the mock NVML in it enumerates the GPUs whose /dev node it can open).
CGROUP_V2_NAMESPACE = r"""
set -eu
mount --make-rprivate /
mount --bind /sys/fs/cgroup/unified /sys/fs/cgroup
mount -t tmpfs -o mode=755,nosuid tmpfs /dev
for n in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=: read -r name major minor <<<"$n"; mknod -m 666 "/dev/$name" c "$major" "$minor"
done
ln -s /proc/self/fd /dev/fd
mknod -m 666 /dev/nvidia0 c 195 0; mknod -m 666 /dev/nvidia1 c 195 1; mknod -m 666 /dev/nvidiactl c 195 255
exec "$@"
"""


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fracgpu-gpucheck-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def bundle(base: Path) -> Path:
    out = base / "bundle"
    manifest = gpu_bundle.build(out, (PYTHON,))
    assert int(str(manifest["bytes"])) < gpu_bundle.CARRY_LIMIT_BYTES
    return out


@pytest.fixture(scope="module")
def driver(base: Path) -> DriverInstall:
    return make_faithful_driver_root(base / "root", PROFILE, base / "build")


def check(
    bundle: Path, driver_root: Path, nvml_dir: Path, *extra: str, cgroup_v2: bool = False, **env: str
) -> tuple[int, str]:
    """Run check.sh as the device machine would (python3 from PATH), with ``cgroup_v2`` in the namespace above;
    its exit status and output."""
    argv = [str(CHECK), "--bundle", str(bundle), "--driver-root", str(driver_root), "--nvml-library-dir", str(nvml_dir)]
    if cgroup_v2:
        argv = ["unshare", "-m", "bash", "-c", CGROUP_V2_NAMESPACE, "cgroup-v2", *argv]
    environ = {**os.environ, "FRACGPU_MOCK_NVML_DEV_ROOT": str(driver_root), **env}
    environ.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        [*argv, *extra], capture_output=True, text=True, timeout=240, env=environ, cwd="/", check=False
    )
    return done.returncode, done.stdout + done.stderr


def test_the_bundle_carries_the_locked_versions(bundle: Path) -> None:
    """The wheels the device machine installs are constraints.txt's pins, the versions `make venv` and CI test."""
    carried = dict(line.split("==") for line in (bundle / "requirements.txt").read_text().split())
    pins = lock.read_pins()
    assert {n: pins[canonicalize_name(n)] for n in carried} == {n: Version(v) for n, v in carried.items()}
    assert {"pydantic-settings", "nvidia-ml-py"} <= {canonicalize_name(n) for n in carried}


def mps_leftovers(driver: DriverInstall) -> list[str]:
    """The MPS roots the check makes (/tmp/fgm-*) and the mock driver's daemons and servers still running."""
    found = [str(p) for p in Path("/tmp").glob("fgm-*")]
    for exe in Path("/proc").glob("[0-9]*/exe"):
        try:
            target = os.readlink(exe)
        except OSError:
            continue
        if target.startswith(str(driver.root)) and "mps" in target:
            found.append(f"{exe.parent.name}: {target}")
    return found


def mps_part(out: str, head: str) -> str:
    """The lines of the check's output from the first line starting with `head` to the next top-level line."""
    lines = out.split(f"[gpu-check] {head}", 1)[1].splitlines()
    kept = [lines[0]]
    for line in lines[1:]:
        if not line.startswith("[gpu-check]   "):
            break
        kept.append(line)
    return "\n".join(kept)


def test_the_check_passes_and_the_container_sees_exactly_the_granted_gpu(bundle: Path, driver: DriverInstall) -> None:
    assert mps_leftovers(driver) == []
    rc, out = check(bundle, driver.root, driver.libdir, "--keep")
    kept = re.search(r"work dir kept: (\S+)", out)
    assert kept is not None, out
    work = Path(kept.group(1))
    try:
        assert rc == 0, out
        assert "[gpu-check] PASS" in out, out
        assert "[gpu-check] NVML GPUs: 2" in out, out  # the host sees both GPUs...
        assert f"granted: 10240 MiB of {GPU0}" in out, out
        # the MPS step: the mock driver's daemon enforces each share's limits in its client
        assert "[gpu-check] MPS: ceiling 20480 MiB / 50 % set on the daemon" in out, out
        for mib, percent, above in ((10240, 30, 12288), (20480, 50, 24576)):
            head = (
                f"[gpu-check] MPS client {mib} MiB / {percent} %: tier mps, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M"
            )
            client = out.split(head, 1)[1].split("[gpu-check] MPS client", 1)[0].split("[gpu-check] PASS", 1)[0]
            assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}" in client, out
            assert (
                f"sees {GPU0}: memory total 81920 MiB" in client and f"multiprocessors {132 * percent // 100}" in client
            )
            assert f"cuMemAlloc {above} MiB: CUDA_ERROR_OUT_OF_MEMORY" in client, out
            assert f"cuMemAlloc {mib * 8 // 10} MiB: CUDA_SUCCESS" in client, out
            # the pipe directory is read-only in the container, and a client held open through it is the daemon's
            assert "pipe directory /run/fracgpu-mps/pipe: mount options ro," in client, out
            assert (
                "a write into it refused: touch: /run/fracgpu-mps/pipe/fracgpu-write-test: Read-only file system"
                in (client)
            ), out
            held = re.search(
                r"held client \(cuMemAlloc 1 MiB: CUDA_SUCCESS\); .*; server (\d+): clients (\d+)$", client, re.M
            )
            assert held is not None, out
            assert "read-only pipe directory: the client connected through it and works" in client, out
        # the default limit as the daemon prints it after the plugin's set, read back as it was set
        sent = "[gpu-check] MPS: `get_default_device_pinned_mem_limit 0` prints '20480M' after the plugin set 20480M"
        assert sent + " (the form the plugin sends)" in out, out
        for when in ("right after the plugin set the ceiling", "with the shares' server running"):
            assert f"[gpu-check] MPS: MpsLimits.repair twice {when}: nothing changed; nothing changed" in out, out
        assert re.search(r"MPS: server \d+ prints its limits as '20480M' / '50\.0'", out), out
        # control commands from a share's container reach the daemon; the plugin's repair finds and undoes them
        control = mps_part(out, "MPS control from a share's container (uid 0,")
        assert "`get_default_device_pinned_mem_limit 0` answered '20480M' (exit 0)" in control, out
        assert "`set_default_active_thread_percentage 100` answered '(nothing)' (exit 0)" in control, out
        assert "`get_default_active_thread_percentage` answered '100.0' (exit 0)" in control, out
        assert (
            "MpsLimits.repair (the node plugin's refresh) found: the daemon's defaults are pinned memory 20480M, "
            "active threads 100.0 %, not pinned memory 20480M, active threads 50.0 %; set back: the daemon's "
            "defaults are pinned memory 20480M, active threads 50.0 %"
        ) in control, out
        # the client cap: the mock server takes 48 (Volta and later) and refuses the 49th with 808
        cap = re.search(
            r"MPS client cap \(one share's container, the plugin publishes mpsClients 48\): (.*)$", out, re.M
        )
        assert cap is not None, out
        assert re.fullmatch(
            r"48 clients taken in \d+ s; client 49 refused: cuInit CUDA_ERROR_MPS_MAX_CLIENTS_REACHED \(808\), as documented",
            cap.group(1),
        ), out
        # a share of a second trust domain commands its own daemon; the first domain's reads as before
        other = mps_part(out, "MPS second trust domain namespace/gpu-check-other: its own daemon")
        assert "the GPU's compute mode is DEFAULT (left as it is)" in other, out
        assert "its client (10240 MiB / 30 %): sees " + GPU0 in other and "cuMemAlloc 64 MiB: CUDA_SUCCESS" in other
        assert "its container: `set_default_device_pinned_mem_limit 0 81920M` answered '(nothing)' (exit 0)" in other
        assert "its container: `get_default_device_pinned_mem_limit 0` answered '81920M' (exit 0)" in other, out
        assert "its daemon: defaults pinned memory 81920M, active threads 100.0 %, servers [" in other, out
        first = re.search(r"the first domain's daemon: defaults (.*?), servers (.*): (\S+);", other)
        assert first is not None, out
        assert first.group(1) == "pinned memory 20480M, active threads 50.0 %", out
        assert first.group(3) == "unchanged", out
        # every daemon the check started is gone, and its directories
        assert mps_leftovers(driver) == [], out
        smi = out.split("container nvidia-smi -L (exit 0):", 1)[1].split("container CUDA probe", 1)[0]
        assert GPU0 in smi and GPU1 not in smi, out  # ...the container only the granted one
        assert "device count 1" in out and f"device 0: NVIDIA H100 80GB HBM3 {GPU0}" in out, out
        assert "container NVIDIA_VISIBLE_DEVICES=void" in out, out
        assert "hooks (4): create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification" in out
        # our detection on this hybrid-v1 machine: the driver could set limits, the cgroup rules nvml out
        assert f"[gpu-check] cgroup v2 at /sys/fs/cgroup: {V1_REASON}" in out, out
        assert "[gpu-check]   gpu-0: NVML memory-limits probe: supported" in out, out
        hami = "HAMi-core's library /usr/local/vgpu/libvgpu.so is not on this node"
        for gpu in ("gpu-0", "gpu-1"):
            line = (
                f"[gpu-check] enforcement {gpu}: available none; hami-core not available: {hami}; mps not available: "
                f"it is not an MPS GPU (chart value mps.gpus, plugin flag --mps-gpus); nvml not available: {V1_REASON}\n"
            )
            assert line in out, out
        assert "[gpu-check] claim tier: none; spec hooks apply-cuda-memory-limits: none" in out, out
        assert "container CUDA probe 12288 MiB" not in out, out  # no cap to check
        # the MIG step: GPU 1 could do MIG but its mode is off, which the check never changes
        assert "[gpu-check] MIG gpu-1: disabled\n" in out, out
        assert "[gpu-check] MIG: skipped: no GPU has MIG mode on" in out, out
        verdict = re.search(r"^\[gpu-check\] PASS: .*$", out, re.MULTILINE)
        assert verdict is not None, out
        assert verdict.group(0).endswith(f"; nvml not available: {V1_REASON}; memory cap not checked"), out
        # NVIDIA's runtime, not our code, applied our spec: its log names the injected device.
        device = re.search(r"CDI device: (\S+)", out)
        assert device is not None, out
        assert (
            f"Injecting devices using CDI: [{device.group(1)}]" in (work / "nvidia-container-runtime.log").read_text()
        )
        spec_path = re.search(r"claim spec: (\S+\.json)", out)
        assert spec_path is not None, out
        spec = json.loads(Path(spec_path.group(1)).read_text())
        nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
        assert "/dev/nvidia0" in nodes and "/dev/nvidia1" not in nodes
        dev = out.split("container /dev:", 1)[1].split("\n", 1)[0].split()
        assert "nvidia0" in dev and "nvidia1" not in dev, out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_an_mps_server_that_takes_fewer_clients_than_the_plugin_publishes_fails_the_check(
    bundle: Path, driver: DriverInstall
) -> None:
    """The mock daemon's cap lowered to 8 (FRACGPU_MOCK_MPS_MAX_CLIENTS, which the check passes to the daemons it
    starts): the scheduler would place shares the server refuses, and the check says so."""
    rc, out = check(bundle, driver.root, driver.libdir, FRACGPU_MOCK_MPS_MAX_CLIENTS="8")
    assert rc == 1, out
    refused = "client 9 refused: cuInit CUDA_ERROR_MPS_MAX_CLIENTS_REACHED (808)"
    assert re.search(rf"mpsClients 48\): 8 clients taken in \d+ s; {re.escape(refused)}, as documented$", out, re.M), (
        out
    )
    verdict = re.search(r"^\[gpu-check\] FAIL: (.*)$", out, re.M)
    assert verdict is not None, out
    assert verdict.group(1) == (  # the only reason: every other part held
        f"the MPS server took 8 clients, fewer than the 48 the plugin publishes as mpsClients ({refused})"
    ), out
    assert mps_leftovers(driver) == [], out


def test_a_driver_root_without_libraries_fails_with_what_to_fix(
    bundle: Path, driver: DriverInstall, base: Path
) -> None:
    bare = make_driver_root(base / "bare-root", PROFILE)  # device nodes, no driver files
    rc, out = check(bundle, bare, driver.libdir)  # NVML still answers (discovery works), nvidia-ctk finds nothing
    assert rc == 1, out
    assert f"[gpu-check] FAIL: driver edits (nvidia-ctk): nvidia-ctk cdi generate on driver root {bare} exited" in out
    assert f"libcuda.so.{driver.version}: not found" in out, out  # the generator's own words
    assert "PASS" not in out


def test_an_old_python_is_refused_with_what_to_do(bundle: Path, driver: DriverInstall, base: Path) -> None:
    fake = base / "python3.10"
    fake.write_text('#!/bin/sh\ncase "$*" in *"< (3, 11)"*) exit 1 ;; *) echo 3.10 ;; esac\n')
    fake.chmod(0o755)
    rc, out = check(bundle, driver.root, base / "root" / LIBDIR, FRACGPU_GPU_CHECK_PYTHON=str(fake))
    assert rc == 2, out
    assert f"FAIL: {fake} is Python 3.10; the check needs CPython >= 3.11" in out, out


def test_at_the_nvml_tier_the_hook_runs_and_an_uncapped_driver_fails_the_check(bundle: Path, base: Path) -> None:
    if not (UNIFIED / "cgroup.procs").is_file():
        pytest.fail(f"{UNIFIED} is not a cgroup2 mount on this machine: the test needs the host's unified hierarchy")
    record = base / "limits.jsonl"
    profile = base / "recording.profile"
    profile.write_text(PROFILE.read_text() + f"\nmemory_limits_record = {record}\n")
    driver = make_faithful_driver_root(base / "root-v2", profile, base / "build-v2")
    rc, out = check(bundle, driver.root, driver.libdir, "--keep", cgroup_v2=True)
    kept = re.search(r"work dir kept: (\S+)", out)
    assert kept is not None, out
    work = Path(kept.group(1))
    try:
        assert "[gpu-check] cgroup v2 at /sys/fs/cgroup: yes" in out, out
        assert "[gpu-check] enforcement gpu-0: available none, nvml; hami-core not available:" in out, out
        hook = re.search(r"\[gpu-check\] claim tier: nvml; spec hooks apply-cuda-memory-limits: (.*)", out)
        assert hook is not None, out
        assert hook.group(1).startswith("createRuntime ") and f"--gpu-id {GPU0}" in hook.group(1), out
        assert "container NVIDIA_GPU_MEMORY_LIMIT=10240" in out, out
        # NVIDIA's hook ran for the container and asked the driver to cap its cgroup at the grant
        calls = [json.loads(line) for line in record.read_text().splitlines()]
        assert len(calls) == 1, calls
        (call,) = calls
        assert call["uuid"] == GPU0 and call["hard"] == call["soft"] == 10240 * 1024 * 1024, call
        assert re.fullmatch(r"/sys/fs/cgroup/fracgpu-gpu-check/fracgpu-gpu-check-\d+", call["cgroup"]), call
        # the mock caps nothing: the check sees the 12 GiB allocation succeed and fails, saying so
        assert "container CUDA probe 12288 MiB, cap 10240 MiB (exit 0): cuMemAlloc CUDA_SUCCESS" in out, out
        assert rc == 1, out
        assert "memory cap not enforced: cuMemAlloc of 12288 MiB succeeded in a container capped at 10240 MiB" in out, (
            out
        )
        assert "PASS" not in out
        assert not list(UNIFIED.glob("fracgpu-gpu-check")), "the check left its cgroup behind"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_mig_step_makes_the_smallest_partition_and_the_container_sees_only_it(bundle: Path, base: Path) -> None:
    state = base / "mig-state"
    state.mkdir()
    profile = base / "mig.profile"
    profile.write_text(PROFILE.read_text().replace("gpu.1.mig_mode = disabled", "gpu.1.mig_mode = enabled"))
    driver = make_faithful_driver_root(base / "root-mig", profile, base / "build-mig")
    rc, out = check(bundle, driver.root, driver.libdir, "--no-mps", FRACGPU_MOCK_NVML_STATE_DIR=str(state))
    assert rc == 0, out
    assert (
        "[gpu-check] MIG gpu-1: enabled, 8 memory / 7 compute slices; profiles 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb, 1g.20gb\n"
        in out
    )
    assert "MPS:" not in out, out
    # the smallest profile, at the highest of its placements (small partitions fill a GPU from the top)
    assert "the smallest, 1g.10gb (9984 MiB, 16 SMs), at placements 6, 5, 4, 3, 2, 1, 0" in out, out
    made = re.search(
        r"\[gpu-check\] MIG: made 1g\.10gb at placement 6 of (\S+): .* (MIG-[0-9a-f-]+), 9984 MiB, 16 SMs", out
    )
    assert made is not None and made.group(1) == GPU1, out
    mig = made.group(2)
    nodes = re.search(r"^\[gpu-check\] MIG: claim tier mig; spec device nodes (.*)$", out, re.MULTILINE)
    assert nodes is not None, out
    gpu_nodes = [n for n in nodes.group(1).split() if re.fullmatch(r"/dev/nvidia\d+", n)]
    caps = [n for n in nodes.group(1).split() if n.startswith("/dev/nvidia-caps/")]
    assert gpu_nodes == ["/dev/nvidia1"] and len(caps) == 2, out  # the GPU's node, the GI's and CI's capabilities
    smi = re.findall(r"^\[gpu-check\] MIG container nvidia-smi -L: (.*)$", out, re.MULTILINE)
    assert len(smi) == 2 and GPU1 in smi[0] and smi[1].strip().startswith("MIG 1g.10gb") and mig in smi[1], out
    assert f"MIG container CUDA probe: device 0 {mig}: memory total 9984 MiB" in out, out
    assert "multiprocessors 16" in out and "MIG container NVIDIA_VISIBLE_DEVICES=void" in out, out
    assert f"[gpu-check] MIG: destroyed {mig}" in out, out
    assert "[gpu-check] PASS" in out, out
    held = (state / f"mig.{GPU1}").read_text().splitlines()  # the mock driver's instances: none left
    assert not [line for line in held if line.startswith(("gi ", "ci "))], held
