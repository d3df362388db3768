"""Controller settings: command-line flags with environment defaults, validated by pydantic."""

import argparse
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME

FIELD_MANAGER = "fracgpu-controller"
COMPONENT = "fracgpu-controller"


class Settings(BaseModel):
    """Everything the controller needs to know about its cluster and itself."""

    model_config = ConfigDict(frozen=True)

    kubeconfig: Path | None = Field(None, description="None: in-cluster service account, else $KUBECONFIG")
    driver_name: str = DRIVER_NAME
    device_class: str = DEVICE_CLASS_NAME
    admission: bool = Field(True, description="serve and register the validating webhooks")
    webhook_address: str = Field("0.0.0.0", description="where the webhook server listens")
    webhook_port: int = Field(9443, ge=1, le=65535)
    webhook_host: str | None = Field(None, description="host name in the webhook URL (and certificate)")
    webhook_service: str | None = Field(
        None, description="`<namespace>/<name>` of a Service in front of the webhook: registered as service ref"
    )
    webhook_config_name: str = Field(DRIVER_NAME, description="name of the ValidatingWebhookConfiguration")
    webhook_cert_dir: Path | None = Field(None, description="directory with tls.crt/tls.key; None: self-signed")
    webhook_failure_policy: Literal["Ignore", "Fail"] = Field(
        "Ignore", description="what the API server does when the webhook cannot be reached"
    )
    health_address: str = "0.0.0.0"
    health_port: int = Field(8080, ge=0, le=65535, description="kopf liveness endpoint /healthz; 0 disables")
    metrics_port: int = Field(8081, ge=0, le=65535, description="Prometheus /metrics; 0 disables")
    workers: int = Field(16, ge=1, le=64, description="concurrent status writers (and ledger writers)")
    ledger_delay_seconds: float = Field(0.5, ge=0, description="batch ledger updates over this window")
    resync_seconds: float = Field(300.0, gt=0, description="full re-check of claims and ledger")
    device_gone_grace_seconds: float = Field(
        60.0, ge=0, description="how long an allocated device may be missing before a Warning event"
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"

    @property
    def liveness_endpoint(self) -> str | None:
        """kopf's liveness URL, or None when disabled."""
        return f"http://{self.health_address}:{self.health_port}/healthz" if self.health_port else None


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    """The command line; each flag defaults to its FRACGPU_* environment variable."""
    p = argparse.ArgumentParser(
        prog="fracgpu-controller",
        description="fracgpu controller: records the physical GPU of each ResourceClaim of gpu.fracgpu.dev "
        "in its status, keeps the `kubectl get gpus` ledger and validates claims at admission.",
    )
    p.add_argument("--kubeconfig", default=_env("KUBECONFIG"), help="kubeconfig file (default: in-cluster)")
    p.add_argument("--driver-name", default=_env("FRACGPU_DRIVER_NAME", DRIVER_NAME))
    p.add_argument("--device-class", default=_env("FRACGPU_DEVICE_CLASS", DEVICE_CLASS_NAME))
    p.add_argument(
        "--no-admission",
        dest="admission",
        action="store_false",
        default=_env("FRACGPU_ADMISSION", "true") != "false",
        help="do not serve or register the validating webhooks",
    )
    p.add_argument("--webhook-address", default=_env("FRACGPU_WEBHOOK_ADDRESS", "0.0.0.0"))
    p.add_argument("--webhook-port", type=int, default=int(_env("FRACGPU_WEBHOOK_PORT", "9443") or 9443))
    p.add_argument("--webhook-host", default=_env("FRACGPU_WEBHOOK_HOST"), help="host in the webhook URL")
    p.add_argument(
        "--webhook-service",
        default=_env("FRACGPU_WEBHOOK_SERVICE"),
        help="<namespace>/<name> of the webhook Service (registers a service reference instead of a URL)",
    )
    p.add_argument("--webhook-config-name", default=_env("FRACGPU_WEBHOOK_CONFIG_NAME"))
    p.add_argument(
        "--webhook-cert-dir",
        default=_env("FRACGPU_WEBHOOK_CERT_DIR"),
        help="directory with tls.crt and tls.key (default: generate a self-signed certificate at start)",
    )
    p.add_argument(
        "--webhook-failure-policy",
        choices=["Ignore", "Fail"],
        default=_env("FRACGPU_WEBHOOK_FAILURE_POLICY", "Ignore"),
        help="Ignore: a controller outage never blocks claims (the node plugin still refuses bad configs at "
        "prepare); Fail: no claim of the driver is admitted unchecked",
    )
    p.add_argument("--health-port", type=int, default=int(_env("FRACGPU_HEALTH_PORT", "8080") or 0))
    p.add_argument("--metrics-port", type=int, default=int(_env("FRACGPU_METRICS_PORT", "8081") or 0))
    p.add_argument("--workers", type=int, default=int(_env("FRACGPU_WORKERS", "16") or 16))
    p.add_argument("--ledger-delay", type=float, default=float(_env("FRACGPU_LEDGER_DELAY", "0.5") or 0.5))
    p.add_argument("--resync", type=float, default=float(_env("FRACGPU_RESYNC", "300") or 300))
    p.add_argument(
        "--device-gone-grace",
        type=float,
        default=float(_env("FRACGPU_DEVICE_GONE_GRACE", "60") or 60),
        help="seconds an allocated device may be unpublished before the claim gets a Warning event",
    )
    p.add_argument("--log-level", default=_env("FRACGPU_LOG_LEVEL", "info"))
    p.add_argument("--log-format", default=_env("FRACGPU_LOG_FORMAT", "json"), help="json | text")
    return p


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags and environment; exits with a usage message on bad values."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.webhook_service and args.webhook_service.count("/") != 1:
        p.error("--webhook-service must be <namespace>/<name>")
    try:
        return Settings(
            kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
            driver_name=args.driver_name,
            device_class=args.device_class,
            admission=args.admission,
            webhook_address=args.webhook_address,
            webhook_port=args.webhook_port,
            webhook_host=args.webhook_host or None,
            webhook_service=args.webhook_service or None,
            webhook_config_name=args.webhook_config_name or args.driver_name,
            webhook_cert_dir=Path(args.webhook_cert_dir) if args.webhook_cert_dir else None,
            webhook_failure_policy=args.webhook_failure_policy,
            health_port=args.health_port,
            metrics_port=args.metrics_port,
            workers=args.workers,
            ledger_delay_seconds=args.ledger_delay,
            resync_seconds=args.resync,
            device_gone_grace_seconds=args.device_gone_grace,
            log_level=args.log_level,
            log_format=args.log_format,
        )
    except ValidationError as err:
        p.error("; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()))
