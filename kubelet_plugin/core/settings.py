"""Node plugin settings: one pydantic field per option, each a flag and an environment variable (api/options.py)."""

from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from api.mps_trust import TrustScope
from api.names import DRIVER_NAME
from api.options import OptionSettings, build_parser, parse
from api.quantity import MiB, to_bytes
from kubelet_plugin.core.model import NodeMode, TaintEffect

CHECKPOINT_FILE_NAME = "checkpoint.json"
SERIALIZE_LOCK_NAME = "serialize.lock"


def serialize_lock_path(plugin_data_dir: Path) -> Path:
    """Path of the node lock file (``filelock.serialize_lock``) inside the plugin data dir."""
    return plugin_data_dir / SERIALIZE_LOCK_NAME


#: The kubelet cancels NodePrepareResources / NodeUnprepareResources after 45 s.
KUBELET_CALL_TIMEOUT_S = 45.0
#: What a call may spend waiting on the API server plus waiting for the node lock (and, for a claim whose MPS
#: GPU switches trust domain, for the switch and the node lock again: that second lock wait gets at most what is
#: left of this); the rest of the kubelet's 45 s is left for the local work and the answer.
MAX_WAIT_S = 40.0
#: Of ``MAX_WAIT_S``, what a prepare keeps for the node lock (at most ``node_lock_timeout_seconds``) however long
#: its claim reads waited what a throttling API server asked (``prepare/preparer.py``, Deadlines).
READ_LOCK_SHARE_S = 5.0


def mps_selection(value: str) -> list[str]:
    """``--mps-gpus`` as a list: ``["all"]``, or NVML indices and ``GPU-`` UUIDs; ValueError says what is allowed."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if "all" in parts and len(parts) > 1:
        raise ValueError(f"'all' cannot be combined with other GPUs, got {parts}")
    bad = [p for p in parts if p != "all" and not p.isdigit() and not p.startswith("GPU-")]
    if bad:
        raise ValueError(f"MPS GPUs are 'all' or NVML indices (0,1) and UUIDs (GPU-...) separated by commas, got {bad}")
    return parts


def is_mps_gpu(selection: str, index: int, uuid: str) -> bool:
    """Whether the GPU of NVML `index` and `uuid` is named by a normalised ``--mps-gpus`` value."""
    parts = selection.split(",") if selection else []
    return "all" in parts or str(index) in parts or uuid in parts


def gpu_selection(value: str, what: str) -> list[str]:
    """A GPU list option (``--mig-gpus``) as a list: ``["all"]``, or NVML indices and ``GPU-`` UUIDs; ValueError says
    what is allowed."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if "all" in parts and len(parts) > 1:
        raise ValueError(f"'all' cannot be combined with other GPUs, got {parts}")
    bad = [p for p in parts if p != "all" and not p.isdigit() and not p.startswith("GPU-")]
    if bad:
        raise ValueError(f"{what} are 'all' or NVML indices (0,1) and UUIDs (GPU-...) separated by commas, got {bad}")
    return parts


def is_selected(selection: str, index: int, uuid: str) -> bool:
    """Whether the GPU of NVML `index` and `uuid` is named by a normalised GPU list option."""
    return is_mps_gpu(selection, index, uuid)


#: Bytes, given as a Kubernetes quantity (256Mi) or a plain number.
Quantity = Annotated[int, BeforeValidator(to_bytes)]


