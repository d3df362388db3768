"""The NVIDIA device nodes a GPU share needs: a snapshot of them taken on the host (the one place that stats
them for planning) before any CDI spec names them, and the ``/dev/char`` links that keep them reachable."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
OPTIONAL_NODES = ("nvidia-modeset",)


class DeviceNodeError(Exception):
    """A required device node is missing or is not a character device."""


@dataclass(frozen=True)
class HostDeviceNode:
    """A character device: where the container sees it and where it is on the host."""

    container_path: str
    host_path: Path
    major: int
    minor: int


@dataclass(frozen=True)
class DeviceNodeSnapshot:
    """The NVIDIA device nodes under ``<driver_root>/dev``, as seen once: what planning reads instead of the host.

    ``found``: node name (``nvidia0``, ``nvidiactl``, ...) -> the character device there, or a string saying why
    the entry there is unusable. A name that is absent was not there.
    """

    driver_root: Path
    found: Mapping[str, HostDeviceNode | str]

    @classmethod
    def of(cls, driver_root: Path, nodes: Mapping[str, tuple[int, int]]) -> DeviceNodeSnapshot:
        """A snapshot of character devices `name -> (major, minor)` under ``<driver_root>/dev`` (no stat)."""
        return cls(
            driver_root,
            {
                name: HostDeviceNode(f"/dev/{name}", driver_root / "dev" / name, mj, mn)
                for name, (mj, mn) in nodes.items()
            },
        )

    def gpu_nodes(self, minor: int) -> list[HostDeviceNode]:
        """`/dev/nvidia<minor>` and the control nodes (plus nvidia-modeset when present).

        Raises DeviceNodeError naming the missing or unusable path: a spec without its device nodes would start
        a container that has no GPU.
        """
        nodes: list[HostDeviceNode] = []
        for name in (f"nvidia{minor}", *CONTROL_NODES):
            node = self.found.get(name)
            if node is None:
                raise DeviceNodeError(
                    f"device node {self.driver_root / 'dev' / name} does not exist; is the NVIDIA driver loaded "
                    f"(nvidia-smi creates the nodes; nvidia-modprobe -u -c=0 creates nvidia-uvm) and is the "
                    f"driver root ({self.driver_root}) right?"
                )
            if isinstance(node, str):
                raise DeviceNodeError(node)
            nodes.append(node)
        nodes += [n for n in (self.found.get(name) for name in OPTIONAL_NODES) if isinstance(n, HostDeviceNode)]
        return nodes

    def cap_nodes(self, cap_minors: tuple[int, ...]) -> list[HostDeviceNode]:
        """``/dev/nvidia-caps/nvidia-cap<minor>`` of each MIG capability minor; DeviceNodeError when one is missing."""
        nodes = []
        for minor in cap_minors:
            name = cap_node_name(minor)
            node = self.found.get(name)
            if node is None:
                raise DeviceNodeError(
                    f"MIG capability node {self.driver_root / 'dev' / name} does not exist and could not be made "
                    "(the kernel lists no nvidia-caps major in /proc/devices: is the NVIDIA driver loaded?)"
                )
            if isinstance(node, str):
                raise DeviceNodeError(node)
            nodes.append(node)
        return nodes

    def with_found(self, more: Mapping[str, HostDeviceNode | str]) -> DeviceNodeSnapshot:
        """This snapshot with `more` entries (nodes stat-ed later, e.g. MIG capability nodes)."""
        return DeviceNodeSnapshot(self.driver_root, {**self.found, **more})

    def present(self, name: str) -> bool:
        """True if `name` is a character device in the snapshot."""
        return isinstance(self.found.get(name), HostDeviceNode)


CAPS_DIR = "nvidia-caps"
CAPS_DEVICE = "nvidia-caps"  # its name in /proc/devices


def cap_node_name(minor: int) -> str:
    """The name under /dev of MIG capability `minor`."""
    return f"{CAPS_DIR}/nvidia-cap{minor}"


def mig_cap_minors(minors_file: Path, gpu_minor: int, gpu_instance: int, compute_instance: int) -> tuple[int, int]:
    """The capability minors of a GPU instance and its compute instance, from the driver's table
    (``/proc/driver/nvidia-caps/mig-minors``: ``gpu<minor>/gi<g>/access <n>``, ``gpu<minor>/gi<g>/ci<c>/access <n>``).
    Raises DeviceNodeError naming the file or the missing line."""
    keys = (f"gpu{gpu_minor}/gi{gpu_instance}/access", f"gpu{gpu_minor}/gi{gpu_instance}/ci{compute_instance}/access")
    found: dict[str, int] = {}
    try:
        with open(minors_file, encoding="utf-8") as f:
            for line in f:
                name, _, value = line.strip().partition(" ")
                if name in keys and value.strip().isdigit():
                    found[name] = int(value)
    except OSError as err:
        raise DeviceNodeError(
            f"cannot read the driver's MIG capability table {minors_file} ({err.strerror or err}); is the NVIDIA "
            "driver loaded? (plugin setting --mig-minors-file)"
        ) from None
    missing = [k for k in keys if k not in found]
    if missing:
        raise DeviceNodeError(f"the driver's MIG capability table {minors_file} has no {', '.join(missing)}")
    return found[keys[0]], found[keys[1]]


def caps_major(proc_devices: Path) -> int | None:
    """The character major of ``nvidia-caps`` in the kernel's ``/proc/devices``; None when not listed."""
    try:
        text = proc_devices.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        number, _, name = line.strip().partition(" ")
        if name.strip() == CAPS_DEVICE and number.isdigit():
            return int(number)
    return None


