"""Run one command in a container that gets a CDI device, applied by NVIDIA's runtime, not by our code.

``nvidia-container-runtime`` in ``cdi`` mode (its config file named by ``NVIDIA_CTK_CONFIG_FILE_PATH``) reads the
device from the bundle's ``cdi.k8s.io/`` annotation, resolves it in our spec directory and applies the spec's
edits (device nodes and their cgroup rules, mounts, hooks, env) to ``config.json`` before handing ``create`` to
runc. The bundle's ``config.json`` starts as ``runc spec``'s template. The container gets its own cgroup
``/fracgpu-gpu-check/<name>`` (``linux.cgroupsPath``, cgroupfs driver: on cgroup v2 a directory of the unified
hierarchy, the one NVIDIA's ``apply-cuda-memory-limits`` hook resolves from ``/proc/<pid>/cgroup`` and caps);
the parent is removed again after the container. Every call has a timeout.

Against the simulated driver only (tests/integration/test_gpu_check.py), ``Runtime.simulated_state`` names the
mock driver's state directory (``FRACGPU_MOCK_NVML_STATE_DIR``: its MIG instances, the stand-in for the kernel's),
bind-mounted read-only into the container at the same path and named in its environment, as the e2e test pods
mount it. A real driver needs nothing of the kind.
"""

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANNOTATION = "cdi.k8s.io/fracgpu-gpu-check"
CGROUP_PARENT = "fracgpu-gpu-check"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTAINER_PATH = "PATH=/usr/local/bin:/usr/bin:/bin"
STATE_ENV = "FRACGPU_MOCK_NVML_STATE_DIR"


class ContainerError(Exception):
    """The container could not be created or run; the message has the runtime's own words."""


@dataclass(frozen=True)
class Runtime:
    """The runtimes and where their state goes."""

    nvidia_container_runtime: Path
    runc: Path
    work: Path  # config, runc state, logs
    timeout_s: float = 30.0
    simulated_state: Path | None = None
    """The mock driver's state directory, given to the container (see the module docstring); None on a real one."""

    @property
    def config_file(self) -> Path:
        return self.work / "nvidia-container-runtime.toml"

    @property
    def log_file(self) -> Path:
        return self.work / "nvidia-container-runtime.log"

    @property
    def state_dir(self) -> Path:
        return self.work / "runc-state"


def runtime_config(runc: Path, spec_dir: Path, log_file: Path, default_kind: str) -> str:
    """nvidia-container-runtime's config.toml: cdi mode, devices from annotations in ``spec_dir``, runc."""
    q = json.dumps  # a JSON string of plain paths is a TOML basic string
    return (
        "[nvidia-container-runtime]\n"
        f"debug = {q(str(log_file))}\n"
        'log-level = "debug"\n'
        'mode = "cdi"\n'
        f"runtimes = [{q(str(runc))}]\n\n"
        "[nvidia-container-runtime.modes.cdi]\n"
        'annotation-prefixes = ["cdi.k8s.io/"]\n'
        f"default-kind = {q(default_kind)}\n"
        f"spec-dirs = [{q(str(spec_dir))}]\n"
    )


def _run(argv: list[str], what: str, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, text=True, timeout=timeout, check=False, **kwargs)
    except subprocess.TimeoutExpired:
        raise ContainerError(f"{what} did not finish within {timeout:g} s") from None
    except OSError as err:
        raise ContainerError(f"{what} could not be started: {err}") from None
    return done


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""


