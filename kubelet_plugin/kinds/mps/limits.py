"""The ceiling of an MPS GPU: what no client of its daemon can exceed, whatever its own environment; kept by the
node plugin, read back and repaired.

CUDA lets an MPS client lower its pinned device memory limit and active thread percentage through its
environment, never raise them above what its server was given. The node plugin therefore keeps each MPS GPU's
daemon defaults (which reach servers started later) and its running servers' values (which reach their clients
that attach later) at the largest grant and the largest percentage among the MPS shares prepared on that GPU
(100 % when one has none; a share's percentage is its compute ceiling, ``api/compute.py``): a share's own environment then gives it its grant, and a workload that rewrites that
environment gets at most the largest grant of its trust domain on its GPU (only one domain's claims share a
GPU's daemon). Set before a new share's files are written, lowered after an unprepare, set again when the
daemon comes back (it starts without one), and read back every refresh: a daemon whose limits differ from what
was set (a client of the domain sent control commands) is set again (``MpsLimits.repair``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from kubelet_plugin.kinds.mps.control import DaemonReading, Limits, MpsControl

Grant = tuple[int, int | None]
"""(MiB, active thread percentage or None) of one MPS share."""


def ceiling(grants: Iterable[Grant]) -> Limits | None:
    """The largest MiB and the largest percentage (100 when a share has none) of the shares; None for no share
    (pure)."""
    listed = list(grants)
    if not listed:
        return None
    percentages = [p for _, p in listed]
    top = 100 if None in percentages else max(p for p in percentages if p is not None)
    return Limits(memory_mib=max(m for m, _ in listed), percentage=top)


@dataclass(frozen=True)
class _Set:
    """What this plugin last set on one daemon, and what the daemon printed for it right afterwards."""

    limits: Limits
    daemon: int | None
    reading: DaemonReading


class MpsLimits:
    """Each MPS GPU's ceiling as its daemon holds it (thread-safe; callers serialise per GPU by the node lock)."""

    def __init__(self, control: MpsControl) -> None:
        self.control = control
        self._set: dict[str, _Set] = {}
        self._lock = threading.Lock()

    def ensure(self, uuid: str, limits: Limits, daemon: int | None, *, force: bool = False) -> None:
        """Make `limits` GPU `uuid`'s ceiling unless this plugin already gave that very daemon (`daemon`: its pid
        from the supervisor's status file) that ceiling. Raises MpsControlError."""
        with self._lock:
            known = self._set.get(uuid)
        if not force and daemon is not None and known is not None and (known.limits, known.daemon) == (limits, daemon):
            return
        with self._lock:
            self._set.pop(uuid, None)
        self.control.apply(uuid, limits)
        reading = self.control.read(uuid)
        with self._lock:
            self._set[uuid] = _Set(limits, daemon, reading)

    def repair(self, uuid: str, limits: Limits, daemon: int | None) -> list[str]:
        """Read GPU `uuid`'s limits back; where they differ from what was set, set `limits` again. What differed, as
        sentences (empty: nothing, or `limits` were not set on this daemon before and are now). Raises
        MpsControlError."""
        with self._lock:
            known = self._set.get(uuid)
        if known is None or (known.limits, known.daemon) != (limits, daemon):
            self.ensure(uuid, limits, daemon, force=True)
            return []
        now = self.control.read(uuid)
        changed = _differences(known.reading, now)
        if changed:
            self.ensure(uuid, limits, daemon, force=True)
        return changed

    def forget(self, uuid: str) -> None:
        with self._lock:
            self._set.pop(uuid, None)


def _differences(expected: DaemonReading, now: DaemonReading) -> list[str]:
    """Where `now` differs from the reading taken right after the ceiling was set. A server started since then
    took the defaults of that moment, so it is compared with them."""
    found = []
    if now.defaults != expected.defaults:
        found.append(f"the daemon's defaults are {now.defaults.describe()}, not {expected.defaults.describe()}")
    for pid, reading in sorted(now.servers.items()):
        wanted = expected.servers.get(pid, expected.defaults)
        if reading != wanted:
            found.append(f"server {pid} has {reading.describe()}, not {wanted.describe()}")
    return found
