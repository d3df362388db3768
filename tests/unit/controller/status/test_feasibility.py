"""DRA CEL selectors over sample devices (controller/status/selectors.py) and the Unsatisfiable messages
(controller/status/feasibility.py)."""

from typing import Any

import pytest

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import MiB
from controller.core.model import DeviceClassView, DeviceRecord, claim_view, current_devices, slice_view
from controller.status import feasibility
from controller.status.feasibility import plan_unsatisfiable
from controller.status.selectors import NotEvaluated, evaluate
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller_factories import claim, gpu, memory_request

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"
CLASS = DeviceClassView(name=DEVICE_CLASS_NAME, selectors=(f'device.driver == "{DRIVER_NAME}"',))
PRODUCT = f'device.attributes["{DRIVER_NAME}"].productName'


def devices(*models: tuple[str, int]) -> list[DeviceRecord]:
    """One node's GPUs as the node plugin publishes them: (product name, GiB) each."""
    infos = [gpu(i, gib).model_copy(update={"product_name": name}) for i, (name, gib) in enumerate(models)]
    (body,) = build_slices("n1", "uid-n1", DRIVER_NAME, infos, step=256 * MiB, reserve=0, generation=1)
    view = slice_view(body, DRIVER_NAME)
    assert view is not None
    return list(current_devices([view]).values())


CLUSTER = devices((A100, 40), (A100, 40), (A100, 40), (H100, 80))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'{PRODUCT} == "{A100}"', [True, True, True, False]),
        (f'{PRODUCT}.startsWith("NVIDIA H100")', [False, False, False, True]),
        (f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("40Gi")) >= 0', [True] * 4),
        (f'device.capacity["{DRIVER_NAME}"].memory.isGreaterThan(quantity("40Gi"))', [False, False, False, True]),
        (f'device.capacity["{DRIVER_NAME}"].memory.isLessThan(quantity("41Gi"))', [True, True, True, False]),
        (f'device.driver == "{DRIVER_NAME}"', [True] * 4),
        (f'device.attributes["{DRIVER_NAME}"].index == 1', [False, True, False, False]),
        ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:10:00.0"', [True, False, False, False]),
        (f'device.attributes["{DRIVER_NAME}"].architecture.lowerAscii() == "hopper"', [True] * 4),
    ],
)
def test_selectors_evaluate_kubernetes_dra_expressions(expression: str, expected: list[bool]) -> None:
    assert [evaluate(expression, d, DRIVER_NAME) for d in CLUSTER] == expected


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        (f'device.attributes["{DRIVER_NAME}"].driverVersion.isGreaterThan(semver("570.0.0"))', "semver"),
        (f'device.attributes["{DRIVER_NAME}"].cudaComputeCapability == "9.0.0"', "cudaComputeCapability"),
        (f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("0.5")) > 0', "not a whole number"),
        (f"{PRODUCT} ==", "Syntax error"),
        (PRODUCT, "STRING"),
    ],
)
def test_what_cannot_be_evaluated_says_so(expression: str, reason: str) -> None:
    outcome = evaluate(expression, CLUSTER[0], DRIVER_NAME)
    assert isinstance(outcome, NotEvaluated) and reason in outcome.reason, outcome


