"""A private containerd 2.x (pinned, built from its Go module) run as a supervised child process.

    ctd = Containerd(state_dir)             # config, root, state and socket under state_dir
    ctd.start()                             # returns once `ctr version` answers
    ctd.ctr("images", "import", "img.tar")  # ctr against this containerd
    ctd.stop()                              # kills its containers, stops it, unmounts what it left

The CRI plugin is configured for a kubelet (issue #6): CDI spec dirs, cgroupfs (no systemd here), a local
sandbox image, CNI dirs; `ContainerdSettings.extra` deep-merges any further config (e.g. another runtime handler),
`ContainerdSettings.env` adds to containerd's environment (its shims and runtimes inherit it). runc comes from Debian
(apt-get installs it when missing); containerd-shim-runc-v2 is built with containerd and ctr (build-binaries.sh).
"""

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from harness.cluster import binaries
from harness.cluster.processes import ProcessGroup, stop_recorded
from harness.image import hosttools

SHIM = "containerd-shim-runc-v2"
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes; containerd appends ".ttrpc" for its second socket
SHIM_SOCKET_DIR_MAX = 42  # containerd's limit for socket_dir on Linux
DEFAULT_SANDBOX_IMAGE = "fracgpu.local/pause:3.10"


@dataclass
class ContainerdSettings:
    """What a test or cluster may want to change in the generated config (version 3)."""

    snapshotter: str = "overlayfs"  # "native" works on any filesystem, slower
    cdi_spec_dirs: list[str] = field(default_factory=lambda: ["/etc/cdi", "/var/run/cdi"])
    # CDI is always on in containerd >= 2.4 (ours), which warns about this key; 2.0-2.3 need enable_cdi=True.
    enable_cdi: bool | None = None  # None: leave the key out
    sandbox_image: str = DEFAULT_SANDBOX_IMAGE
    systemd_cgroup: bool = False  # cgroupfs: no systemd as PID 1 on our machines
    cni_bin_dirs: list[str] = field(default_factory=lambda: ["/opt/cni/bin"])
    cni_conf_dir: str = "/etc/cni/net.d"
    nri: bool = False  # NRI's socket (/var/run/nri/nri.sock) would be shared by every containerd on the host
    log_level: str = "info"
    extra: dict[str, Any] = field(default_factory=dict)  # deep-merged over the generated config
    env: dict[str, str] = field(default_factory=dict)  # containerd's extra environment; shims and runtimes inherit it


def _descendants(root: int) -> list[int]:
    """PIDs of every process below `root`, deepest last."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_shims(socket: Path) -> list[int]:
    """SIGKILL the shims of the containerd at `socket`, and their containers; return the shims' PIDs."""
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and SHIM in Path(cmdline[0].decode(errors="replace")).name and str(socket).encode() in cmdline:
            for pid in [*_descendants(int(proc.name)), int(proc.name)]:  # containers first, then the shim
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed.append(int(proc.name))
    return killed