class NodeFields(BaseModel):
    """This node, the host directories the plugin works in, and how its GPUs are shared; a base of `Settings`."""

    node_name: str = Field(
        min_length=1,
        description="this node's name; the plugin publishes its GPUs",
        json_schema_extra={"env": "NODE_NAME"},
    )
    driver_name: str = Field(DRIVER_NAME, description="DRA driver name")
    kubelet_dir: Path = Field(Path("/var/lib/kubelet"), description="the kubelet's root directory")
    cdi_dir: Path = Field(Path("/var/run/cdi"), description="where the per-claim CDI specs are written")
    driver_root: Path = Field(Path("/"), description="host root under which /dev/nvidia* are found")
    dev_char_dir: Path = Field(Path("/dev/char"), description="host /dev/char, for <major>:<minor> links")
    memory_step_bytes: Quantity = Field(256 * MiB, gt=0, description="share granularity (a quantity, e.g. 256Mi)")
    memory_reserve_bytes: Quantity = Field(0, ge=0, description="memory held back per GPU (a quantity, e.g. 1Gi)")
    enforcement: NodeMode = Field(
        "auto",
        description="the floor of every claim's memory enforcement: auto (the strongest tier each GPU offers: "
        "nvml, hami-core, none), or that tier for every claim; a claim's GpuConfig may raise it",
    )
    cgroup_root: Path = Field(Path("/sys/fs/cgroup"), description="where NVIDIA's hook looks for cgroup v2")
    hami_core_library: Path = Field(
        Path("/usr/local/vgpu/libvgpu.so"), description="host path of HAMi-core's libvgpu.so"
    )
    hami_core_lock_dir: Path = Field(Path("/tmp/vgpulock"), description="host directory of HAMi-core's lock files")

    @field_validator("memory_step_bytes")
    @classmethod
    def _step_is_whole_mib(cls, value: int) -> int:
        if value % MiB:
            raise ValueError("memory step must be a whole number of MiB (e.g. 256Mi)")
        return value

    @cached_property
    def plugin_data_dir(self) -> Path:
        """`<kubelet dir>/plugins/<driver>`: DRA socket, checkpoint, lock (computed once: every claim's paths
        start here)."""
        return self.kubelet_dir / "plugins" / self.driver_name

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_data_dir / CHECKPOINT_FILE_NAME

    @property
    def lock_path(self) -> Path:
        return serialize_lock_path(self.plugin_data_dir)


class MpsFields(BaseModel):
    """The MPS GPUs (tier mps), their daemons' files and who may share a daemon; a base of `Settings`."""

    mps_gpus: str = Field(
        "",
        description="the GPUs whose shares are CUDA MPS clients (tier mps): all, or a comma-separated list of NVML "
        "indices and UUIDs; empty: none. Their daemons are the fracgpu-mps DaemonSet's (python -m kubelet_plugin.mps_supervisor)",
    )
    mps_root: Path = Field(
        Path("/run/fracgpu/mps"), description="host directory of the MPS daemons' pipe, log and status files"
    )
    mps_control: Path | None = Field(
        None,
        description="the driver's nvidia-cuda-mps-control, which sets the MPS GPUs' ceilings (default: "
        "<toolkit driver root or driver root>/usr/bin/nvidia-cuda-mps-control)",
    )
    mps_trust_scope: TrustScope = Field(
        "namespace",
        description="who may share an MPS GPU's daemon: namespace (a claim's namespace), namespaceLabel (namespaces "
        "with the same value of --mps-trust-label) or cluster (every claim; every namespace trusts every other)",
    )
    mps_trust_label: str = Field("", description="the namespace label of --mps-trust-scope=namespaceLabel")
    mps_domain_switch_timeout_seconds: float = Field(
        15.0,
        gt=0,
        description="seconds a prepare waits (without the node lock) for the MPS supervisor to start a fresh daemon "
        "for a new trust domain",
    )

    @field_validator("mps_gpus")
    @classmethod
    def _mps_list(cls, value: str) -> str:
        return ",".join(mps_selection(value))


class MigFields(BaseModel):
    """The MIG GPUs (tier mig) and the kernel tables their device nodes come from; a base of `Settings`."""

    mig_gpus: str = Field(
        "",
        description="the GPUs offered as MIG partitions (tier mig): all, or a comma-separated list of NVML indices "
        "and UUIDs; empty: none. Their MIG mode must be on (the plugin never switches it); a GPU here is never "
        "offered whole or as a share, and cannot also be an MPS GPU",
    )
    mig_minors_file: Path = Field(
        Path("/proc/driver/nvidia-caps/mig-minors"),
        description="the driver's table of MIG capability minors (/dev/nvidia-caps/nvidia-cap<minor>)",
    )
    proc_devices_file: Path = Field(
        Path("/proc/devices"), description="the kernel's device majors (that of nvidia-caps, for missing MIG nodes)"
    )

    @field_validator("mig_gpus")
    @classmethod
    def _mig_list(cls, value: str) -> str:
        return ",".join(gpu_selection(value, "MIG GPUs"))


