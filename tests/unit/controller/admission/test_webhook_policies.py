"""The failure policies and match conditions of the controller's webhooks (controller/admission/webhook_config.py):
with MPS GPUs, the claims of the driver's DeviceClasses are mutated and reviewed by webhooks that fail closed, and
only those (a matchCondition the API server evaluates, here evaluated by CEL's own runtime); every other claim and
template keeps the configured policy, as does the webhook that rewrites the opaque parameters of the driver's configs
(called for the claims that have one)."""

import asyncio
from typing import Any

import kopf
import pytest
from cel_expr_python import cel
from kubernetes import client

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.admission.webhook import WebhookServer
from controller.admission.webhook_config import (
    CANONICAL_CLAIMS,
    CONFIGS,
    MUTATING_CONFIGS,
    VALIDATED,
    names_classes,
    registered,
    webhooks,
)
from controller.core.settings import Settings
from controller.handlers import operator_settings

CLASSES = ("gpu.fracgpu.dev", "mps.gpu.fracgpu.dev")
CONFIG = kopf.WebhookClientConfig(url="https://h", caBundle="Q0E=")


def hooks(fail: bool) -> dict[str, dict[str, Any]]:
    """Name -> webhook, validating and mutating, as registered with MPS GPUs."""
    mps = registered(frozenset(CLASSES), DRIVER_NAME)
    out = {}
    for kind in ("validating", "mutating"):
        for hook in webhooks("hooks", CONFIG, fail=fail, validated=tuple(v for v in mps if v.kind == kind)):
            out[hook["name"]] = hook
    return out


@pytest.mark.parametrize("fail", [False, True])
def test_with_mps_gpus_the_claims_of_our_classes_fail_closed_and_the_rest_keep_the_configured_policy(
    fail: bool,
) -> None:
    found = hooks(fail)
    configured = "Fail" if fail else "Ignore"
    policies = {name: (h["failurePolicy"], h["clientConfig"]["url"]) for name, h in found.items()}
    assert policies == {
        "resourceclaims.hooks": (configured, "https://h/resourceclaims"),
        "mps-resourceclaims.hooks": ("Fail", "https://h/resourceclaims"),  # the same kopf handler
        "resourceclaimtemplates.hooks": (configured, "https://h/resourceclaimtemplates"),
        "mutate-resourceclaims.hooks": ("Fail", "https://h/mutate-resourceclaims"),
        "canonical-resourceclaims.hooks": (configured, "https://h/canonical-resourceclaims"),
    }
    ours = names_classes(CLASSES)
    assert found["mps-resourceclaims.hooks"]["matchConditions"] == [
        {"name": "requests-a-driver-class", "expression": ours}
    ]
    assert found["mutate-resourceclaims.hooks"]["matchConditions"] == [
        {"name": "requests-a-driver-class", "expression": ours}
    ]
    assert found["resourceclaims.hooks"]["matchConditions"] == [
        {"name": "requests-no-driver-class", "expression": f"!({ours})"}
    ]
    assert "matchConditions" not in found["resourceclaimtemplates.hooks"], "templates are never mutated"
    assert found["mutate-resourceclaims.hooks"]["reinvocationPolicy"] == "Never"
    assert found["canonical-resourceclaims.hooks"]["reinvocationPolicy"] == "Never"
    assert all(h["rules"][0]["operations"] == ["CREATE"] for h in found.values())


@pytest.mark.parametrize("fail", [False, True])
def test_without_mps_gpus_nothing_fails_closed_unless_configured(fail: bool) -> None:
    assert registered() == VALIDATED
    ours = registered(driver=DRIVER_NAME)
    assert ours[:2] == VALIDATED
    plain = webhooks("hooks", CONFIG, fail=fail, validated=VALIDATED)
    configured = "Fail" if fail else "Ignore"
    assert [(h["name"], h["failurePolicy"]) for h in plain] == [
        ("resourceclaims.hooks", configured),
        ("resourceclaimtemplates.hooks", configured),
    ]
    assert not any("matchConditions" in h for h in plain)
    (canonical,) = webhooks("hooks", CONFIG, fail=fail, validated=ours[2:])
    assert (canonical["name"], canonical["failurePolicy"]) == ("canonical-resourceclaims.hooks", configured)
    assert canonical["rules"][0]["operations"] == ["CREATE"] and canonical["rules"][0]["resources"] == [
        "resourceclaims"
    ]


def evaluate(expression: str, claim: Any) -> bool:
    """A matchCondition on `claim` as the API server evaluates it: a boolean, never an error (which a Fail webhook
    would turn into a refusal)."""
    env = cel.NewEnv(variables={"object": cel.Type.DYN})
    value = env.compile(expression).eval(data={"object": claim})
    assert value.type() == cel.Type.BOOL, value.value()
    return bool(value.value())


