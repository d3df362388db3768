"""A network namespace of our own for a local cluster: loopback plus one veth pair to the host.

The namespace side gets 203.0.113.(4k+2)/30, the host side 203.0.113.(4k+1)/30 (TEST-NET-3, a
documentation range; creation refuses to run if the host already uses any address of it). The namespace
has no default route, so nothing started in it can reach any other address; the host reaches the
cluster's API server through the veth pair.
"""

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")
BASE = ipaddress.ip_network("203.0.113.0/24")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


@dataclass(frozen=True)
class Netns:
    """`fracgpu-<slot>` with its veth pair; `slot` 0..63 picks the /30 inside 192.0.2.0/24."""

    slot: int

    @property
    def name(self) -> str:
        return f"fracgpu-{self.slot}"

    @property
    def address(self) -> str:
        """The cluster's address, inside the namespace."""
        return str(BASE.network_address + 4 * self.slot + 2)

    @property
    def host_address(self) -> str:
        return str(BASE.network_address + 4 * self.slot + 1)

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def exec_prefix(self) -> list[str]:
        """argv prefix that runs a command in this network namespace only (mounts stay shared)."""
        return ["nsenter", f"--net={self.path}", "--"]

    def create(self) -> "Netns":
        """Create namespace and veth pair (replacing leftovers of an earlier run in this slot)."""
        self.delete()
        _refuse_overlap()
        host_if, ns_if = f"fg{self.slot}h", f"fg{self.slot}n"
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_address}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", ns_if)
        _ip("-n", self.name, "link", "set", ns_if, "up")
        return self

    def delete(self) -> None:
        """Remove the namespace (its veth end goes with it, and so does the host end)."""
        if self.path.exists():
            _ip("netns", "delete", self.name, check=False)
        _ip("link", "delete", f"fg{self.slot}h", check=False)


def _refuse_overlap() -> None:
    """Fail if an address or route of the host falls in BASE: our veth must never shadow a real network."""
    for line in (
        _ip("-o", "addr", "show").stdout.splitlines() + _ip("route", "show", "table", "all").stdout.splitlines()
    ):
        for word in line.replace("/", " ").split():
            try:
                address = ipaddress.ip_address(word)
            except ValueError:
                continue
            if address in BASE and not any(f"fg{s}h" in line or f"fg{s}n" in line for s in range(64)):
                raise RuntimeError(f"the host already uses {address} in {BASE} ({line.strip()}); pick another range")


def free_slot() -> int:
    """The lowest slot without a namespace."""
    for slot in range(64):
        if not (NETNS_DIR / f"fracgpu-{slot}").exists():
            return slot
    raise RuntimeError("all 64 fracgpu network namespaces are in use; remove stale ones with `ip netns delete`")


def free_slots(count: int) -> list[int]:
    """The `count` lowest slots without a namespace."""
    free = [s for s in range(64) if not (NETNS_DIR / f"fracgpu-{s}").exists()][:count]
    if len(free) < count:
        raise RuntimeError(
            f"fewer than {count} free fracgpu network namespaces; remove stale ones with `ip netns delete`"
        )
    return free


def link(hub: Netns, spoke: Netns) -> None:
    """A veth pair between two namespaces, so each reaches the other's address (and nothing else) directly.

    The link carries no address of its own: a /32 route each way names the peer's cluster address, so two
    nodes of one cluster talk (API server, kubelet, webhooks) while neither gains a route anywhere else.
    Deleting either namespace deletes the pair.
    """
    hub_if, spoke_if = f"fg{hub.slot}x{spoke.slot}", f"fg{spoke.slot}x{hub.slot}"
    _ip("link", "add", hub_if, "netns", hub.name, "type", "veth", "peer", "name", spoke_if, "netns", spoke.name)
    for ns, iface, peer, own in ((hub, hub_if, spoke, hub), (spoke, spoke_if, hub, spoke)):
        _ip("-n", ns.name, "link", "set", iface, "up")
        _ip("-n", ns.name, "route", "add", f"{peer.address}/32", "dev", iface, "src", own.address)
