"""Unit tests of the GPU ledger (controller/ledger/plan.py)."""

from api.gpu import NODE_LABEL
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import GiB
from controller.core.claims import ClaimView, claim_view
from controller.core.slices import DeviceKey, DeviceRecord, SliceView, current_devices, slice_view
from controller.ledger.plan import (
    MANAGED_BY_LABEL,
    ExistingGpu,
    GpuObject,
    desired_ledger,
    identity_body,
    plan_ledger,
    status_body,
)
from tests.unit.controller_factories import NODE, claim, gpu, result, slices
from tests.unit.scheduler_claims import extended_resource_claim

MANAGER = "fracgpu-controller"


def devices(count: int = 2) -> dict[DeviceKey, DeviceRecord]:
    views = [slice_view(s, DRIVER_NAME) for s in slices(count=count)]
    return current_devices([v for v in views if isinstance(v, SliceView)])


def claims(*bodies: dict[str, object]) -> list[ClaimView]:
    out = [claim_view(b, DRIVER_NAME, DEVICE_CLASS_NAME) for b in bodies]
    return [c for c in out if c is not None]


def ledger(*bodies: dict[str, object], count: int = 2) -> dict[str, GpuObject]:
    return desired_ledger(devices(count), claims(*bodies), DRIVER_NAME, MANAGER)


def existing(obj: GpuObject) -> ExistingGpu:
    owners = (obj.owner_uid,) if obj.owner_uid else ()
    return ExistingGpu(name=obj.name, labels=obj.labels, spec=obj.spec, status=obj.status, owners=owners)


def test_one_object_per_device_with_totals_shares_and_claims() -> None:
    out = ledger(
        claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1"), result("b", "gpu-0", "20Gi", "s-2")]),
        claim("c0", results=[result("gpu", "gpu-0", "5Gi", "s-3")], namespace="aa"),
    )
    assert sorted(out) == [f"{NODE}-gpu-0", f"{NODE}-gpu-1"]
    g0 = out[f"{NODE}-gpu-0"]
    assert g0.labels == {NODE_LABEL: NODE, MANAGED_BY_LABEL: MANAGER}
    assert g0.spec == {"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0", "node": NODE}
    assert {k: v for k, v in g0.status.items() if k != "claims"} == {
        "node": NODE,
        "index": 0,
        "uuid": gpu(0).uuid,
        "model": "NVIDIA H100 80GB HBM3",
        "totalMemory": "80Gi",
        "allocatedMemory": "35Gi",
        "freeMemory": "45Gi",
        "shares": 3,
        "enforcement": "none",  # the device's memoryEnforcement attribute
        "shareEnforcement": "unreported=3",  # no node plugin has prepared them
    }
    assert g0.status["claims"] == [
        {"namespace": "aa", "name": "c0", "request": "gpu", "shareID": "s-3", "memory": "5Gi"},
        {"namespace": "ns", "name": "c1", "request": "a", "shareID": "s-1", "memory": "10Gi"},
        {"namespace": "ns", "name": "c1", "request": "b", "shareID": "s-2", "memory": "20Gi"},
    ]
    g1 = out[f"{NODE}-gpu-1"].status
    assert (g1["allocatedMemory"], g1["freeMemory"], g1["shares"], g1["claims"]) == ("0", "80Gi", 0, [])


def test_whole_device_allocations_and_unknown_devices() -> None:
    out = ledger(
        claim("whole", results=[result("gpu", "gpu-1", None, None)]),
        claim("lost", results=[result("gpu", "gpu-7", "1Gi", "s")]),
        claim("pending", results=None),
    )
    g1 = out[f"{NODE}-gpu-1"].status
    assert (g1["allocatedMemory"], g1["freeMemory"], g1["shares"]) == ("80Gi", "0", 1)
    assert g1["claims"][0]["shareID"] == ""
    assert sum(o.status["shares"] for o in out.values()) == 1


