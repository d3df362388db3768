"""What the check's container printed, parsed, and the verdict on it (pure).

The container runs one busybox shell script (``container_script``) whose sections start with a marker line
``@@fracgpu <section>``; ``parse_output`` reads them back.
"""

import json
import re
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MARKER = "@@fracgpu"
PROBE_ALLOC_MIB = 64
_SMI_LINE = re.compile(r"^GPU (\d+): (.*) \(UUID: (GPU-[0-9a-fA-F-]+)\)$")


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

    @property
    def smi_uuids(self) -> list[str]:
        """UUIDs of the GPUs ``nvidia-smi -L`` listed."""
        return [m.group(3) for m in map(_SMI_LINE.match, self.smi_lines) if m is not None]


def container_script(busybox: str, nvidia_smi: str | None, probe: str) -> str:
    """The shell script the container runs: env, ``nvidia-smi -L``, the CUDA probe, /dev, each after a marker."""
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
            f"echo {MARKER} dev; {bb} ls /dev",
            f"echo {MARKER} end",
        ]
    )


def _rc(line: str) -> int | None:
    try:
        return int(line.rsplit(maxsplit=1)[-1])
    except (IndexError, ValueError):
        return None


def parse_output(text: str) -> ContainerView:
    """The sections of ``container_script``'s output."""
    sections: dict[str, list[str]] = {}
    rcs: dict[str, int | None] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(MARKER + " "):
            name = line[len(MARKER) + 1 :].split()[0]
            if name.endswith("-rc"):
                rcs[name] = _rc(line)
                current = None
            else:
                current = sections.setdefault(name, [])
            continue
        if current is not None:
            current.append(line)
    env = dict(entry.split("=", 1) for entry in sections.get("env", []) if "=" in entry)
    probe_lines = sections.get("probe", [])
    probe: dict[str, Any] | None = None
    for line in reversed(probe_lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            probe = value
            break
    return ContainerView(
        env=env,
        smi_lines=[line for line in sections.get("smi", []) if line.strip()],
        smi_rc=rcs.get("smi-rc"),
        probe=probe,
        probe_text="\n".join(probe_lines),
        probe_rc=rcs.get("probe-rc"),
        dev=sorted(" ".join(sections.get("dev", [])).split()),
    )


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
