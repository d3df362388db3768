"""What the check's container printed, parsed, and the verdict on it (pure).

The container runs one busybox shell script (``container_script``) whose sections start with a marker line
``@@fracgpu <section>``; ``parse_output`` reads them back. With a memory cap to check (the share planned at the
``nvml`` tier) the script also runs the CUDA probe once per ``cap_mibs`` size (sections ``cap-<MiB>``):
``cap_problems`` wants the size above the cap refused and the one below it allowed.
"""

import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MARKER = "@@fracgpu"
PROBE_ALLOC_MIB = 64
_SMI_LINE = re.compile(r"^GPU (\d+): (.*) \(UUID: (GPU-[0-9a-fA-F-]+)\)$")


class ProbeRun(BaseModel):
    """One CUDA probe run: its JSON line (None if it printed none), all it printed, its exit status."""

    model_config = ConfigDict(frozen=True)

    result: dict[str, Any] | None = None
    text: str = ""
    rc: int | None = None

    @property
    def alloc_result(self) -> str | None:
        """cuMemAlloc's result name, or None when the probe did not get that far."""
        if self.result is None or "error" in self.result:
            return None
        alloc = self.result.get("alloc") or {}
        value = alloc.get("result")
        return str(value) if value is not None else None


class ContainerView(BaseModel):
    """What the container saw; ``None`` where a section is missing (the script did not get that far)."""

    model_config = ConfigDict(frozen=True)

    env: dict[str, str] = Field(default_factory=dict)
    smi_lines: list[str] = Field(default_factory=list)
    smi_rc: int | None = None
    probe: dict[str, Any] | None = None
    probe_text: str = ""
    probe_rc: int | None = None
    dev: list[str] = Field(default_factory=list)
    caps: dict[int, ProbeRun] = Field(default_factory=dict)
    """alloc MiB -> the probe run allocating that much (only the sizes the script was given)."""

    @property
    def smi_uuids(self) -> list[str]:
        """UUIDs of the GPUs ``nvidia-smi -L`` listed."""
        return [m.group(3) for m in map(_SMI_LINE.match, self.smi_lines) if m is not None]


def container_script(busybox: str, nvidia_smi: str | None, probe: str, cap_mibs: Sequence[int] = ()) -> str:
    """The shell script the container runs: env, ``nvidia-smi -L``, the CUDA probe, the probe once per
    ``cap_mibs`` size, /dev, each after a marker."""
    bb = shlex.quote(busybox)
    smi = (
        f"{shlex.quote(nvidia_smi)} -L 2>&1; echo {MARKER} smi-rc $?"
        if nvidia_smi
        else f"echo 'the driver edits mount no nvidia-smi'; echo {MARKER} smi-rc 127"
    )
    return "\n".join(
        [
            f"echo {MARKER} env; {bb} env",
            f"echo {MARKER} smi; {smi}",
            f"echo {MARKER} probe; {shlex.quote(probe)} {PROBE_ALLOC_MIB} 2>&1; echo {MARKER} probe-rc $?",
            *(
                f"echo {MARKER} cap-{mib}; {shlex.quote(probe)} {mib} 2>&1; echo {MARKER} cap-{mib}-rc $?"
                for mib in cap_mibs
            ),
            f"echo {MARKER} dev; {bb} ls /dev",
            f"echo {MARKER} end",
        ]
    )


def _rc(line: str) -> int | None:
    try:
        return int(line.rsplit(maxsplit=1)[-1])
    except (IndexError, ValueError):
        return None


def sections(text: str) -> tuple[dict[str, list[str]], dict[str, int | None]]:
    """A marked script's output: (section -> its lines, ``<section>-rc`` -> the status that marker line gives).
    Lines before the first marker, and after an ``-rc`` marker until the next section, belong to no section."""
    found: dict[str, list[str]] = {}
    rcs: dict[str, int | None] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(MARKER + " "):
            name = line[len(MARKER) + 1 :].split()[0]
            if name.endswith("-rc"):
                rcs[name] = _rc(line)
                current = None
            else:
                current = found.setdefault(name, [])
            continue
        if current is not None:
            current.append(line)
    return found, rcs


