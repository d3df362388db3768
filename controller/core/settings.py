"""Controller settings: one pydantic field per option, each a flag and an environment variable (api/options.py)."""

import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from api.mps_trust import TrustScope
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME, MIG_DEVICE_CLASS_NAME, MPS_DEVICE_CLASS_NAME
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
    mig_device_class: str = Field(
        MIG_DEVICE_CLASS_NAME,
        description="the DeviceClass of the driver's MIG partitions (chart value mig.deviceClass)",
    )
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
    webhook_cert_secret: str | None = Field(
        None,
        description="<namespace>/<name> of the Secret every replica shares its webhook certificate through: the "
        "first replica creates it, the others read it (default: each process makes its own certificate)",
    )
    webhook_check_seconds: float = Field(
        10.0,
        gt=0,
        description="how often each replica checks that its webhooks are still in the configuration (and puts "
        "them back when they were removed)",
    )
    webhook_cert_check_seconds: float = Field(
        3600.0, gt=0, description="how often each replica re-reads the shared certificate (and renews it when due)"
    )
    leader_elect: bool = Field(
        False, description="elect a leader on a Lease: only the leader writes claim status, the ledger and Events"
    )
    lease_name: str = Field("fracgpu-controller", description="name of the leader Lease")
    identity: str | None = Field(
        None,
        description="this replica's name, the leader Lease's holder before `_<random>` (default: the host name)",
        json_schema_extra={"env": "POD_NAME"},
    )
    lease_duration_seconds: float = Field(
        15.0, gt=0, description="seconds a leader Lease is valid unrenewed: a follower takes over after this long"
    )
    renew_deadline_seconds: float = Field(
        10.0, gt=0, description="seconds the leader leads after its last successful renew (less than the duration)"
    )
    retry_period_seconds: float = Field(
        2.0, gt=0, description="seconds between attempts to take or renew the Lease (less than the renew deadline)"
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
    namespace: str | None = Field(
        None,
        description="the controller's namespace (the release's): where the leader Lease is and the node plugins "
        "renew their heartbeat Leases; unset: plugin heartbeats are not watched and --leader-elect is refused",
        json_schema_extra={"env": "POD_NAMESPACE"},
    )
    plugin_heartbeat_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="seconds without a renewal of a node plugin's heartbeat Lease after which the node's GPU "
        "objects say PluginReporting=False",
    )
    mps: bool = Field(
        False,
        description="the cluster may have MPS GPUs (chart: mps.gpus set): keep MPS trust domains apart at scheduling "
        "(tolerations at admission, a DeviceTaintRule per MPS GPU, the MPS binding conditions decided)",
    )
    mps_trust_scope: TrustScope = Field(
        "namespace",
        description="who may share an MPS GPU's daemon: namespace, namespaceLabel (namespaces with the same value "
        "of --mps-trust-label) or cluster (every claim)",
    )
    mps_trust_label: str = Field("", description="the namespace label of --mps-trust-scope=namespaceLabel")
    extra_device_classes: str = Field(
        "",
        description="further DeviceClasses of the driver, comma-separated (the chart's enforced and MPS classes): their "
        "pending claims are watched as those of --device-class are, and with --mps their requests get MPS "
        "trust-domain tolerations too",
    )

    @property
    def device_classes(self) -> frozenset[str]:
        """Our DeviceClass and the further ones (--extra-device-classes)."""
        return frozenset({self.device_class, *(c.strip() for c in self.extra_device_classes.split(",") if c.strip())})

    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["json", "text"] = Field("json", description="log format")

    @model_validator(mode="after")
    def _label_scope_has_a_label(self) -> "Settings":
        if self.mps_trust_scope == "namespaceLabel" and not self.mps_trust_label:
            raise ValueError("--mps-trust-scope=namespaceLabel needs --mps-trust-label (chart mps.trustDomain.label)")
        return self

    @field_validator("webhook_service")
    @classmethod
    def _service_is_namespaced(cls, value: str | None) -> str | None:
        if value is not None and value.count("/") != 1:
            raise ValueError("must be <namespace>/<name>, e.g. fracgpu/fracgpu-controller")
        return value

    @field_validator("webhook_cert_secret")
    @classmethod
    def _secret_is_namespaced(cls, value: str | None) -> str | None:
        if value is not None and value.count("/") != 1:
            raise ValueError("must be <namespace>/<name>, e.g. fracgpu/fracgpu-controller-webhook-cert")
        return value

    @model_validator(mode="after")
    def _lease_settings_fit(self) -> "Settings":
        if not self.leader_elect:
            return self
        if not self.namespace:
            raise ValueError(
                "--leader-elect needs the Lease's namespace: --namespace (or env POD_NAMESPACE, as the chart sets)"
            )
        if not 0 < self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                f"the lease timings must satisfy --retry-period ({self.retry_period_seconds:g}) < --renew-deadline "
                f"({self.renew_deadline_seconds:g}) < --lease-duration ({self.lease_duration_seconds:g})"
            )
        return self

    @field_validator("webhook_config_name")
    @classmethod
    def _config_name_defaults_to_the_driver(cls, value: str, info: ValidationInfo) -> str:
        return value or str(info.data.get("driver_name", DRIVER_NAME))

    @property
    def claim_classes(self) -> tuple[str, ...]:
        """Every DeviceClass of ours a claim may name, each once: shares of GPUs (`device_class`), MIG partitions,
        the further classes (--extra-device-classes) and the chart's optional MPS and enforced classes by their
        default names, installed or not (a claim of one the cluster lacks is told so: `chart_classes`)."""
        optional = {f"mps.{self.driver_name}", f"enforced.{self.driver_name}"}
        extra = sorted({*self.device_classes, *optional} - {self.device_class, self.mig_device_class})
        return (self.device_class, self.mig_device_class, *extra)

    @property
    def indexed_classes(self) -> frozenset[str]:
        """The DeviceClasses the controller indexes: those a claim of ours may name, and the MPS class, which
        messages advise (whether it exists decides what they say)."""
        return frozenset({*self.claim_classes, MPS_DEVICE_CLASS_NAME})

    @property
    def replica(self) -> str:
        """This replica's name: the pod name, else the host name (its identity in the leader Lease adds
        `_<random>`, as kube-controller-manager's does: a restarted process must not take over its dead
        predecessor's Lease as if it were its own)."""
        return self.identity or socket.gethostname()

    @property
    def liveness_endpoint(self) -> str | None:
        """kopf's liveness URL, or None when disabled."""
        return f"http://{self.health_address}:{self.health_port}/healthz" if self.health_port else None