def _pending(memory: str, *selectors: str, alternatives: list[tuple[str, str]] | None = None) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": memory}}}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    request: dict[str, Any] = {"name": "gpu", "exactly": exactly}
    if alternatives is not None:
        request = {
            "name": "gpu",
            "firstAvailable": [
                {"name": n, **exactly, "capacity": {"requests": {"memory": m}}} for n, m in alternatives
            ],
        }
    view = claim_view(claim(requests=[request]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    return view


def _messages(view: Any, device_class: DeviceClassView | None = CLASS) -> list[str]:
    return [u.message for u in plan_unsatisfiable(view, CLUSTER, device_class, DRIVER_NAME)]


def test_an_a100_only_request_larger_than_an_a100_names_the_selector() -> None:
    a100 = f'{PRODUCT} == "{A100}"'
    (message,) = _messages(_pending("50Gi", a100))
    assert message == (
        f"no GPU of {DRIVER_NAME} can ever satisfy this claim: request 'gpu' asks for 50Gi of GPU memory, but only "
        f'3 published GPUs of 4 match selectors `device.driver == "{DRIVER_NAME}"` (of DeviceClass '
        f"{DEVICE_CLASS_NAME}), `{a100}` (of the request), and the largest of them has 40Gi"
    )
    assert _messages(_pending("40Gi", a100)) == [], "an A100 has 40Gi"
    assert _messages(_pending("50Gi")) == [], "the H100 has 80Gi"


def test_no_device_matching_a_selector_is_named() -> None:
    b200 = f'{PRODUCT} == "NVIDIA B200"'
    (message,) = _messages(_pending("10Gi", b200))
    assert message.endswith(f"but no published GPU matches selector `{b200}` (of the request)"), message
    a100, big = f'{PRODUCT} == "{A100}"', f'device.capacity["{DRIVER_NAME}"].memory.isGreaterThan(quantity("50Gi"))'
    (together,) = _messages(_pending("10Gi", a100, big))
    assert "no published GPU matches all of its selectors together" in together
    assert f"`{a100}` (of the request: 3)" in together and f"`{big}` (of the request: 1)" in together


def test_the_deviceclass_selectors_apply_too() -> None:
    only_h100 = DeviceClassView(name="gpus", selectors=(f'{PRODUCT}.startsWith("NVIDIA H100")',))
    a100 = f'{PRODUCT} == "{A100}"'
    (message,) = _messages(_pending("10Gi", a100), only_h100)
    assert "no published GPU matches all of its selectors together" in message
    assert "(of DeviceClass gpus: 1)" in message


def test_without_selectors_the_largest_gpu_is_compared() -> None:
    (message,) = _messages(_pending("100Gi"), None)
    assert message == (
        f"no GPU of {DRIVER_NAME} can ever satisfy this claim: request 'gpu' asks for 100Gi of GPU memory, "
        "and the largest GPU has 80Gi"
    )


def test_a_selector_not_evaluated_never_rules_a_gpu_out() -> None:
    version = f'device.attributes["{DRIVER_NAME}"].driverVersion.isGreaterThan(semver("570.0.0"))'
    assert _messages(_pending("60Gi", version)) == [], "the H100 might match"
    (message,) = _messages(_pending("100Gi", version))
    assert "the largest GPU has 80Gi" in message
    assert f"selector `{version}` was not evaluated (" in message and "so it ruled out no GPU" in message
    a100 = f'{PRODUCT} == "{A100}"'
    (both,) = _messages(_pending("50Gi", a100, version))
    assert "only 3 published GPUs of 4 match" in both and "was not evaluated" in both


def test_every_alternative_must_be_unsatisfiable() -> None:
    a100 = f'{PRODUCT} == "{A100}"'
    assert _messages(_pending("", a100, alternatives=[("big", "50Gi"), ("small", "20Gi")])) == []
    (message,) = _messages(_pending("", a100, alternatives=[("big", "60Gi"), ("bigger", "70Gi")]))
    assert "request 'gpu/big' asks for 60Gi" in message and "; or request 'gpu/bigger' asks for 70Gi" in message


def test_nothing_is_said_without_published_gpus_or_once_allocated() -> None:
    view = _pending("100Gi")
    assert plan_unsatisfiable(view, [], CLASS, DRIVER_NAME) == ()
    assert plan_unsatisfiable(view.model_copy(update={"allocated": True}), CLUSTER, CLASS, DRIVER_NAME) == ()


def test_a_claim_that_fits_stops_at_the_first_device_that_satisfies_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # a pending claim is re-checked on each of its events: it must not evaluate selectors on every GPU
    evaluated: list[str] = []

    def counting(expression: str, device: DeviceRecord, driver: str) -> bool | NotEvaluated:
        evaluated.append(device.device)
        return evaluate(expression, device, driver)

    monkeypatch.setattr(feasibility, "evaluate", counting)
    many = devices(*[(H100, 80)] * 8)
    fits = claim_view(claim(requests=[memory_request("gpu", "10Gi")]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert fits is not None
    assert plan_unsatisfiable(fits, many, CLASS, DRIVER_NAME) == ()
    assert evaluated == ["gpu-0"], "one device's selectors, not all eight"
    evaluated.clear()
    big = claim_view(claim(requests=[memory_request("gpu", "100Gi")]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert big is not None
    assert plan_unsatisfiable(big, many, CLASS, DRIVER_NAME), "still found unsatisfiable"
