"""Node plugin settings: command-line flags with environment defaults, validated by pydantic."""

import argparse
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from api.names import DRIVER_NAME
from api.quantity import MiB, to_bytes
from kubelet_plugin.checkpoint import CHECKPOINT_FILE_NAME
from kubelet_plugin.enforcement import NODE_MODES, NodeMode
from kubelet_plugin.filelock import serialize_lock_path

#: The kubelet cancels NodePrepareResources / NodeUnprepareResources after 45 s.
KUBELET_CALL_TIMEOUT_S = 45.0
#: What a call may spend waiting on the API server plus waiting for the node lock; the rest of the
#: kubelet's 45 s is left for the local work and the answer.
MAX_WAIT_S = 40.0


class Settings(BaseModel):
    """Everything the node plugin needs to know about its node and its cluster."""

    model_config = ConfigDict(frozen=True)

    node_name: str = Field(min_length=1)
    driver_name: str = DRIVER_NAME
    kubelet_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    driver_root: Path = Field(Path("/"), description="host root under which /dev/nvidia* are found")
    dev_char_dir: Path = Field(Path("/dev/char"), description="host /dev/char, for <major>:<minor> links")
    memory_step_bytes: int = Field(256 * MiB, gt=0)
    memory_reserve_bytes: int = Field(0, ge=0)
    enforcement: NodeMode = Field(
        "auto", description="the floor of every claim's memory enforcement; auto: the strongest each GPU offers"
    )
    cgroup_root: Path = Field(Path("/sys/fs/cgroup"), description="where NVIDIA's hook looks for cgroup v2")
    hami_core_library: Path = Path("/usr/local/vgpu/libvgpu.so")
    hami_core_lock_dir: Path = Path("/tmp/vgpulock")
    driver_edits: Literal["none", "toolkit"] = Field(
        "none", description="toolkit: every claim spec carries the driver's libraries and hooks (nvidia-ctk)"
    )
    toolkit_driver_root: Path | None = Field(
        None, description="the driver root as mounted into the plugin, for nvidia-ctk (default: driver_root)"
    )
    host_driver_root: Path | None = Field(
        None, description="the driver root as the host sees it, written into specs (default: driver_root)"
    )
    nvidia_ctk: Path = Path("/usr/bin/nvidia-ctk")
    nvidia_cdi_hook_source: Path = Field(Path("/usr/bin/nvidia-cdi-hook"), description="the hook in the image")
    nvidia_cdi_hook_path: Path | None = Field(
        None, description="host path the hook is copied to (default: <plugin data dir>/nvidia-cdi-hook)"
    )
    driver_edits_retry_seconds: float = Field(60.0, gt=0)
    instance_id: str | None = Field(None, description="pod UID: unique socket names during rolling updates")
    health_interval_seconds: float = Field(10.0, gt=0)
    resync_seconds: float = Field(60.0, gt=0)
    api_timeout_seconds: float = Field(
        10.0, gt=0, description="budget of one API request on the prepare path, retries included"
    )
    node_lock_timeout_seconds: float = Field(
        10.0, ge=0, description="how long a prepare/unprepare waits for the node-wide lock"
    )
    metrics_address: str = "0.0.0.0"
    metrics_port: int = Field(8080, ge=0, le=65535, description="0 disables the metrics server")
    usage_interval_seconds: float = Field(0.0, ge=0, description="GPU memory use sample interval; 0 = off")
    usage_ledger_interval_seconds: float = Field(
        30.0, gt=0, description="at most one write of a GPU's used memory to its ledger object per this interval"
    )
    proc_root: Path = Field(Path("/proc"), description="the host's /proc (process cgroups of the usage sampler)")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"
    handover_timeout_seconds: float = Field(
        25.0, ge=0, description="after SIGTERM, serve at most this long while no replacement instance is registered"
    )

    @field_validator("memory_step_bytes")
    @classmethod
    def _step_is_whole_mib(cls, value: int) -> int:
        if value % MiB:
            raise ValueError("memory step must be a whole number of MiB (e.g. 256Mi)")
        return value

    @model_validator(mode="after")
    def _waits_fit_the_kubelet_deadline(self) -> "Settings":
        if self.api_timeout_seconds + self.node_lock_timeout_seconds > MAX_WAIT_S:
            raise ValueError(
                f"API timeout plus node lock timeout must be at most {MAX_WAIT_S:g} s "
                f"(the kubelet gives a prepare call {KUBELET_CALL_TIMEOUT_S:g} s), got "
                f"{self.api_timeout_seconds:g} s + {self.node_lock_timeout_seconds:g} s"
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
    def plugin_data_dir(self) -> Path:
        """`<kubelet dir>/plugins/<driver>`: DRA socket, checkpoint, lock."""
        return self.kubelet_dir / "plugins" / self.driver_name

    @property
    def cdi_hook_path(self) -> Path:
        """Where nvidia-cdi-hook is installed, on the host and in the plugin (the same path)."""
        return self.nvidia_cdi_hook_path or self.plugin_data_dir / "nvidia-cdi-hook"

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_data_dir / CHECKPOINT_FILE_NAME

    @property
    def lock_path(self) -> Path:
        return serialize_lock_path(self.plugin_data_dir)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def _problem(error: ErrorDetails) -> str:
    message = error["msg"].removeprefix("Value error, ")
    return f"{'.'.join(map(str, error['loc']))}: {message}" if error["loc"] else message


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags; every flag defaults to its environment variable (FRACGPU_*, NODE_NAME, POD_UID)."""
    p = argparse.ArgumentParser(
        prog="fracgpu-kubelet-plugin",
        description="fracgpu node plugin: publishes this node's NVIDIA GPUs as DRA devices shareable by memory "
        "and prepares ResourceClaims of the driver as CDI devices for the kubelet. Every flag defaults to the "
        "environment variable named in its help.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    add("--node-name", default=_env("NODE_NAME"), help="this node; required (NODE_NAME)")
    add("--driver-name", default=_env("FRACGPU_DRIVER_NAME", DRIVER_NAME), help="DRA driver name (FRACGPU_DRIVER_NAME)")
    add("--kubelet-dir", default=_env("FRACGPU_KUBELET_DIR", "/var/lib/kubelet"), help="(FRACGPU_KUBELET_DIR)")
    add("--cdi-dir", default=_env("FRACGPU_CDI_DIR", "/var/run/cdi"), help="per-claim CDI specs (FRACGPU_CDI_DIR)")
    add(
        "--driver-root", default=_env("FRACGPU_DRIVER_ROOT", "/"), help="host root of dev/nvidia* (FRACGPU_DRIVER_ROOT)"
    )
    add(
        "--dev-char-dir",
        default=_env("FRACGPU_DEV_CHAR_DIR", "/dev/char"),
        help="host /dev/char (FRACGPU_DEV_CHAR_DIR)",
    )
    add("--memory-step", default=_env("FRACGPU_MEMORY_STEP", "256Mi"), help="share granularity (FRACGPU_MEMORY_STEP)")
    add(
        "--memory-reserve",
        default=_env("FRACGPU_MEMORY_RESERVE", "0"),
        help="held back per GPU (FRACGPU_MEMORY_RESERVE)",
    )
    add(
        "--enforcement",
        choices=NODE_MODES,
        default=_env("FRACGPU_ENFORCEMENT", "auto"),
        help="the floor of every claim's memory enforcement: auto (the strongest tier each GPU offers: nvml, "
        "hami-core, none), or that tier for every claim; a claim's GpuConfig may raise it (FRACGPU_ENFORCEMENT)",
    )
    add(
        "--cgroup-root",
        default=_env("FRACGPU_CGROUP_ROOT", "/sys/fs/cgroup"),
        help="where the host's cgroup hierarchy is mounted, as NVIDIA's hook sees it (FRACGPU_CGROUP_ROOT)",
    )
    add(
        "--hami-core-library",
        default=_env("FRACGPU_HAMI_CORE_LIBRARY", "/usr/local/vgpu/libvgpu.so"),
        help="host path of HAMi-core's libvgpu.so (FRACGPU_HAMI_CORE_LIBRARY)",
    )
    add(
        "--driver-edits",
        choices=["none", "toolkit"],
        default=_env("FRACGPU_DRIVER_EDITS", "none"),
        help="toolkit: claim specs carry the driver's libraries and hooks, generated by nvidia-ctk; none: they "
        "carry device nodes only and rely on an nvidia runtime that injects the driver (FRACGPU_DRIVER_EDITS)",
    )
    add(
        "--toolkit-driver-root",
        default=_env("FRACGPU_TOOLKIT_DRIVER_ROOT"),
        help="the driver root as mounted into the plugin, read by nvidia-ctk; default --driver-root "
        "(FRACGPU_TOOLKIT_DRIVER_ROOT)",
    )
    add(
        "--host-driver-root",
        default=_env("FRACGPU_HOST_DRIVER_ROOT"),
        help="the driver root as the host sees it (e.g. / or /run/nvidia/driver); default --driver-root "
        "(FRACGPU_HOST_DRIVER_ROOT)",
    )
    add("--nvidia-ctk", default=_env("FRACGPU_NVIDIA_CTK", "/usr/bin/nvidia-ctk"), help="(FRACGPU_NVIDIA_CTK)")
    add(
        "--nvidia-cdi-hook-source",
        default=_env("FRACGPU_NVIDIA_CDI_HOOK_SOURCE", "/usr/bin/nvidia-cdi-hook"),
        help="the hook binary shipped in the image (FRACGPU_NVIDIA_CDI_HOOK_SOURCE)",
    )
    add(
        "--nvidia-cdi-hook-path",
        default=_env("FRACGPU_NVIDIA_CDI_HOOK_PATH"),
        help="where the hook is copied to, the same path on the host; default <kubelet dir>/plugins/<driver>/"
        "nvidia-cdi-hook (FRACGPU_NVIDIA_CDI_HOOK_PATH)",
    )
    add("--instance-id", default=_env("POD_UID"), help="pod UID, for rolling-update socket names (POD_UID)")
    add(
        "--metrics-port",
        type=int,
        default=int(_env("FRACGPU_METRICS_PORT", "8080") or 0),
        help="0 = off (FRACGPU_METRICS_PORT)",
    )
    add(
        "--api-timeout",
        type=float,
        default=_env("FRACGPU_API_TIMEOUT", "10"),  # argparse applies `type` to a string default
        help="seconds one API request of a prepare may take, retries included (FRACGPU_API_TIMEOUT)",
    )
    add(
        "--node-lock-timeout",
        type=float,
        default=_env("FRACGPU_NODE_LOCK_TIMEOUT", "10"),
        help="seconds a prepare/unprepare waits for the node-wide lock (FRACGPU_NODE_LOCK_TIMEOUT)",
    )
    add(
        "--usage-interval",
        type=float,
        default=_env("FRACGPU_USAGE_INTERVAL", "0"),
        help="seconds between samples of GPU memory use per claim (NVML per process); 0 = off (FRACGPU_USAGE_INTERVAL)",
    )
    add(
        "--usage-ledger-interval",
        type=float,
        default=_env("FRACGPU_USAGE_LEDGER_INTERVAL", "30"),
        help="seconds between two writes of one GPU's used memory to its GPU object (FRACGPU_USAGE_LEDGER_INTERVAL)",
    )
    add(
        "--proc-root",
        default=_env("FRACGPU_PROC_ROOT", "/proc"),
        help="the host's /proc, where the usage sampler reads process cgroups (FRACGPU_PROC_ROOT)",
    )
    add(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=_env("FRACGPU_LOG_LEVEL", "info"),
        help="(FRACGPU_LOG_LEVEL)",
    )
    add(
        "--log-format",
        choices=["json", "text"],
        default=_env("FRACGPU_LOG_FORMAT", "json"),
        help="(FRACGPU_LOG_FORMAT)",
    )
    add(
        "--handover-timeout",
        type=float,
        default=_env("FRACGPU_HANDOVER_TIMEOUT", "25"),
        help="seconds the plugin keeps serving after SIGTERM until a replacement instance has registered with the "
        "kubelet; keep it below the pod's termination grace period (FRACGPU_HANDOVER_TIMEOUT)",
    )
    args = p.parse_args(argv)
    if not args.node_name:
        p.error("--node-name (or env NODE_NAME) is required: the plugin publishes this node's GPUs")
    try:
        return Settings(
            node_name=args.node_name,
            driver_name=args.driver_name,
            kubelet_dir=Path(args.kubelet_dir),
            cdi_dir=Path(args.cdi_dir),
            driver_root=Path(args.driver_root),
            dev_char_dir=Path(args.dev_char_dir),
            memory_step_bytes=to_bytes(args.memory_step),
            memory_reserve_bytes=to_bytes(args.memory_reserve),
            enforcement=args.enforcement,
            cgroup_root=Path(args.cgroup_root),
            hami_core_library=Path(args.hami_core_library),
            driver_edits=args.driver_edits,
            toolkit_driver_root=Path(args.toolkit_driver_root) if args.toolkit_driver_root else None,
            host_driver_root=Path(args.host_driver_root) if args.host_driver_root else None,
            nvidia_ctk=Path(args.nvidia_ctk),
            nvidia_cdi_hook_source=Path(args.nvidia_cdi_hook_source),
            nvidia_cdi_hook_path=Path(args.nvidia_cdi_hook_path) if args.nvidia_cdi_hook_path else None,
            instance_id=args.instance_id or None,
            metrics_port=args.metrics_port,
            api_timeout_seconds=args.api_timeout,
            node_lock_timeout_seconds=args.node_lock_timeout,
            usage_interval_seconds=args.usage_interval,
            usage_ledger_interval_seconds=args.usage_ledger_interval,
            proc_root=Path(args.proc_root),
            log_level=args.log_level,
            log_format=args.log_format,
            handover_timeout_seconds=args.handover_timeout,
        )
    except ValidationError as err:
        p.error("; ".join(map(_problem, err.errors())))
    except ValueError as err:
        p.error(str(err))