def parse_output(text: str) -> ContainerView:
    """The sections of ``container_script``'s output."""
    parts, rcs = sections(text)
    env = dict(entry.split("=", 1) for entry in parts.get("env", []) if "=" in entry)
    probe_lines = parts.get("probe", [])
    caps = {
        int(name.removeprefix("cap-")): ProbeRun(
            result=json_line(lines), text="\n".join(lines), rc=rcs.get(f"{name}-rc")
        )
        for name, lines in parts.items()
        if name.startswith("cap-") and name.removeprefix("cap-").isdigit()
    }
    return ContainerView(
        env=env,
        smi_lines=[line for line in parts.get("smi", []) if line.strip()],
        smi_rc=rcs.get("smi-rc"),
        probe=json_line(probe_lines),
        probe_text="\n".join(probe_lines),
        probe_rc=rcs.get("probe-rc"),
        dev=sorted(" ".join(parts.get("dev", [])).split()),
        caps=caps,
    )


def json_line(lines: list[str]) -> dict[str, Any] | None:
    """The last line that is a JSON object (the probe's report), or None."""
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def problems(view: ContainerView, granted_uuid: str) -> list[str]:
    """Why the container's view is not exactly the one GPU granted (empty: PASS)."""
    found: list[str] = []
    if view.smi_rc != 0:
        found.append(f"nvidia-smi -L exited with {view.smi_rc}: {' | '.join(view.smi_lines) or '(no output)'}")
    elif view.smi_uuids != [granted_uuid]:
        found.append(f"nvidia-smi -L listed {view.smi_uuids or 'no GPU'}, not exactly the granted {granted_uuid}")
    if view.probe is None or "error" in view.probe:
        found.append(f"the CUDA probe failed (exit {view.probe_rc}): {view.probe_text.strip() or '(no output)'}")
    else:
        devices = view.probe.get("devices") or []
        if view.probe.get("device_count") != 1:
            found.append(f"the CUDA probe counted {view.probe.get('device_count')} devices, not 1")
        uuids = [d.get("uuid") for d in devices]
        if uuids[:1] != [granted_uuid]:
            found.append(f"the CUDA probe saw {uuids or 'no device'}, not the granted {granted_uuid}")
        alloc = view.probe.get("alloc") or {}
        if alloc.get("result") != "CUDA_SUCCESS":
            found.append(f"cuMemAlloc of {PROBE_ALLOC_MIB} MiB gave {alloc.get('result')}")
    visible = view.env.get("NVIDIA_VISIBLE_DEVICES")
    if visible != "void":
        found.append(f"NVIDIA_VISIBLE_DEVICES is {visible!r}, not 'void'")
    return found


def cap_sizes(limit_mib: int) -> tuple[int, int]:
    """(above, below): allocation sizes 20% over and under a ``limit_mib`` cap (12 GiB and 8 GiB for 10 GiB)."""
    return limit_mib * 6 // 5, limit_mib * 4 // 5


def cap_problems(view: ContainerView, limit_mib: int) -> list[str]:
    """Why the container's memory cap of ``limit_mib`` MiB does not hold (empty: it holds): the probe must be
    refused ``cap_sizes``' size above the cap and allowed the one below it."""
    above, below = cap_sizes(limit_mib)
    found: list[str] = []
    for mib, want_success in ((above, False), (below, True)):
        run = view.caps.get(mib)
        result = run.alloc_result if run is not None else None
        if run is None or result is None:
            text = run.text.strip() if run is not None else ""
            rc = run.rc if run is not None else None
            found.append(f"the {mib} MiB CUDA probe did not allocate (exit {rc}): {text or '(no output)'}")
        elif want_success and result != "CUDA_SUCCESS":
            found.append(f"cuMemAlloc of {mib} MiB, under the {limit_mib} MiB cap, gave {result}")
        elif not want_success and result == "CUDA_SUCCESS":
            found.append(
                f"memory cap not enforced: cuMemAlloc of {mib} MiB succeeded in a container capped at {limit_mib} MiB"
            )
    return found


def cap_summary(view: ContainerView, limit_mib: int) -> str:
    """One line: what the cap probes got (for the PASS line)."""
    parts = []
    for mib in cap_sizes(limit_mib):
        run = view.caps.get(mib)
        parts.append(f"{mib} MiB: {run.alloc_result if run is not None else None}")
    return f"memory cap {limit_mib} MiB (nvml) enforced: cuMemAlloc " + ", ".join(parts)


def not_checked(reason: str) -> str:
    """The note when the GPU offers no nvml tier: the cap is not checked, and that is no failure."""
    return f"nvml not available: {reason}; memory cap not checked"


def verdict(reasons: list[str], cap_note: str) -> str:
    """The last line: ``PASS: ...; <cap note>`` when there are no reasons, else ``FAIL: <reasons>``."""
    if reasons:
        return "FAIL: " + "; ".join(reasons)
    return (
        "PASS: nvidia-smi -L and the CUDA probe in the container saw exactly the granted GPU (count 1, same UUID); "
        + cap_note
    )
