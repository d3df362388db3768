"""Where a GPU sits on the host: its PCIe root complex and NUMA node, read from sysfs as Kubernetes defines the
standard device attributes ``resource.kubernetes.io/pcieRoot`` and ``resource.kubernetes.io/numaNode``.

- pcieRoot: ``<sys>/bus/pci/devices/<bus id>`` is a link into ``<sys>/devices/pci<domain>:<bus>/.../<bus id>``
  (the directories of ``devices`` follow the hardware: the root complex, then each bridge on the way); the first
  directory under ``devices`` is the root complex and its name the value, ``pci0000:17``.
- numaNode: the integer in ``<sys>/bus/pci/devices/<bus id>/numa_node``; ``-1`` means the device has no NUMA
  affinity, and then the attribute is left out (a ``-1`` would match every other device without one).

Whatever cannot be read or does not have that form is left out (logged at debug level), never guessed.
"""

import logging
import os
import re
from pathlib import Path

__all__ = ["MAX_NUMA_NODES", "numa_node", "pcie_root"]

log = logging.getLogger(__name__)

MAX_NUMA_NODES = 1024
"""Linux's largest MAX_NUMNODES: a NUMA node of this number or more is no NUMA node."""
_BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ROOT = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")


def _device_link(sys_root: Path, bus_id: str) -> Path | None:
    if _BUS_ID.fullmatch(bus_id) is None:
        log.debug("no PCI topology for a bus id sysfs cannot name", extra={"pci_bus_id": bus_id})
        return None
    return sys_root / "bus" / "pci" / "devices" / bus_id


def pcie_root(sys_root: Path, bus_id: str) -> str | None:
    """The PCIe root complex (``pci<domain>:<bus>``) of the device at ``bus_id`` (lower-case ``dddd:bb:dd.f``)
    under ``sys_root`` (the host's ``/sys``); None when the link is missing or does not lead to such a root."""
    link = _device_link(sys_root, bus_id)
    if link is None:
        return None
    try:
        target = os.readlink(link)
    except OSError as err:
        log.debug("no pcieRoot: cannot read the device's link", extra={"path": str(link), "error": str(err)})
        return None
    # resolved as text, not through the file system: the link's own words say where the device sits
    resolved = Path(os.path.normpath(target if os.path.isabs(target) else link.parent / target))
    try:
        parts = resolved.relative_to(os.path.normpath(sys_root)).parts
    except ValueError:
        parts = ()
    if len(parts) < 3 or parts[0] != "devices" or parts[-1] != bus_id or _ROOT.fullmatch(parts[1]) is None:
        log.debug(
            "no pcieRoot: the device's link does not lead to <sys>/devices/pci<domain>:<bus>/.../<bus id>",
            extra={"path": str(link), "target": target},
        )
        return None
    return parts[1]


def numa_node(sys_root: Path, bus_id: str) -> int | None:
    """The NUMA node of the device at ``bus_id`` under ``sys_root``; None when its ``numa_node`` file is missing or
    unreadable, or says ``-1`` (no NUMA affinity) or a number that is no NUMA node."""
    link = _device_link(sys_root, bus_id)
    if link is None:
        return None
    path = link / "numa_node"
    try:
        text = path.read_text().strip()
    except OSError as err:
        log.debug("no numaNode: cannot read the device's numa_node", extra={"path": str(path), "error": str(err)})
        return None
    try:
        node = int(text)
    except ValueError:
        log.debug("no numaNode: numa_node is not a number", extra={"path": str(path), "value": text[:32]})
        return None
    if not 0 <= node < MAX_NUMA_NODES:
        log.debug("no numaNode: the device has no NUMA affinity", extra={"path": str(path), "value": node})
        return None
    return node