class DriverEditsFields(BaseModel):
    """Whether claim specs carry the driver (nvidia-ctk's edits) and NVIDIA's hook; a base of `Settings`."""

    driver_edits: Literal["none", "toolkit"] = Field(
        "none",
        description="toolkit: claim specs carry the driver's libraries and hooks, generated by nvidia-ctk; none: "
        "they carry device nodes only and rely on an nvidia runtime that injects the driver",
    )
    toolkit_driver_root: Path | None = Field(
        None, description="the driver root as mounted into the plugin, for nvidia-ctk (default: --driver-root)"
    )
    host_driver_root: Path | None = Field(
        None, description="the driver root as the host sees it, written into specs (default: --driver-root)"
    )
    nvidia_ctk: Path = Field(Path("/usr/bin/nvidia-ctk"), description="NVIDIA's nvidia-ctk, for the driver edits")
    nvidia_cdi_hook_source: Path = Field(Path("/usr/bin/nvidia-cdi-hook"), description="the hook in the image")
    nvidia_cdi_hook_path: Path | None = Field(
        None, description="host path the hook is copied to (default: <kubelet dir>/plugins/<driver>/nvidia-cdi-hook)"
    )
    driver_edits_retry_seconds: float = Field(60.0, gt=0, description="seconds between retries of failed driver edits")


class HealthFields(BaseModel):
    """How GPU health is watched and probed, and how an unhealthy GPU is tainted; a base of `Settings`."""

    health_interval_seconds: float = Field(10.0, gt=0, description="seconds between two GPU health checks")
    health_nvml: bool = Field(
        True,
        description="watch NVML for GPU health (XID errors, GPUs lost) and taint unhealthy GPUs in the ResourceSlice",
    )
    health_ignored_xids: str = Field(
        "",
        description="comma-separated XIDs that never change a GPU's health, besides those caused by applications "
        "(e.g. 13,31,43)",
    )
    health_degraded_effect: TaintEffect = Field(
        "NoSchedule", description="taint effect of a GPU degraded by an XID or a recovery action"
    )
    health_fatal_effect: TaintEffect = Field(
        "NoExecute", description="taint effect of a GPU with a fatal XID, lost, or to be reset"
    )
    health_probe_interval_seconds: float = Field(
        5.0, gt=0, description="seconds between two probes of every GPU (lost? reset again? recovery action?)"
    )
    health_coalesce_seconds: float = Field(
        1.0, ge=0, description="GPU health changes within this many seconds are published in one slice update"
    )

    @field_validator("health_ignored_xids")
    @classmethod
    def _xid_list(cls, value: str) -> str:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        bad = [p for p in parts if not p.isdigit()]
        if bad:
            raise ValueError(f"XIDs must be non-negative integers separated by commas (e.g. 13,31,43), got {bad}")
        return ",".join(parts)

    @property
    def ignored_xids(self) -> frozenset[int]:
        """``--health-ignored-xids`` as numbers."""
        return frozenset(int(p) for p in self.health_ignored_xids.split(",") if p)


