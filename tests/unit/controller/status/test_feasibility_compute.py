"""The Unsatisfiable reason of a request whose compute no usable GPU offers (controller/status/feasibility.py
`compute_short`, issue 39): GPUs of an older node plugin publish no `compute`, a shared GPU offers 100."""

from typing import Any

from api.names import COMPUTE_CAPACITY, DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.claims import claim_view
from controller.core.slices import DeviceRecord
from controller.status.feasibility import plan_unsatisfiable
from tests.unit.controller.status.test_feasibility import CLASS, CLUSTER
from tests.unit.controller_factories import claim


def pending(compute: str) -> Any:
    capacity = {"requests": {"memory": "10Gi", COMPUTE_CAPACITY: compute}}
    request = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "capacity": capacity}}
    view = claim_view(claim(requests=[request]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    return view


def messages(compute: str, devices: list[DeviceRecord]) -> list[str]:
    return [u.message for u in plan_unsatisfiable(pending(compute), devices, CLASS, DRIVER_NAME)]


def test_a_compute_request_fits_gpus_that_publish_compute() -> None:
    assert {d.compute_total for d in CLUSTER} == {100}
    assert messages("100", CLUSTER) == []
    assert messages("0", [d.model_copy(update={"compute_total": None}) for d in CLUSTER]) == []


def test_gpus_that_publish_no_compute_are_named_as_the_reason() -> None:
    older = [d.model_copy(update={"compute_total": None}) for d in CLUSTER]
    (message,) = messages("50", older)
    assert message == (
        f"no GPU of {DRIVER_NAME} can ever satisfy this claim: request 'gpu' asks for 10Gi of GPU memory and compute "
        "50 (percent of a GPU), but of the 4 published GPUs it can use none of them publishes compute (a shared GPU "
        "offers 100, a MIG partition its compute slices' share; an older node plugin publishes none)"
    )
    (smaller,) = messages("50", [d.model_copy(update={"compute_total": 42}) for d in CLUSTER])
    assert "the most any of them offers is 42" in smaller
