"""Which GpuConfigs apply to a request, merged as the node plugin applies them (pure; shared with admission).

DeviceClass entries come first, then the claim's, each in its own order; an entry with `requests` applies
only to those requests, and naming a request (`gpu`) also covers its subrequests (`gpu/large`).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.gpu_config import GpuConfig, GpuConfigError, decode_gpu_config, merge_configs


@dataclass(frozen=True)
class ConfigEntry:
    """One opaque config entry of our driver: its parameters, scope and origin."""

    parameters: object
    requests: tuple[str, ...] = ()
    from_class: bool = False
    where: str = ""
    """How to name the entry to a user, e.g. `spec.devices.config[1]`."""


def allocation_entries(configs: Sequence[Mapping[str, Any]] | None, driver: str) -> list[ConfigEntry]:
    """The entries of an allocation's `devices.config` (`source` FromClass or FromClaim) that are opaque configs
    of `driver`, in their order."""
    return [
        ConfigEntry(
            parameters=c["opaque"]["parameters"],
            requests=tuple(c.get("requests") or ()),
            from_class=c.get("source") == "FromClass",
        )
        for c in configs or []
        if (c.get("opaque") or {}).get("driver") == driver
    ]


class EntryError(GpuConfigError):
    """One entry does not decode; `entry` names it."""

    def __init__(self, entry: ConfigEntry, err: GpuConfigError) -> None:
        super().__init__(err.problems)
        self.entry = entry


class MergeError(GpuConfigError):
    """The applicable entries decode one by one but their merge is invalid; `entries` were merged."""

    def __init__(self, entries: Sequence[ConfigEntry], err: GpuConfigError) -> None:
        super().__init__(err.problems)
        self.entries = tuple(entries)


def applicable(entries: Sequence[ConfigEntry], request: str) -> list[ConfigEntry]:
    """The entries that apply to `request` (`name` or `name/subrequest`), class entries first."""
    names = {request, request.split("/", 1)[0]}
    scoped = [e for e in entries if not e.requests or names & set(e.requests)]
    return [e for e in scoped if e.from_class] + [e for e in scoped if not e.from_class]


def config_for(entries: Sequence[ConfigEntry], request: str) -> GpuConfig:
    """The merged GpuConfig of `request`; raises EntryError or MergeError."""
    ordered = applicable(entries, request)
    decoded = []
    for entry in ordered:
        try:
            decoded.append(decode_gpu_config(entry.parameters))  # type: ignore[arg-type]  # any JSON: it reports
        except GpuConfigError as err:
            raise EntryError(entry, err) from None
    try:
        return merge_configs(decoded)
    except GpuConfigError as err:
        raise MergeError(ordered, err) from None
