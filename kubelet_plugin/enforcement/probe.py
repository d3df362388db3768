"""Detection of the enforcement tiers each GPU offers (kubelet_plugin/enforcement/tiers.py decides from the facts).

Facts, read at start (and HAMi-core's library on every call, so installing it later is noticed):
- cgroup v2: the filesystem mounted at the cgroup root (``/sys/fs/cgroup``, where NVIDIA's hook checks) is
  ``cgroup2``, read from ``/proc/self/mountinfo`` (the top mount there; a hybrid v1 node has tmpfs);
- NVML: ``libnvidia-ml.so.1`` exports ``nvmlDeviceSetMemoryLimits_v1`` and, per GPU, the call answers a probe
  with no limits (a NULL ``nvmlSetMemoryLimits_v1_t``): ``NVML_ERROR_INVALID_ARGUMENT`` is the documented
  answer of a device that implements it, ``NVML_ERROR_NOT_SUPPORTED`` that of one that does not; any other
  answer counts as not available. The probe passes no limits, so it changes nothing;
- ``--driver-edits=toolkit``: the hook binary is installed on the host;
- HAMi-core: its library file exists;
- MPS (on every call, for the GPUs ``--mps-gpus`` names): the GPU's daemon status file says running and is fresh
  (``kubelet_plugin/state/mps_files.py``).
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from types import MappingProxyType

import pynvml

from kubelet_plugin.core.model import GpuInfo
from kubelet_plugin.core.settings import Settings, is_mps_gpu
from kubelet_plugin.enforcement.tiers import NOT_MPS, GpuTiers, MpsFacts, NodeFacts, NvmlLimits, gpu_tiers
from kubelet_plugin.state.mps_files import read_status

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
SET_LIMITS = "nvmlDeviceSetMemoryLimits_v1"
_OCTAL = re.compile(r"\\([0-7]{3})")


def mount_fs_type(mountinfo: str, mount_point: str) -> str | None:
    """The filesystem type of the last (topmost) mount at `mount_point` in a mountinfo text, or None."""
    found = None
    for line in mountinfo.splitlines():
        fields, sep, rest = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 5:
            continue
        if _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), parts[4]) == mount_point:
            found = rest.split()[0] if rest.split() else None
    return found


def cgroup_problem(cgroup_root: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """None when `cgroup_root` is a cgroup2 mount; else what is there instead."""
    try:
        fs_type = mount_fs_type(mountinfo.read_text(), str(cgroup_root))
    except OSError as err:
        return f"cannot read {mountinfo} to check the cgroup version: {err}"
    if fs_type == "cgroup2":
        return None
    what = "nothing is mounted there" if fs_type is None else f"it is {fs_type} (cgroup v1 or hybrid)"
    return f"the node has no cgroup v2 unified hierarchy at {cgroup_root} ({what}), and NVIDIA's hook needs one"


def probe_nvml_limits(uuids: list[str]) -> dict[str, NvmlLimits]:
    """Per GPU UUID: can the driver set memory limits on it. Never raises: an NVML failure is every GPU's
    problem. Initialises NVML and shuts it down again."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return dict.fromkeys(uuids, NvmlLimits(problem=f"NVML could not be initialised: {err}"))
    try:
        try:
            function = pynvml._nvmlGetFunctionPointer(SET_LIMITS)
        except pynvml.NVMLError:
            problem = f"the driver's libnvidia-ml.so.1 has no {SET_LIMITS} (it came with driver r615)"
            return dict.fromkeys(uuids, NvmlLimits(problem=problem))
        return {uuid: _probe(function, uuid) for uuid in uuids}
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("nvmlShutdown failed: %s", err)


def _probe(function: Callable[..., int], uuid: str) -> NvmlLimits:
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as err:
        return NvmlLimits(problem=f"NVML cannot find GPU {uuid}: {err}")
    function.restype = ctypes.c_int  # type: ignore[attr-defined]
    code = int(function(handle, None))
    if code == pynvml.NVML_ERROR_INVALID_ARGUMENT:  # implemented, and it refused the missing limits
        return NvmlLimits(problem=None)
    if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return NvmlLimits(problem=f"the driver says GPU {uuid} does not support memory limits ({SET_LIMITS})")
    return NvmlLimits(problem=f"{SET_LIMITS} probe on GPU {uuid} answered NVML error {code} ({_error_string(code)})")