def bundle_config(
    template: dict[str, Any],
    rootfs: Path,
    args: list[str],
    cdi_device: str,
    name: str,
    *,
    simulated_state: Path | None = None,
) -> dict[str, Any]:
    """``runc spec``'s template with our root, process, cgroup ``/fracgpu-gpu-check/<name>`` and the CDI device
    annotation (and the simulated driver's state, see the module docstring)."""
    config = dict(template)
    config["linux"] = {**template.get("linux", {}), "cgroupsPath": f"/{CGROUP_PARENT}/{name}"}
    config["root"] = {"path": str(rootfs), "readonly": False}
    env = [CONTAINER_PATH]
    if simulated_state is not None:
        state = str(simulated_state)
        mount = {"destination": state, "type": "bind", "source": state, "options": ["rbind", "ro"]}
        config["mounts"] = [*(template.get("mounts") or []), mount]
        env.append(f"{STATE_ENV}={state}")
    config["process"] = {**template["process"], "terminal": False, "args": args, "env": env}
    config["annotations"] = {**(template.get("annotations") or {}), ANNOTATION: cdi_device}
    config["hostname"] = "fracgpu-gpu-check"
    return config


def run_with_device(runtime: Runtime, rootfs: Path, args: list[str], cdi_device: str, default_kind: str) -> str:
    """Create, start and wait for a container running ``args`` with ``cdi_device``; its stdout and stderr.

    Raises ContainerError with the runtime's log when any step fails or times out.
    """
    rt, work = runtime, runtime.work
    bundle = work / "oci-bundle"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").unlink(missing_ok=True)  # runc spec writes a new one (one bundle per container run)
    rt.config_file.write_text(runtime_config(rt.runc, work / "cdi", rt.log_file, default_kind))
    spec = _run([str(rt.runc), "spec", "--bundle", str(bundle)], "runc spec", rt.timeout_s, capture_output=True)
    if spec.returncode != 0:
        raise ContainerError(f"runc spec exited with {spec.returncode}: {spec.stderr.strip()}")
    name = f"fracgpu-gpu-check-{time.time_ns()}"
    template = json.loads((bundle / "config.json").read_text())
    config = bundle_config(template, rootfs, args, cdi_device, name, simulated_state=rt.simulated_state)
    (bundle / "config.json").write_text(json.dumps(config, indent=2))
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": str(rt.config_file), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    runc = [str(rt.runc), "--root", str(rt.state_dir)]
    output = work / "container.out"
    runc_log = work / "runc.log"
    create = [str(rt.nvidia_container_runtime), "--root", str(rt.state_dir), "--log", str(runc_log)]
    try:
        with output.open("w") as out:
            done = _run(
                [*create, "create", "--bundle", str(bundle), name],
                "nvidia-container-runtime create",
                rt.timeout_s,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        if done.returncode != 0:
            raise ContainerError(
                f"nvidia-container-runtime create exited with {done.returncode}:\n{_tail(output)}\n"
                f"runc log:\n{_tail(runc_log)}\nnvidia-container-runtime log:\n{_tail(rt.log_file)}"
            )
        started = _run([*runc, "start", name], "runc start", rt.timeout_s, capture_output=True)
        if started.returncode != 0:
            raise ContainerError(f"runc start exited with {started.returncode}: {started.stderr.strip()}")
        _wait_stopped(runc, name, rt.timeout_s)
        return output.read_text(errors="replace")
    finally:
        _run([*runc, "delete", "--force", name], "runc delete", rt.timeout_s, capture_output=True)
        remove_cgroup_parent()


def remove_cgroup_parent(root: Path = CGROUP_ROOT) -> None:
    """Remove the (then empty) ``fracgpu-gpu-check`` cgroup runc created, in the v2 hierarchy and every v1 one."""
    for parent in [root / CGROUP_PARENT, *root.glob(f"*/{CGROUP_PARENT}")]:
        with contextlib.suppress(OSError):  # not there, or in use by another check: nothing of ours to clean
            parent.rmdir()


def _wait_stopped(runc: list[str], name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = _run([*runc, "state", name], "runc state", timeout, capture_output=True)
        if state.returncode != 0:
            raise ContainerError(f"runc state exited with {state.returncode}: {state.stderr.strip()}")
        if json.loads(state.stdout).get("status") == "stopped":
            return
        if time.monotonic() > deadline:
            raise ContainerError(f"the container did not finish within {timeout:g} s")
        time.sleep(0.1)