def _short_dir(state_dir: Path, name: str) -> Path:
    """A short directory (for unix sockets) unique to `state_dir`."""
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:10]
    return Path("/run/fracgpu") / digest / name


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, recursively for tables."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class Containerd:
    """containerd with its config, root, state and socket under `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        *,
        settings: ContainerdSettings | None = None,
        socket: Path | None = None,
        namespace: str = "default",
        detached: bool = False,
        procs: ProcessGroup | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.settings = settings or ContainerdSettings()
        self.namespace = namespace
        self.owns_procs = procs is None  # a shared group (a whole cluster) is cleaned up by its owner
        self.procs = procs or ProcessGroup(self.state_dir, detached=detached)
        self.root = self.state_dir / "root"
        self.state = self.state_dir / "state"
        self.config_path = self.state_dir / "containerd.toml"
        self.bin_dir = self.state_dir / "bin"  # shim and runc, first on containerd's PATH
        default_socket = self.state_dir / "containerd.sock"
        if socket is None and len(str(default_socket)) > MAX_SOCKET_PATH:
            default_socket = _short_dir(self.state_dir, "containerd.sock")
        self.socket = (socket or default_socket).absolute()
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise ValueError(f"socket path longer than {MAX_SOCKET_PATH} bytes: {self.socket}")
        self.shim_socket_dir = _short_dir(self.state_dir, "s")
        self.bin: dict[str, Path] = {}
        self.runc = ""

    @property
    def address(self) -> str:
        return str(self.socket)

    def config(self) -> dict[str, Any]:
        """The containerd config (version 3) as nested dicts."""
        s = self.settings
        runtime: dict[str, Any] = {
            "cdi_spec_dirs": list(s.cdi_spec_dirs),
            "containerd": {
                "default_runtime_name": "runc",
                "runtimes": {
                    "runc": {
                        "runtime_type": "io.containerd.runc.v2",
                        "options": {"BinaryName": self.runc, "SystemdCgroup": s.systemd_cgroup},
                    }
                },
            },
            "cni": {"bin_dirs": list(s.cni_bin_dirs), "conf_dir": s.cni_conf_dir},
        }
        if s.enable_cdi is not None:
            runtime = {"enable_cdi": s.enable_cdi, **runtime}
        config: dict[str, Any] = {
            "version": 3,
            "root": str(self.root),
            "state": str(self.state),
            "grpc": {"address": str(self.socket)},
            "debug": {"level": s.log_level},
            "plugins": {
                "io.containerd.cri.v1.images": {
                    "snapshotter": s.snapshotter,
                    "pinned_images": {"sandbox": s.sandbox_image},
                },
                "io.containerd.cri.v1.runtime": runtime,
                "io.containerd.nri.v1.nri": {"disable": not s.nri},
                "io.containerd.shim.v1.manager": {"socket_dir": str(self.shim_socket_dir)},
                "io.containerd.internal.v1.opt": {"path": str(self.root / "opt")},
            },
        }
        return deep_merge(config, s.extra)

    def start(self, timeout: float = 60.0) -> None:
        """Ensure binaries (containerd, ctr, shim, runc), write the config, start, wait for `ctr version`."""
        self.bin = binaries.ensure_built("containerd", "ctr", SHIM)
        self.runc = hosttools.require_commands(hosttools.CONTAINER_RUNTIME_COMMANDS)["runc"]
        if self.owns_procs:
            stop_recorded(self.state_dir)  # leftovers of a run that was killed
        self._unmount_leftovers()
        for path in (self.root, self.state, self.bin_dir, self.socket.parent, self.shim_socket_dir):
            path.mkdir(parents=True, exist_ok=True)
        for name, target in ((SHIM, self.bin[SHIM]), ("runc", Path(self.runc))):
            link = self.bin_dir / name
            link.unlink(missing_ok=True)
            link.symlink_to(target)
        self.socket.unlink(missing_ok=True)
        self.config_path.write_text(tomli_w.dumps(self.config()))
        search = f"{self.bin_dir}:{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin"
        env = {**os.environ, **self.settings.env, "PATH": search}
        self.procs.start("containerd", [self.bin["containerd"], "--config", self.config_path], env=env)
        deadline = time.monotonic() + timeout
        while True:
            self.procs.check_alive("containerd")
            if self.socket.exists() and self.ctr("version", check=False, timeout=10).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"containerd did not answer within {timeout}s:\n{self.procs.log_tail('containerd')}")
            time.sleep(0.2)

    def ctr(
        self,
        *args: str | os.PathLike[str],
        check: bool = True,
        timeout: float | None = 120,
        namespace: str | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `ctr` against this containerd; raises with its output when `check` and it fails."""
        argv = [
            str(self.bin["ctr"]),
            "--address",
            self.address,
            "--namespace",
            namespace or self.namespace,
            *map(str, args),
        ]
        env = {**os.environ, "CONTAINERD_SNAPSHOTTER": self.settings.snapshotter}
        result = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, input=input, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[3:])} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return result

    def image_names(self, namespace: str | None = None) -> list[str]:
        return self.ctr("images", "list", "--quiet", namespace=namespace).stdout.split()

    def stop(self, timeout: float = 15.0) -> None:
        """Kill every task, stop containerd, unmount what it left under its root and state dirs."""
        if "containerd" in self.procs.procs and self.procs.procs["containerd"].poll() is None:
            with contextlib.suppress(Exception):
                self._kill_tasks()
        self.procs.stop("containerd", timeout)
        kill_shims(self.socket)  # any task the kill above missed would keep its mounts busy
        self._unmount_leftovers()
        shutil.rmtree(self.shim_socket_dir.parent, ignore_errors=True)  # shim sockets (and a short main socket)

    def _kill_tasks(self) -> None:
        for ns in self.ctr("namespaces", "list", "--quiet", timeout=10).stdout.split():
            for task in self.ctr("tasks", "list", "--quiet", namespace=ns, timeout=10).stdout.split():
                self.ctr("tasks", "kill", "--signal", "SIGKILL", "--all", task, namespace=ns, check=False, timeout=10)
                self.ctr("tasks", "delete", "--force", task, namespace=ns, check=False, timeout=30)
            for container in self.ctr("containers", "list", "--quiet", namespace=ns, timeout=10).stdout.split():
                self.ctr("containers", "delete", container, namespace=ns, check=False, timeout=30)

    def _unmount_leftovers(self) -> None:
        """Lazily unmount anything still mounted below our dirs (deepest first)."""
        prefixes = tuple(f"{p}/" for p in (self.root, self.state, self.shim_socket_dir.parent))
        mounts = []
        with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].replace("\\040", " ")
                if point.startswith(prefixes):
                    mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
