"""The `daemon-reload` property of a container: every device node it has is one its OCI spec grants.

A node the runtime created but the spec does not list (NVIDIA's legacy hook used to add them) loses its
cgroup permission when systemd re-applies a unit's device rules, which it derives from the spec. So for each
character device a container has under /dev, its OCI spec (the bundle's config.json that containerd hands
runc) must list it in `linux.devices` (same path, type `c`, major and minor) and `linux.resources.devices`
must leave it readable and writable, rules applied in order as the device cgroup does (later rules win).

Exempt are only the OCI runtime spec's default devices with their standard numbers (`/dev/null` 1:3 and the
others in DEFAULT_DEVICES): every runtime supplies and allows them itself, without the spec naming them.
"""

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The OCI runtime spec's default devices: path -> (major, minor).
DEFAULT_DEVICES = {
    "/dev/null": (1, 3),
    "/dev/zero": (1, 5),
    "/dev/full": (1, 7),
    "/dev/random": (1, 8),
    "/dev/urandom": (1, 9),
    "/dev/tty": (5, 0),
    "/dev/console": (5, 1),
    "/dev/ptmx": (5, 2),
}
# Prints `DEV <path> <major hex> <minor hex>` per character device on /dev's own filesystem (not devpts).
LIST_DEVICES = r"""find /dev -xdev -type c | while read -r d; do stat -c "DEV %n %t %T" "$d"; done"""
BUNDLES = "io.containerd.runtime.v2.task"  # below containerd's state dir: <namespace>/<container id>/


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class LinuxDevice(_Spec):
    """An entry of `linux.devices`."""

    path: str
    type: str
    major: int = 0
    minor: int = 0


class DeviceRule(_Spec):
    """An entry of `linux.resources.devices`; no type, major or minor matches all, no access means rwm."""

    allow: bool
    type: Literal["a", "c", "b"] = "a"
    major: int | None = None
    minor: int | None = None
    access: str = "rwm"

    def matches(self, major: int, minor: int) -> bool:
        """Whether the rule covers the character device major:minor (-1 is a wildcard too)."""
        return self.type in ("a", "c") and self.major in (None, -1, major) and self.minor in (None, -1, minor)


class _Resources(_Spec):
    devices: list[DeviceRule] = Field(default_factory=list)


class _Linux(_Spec):
    devices: list[LinuxDevice] = Field(default_factory=list)
    resources: _Resources = Field(default_factory=_Resources)


class OciSpec(_Spec):
    """The parts of an OCI runtime spec (config.json) this check reads."""

    linux: _Linux = Field(default_factory=_Linux)


class DeviceNode(_Spec):
    """A character device seen inside a container."""

    path: str
    major: int
    minor: int


def parse_listing(lines: Iterable[str]) -> list[DeviceNode]:
    """The `DEV <path> <major hex> <minor hex>` lines LIST_DEVICES prints (other lines are ignored);
    ValueError naming the line when one is malformed."""
    nodes = []
    for line in lines:
        if not line.startswith("DEV "):
            continue
        try:
            _, path, major, minor = line.split()
            nodes.append(DeviceNode(path=path, major=int(major, 16), minor=int(minor, 16)))
        except ValueError as err:
            raise ValueError(f"device listing line {line!r} is not 'DEV <path> <major hex> <minor hex>'") from err
    return nodes


def access_of(rules: Iterable[DeviceRule], major: int, minor: int) -> set[str]:
    """What the rules, applied in order from nothing allowed, leave allowed of char device major:minor."""
    allowed: set[str] = set()
    for rule in rules:
        if rule.matches(major, minor):
            allowed = allowed | set(rule.access) if rule.allow else allowed - set(rule.access)
    return allowed


def mismatches(nodes: Iterable[DeviceNode], spec: Mapping[str, Any]) -> list[str]:
    """Each device node that `spec` (an OCI config.json as loaded) does not list or does not allow rw, with why."""
    oci = OciSpec.model_validate(spec)
    listed = {d.path: d for d in oci.linux.devices}
    found = []
    for node in nodes:
        number = f"{node.major}:{node.minor}"
        if DEFAULT_DEVICES.get(node.path) == (node.major, node.minor):
            continue
        entry = listed.get(node.path)
        if entry is None:
            found.append(f"{node.path} ({number}) is not in linux.devices")
        elif (entry.type, entry.major, entry.minor) != ("c", node.major, node.minor):
            found.append(
                f"{node.path} is {number} in the container but {entry.type} {entry.major}:{entry.minor} in linux.devices"
            )
        missing = {"r", "w"} - access_of(oci.linux.resources.devices, node.major, node.minor)
        if missing:
            found.append(f"{node.path} ({number}) lacks {''.join(sorted(missing))} in linux.resources.devices")
    return found


def bundle_config(containerd_state: Path, container_id: str, namespace: str = "k8s.io") -> Path:
    """The config.json containerd wrote for runc for `container_id` (`containerd://` prefix allowed)."""
    return containerd_state / BUNDLES / namespace / container_id.removeprefix("containerd://") / "config.json"
