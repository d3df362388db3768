"""Unit tests of the controller's command line and kopf settings (controller/core/settings.py, handlers.py)."""

import logging
from pathlib import Path

import pytest
from kubernetes import client

from api.names import DRIVER_NAME
from controller.__main__ import main
from controller.admission.webhook import WebhookServer
from controller.core.settings import Settings, parse_settings
from controller.handlers import operator_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KUBECONFIG", "FRACGPU_WORKERS", "FRACGPU_ADMISSION"):
        monkeypatch.delenv(var, raising=False)
    s = parse_settings([])
    assert s.kubeconfig is None and s.driver_name == DRIVER_NAME and s.admission
    assert (s.webhook_port, s.health_port, s.metrics_port, s.webhook_config_name) == (9443, 8080, 8081, DRIVER_NAME)
    assert s.liveness_endpoint == "http://0.0.0.0:8080/healthz"


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/k")
    monkeypatch.setenv("FRACGPU_WORKERS", "7")
    s = parse_settings(["--no-admission", "--health-port=0", "--device-gone-grace=5", "--webhook-service=sys/hook"])
    assert s.kubeconfig == Path("/k") and s.workers == 7 and not s.admission
    assert s.liveness_endpoint is None and s.device_gone_grace_seconds == 5 and s.webhook_service == "sys/hook"


def test_claims_of_every_device_class_of_ours_are_watched() -> None:
    s = parse_settings(["--extra-device-classes=mps.gpu.fracgpu.dev, enforced.gpu.fracgpu.dev,gpu.fracgpu.dev"])
    assert s.claim_classes == (
        "gpu.fracgpu.dev",
        "mig.gpu.fracgpu.dev",
        "enforced.gpu.fracgpu.dev",
        "mps.gpu.fracgpu.dev",
    ), "each class once: the default, the MIG class, then the further ones"
    assert parse_settings([]).claim_classes == (
        "gpu.fracgpu.dev",
        "mig.gpu.fracgpu.dev",
        "enforced.gpu.fracgpu.dev",
        "mps.gpu.fracgpu.dev",
    ), "the chart's optional classes are watched without the flag: a claim of one the cluster lacks is told so"
    assert parse_settings(
        ["--driver-name=x.dev", "--device-class=x.dev", "--mig-device-class=mig.x.dev"]
    ).claim_classes == (
        "x.dev",
        "mig.x.dev",
        "enforced.x.dev",
        "mps.x.dev",
    )


def test_empty_device_gone_grace_falls_back_to_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACGPU_DEVICE_GONE_GRACE", "")
    assert parse_settings([]).device_gone_grace_seconds == 60
    monkeypatch.setenv("FRACGPU_DEVICE_GONE_GRACE", "0")
    assert parse_settings([]).device_gone_grace_seconds == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers=0"], "--workers=0: Input should be greater than or equal to 1"),
        (["--webhook-service=nope"], "--webhook-service=nope: must be <namespace>/<name>"),
        (["--log-format=xml"], "argument --log-format: invalid choice: 'xml'"),
        (["--admission=no"], "argument --admission/--no-admission: ignored explicit argument 'no'"),
        (["--webhook-cert-secret=nope"], "--webhook-cert-secret=nope: must be <namespace>/<name>"),
        (["--leader-elect"], "--leader-elect needs the Lease's namespace: --namespace (or env POD_NAMESPACE"),
        (
            ["--leader-elect", "--namespace=ns", "--renew-deadline=15"],
            "--retry-period (2) < --renew-deadline (15) < --lease-duration (15)",
        ),
    ],
)
def test_bad_values_exit_with_usage(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: fracgpu-controller" in err and message in err


def test_webhook_config_name_follows_the_driver_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACGPU_DRIVER_NAME", "gpu.example.com")
    assert parse_settings([]).webhook_config_name == "gpu.example.com"
    assert parse_settings(["--webhook-config-name=hooks"]).webhook_config_name == "hooks"


def test_admission_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACGPU_ADMISSION", "false")
    assert not parse_settings([]).admission
    assert parse_settings(["--admission"]).admission, "the flag wins over the variable"


def test_help_works(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "--webhook-port" in capsys.readouterr().out


def test_missing_credentials_exit_2(tmp_path: Path) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        assert main([f"--kubeconfig={tmp_path / 'absent'}", "--metrics-port=0", "--log-format=text"]) == 2
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_kopf_settings_follow_the_pitfalls() -> None:
    api = client.ApiClient(client.Configuration(host="https://127.0.0.1:6443"))
    s = operator_settings(Settings(webhook_address="127.0.0.1", webhook_port=1234), api)
    assert s.peering.standalone and s.posting.level == logging.WARNING
    assert s.posting.reporting_component == "fracgpu-controller"
    # kopf's configuration manager would POST the configuration first (a create the controller may not do)
    assert s.admission.managed is None
    assert isinstance(s.admission.server, WebhookServer) and s.admission.server.port == 1234
    assert s.admission.server.registration is not None and s.admission.server.registration.name == DRIVER_NAME
    svc = operator_settings(Settings(webhook_service="sys/hook", webhook_config_name="hooks"), api).admission.server
    assert isinstance(svc, WebhookServer) and svc.service == ("sys", "hook") and svc.host == "hook.sys.svc"
    assert svc.registration is not None and svc.registration.name == "hooks"
    off = operator_settings(Settings(admission=False), api)
    assert off.admission.server is None and off.admission.managed is None


@pytest.mark.parametrize(("value", "fail"), [("Ignore", False), ("Fail", True)])
def test_webhook_failure_policy_reaches_the_registration(
    value: str, fail: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRACGPU_WEBHOOK_FAILURE_POLICY", value)
    settings = parse_settings([])
    assert settings.webhook_failure_policy == value
    server = operator_settings(
        settings, client.ApiClient(client.Configuration(host="https://127.0.0.1:6443"))
    ).admission.server
    assert isinstance(server, WebhookServer) and server.registration is not None
    assert server.registration.fail is fail
