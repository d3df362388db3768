"""GPU compute in the controller's views and ledger (issue 39): a result's `consumedCapacity.compute` is the share's
reserved compute (none for an adminAccess result), a request's `capacity.requests.compute` is read, a device's
`compute` capacity is known, and a GPU object lists each share's compute and their sum in `allocatedCompute`,
leaving both out where nothing reserved compute (memory-only ledgers are as before)."""

from typing import Any

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.claims import claim_view
from tests.unit.controller.ledger.test_plan import devices, ledger
from tests.unit.controller_factories import NODE, claim, result


def with_compute(r: dict[str, Any], percent: str) -> dict[str, Any]:
    r["consumedCapacity"] = {**r.get("consumedCapacity", {}), "compute": percent}
    return r


def test_a_results_reserved_compute_and_a_requests_asked_compute_are_read() -> None:
    capacity = {"requests": {"memory": "1Gi", f"{DRIVER_NAME}/compute": "30"}}
    request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "capacity": capacity}}
    admin = with_compute(result("mon", "gpu-0", "0", "s-9"), "40") | {"adminAccess": True}
    body = claim("c", results=[with_compute(result("gpu", "gpu-0", "1Gi", "s-1"), "30"), admin], requests=[request])
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    assert [s.compute for s in view.shares] == [30, 0], "an admin-access monitor reserves nothing"
    assert view.requests[0][0].compute == 30
    memory_only = claim_view(claim("m", results=[result("gpu", "gpu-0", "1Gi", "s")]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert memory_only is not None and memory_only.shares[0].compute == 0
    assert memory_only.requests[0][0].compute is None


def test_a_shared_gpu_is_known_to_offer_100_compute() -> None:
    assert {d.compute_total for d in devices().values()} == {100}


def test_the_ledger_sums_reserved_compute_and_lists_each_shares() -> None:
    out = ledger(
        claim("a", results=[with_compute(result("gpu", "gpu-0", "10Gi", "s-1"), "50")]),
        claim("b", results=[with_compute(result("gpu", "gpu-0", "10Gi", "s-2"), "30")]),
        claim("m", results=[with_compute(result("gpu", "gpu-0", "10Gi", "s-3"), "0")]),
        claim("z", results=[with_compute(result("gpu", "gpu-1", "10Gi", "s-4"), "0")]),
    )
    g0, g1 = out[f"{NODE}-gpu-0"].status, out[f"{NODE}-gpu-1"].status
    assert g0["allocatedCompute"] == 80
    assert [c.get("compute") for c in g0["claims"]] == [50, 30, None]
    assert "allocatedCompute" not in g1 and "compute" not in g1["claims"][0], "memory-only: as before"
