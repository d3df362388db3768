"""Seamless handover between two plugin instances of one node (rolling update, pod deletion).

An instance the kubelet accepted marks itself with a file next to its DRA socket
(``dra-<instance>.registered``), removed when it is withdrawn (SIGTERM) or stops. A terminating instance
keeps serving until another instance is *registered*: its marker exists and its DRA socket accepts
connections (a marker of an instance that died without cleaning up does not count). The kubelet keeps every
registered endpoint of a driver and calls the newest connected one, so once the replacement is registered
the old instance may go without a window in which the driver "is not registered".
"""

import logging
import socket
import time
from pathlib import Path

log = logging.getLogger(__name__)

MARKER_SUFFIX = ".registered"


def marker_path(dra_socket: Path) -> Path:
    """The marker of the instance serving ``dra_socket``."""
    return dra_socket.with_suffix(MARKER_SUFFIX)


def set_marker(dra_socket: Path, registered: bool) -> None:
    """Create (registered) or remove the marker of the instance serving ``dra_socket``."""
    marker = marker_path(dra_socket)
    if registered:
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


def _accepts_connections(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def registered_replacements(own_dra_socket: Path) -> list[Path]:
    """DRA sockets of the other live, registered instances of this driver on this node."""
    live = []
    for marker in sorted(own_dra_socket.parent.glob(f"dra*{MARKER_SUFFIX}")):
        other = marker.with_suffix(".sock")
        if other != own_dra_socket and _accepts_connections(other):
            live.append(other)
    return live


def remove_dead_markers(own_dra_socket: Path) -> None:
    """Delete markers whose instance no longer serves (it died without cleaning up); ours included."""
    for marker in own_dra_socket.parent.glob(f"dra*{MARKER_SUFFIX}"):
        if not _accepts_connections(marker.with_suffix(".sock")):
            marker.unlink(missing_ok=True)


def await_replacement(own_dra_socket: Path, timeout: float, poll: float = 0.2) -> bool:
    """Block until another registered instance serves (True) or ``timeout`` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if found := registered_replacements(own_dra_socket):
            log.info("a replacement instance is registered; handing over", extra={"replacement": str(found[-1])})
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log.warning("no replacement instance registered within the handover timeout", extra={"timeout": timeout})
            return False
        time.sleep(min(poll, remaining))
