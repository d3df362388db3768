"""Admission of GPU compute as a capacity (issue 39; controller/admission/verdict.py, spec_warnings.py): a whole
percentage from 0 to 100 is admitted, anything else refused naming the rule; a compute request without memory is
warned that it takes a whole GPU's memory, an adminAccess one that it reserves nothing; `computeLimitPercent` beside
a reservation is told how it maps, and a reservation no published GPU can enforce is said to be unenforced."""

from typing import Any

import pytest

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import GiB
from controller.admission.verdict import Review, review_claim_spec
from tests.unit.controller.admission.test_verdict import HEAD, opaque, req, spec

PATH = "spec.devices.requests[0].exactly"


def review(
    spec_: dict[str, Any], *, mps: bool | None = True, hami_core: bool | None = True, nvml: bool | None = True
) -> Review:
    return review_claim_spec(
        spec_, "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=80 * GiB, mps_offered=mps,
        hami_core_offered=hami_core, nvml_offered=nvml,
    )  # fmt: skip


@pytest.mark.parametrize("amount", ["0", "1", "50", "100", 30])
def test_a_whole_percentage_with_memory_is_admitted_without_a_word(amount: object) -> None:
    assert review(spec([req("10Gi", compute=amount)])) == Review()


@pytest.mark.parametrize("amount", ["101", "-1", "50.5", "500m", "1Ki", "half"])
def test_anything_but_a_whole_percentage_from_0_to_100_is_refused(amount: object) -> None:
    out = review(spec([req("10Gi", compute=amount)]))
    assert out.problems == (
        f"{PATH}.capacity.requests.compute: must be a whole percentage of one GPU's compute from 0 to 100 (a GPU "
        f"offers 100), got {amount!r}",
    )


def test_compute_without_memory_is_warned_that_it_takes_a_whole_gpu() -> None:
    (warning,) = review(spec([req(None, compute="50")])).warnings
    assert warning.startswith(f"{PATH}.capacity.requests.compute: request 'gpu' asks for compute but no "), warning
    assert "all of its memory: it takes a whole GPU that no share can join" in warning


def test_compute_on_an_admin_access_request_is_warned_that_it_reserves_nothing() -> None:
    request = req("0", compute="50")
    request["exactly"]["adminAccess"] = True
    (warning,) = review(spec([request])).warnings
    assert "has adminAccess, which reserves no compute, but the scheduler places it only on a GPU with 50" in warning


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        (80, "reserves compute 50 and sets computeLimitPercent 80, above it: the share's compute ceiling is its "
         "reservation, 50 %"),
        (30, "reserves compute 50 and sets computeLimitPercent 30: the share's compute ceiling is 30 %, and the "
         "scheduler still counts 50 % of the GPU for it"),
    ],
)  # fmt: skip
def test_compute_limit_percent_beside_a_reservation_is_told_how_it_maps(limit: int, said: str) -> None:
    out = review(spec([req("10Gi", compute="50")], opaque({**HEAD, "computeLimitPercent": limit})))
    (warning,) = out.warnings
    assert out.allowed and warning.startswith(f"{PATH}: request 'gpu' {said}"), warning
    equal = review(spec([req("10Gi", compute="50")], opaque({**HEAD, "computeLimitPercent": 50})))
    assert equal == Review()


def test_a_reservation_no_published_gpu_can_enforce_is_said_to_be_unenforced() -> None:
    (warning,) = review(spec([req("10Gi", compute="50")]), mps=False, hami_core=False).warnings
    assert warning.startswith(
        f"{PATH}: request 'gpu' reserves compute 50, but no published GPU can enforce it (none is an MPS GPU or "
        "offers hami-core): the scheduler counts the reservation, and the share gets the GPU's compute unlimited;"
    ), warning
    (nvml,) = review(spec([req("10Gi", compute="50")], opaque({**HEAD, "enforcement": "nvml"}))).warnings
    assert "reserves compute 50, but enforcement 'nvml' does not apply it" in nvml


def test_memory_only_requests_and_compute_limit_percent_alone_are_reviewed_as_before() -> None:
    assert review(spec([req("10Gi")], opaque({**HEAD, "computeLimitPercent": 30}))) == Review()
    (alone,) = review(
        spec([req("10Gi")], opaque({**HEAD, "computeLimitPercent": 30})), mps=False, hami_core=False
    ).warnings
    assert alone.startswith(f"{PATH}: request 'gpu' sets computeLimitPercent 30, but no published GPU can enforce")