class ServiceFields(BaseModel):
    """Republishing, API and lock timeouts, metrics, usage sampling, the host's /proc and /sys, and logs; a base of
    `Settings`."""

    resync_seconds: float = Field(60.0, gt=0, description="seconds between two full republishes of the node's GPUs")
    api_timeout_seconds: float = Field(
        10.0, gt=0, description="seconds one API request on the prepare path may take, retries included"
    )
    node_lock_timeout_seconds: float = Field(
        10.0, ge=0, description="seconds a prepare/unprepare waits for the node-wide lock"
    )
    metrics_address: str = Field("0.0.0.0", description="where the metrics server listens")
    metrics_port: int = Field(8080, ge=0, le=65535, description="port of the Prometheus /metrics server; 0 disables it")
    usage_interval_seconds: float = Field(
        0.0, ge=0, description="seconds between samples of GPU memory use per claim (NVML per process); 0 = off"
    )
    usage_ledger_interval_seconds: float = Field(
        30.0, gt=0, description="at most one write of a GPU's used memory to its ledger object per this many seconds"
    )
    proc_root: Path = Field(Path("/proc"), description="the host's /proc (process cgroups of the usage sampler)")
    sys_root: Path = Field(
        Path("/sys"),
        description="the host's /sys, where each GPU's PCIe root and NUMA node are read (the standard attributes "
        "resource.kubernetes.io/pcieRoot and numaNode)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["json", "text"] = Field("json", description="log format")


# The fields are declared by theme in the bases; here are the plugin pod's own (its UID, namespace, heartbeat and
# handover) and the checks and paths that span themes. pydantic orders the fields from the last base to the first,
# then the class's own: --help lists the flags in that order.
class Settings(ServiceFields, HealthFields, DriverEditsFields, MigFields, MpsFields, NodeFields, OptionSettings):
    """Everything the node plugin needs to know about its node and its cluster (flags and env: api/options.py)."""

    model_config = SettingsConfigDict(env_prefix="FRACGPU_")

    instance_id: str | None = Field(
        None, description="pod UID: unique socket names during rolling updates", json_schema_extra={"env": "POD_UID"}
    )
    namespace: str | None = Field(
        None,
        description="the plugin pod's namespace, where it renews its node's heartbeat Lease; unset: no heartbeat",
        json_schema_extra={"env": "POD_NAMESPACE"},
    )
    heartbeat_interval_seconds: float = Field(
        10.0, gt=0, description="seconds between two renewals of the node's heartbeat Lease"
    )
    handover_timeout_seconds: float = Field(
        25.0, ge=0, description="after SIGTERM, serve at most this long while no replacement instance is registered"
    )

    @model_validator(mode="after")
    def _mig_is_not_mps(self) -> "Settings":
        mig, mps = set(filter(None, self.mig_gpus.split(","))), set(filter(None, self.mps_gpus.split(",")))
        both = sorted(mig & mps) if not ({"all"} & (mig | mps)) else (sorted(mig | mps) if mig and mps else [])
        if both:
            raise ValueError(
                f"GPUs {', '.join(both)} are named both MIG GPUs (--mig-gpus, chart value mig.gpus) and MPS GPUs "
                "(--mps-gpus, chart value mps.gpus): a MIG GPU is partitioned by the hardware and is never an MPS GPU; "
                "name each GPU in at most one of them"
            )
        return self

    @model_validator(mode="after")
    def _label_scope_has_a_label(self) -> "Settings":
        if self.mps_trust_scope == "namespaceLabel" and not self.mps_trust_label:
            raise ValueError("--mps-trust-scope=namespaceLabel needs --mps-trust-label (chart mps.trustDomain.label)")
        return self

    @model_validator(mode="after")
    def _waits_fit_the_kubelet_deadline(self) -> "Settings":
        waits = (self.api_timeout_seconds, self.node_lock_timeout_seconds, self.mps_domain_switch_timeout_seconds)
        if sum(waits) > MAX_WAIT_S:
            raise ValueError(
                f"API timeout plus node lock timeout plus MPS domain switch timeout must be at most {MAX_WAIT_S:g} s "
                f"(the kubelet gives a prepare call {KUBELET_CALL_TIMEOUT_S:g} s), got "
                + " + ".join(f"{w:g} s" for w in waits)
            )
        return self

    @model_validator(mode="after")
    def _nvml_needs_driver_edits(self) -> "Settings":
        if self.enforcement == "nvml" and self.driver_edits != "toolkit":
            raise ValueError(
                "--enforcement=nvml needs --driver-edits=toolkit: the plugin installs NVIDIA's nvidia-cdi-hook, "
                "which applies the limit, with the driver edits (chart: driverEdits: toolkit)"
            )
        return self

    @property
    def mps_control_binary(self) -> Path:
        """The driver's nvidia-cuda-mps-control as this process sees it."""
        root = self.toolkit_driver_root or self.driver_root
        return self.mps_control or root / "usr/bin/nvidia-cuda-mps-control"

    @property
    def cdi_hook_path(self) -> Path:
        """Where nvidia-cdi-hook is installed, on the host and in the plugin (the same path)."""
        return self.nvidia_cdi_hook_path or self.plugin_data_dir / "nvidia-cdi-hook"


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags over the environment (FRACGPU_*, NODE_NAME, POD_UID); exits 2 on bad input."""
    parser = build_parser(
        Settings,
        "fracgpu-kubelet-plugin",
        "fracgpu node plugin: publishes this node's NVIDIA GPUs as DRA devices shareable by memory and prepares "
        "ResourceClaims of the driver as CDI devices for the kubelet.",
    )
    return parse(Settings, argv, parser)
