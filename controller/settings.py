"""Controller settings: one pydantic field per option, each a flag and an environment variable (api/options.py)."""

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.options import OptionSettings, build_parser, parse

FIELD_MANAGER = "fracgpu-controller"
COMPONENT = "fracgpu-controller"


class Settings(OptionSettings):
    """Everything the controller needs to know about its cluster and itself (flags and env: api/options.py)."""

    model_config = SettingsConfigDict(env_prefix="FRACGPU_")

    kubeconfig: Path | None = Field(
        None,
        description="kubeconfig file (default: the in-cluster service account)",
        json_schema_extra={"env": "KUBECONFIG"},
    )
    driver_name: str = Field(DRIVER_NAME, description="DRA driver name")
    device_class: str = Field(DEVICE_CLASS_NAME, description="the DeviceClass of the driver's claims")
    admission: bool = Field(True, description="serve and register the validating webhooks")
    webhook_address: str = Field("0.0.0.0", description="where the webhook server listens")
    webhook_port: int = Field(9443, ge=1, le=65535, description="port of the webhook server")
    webhook_host: str | None = Field(None, description="host name in the webhook URL (and certificate)")
    webhook_service: str | None = Field(
        None,
        description="<namespace>/<name> of a Service in front of the webhook: registered as a service reference "
        "instead of a URL",
    )
    webhook_config_name: str = Field(
        "", validate_default=True, description="name of the ValidatingWebhookConfiguration (default: the driver name)"
    )
    webhook_cert_dir: Path | None = Field(
        None, description="directory with tls.crt and tls.key (default: a self-signed certificate made at start)"
    )
    webhook_failure_policy: Literal["Ignore", "Fail"] = Field(
        "Ignore",
        description="Ignore: a controller outage never blocks claims (the node plugin still refuses bad configs at "
        "prepare); Fail: no claim of the driver is admitted unchecked",
    )
    health_address: str = Field("0.0.0.0", description="where the liveness endpoint listens")
    health_port: int = Field(8080, ge=0, le=65535, description="kopf liveness endpoint /healthz; 0 disables")
    metrics_port: int = Field(8081, ge=0, le=65535, description="Prometheus /metrics; 0 disables")
    workers: int = Field(64, ge=1, le=128, description="concurrent claim status writers")
    ledger_workers: int = Field(16, ge=1, le=64, description="concurrent GPU object writes of one ledger pass")
    ledger_delay_seconds: float = Field(0.5, ge=0, description="batch ledger updates over this window")
    resync_seconds: float = Field(300.0, gt=0, description="full re-check of claims and ledger")
    device_gone_grace_seconds: float = Field(
        60.0, ge=0, description="seconds an allocated device may be unpublished before the claim gets a Warning event"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["json", "text"] = Field("json", description="log format")

    @field_validator("webhook_service")
    @classmethod
    def _service_is_namespaced(cls, value: str | None) -> str | None:
        if value is not None and value.count("/") != 1:
            raise ValueError("must be <namespace>/<name>, e.g. fracgpu/fracgpu-controller")
        return value

    @field_validator("webhook_config_name")
    @classmethod
    def _config_name_defaults_to_the_driver(cls, value: str, info: ValidationInfo) -> str:
        return value or str(info.data.get("driver_name", DRIVER_NAME))

    @property
    def liveness_endpoint(self) -> str | None:
        """kopf's liveness URL, or None when disabled."""
        return f"http://{self.health_address}:{self.health_port}/healthz" if self.health_port else None


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags over the environment (FRACGPU_*, KUBECONFIG); exits 2 with a usage message on bad input."""
    parser = build_parser(
        Settings,
        "fracgpu-controller",
        "fracgpu controller: records the physical GPU of each ResourceClaim of the driver in its status, keeps the "
        "`kubectl get gpus` ledger and validates claims at admission.",
    )
    return parse(Settings, argv, parser)
