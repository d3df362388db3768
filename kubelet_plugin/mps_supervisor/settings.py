"""The MPS supervisor's options: every field of `MpsSettings` is a flag and a ``FRACGPU_*`` variable
(api/options.py); `parse_mps_settings` reads them, flags over the environment, and exits 2 on bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from api.options import OptionSettings, build_parser, parse
from kubelet_plugin.core.settings import Quantity, mps_selection
from kubelet_plugin.kinds.mps.control import CONTROL_IN_DRIVER_ROOT

GiB = 1 << 30


class MpsSettings(OptionSettings):
    """The supervisor's options (flags and FRACGPU_* variables, api/options.py)."""

    model_config = SettingsConfigDict(env_prefix="FRACGPU_")

    mps_gpus: str = Field(min_length=1, description="the MPS GPUs: all, or NVML indices and UUIDs (as the plugin's)")
    mps_root: Path = Field(Path("/run/fracgpu/mps"), description="host directory of the daemons' files")
    driver_root: Path = Field(Path("/"), description="the driver root as mounted here, holding the MPS binaries")
    mps_control: Path | None = Field(
        None, description="nvidia-cuda-mps-control (default: <driver root>/usr/bin/nvidia-cuda-mps-control)"
    )
    daemon_library_path: str = Field(
        "", description="LD_LIBRARY_PATH of the daemons (the driver's libcuda.so.1 for their servers); empty: inherited"
    )
    multi_user: bool = Field(True, description="start daemons with -multiuser-server: one server for every UID")
    refresh_seconds: float = Field(5.0, gt=0, description="seconds between two status writes per GPU")
    poll_seconds: float = Field(
        0.2, gt=0, description="seconds between two looks at each GPU's tenant request and control socket"
    )
    shm_size_bytes: Quantity = Field(
        8 * GiB, gt=0, description="the size limit of each MPS GPU's /dev/shm tmpfs (a quantity, e.g. 8Gi)"
    )
    start_timeout_seconds: float = Field(10.0, gt=0, description="seconds a new daemon has to answer")
    metrics_address: str = Field("0.0.0.0", description="where the metrics server listens")
    metrics_port: int = Field(8081, ge=0, le=65535, description="port of the Prometheus /metrics server; 0: off")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["json", "text"] = Field("json", description="log format")

    @field_validator("mps_gpus")
    @classmethod
    def _selection(cls, value: str) -> str:
        return ",".join(mps_selection(value))

    @property
    def control(self) -> Path:
        return self.mps_control or self.driver_root / CONTROL_IN_DRIVER_ROOT


def parse_mps_settings(argv: list[str] | None = None) -> MpsSettings:
    parser = build_parser(
        MpsSettings,
        "python -m kubelet_plugin.mps_supervisor",
        "fracgpu MPS supervisor: one CUDA MPS control daemon per MPS GPU, kept alive apart from the node plugin.",
    )
    return parse(MpsSettings, argv, parser)