def claim(spec: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": spec}


CLAIMS: list[tuple[dict[str, Any], bool]] = [
    (claim({"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.fracgpu.dev"}}]}}), True),
    (
        claim(
            {
                "devices": {
                    "requests": [
                        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                        {
                            "name": "alt",
                            "firstAvailable": [
                                {"name": "a", "deviceClassName": "other.example.com"},
                                {"name": "b", "deviceClassName": "mps.gpu.fracgpu.dev"},
                            ],
                        },
                    ]
                }
            }
        ),
        True,
    ),
    (claim({"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}}), False),
    (claim({"devices": {"requests": [{"name": "m", "exactly": {"deviceClassName": "mig.gpu.fracgpu.dev"}}]}}), False),
    (claim({"devices": {"requests": [{"name": "bare", "exactly": {}}]}}), False),  # no class (yet)
    (claim({"devices": {"requests": [{"name": "alt", "firstAvailable": [{"name": "a"}]}]}}), False),
    (claim({"devices": {"requests": []}}), False),
    (claim({"devices": {}}), False),
    (claim({}), False),
    ({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}}, False),
]


@pytest.mark.parametrize(("body", "ours"), CLAIMS)
def test_the_match_condition_selects_exactly_the_claims_of_our_classes_and_never_errs(
    body: dict[str, Any], ours: bool
) -> None:
    found = hooks(fail=False)
    (mps,) = found["mps-resourceclaims.hooks"]["matchConditions"]
    (mutate,) = found["mutate-resourceclaims.hooks"]["matchConditions"]
    (rest,) = found["resourceclaims.hooks"]["matchConditions"]
    assert evaluate(mps["expression"], body) is ours and evaluate(mutate["expression"], body) is ours
    assert evaluate(rest["expression"], body) is not ours, "every claim is reviewed by exactly one claim webhook"


def configured(driver: str, parameters: Any = None) -> dict[str, Any]:
    config: dict[str, Any] = {"requests": ["g"], "opaque": {"driver": driver}}
    if parameters is not None:
        config["opaque"]["parameters"] = parameters
    return config


CONFIGURED: list[tuple[dict[str, Any], bool]] = [
    (claim({"devices": {"config": [configured(DRIVER_NAME, {"kind": "GpuConfig"})]}}), True),
    (claim({"devices": {"config": [configured("nic.example.com", {}), configured(DRIVER_NAME, {"b": 1})]}}), True),
    (claim({"devices": {"config": [configured(DRIVER_NAME)]}}), True),  # no parameters: nothing to rewrite, harmless
    (claim({"devices": {"config": [configured("nic.example.com", {"b": 1})]}}), False),
    (claim({"devices": {"config": [{"requests": ["g"]}]}}), False),
    (claim({"devices": {"config": []}}), False),
    (claim({"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.fracgpu.dev"}}]}}), False),
    (claim({}), False),
    ({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}}, False),
]


@pytest.mark.parametrize(("body", "ours"), CONFIGURED)
def test_the_canonical_webhook_is_called_for_exactly_the_claims_with_an_opaque_config_of_the_driver(
    body: dict[str, Any], ours: bool
) -> None:
    (condition,) = hooks(fail=True)[f"{CANONICAL_CLAIMS.id}.hooks"]["matchConditions"]
    assert evaluate(condition["expression"], body) is ours


class Recorder:
    """`KubeRest.request` that records every call and answers an empty configuration."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, query: Any = None, *, body: Any = None, content_type: str = "") -> Any:
        self.calls.append((method, path, body))
        return {"webhooks": []}


def test_the_controller_with_mps_registers_the_closed_webhooks_for_its_device_classes() -> None:
    api = client.ApiClient(client.Configuration(host="https://127.0.0.1:6443"))
    settings = Settings(mps=True, extra_device_classes="mps.gpu.fracgpu.dev, enforced.gpu.fracgpu.dev")
    server = operator_settings(settings, api).admission.server
    assert isinstance(server, WebhookServer) and server.registration is not None
    registration = server.registration
    assert registration.resources == registered(settings.device_classes, DRIVER_NAME)
    closed = [v for v in registration.resources if v.scope == "classes"]
    assert [v.kind for v in closed] == ["validating", "mutating"]
    assert all(set(v.classes) == {DEVICE_CLASS_NAME, "mps.gpu.fracgpu.dev", "enforced.gpu.fracgpu.dev"} for v in closed)
    assert "mig.gpu.fracgpu.dev" not in closed[0].classes, "a MIG partition is never an MPS GPU"
    plain = operator_settings(Settings(), api).admission.server
    assert isinstance(plain, WebhookServer) and plain.registration is not None
    assert plain.registration.resources == registered(driver=DRIVER_NAME)

    recorder = Recorder()
    registration.rest = recorder  # type: ignore[assignment]
    asyncio.run(registration.register(CONFIG))
    patched = {path: body["webhooks"] for method, path, body in recorder.calls if method == "PATCH"}
    assert {h["name"] for h in patched[f"{CONFIGS}/{registration.name}"]} == {
        f"resourceclaims.{registration.name}",
        f"mps-resourceclaims.{registration.name}",
        f"resourceclaimtemplates.{registration.name}",
    }
    mutating, canonical = patched[f"{MUTATING_CONFIGS}/{registration.name}"]
    assert mutating["failurePolicy"] == "Fail" and mutating["name"] == f"mutate-resourceclaims.{registration.name}"
    assert (
        canonical["failurePolicy"] == "Ignore" and canonical["name"] == f"canonical-resourceclaims.{registration.name}"
    )