def _error_string(code: int) -> str:
    try:
        return str(pynvml.nvmlErrorString(code))
    except pynvml.NVMLError:
        return "unknown"


def static_facts(settings: Settings, mountinfo: Path = MOUNTINFO) -> tuple[str | None, str | None]:
    """(cgroup problem, driver-edits problem) of this node."""
    edits = (
        None
        if settings.driver_edits == "toolkit"
        else "driver edits are off (--driver-edits=none): the hook binary is not installed on the host, set "
        "the chart's driverEdits: toolkit"
    )
    return cgroup_problem(settings.cgroup_root, mountinfo), edits


class EnforcementDetector:
    """The tiers each GPU (by device name) offers: cgroup and NVML facts fixed at construction, HAMi-core's
    library looked up on every `tiers()` call."""

    def __init__(
        self,
        settings: Settings,
        gpus: list[GpuInfo],
        *,
        cgroup_problem: str | None,
        driver_edits_problem: str | None,
        nvml: dict[str, NvmlLimits],
    ) -> None:
        self._settings = settings
        self._gpus = gpus
        self._cgroup = cgroup_problem
        self._edits = driver_edits_problem
        self._nvml = nvml
        self._last_tiers: tuple[Hashable, Mapping[str, GpuTiers]] | None = None

    @classmethod
    def detect(cls, settings: Settings, gpus: list[GpuInfo], mountinfo: Path = MOUNTINFO) -> EnforcementDetector:
        """Read the node's facts and probe NVML for every GPU (NVML is only probed where cgroup v2 and driver
        edits would allow nvml at all)."""
        cgroup, edits = static_facts(settings, mountinfo)
        if cgroup is None and edits is None:
            nvml = probe_nvml_limits([g.uuid for g in gpus])
        else:
            nvml = dict.fromkeys((g.uuid for g in gpus), NvmlLimits(problem=None))  # moot: nvml is out anyway
        detector = cls(settings, gpus, cgroup_problem=cgroup, driver_edits_problem=edits, nvml=nvml)
        for name, tiers in detector.tiers().items():
            log.info(
                "memory enforcement tiers",
                extra={"device": name, "available": list(tiers.available), "missing": tiers.missing},
            )
        return detector

    @classmethod
    def without_nvml(cls, settings: Settings, gpus: list[GpuInfo], why: str) -> EnforcementDetector:
        """A detector that offers no nvml tier (`why`), for callers that probe nothing."""
        nvml = {g.uuid: NvmlLimits(problem=why) for g in gpus}
        return cls(settings, gpus, cgroup_problem=None, driver_edits_problem=None, nvml=nvml)

    def node_facts(self) -> NodeFacts:
        library = self._settings.hami_core_library
        hami = None if library.is_file() else f"HAMi-core's library {library} is not on this node"
        return NodeFacts(cgroup_problem=self._cgroup, driver_edits_problem=self._edits, hami_core_problem=hami)

    def is_mps(self, uuid: str) -> bool:
        """Whether the GPU `uuid` is an MPS GPU (--mps-gpus)."""
        return any(g.uuid == uuid and is_mps_gpu(self._settings.mps_gpus, g.index, g.uuid) for g in self._gpus)

    def mps_facts(self, gpu: GpuInfo) -> MpsFacts:
        """Whether `gpu` is an MPS GPU and, if so, whether its daemon is up now."""
        if not is_mps_gpu(self._settings.mps_gpus, gpu.index, gpu.uuid):
            return NOT_MPS
        return MpsFacts(selected=True, problem=read_status(self._settings.mps_root, gpu.uuid)[1])

    def tiers(self) -> Mapping[str, GpuTiers]:
        """Device name -> the tiers that GPU offers now (read-only: the same mapping while the facts read now are
        those of the last call)."""
        node = self.node_facts()
        mps = [self.mps_facts(g) for g in self._gpus]
        key = (node.hami_core_problem, tuple((m.selected, m.problem) for m in mps))
        if self._last_tiers is None or self._last_tiers[0] != key:
            tiers = {
                g.device_name: gpu_tiers(node, self._nvml[g.uuid], m) for g, m in zip(self._gpus, mps, strict=True)
            }
            self._last_tiers = key, MappingProxyType(tiers)
        return self._last_tiers[1]