def stat_cap_nodes(driver_root: Path, cap_minors: Iterable[int], major: int | None) -> dict[str, HostDeviceNode | str]:
    """The MIG capability nodes ``<driver_root>/dev/nvidia-caps/nvidia-cap<minor>``, made (mode 0444, as the driver's
    nvidia-modprobe makes them) where missing and `major` is known. A node that is missing afterwards is absent."""
    found: dict[str, HostDeviceNode | str] = {}
    for minor in cap_minors:
        name = cap_node_name(minor)
        host_path = driver_root / "dev" / name
        try:
            st = os.stat(host_path)
        except FileNotFoundError:
            if major is None:
                continue
            try:
                host_path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                os.mknod(host_path, 0o444 | stat.S_IFCHR, os.makedev(major, minor))
                os.chmod(host_path, 0o444)
                st = os.stat(host_path)
            except OSError as err:
                found[name] = f"cannot make MIG capability node {host_path} ({err.strerror or err})"
                continue
        except OSError as err:
            found[name] = f"cannot stat MIG capability node {host_path} ({err.strerror or err})"
            continue
        if not stat.S_ISCHR(st.st_mode) or os.minor(st.st_rdev) != minor:
            found[name] = f"{host_path} exists but is not the character device of MIG capability {minor}"
            continue
        found[name] = HostDeviceNode(f"/dev/{name}", host_path, os.major(st.st_rdev), os.minor(st.st_rdev))
    return found


def node_names(minors: Iterable[int]) -> list[str]:
    """The device node names GPUs of `minors` may need: theirs, the control nodes and the optional ones."""
    return [*(f"nvidia{m}" for m in minors), *CONTROL_NODES, *OPTIONAL_NODES]


def snapshot(driver_root: Path, minors: Iterable[int]) -> DeviceNodeSnapshot:
    """Stat the device nodes GPUs of `minors` need under ``<driver_root>/dev`` (one stat each, no errors)."""
    dev = f"{driver_root}/dev"
    found: dict[str, HostDeviceNode | str] = {}
    for name in node_names(minors):
        try:
            st = os.stat(f"{dev}/{name}")
        except OSError:
            continue
        found[name] = _node(dev, name, st.st_mode, st.st_rdev)
    return DeviceNodeSnapshot(driver_root, found)


@lru_cache(maxsize=1024)
def _node(dev: str, name: str, mode: int, rdev: int) -> HostDeviceNode | str:
    """The node `name` under the directory `dev` as one stat found it (the same stat, the same object: the path
    objects are made once per node, not on every call)."""
    host_path = Path(dev, name)
    if not stat.S_ISCHR(mode):
        return f"{host_path} exists but is not a character device; check the driver root"
    return HostDeviceNode(f"/dev/{name}", host_path, os.major(rdev), os.minor(rdev))


def _links_to(link: Path, target: Path) -> bool:
    """True if `link` is a symlink whose text is `target` (the link this module makes for the node there)."""
    try:
        return os.readlink(link) == str(target)
    except OSError:
        return False


def _is_node(path: Path, node: HostDeviceNode) -> bool:
    """True if `path` (followed) is a character device with the node's major:minor."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (node.major, node.minor)


def ensure_char_links(dev_char_dir: Path, nodes: list[HostDeviceNode]) -> None:
    """Make `/dev/char/<major>:<minor>` lead to each node, so systemd's device rules keep granting access after
    `systemctl daemon-reload`. An entry that already leads to that device (e.g. udev's), or is the symlink to the
    node's host path this function makes, is kept; a dangling
    symlink or one leading elsewhere is replaced atomically; anything else there is reported, never touched.
    Problems are logged, never raised: the container can start without the link."""
    try:
        dev_char_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("cannot create the /dev/char directory", extra={"path": str(dev_char_dir), "error": str(err)})
        return
    for node in nodes:
        link = dev_char_dir / f"{node.major}:{node.minor}"
        if _links_to(link, node.host_path) or _is_node(link, node):
            continue
        if link.exists() and not link.is_symlink():
            log.warning(
                "a non-symlink is in the way of a /dev/char link; remove it so systemd can find the device",
                extra={"link": str(link), "device": str(node.host_path), "found": _kind(link)},
            )
            continue
        if link.is_symlink():
            log.warning(
                "repairing a stale /dev/char link",
                extra={"link": str(link), "target": os.readlink(link), "device": str(node.host_path)},
            )
        tmp = dev_char_dir / f".{link.name}.fracgpu.tmp"
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(node.host_path)
            os.replace(tmp, link)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("cannot create /dev/char link", extra={"link": str(link), "error": str(err)})


def _kind(path: Path) -> str:
    try:
        st = path.lstat()
    except OSError as err:
        return f"unreadable ({err})"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISREG(st.st_mode):
        return "regular file"
    if stat.S_ISCHR(st.st_mode):
        return f"character device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    return "special file"