class ChartClass(BaseModel):
    """A DeviceClass of ours the chart may create: the chart value that does, and what the class selects."""

    model_config = ConfigDict(frozen=True)

    value: str
    """The chart value that creates it (`deviceClass.mps.create`)."""
    selects: str
    """What it selects, as the message says it (`only the MPS GPUs, those of chart value mps.gpus`)."""


def chart_classes(s: Settings) -> dict[str, ChartClass]:
    """The optional DeviceClasses of `s.claim_classes` the chart creates (all but the GPU class, without which
    nothing of the driver is allocated), by name, each with its chart value."""
    return {
        s.mig_device_class: ChartClass(
            value="deviceClass.mig.create", selects="only MIG partitions, those of the GPUs of chart value mig.gpus"
        ),
        f"mps.{s.driver_name}": ChartClass(
            value="deviceClass.mps.create", selects="only MPS GPUs, those of chart value mps.gpus"
        ),
        f"enforced.{s.driver_name}": ChartClass(
            value="deviceClass.enforced.create",
            selects="only GPUs whose memory grants are enforced (attribute memoryEnforcement not none)",
        ),
    }


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags over the environment (FRACGPU_*, KUBECONFIG); exits 2 with a usage message on bad input."""
    parser = build_parser(
        Settings,
        "fracgpu-controller",
        "fracgpu controller: records the physical GPU of each ResourceClaim of the driver in its status, keeps the "
        "`kubectl get gpus` ledger and validates claims at admission.",
    )
    return parse(Settings, argv, parser)