def test_admin_access_shares_reserve_no_memory_but_are_listed_and_marked() -> None:
    admin = {**result("mon", "gpu-0", None, None), "adminAccess": True}
    out = ledger(claim("mon", results=[admin]), claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1")]))
    g0 = out[f"{NODE}-gpu-0"].status
    assert (g0["allocatedMemory"], g0["freeMemory"], g0["shares"]) == ("10Gi", "70Gi", 2)
    assert g0["claims"] == [
        {"namespace": "ns", "name": "c1", "request": "a", "shareID": "s-1", "memory": "10Gi"},
        {"namespace": "ns", "name": "mon", "request": "mon", "shareID": "", "memory": "0", "adminAccess": True},
    ]


def test_ledger_is_a_function_of_its_inputs_only() -> None:
    bodies = [claim(f"c{i}", results=[result("gpu", f"gpu-{i % 2}", f"{i + 1}Gi", f"s-{i}")]) for i in range(6)]
    assert ledger(*bodies) == ledger(*reversed(bodies))
    total = sum(int(o.status["allocatedMemory"].removesuffix("Gi")) for o in ledger(*bodies).values())
    assert total * GiB == sum((i + 1) * GiB for i in range(6))


def test_plan_creates_missing_objects_and_writes_nothing_when_in_sync() -> None:
    want = ledger(claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1")]))
    plan = plan_ledger(want, {}, DRIVER_NAME)
    assert [o.name for o in plan.apply_identity] == [o.name for o in plan.apply_status] == sorted(want)
    assert not plan.delete
    in_sync = plan_ledger(want, {n: existing(o) for n, o in want.items()}, DRIVER_NAME)
    assert in_sync.empty


def test_plan_updates_only_changed_status_and_ignores_empty_vs_missing_lists() -> None:
    before = ledger()
    after = ledger(claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1")]))
    stored = {n: existing(o) for n, o in before.items()}
    stored[f"{NODE}-gpu-1"] = existing(before[f"{NODE}-gpu-1"]).model_copy(
        update={"status": {k: v for k, v in before[f"{NODE}-gpu-1"].status.items() if k != "claims"}}
    )  # the API server may drop an empty list
    plan = plan_ledger(after, stored, DRIVER_NAME)
    assert not plan.apply_identity
    assert [o.name for o in plan.apply_status] == [f"{NODE}-gpu-0"]


def test_the_plugins_usage_field_never_makes_the_controller_write() -> None:
    want = ledger(claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1")]))
    stored = {
        n: existing(o).model_copy(update={"status": {**o.status, "usage": {"usedMemory": "3Gi"}}})
        for n, o in want.items()
    }
    assert plan_ledger(want, stored, DRIVER_NAME).empty
    name = f"{NODE}-gpu-0"
    stale = {**stored, name: stored[name].model_copy(update={"status": {**(stored[name].status or {}), "shares": 0}})}
    (obj,) = plan_ledger(want, stale, DRIVER_NAME).apply_status
    assert "usage" not in status_body(obj)["status"], "the controller's apply leaves the plugin's field alone"


def test_plan_deletes_objects_of_vanished_devices_but_not_other_drivers_objects() -> None:
    want = ledger(count=1)
    stored = {n: existing(o) for n, o in ledger(count=2).items()}
    foreign = existing(ledger(count=2)[f"{NODE}-gpu-1"])
    stored["other-gpu-1"] = foreign.model_copy(update={"name": "other-gpu-1", "spec": {**foreign.spec, "driver": "x"}})
    plan = plan_ledger(want, stored, DRIVER_NAME)
    assert plan.delete == (f"{NODE}-gpu-1",)
    assert not plan.apply_identity and not plan.apply_status


def test_plan_reapplies_identity_when_labels_or_spec_drift() -> None:
    want = ledger(count=1)
    name = f"{NODE}-gpu-0"
    drifted = existing(want[name]).model_copy(update={"labels": {NODE_LABEL: "elsewhere"}})
    assert [o.name for o in plan_ledger(want, {name: drifted}, DRIVER_NAME).apply_identity] == [name]


def test_a_gpu_object_is_owned_by_its_slices_node_and_a_new_node_uid_replaces_the_owner() -> None:
    want = ledger(count=1)
    name = f"{NODE}-gpu-0"
    assert want[name].owner_uid == f"uid-{NODE}"
    assert plan_ledger(want, {name: existing(want[name])}, DRIVER_NAME).empty
    # the node re-registered under its name (a new uid): the object of the old Node is not kept as it is
    stale = existing(want[name]).model_copy(update={"owners": ("uid-of-the-deleted-node",)})
    assert [o.name for o in plan_ledger(want, {name: stale}, DRIVER_NAME).apply_identity] == [name]
    unowned = existing(want[name]).model_copy(update={"owners": ()})
    assert [o.name for o in plan_ledger(want, {name: unowned}, DRIVER_NAME).apply_identity] == [name]


def test_the_plugin_reporting_condition_is_part_of_the_status() -> None:
    condition = {"type": "PluginReporting", "status": "False", "reason": "PluginHeartbeatExpired", "message": "m"}
    out = desired_ledger(devices(1), [], DRIVER_NAME, MANAGER, {NODE: condition})
    (obj,) = out.values()
    assert obj.status["conditions"] == [condition]
    was_reporting = {**condition, "status": "True", "reason": "PluginHeartbeat"}
    before = desired_ledger(devices(1), [], DRIVER_NAME, MANAGER, {NODE: was_reporting})
    plan = plan_ledger(out, {n: existing(o) for n, o in before.items()}, DRIVER_NAME)
    assert [o.name for o in plan.apply_status] == [obj.name] and not plan.apply_identity


def test_apply_bodies() -> None:
    obj = ledger(count=1)[f"{NODE}-gpu-0"]
    ident = identity_body(obj)
    assert ident["apiVersion"] == "fracgpu.dev/v1alpha1" and ident["kind"] == "GPU"
    owner = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": f"uid-{NODE}"}  # its slice's owner
    assert ident["metadata"] == {"name": obj.name, "labels": obj.labels, "ownerReferences": [owner]}
    assert "status" not in ident and ident["spec"] == obj.spec
    st = status_body(obj)
    assert st["metadata"] == {"name": obj.name} and st["status"] == obj.status and "spec" not in st


def test_gpu_and_share_enforcement_come_from_the_attribute_and_the_plugins_condition() -> None:
    """The GPU's tier is its published attribute; a share's tier is what the node plugin reported applying."""
    entry = {
        "driver": DRIVER_NAME,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": "s-1",
        "conditions": [{"type": "MemoryEnforcement", "status": "True", "reason": "Nvml", "message": ""}],
    }
    body = claim("c1", results=[result("a", "gpu-0", "10Gi", "s-1"), result("b", "gpu-0", "5Gi", "s-2")])
    body["status"]["devices"] = [entry]
    views = [slice_view(s, DRIVER_NAME) for s in slices(count=1)]
    for view in views:
        assert isinstance(view, SliceView)
        for device in view.devices:
            assert device.memory_enforcement == "none"
    sliced = slices(count=1)
    for s in sliced:
        for d in s["spec"]["devices"]:
            d["attributes"]["memoryEnforcement"] = {"string": "nvml"}
    found = current_devices([v for v in (slice_view(s, DRIVER_NAME) for s in sliced) if isinstance(v, SliceView)])
    out = desired_ledger(found, claims(body), DRIVER_NAME, MANAGER)
    status = out[f"{NODE}-gpu-0"].status
    assert status["enforcement"] == "nvml"
    assert [(c["shareID"], c.get("enforcement")) for c in status["claims"]] == [("s-1", "nvml"), ("s-2", None)]
    assert status["shareEnforcement"] == "nvml=1,unreported=1"


def test_a_scheduler_made_claim_holds_its_gpu_whole_in_the_name_of_its_pod() -> None:
    """A pod's `resources.limits: {gpu.fracgpu.dev/gpu: 1}`: the scheduler's claim consumed all of gpu-1's
    memory; the ledger counts it like any claim and names the pod (the claim's name is generated)."""
    made = extended_resource_claim(
        "trainer",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        pool=NODE,
        devices={"gpu-1": ("s-1", "80Gi")},
    )
    templated = claim("web-gpu-abcde", results=[result("gpu", "gpu-0", "10Gi", "s-2")])
    templated["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "web", "controller": True}]
    out = ledger(made, templated, claim("own", results=[result("gpu", "gpu-0", "20Gi", "s-3")]))
    g1 = out[f"{NODE}-gpu-1"].status
    assert (g1["allocatedMemory"], g1["freeMemory"], g1["shares"]) == ("80Gi", "0", 1)
    assert g1["claims"] == [
        {
            "namespace": "ns",
            "name": "trainer-extended-resources-x7k2p",
            "pod": "trainer",
            "request": "container-0-request-0",
            "shareID": "s-1",
            "memory": "80Gi",
        }
    ]
    pods = [(c["name"], c.get("pod")) for c in out[f"{NODE}-gpu-0"].status["claims"]]
    assert pods == [("own", None), ("web-gpu-abcde", "web")], "a claim of its own names no pod"
