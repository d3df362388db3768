"""The NVIDIA device nodes a GPU share needs, checked on the host before any CDI spec names them."""

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
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


def _stat_node(driver_root: Path, name: str) -> HostDeviceNode | None:
    host_path = driver_root / "dev" / name
    try:
        st = host_path.stat()
    except FileNotFoundError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        raise DeviceNodeError(f"{host_path} exists but is not a character device; check the driver root")
    return HostDeviceNode(f"/dev/{name}", host_path, os.major(st.st_rdev), os.minor(st.st_rdev))


def gpu_device_nodes(driver_root: Path, minor: int) -> list[HostDeviceNode]:
    """`/dev/nvidia<minor>` and the control nodes (plus nvidia-modeset when present), each stat-ed.

    Raises DeviceNodeError naming the missing path: a spec without its device nodes would start a
    container that has no GPU.
    """
    nodes: list[HostDeviceNode] = []
    for name in (f"nvidia{minor}", *CONTROL_NODES):
        node = _stat_node(driver_root, name)
        if node is None:
            raise DeviceNodeError(
                f"device node {driver_root / 'dev' / name} does not exist; is the NVIDIA driver loaded "
                f"(nvidia-smi creates the nodes; nvidia-modprobe -u -c=0 creates nvidia-uvm) and is the "
                f"driver root ({driver_root}) right?"
            )
        nodes.append(node)
    nodes += [n for n in (_stat_node(driver_root, name) for name in OPTIONAL_NODES) if n is not None]
    return nodes


def _is_node(path: Path, node: HostDeviceNode) -> bool:
    """True if `path` (followed) is a character device with the node's major:minor."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (node.major, node.minor)


def ensure_char_links(dev_char_dir: Path, nodes: list[HostDeviceNode]) -> None:
    """Make `/dev/char/<major>:<minor>` lead to each node, so systemd's device rules keep granting access after
    `systemctl daemon-reload`. An entry that already leads to that device (e.g. udev's) is kept; a dangling
    symlink or one leading elsewhere is replaced atomically; anything else there is reported, never touched.
    Problems are logged, never raised: the container can start without the link."""
    try:
        dev_char_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("cannot create the /dev/char directory", extra={"path": str(dev_char_dir), "error": str(err)})
        return
    for node in nodes:
        link = dev_char_dir / f"{node.major}:{node.minor}"
        if _is_node(link, node):
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
