"""Unit tests of what the controller writes into a claim's status.devices (controller/status/plan.py)."""

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.claims import ClaimView, claim_view
from controller.core.slices import DeviceRecord, SliceView, current_devices, slice_view
from controller.status.plan import apply_body, plan_status
from tests.unit.controller_factories import NODE, claim, gpu, result, slices


def devices() -> dict[tuple[str, str], DeviceRecord]:
    views = [slice_view(s, DRIVER_NAME) for s in slices(count=2)]
    return current_devices([v for v in views if isinstance(v, SliceView)])


def view(body: dict[str, object]) -> ClaimView:
    out = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert out is not None
    return out


def test_each_result_gets_an_entry_naming_its_physical_gpu() -> None:
    c = view(claim(results=[result("a", "gpu-1", "10Gi", "s-1"), result("b", "gpu-1", "20Gi", "s-2")]))
    plan = plan_status(c, devices().get, DRIVER_NAME)
    assert plan.changed and not plan.missing
    assert [(e["driver"], e["pool"], e["device"], e["shareID"]) for e in plan.entries] == [
        (DRIVER_NAME, NODE, "gpu-1", "s-1"),
        (DRIVER_NAME, NODE, "gpu-1", "s-2"),
    ]
    assert plan.entries[0]["data"] == {
        "gpu": f"{NODE}-gpu-1",
        "node": NODE,
        "device": "gpu-1",
        "index": 1,
        "uuid": gpu(1).uuid,
        "productName": "NVIDIA H100 80GB HBM3",
        "request": "a",
        "memory": "10Gi",
        "memoryTotal": "80Gi",
    }
    assert plan.entries[1]["data"]["memory"] == "20Gi"
    assert set(plan.entries[0]) == {"driver", "pool", "device", "shareID", "data"}, "only data besides the keys"


def test_a_result_without_consumed_capacity_or_share_id_is_the_whole_gpu() -> None:
    c = view(claim(results=[result("gpu", "gpu-0", None, None)]))
    (entry,) = plan_status(c, devices().get, DRIVER_NAME).entries
    assert "shareID" not in entry
    assert entry["data"]["memory"] == entry["data"]["memoryTotal"] == "80Gi"


def test_an_admin_access_result_reports_no_reserved_memory_and_is_marked() -> None:
    c = view(claim(results=[{**result("mon", "gpu-0", "5Gi", None), "adminAccess": True}]))
    (entry,) = plan_status(c, devices().get, DRIVER_NAME).entries
    assert (entry["data"]["memory"], entry["data"]["memoryTotal"], entry["data"]["adminAccess"]) == ("0", "80Gi", True)
    (plain,) = plan_status(view(claim(results=[result("a", "gpu-0", "5Gi", "s")])), devices().get, DRIVER_NAME).entries
    assert "adminAccess" not in plain["data"]


def test_unchanged_data_needs_no_write() -> None:
    first = plan_status(view(claim(results=[result("a", "gpu-0", "10Gi", "s-1")])), devices().get, DRIVER_NAME)
    status = [{**e, "conditions": [{"type": "Ready", "status": "True"}]} for e in first.entries]
    again = view(claim(results=[result("a", "gpu-0", "10Gi", "s-1")], devices_status=status))
    plan = plan_status(again, devices().get, DRIVER_NAME)
    assert not plan.changed
    assert plan.entries == first.entries


def test_other_drivers_results_and_entries_are_not_ours() -> None:
    body = claim(
        results=[
            result("a", "gpu-0", "1Gi", "s-1"),
            {"request": "n", "driver": "x.example.com", "pool": NODE, "device": "n0"},
        ],
        devices_status=[{"driver": "x.example.com", "pool": NODE, "device": "n0", "data": {"mac": "aa"}}],
    )
    plan = plan_status(view(body), devices().get, DRIVER_NAME)
    assert [e["driver"] for e in plan.entries] == [DRIVER_NAME]


def test_a_vanished_device_keeps_its_data_and_is_reported() -> None:
    written = plan_status(view(claim(results=[result("a", "gpu-1", "1Gi", "s-1")])), devices().get, DRIVER_NAME)
    body = claim(
        results=[result("a", "gpu-1", "1Gi", "s-1"), result("b", "gpu-9", "1Gi", "s-2")],
        devices_status=list(written.entries),
    )
    plan = plan_status(view(body), lambda key: None, DRIVER_NAME)
    assert [s.device for s in plan.missing] == ["gpu-1", "gpu-9"]
    assert plan.entries == written.entries, "known data carried over, nothing invented for gpu-9"
    assert not plan.changed


def test_apply_body_carries_only_our_entries_and_the_uid_precondition() -> None:
    c = view(claim(results=[result("a", "gpu-0", "1Gi", "s-1")]))
    plan = plan_status(c, devices().get, DRIVER_NAME)
    body = apply_body(c, plan.entries)
    assert body["metadata"] == {"name": "c1", "namespace": "ns", "uid": "uid-c1"}
    assert body["kind"] == "ResourceClaim" and body["apiVersion"] == "resource.k8s.io/v1"
    assert body["status"] == {"devices": list(plan.entries)}
    assert set(body) == {"apiVersion", "kind", "metadata", "status"}


def test_data_carries_the_tier_the_plugin_reported() -> None:
    """`enforcement` is in data only once the node plugin's MemoryEnforcement condition says what it applied."""
    body = claim(results=[result("a", "gpu-1", "10Gi", "s-1")])
    assert "enforcement" not in plan_status(view(body), devices().get, DRIVER_NAME).entries[0]["data"]
    body["status"]["devices"] = [
        {
            "driver": DRIVER_NAME,
            "pool": NODE,
            "device": "gpu-1",
            "shareID": "s-1",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Prepared", "message": ""},
                {"type": "MemoryEnforcement", "status": "True", "reason": "HamiCore", "message": ""},
            ],
        }
    ]
    plan = plan_status(view(body), devices().get, DRIVER_NAME)
    assert plan.changed
    assert plan.entries[0]["data"]["enforcement"] == "hami-core"
    body["status"]["devices"][0]["conditions"][1]["reason"] = "Bogus"  # unknown reasons are not reported
    assert "enforcement" not in plan_status(view(body), devices().get, DRIVER_NAME).entries[0]["data"]
