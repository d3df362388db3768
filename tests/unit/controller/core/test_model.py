"""Unit tests of the controller's views of slices and claims (controller/core/slices.py,
controller/core/claims.py, controller/core/parsing.py).

The slices are built by the node plugin's own `build_slices`, so the controller reads what the plugin writes.
The factories are in tests/unit/controller_factories.py.
"""

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import GiB, MiB
from controller.core.claims import claim_view, device_class_view
from controller.core.parsing import quantity_bytes
from controller.core.slices import current_devices, slice_view
from controller.devices.facts import admission_facts
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller_factories import NODE, claim, gpu, memory_request, result, slices
from tests.unit.scheduler_claims import extended_resource_claim

# ----- slices ------------------------------------------------------------------------------------------


def test_slice_view_reads_what_the_node_plugin_publishes() -> None:
    view = slice_view(slices(count=2)[0], DRIVER_NAME)
    assert view is not None
    assert (view.pool, view.generation, view.name) == (NODE, 1, f"{NODE}-{DRIVER_NAME}-0")
    first = view.devices[0]
    assert (first.device, first.node, first.index, first.uuid) == ("gpu-0", NODE, 0, gpu(0).uuid)
    assert first.product_name == "NVIDIA H100 80GB HBM3"
    assert first.memory_total == first.max_request == 80 * GiB
    assert [d.device for d in view.devices] == ["gpu-0", "gpu-1"]


def test_slice_view_reads_the_request_policys_min_and_step_and_admission_facts_collect_them() -> None:
    """What the admission warning about rounded requests computes grants from (controller/devices/facts.py)."""
    view = slice_view(slices(count=2)[0], DRIVER_NAME)
    assert view is not None
    assert [d.request_range for d in view.devices] == [(0, 256 * MiB)] * 2
    coarse = view.devices[1].model_copy(update={"request_range": (GiB, GiB)})
    bare = view.devices[0].model_copy(update={"request_range": None})
    facts = admission_facts([*view.devices, coarse, bare], None)
    assert facts.request_ranges == ((0, 256 * MiB), (GiB, GiB))


def test_slice_view_ignores_other_drivers_and_devices_without_memory() -> None:
    other = slices()[0]
    other["spec"]["driver"] = "other.example.com"
    assert slice_view(other, DRIVER_NAME) is None
    body = slices()[0]
    body["spec"]["devices"].append({"name": "nic-0", "attributes": {}})
    view = slice_view(body, DRIVER_NAME)
    assert view is not None and [d.device for d in view.devices] == ["gpu-0", "gpu-1"]


def test_slice_view_honours_a_smaller_valid_range_max_and_qualified_attribute_names() -> None:
    body = slices(count=1)[0]
    dev = body["spec"]["devices"][0]
    dev["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] = "40Gi"
    dev["attributes"] = {f"{DRIVER_NAME}/uuid": {"string": "GPU-x"}, f"{DRIVER_NAME}/index": {"int": 3}}
    view = slice_view(body, DRIVER_NAME)
    assert view is not None
    d = view.devices[0]
    assert (d.memory_total, d.max_request, d.uuid, d.index, d.product_name) == (80 * GiB, 40 * GiB, "GPU-x", 3, None)


def test_slice_view_reads_what_a_request_without_memory_consumes_and_whether_the_slice_names_a_node() -> None:
    body = slices(count=1)[0]
    view = slice_view(body, DRIVER_NAME)
    assert view is not None and view.devices[0].default_request == 80 * GiB, "the policy's default: all of it"
    assert view.devices[0].node_local
    body["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["default"] = "10Gi"
    view = slice_view(body, DRIVER_NAME)
    assert view is not None and view.devices[0].default_request == 10 * GiB
    del body["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]
    del body["spec"]["nodeName"]
    view = slice_view(body, DRIVER_NAME)
    assert view is not None and view.devices[0].default_request == 80 * GiB, "no policy: the whole capacity"
    assert not view.devices[0].node_local, "no nodeName: its devices may serve any node"


def test_current_devices_use_the_newest_generation_of_each_pool() -> None:
    old = slice_view(slices(count=2, generation=1)[0], DRIVER_NAME)
    new = slice_view(slices(count=1, generation=2)[0] | {"metadata": {"name": "newer"}}, DRIVER_NAME)
    other = slice_view(slices(node="node-b", count=1)[0], DRIVER_NAME)
    assert old is not None and new is not None and other is not None
    devices = current_devices([old, new, other])
    assert sorted(devices) == [(NODE, "gpu-0"), ("node-b", "gpu-0")]
    assert devices[(NODE, "gpu-0")].generation == 2


# ----- claims ------------------------------------------------------------------------------------------


def test_claim_view_of_an_allocated_claim() -> None:
    body = claim(
        results=[
            result("a", "gpu-0", "10Gi", "s-1"),
            result("b", "gpu-0", "20Gi", "s-2"),
            {"request": "nic", "driver": "other.example.com", "pool": NODE, "device": "nic-0"},
        ],
        devices_status=[
            {"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0", "shareID": "s-1", "data": {"x": 1}},
            {"driver": "other.example.com", "pool": NODE, "device": "nic-0", "data": {"y": 2}},
        ],
    )
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    assert view.key == ("ns", "c1") and view.allocated and view.node == NODE
    assert [(s.request, s.device, s.share_id, s.memory) for s in view.shares] == [
        ("a", "gpu-0", "s-1", 10 * GiB),
        ("b", "gpu-0", "s-2", 20 * GiB),
    ]
    assert view.status_data == {(NODE, "gpu-0", "s-1"): {"x": 1}}


def test_claim_view_of_the_schedulers_extended_resource_claim_names_its_pod() -> None:
    body = extended_resource_claim(
        "trainer", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, pool=NODE, devices={"gpu-0": ("s", "80Gi")}
    )
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None and view.pod == "trainer" and view.node == NODE and view.allocated
    assert [(s.request, s.device, s.memory) for s in view.shares] == [("container-0-request-0", "gpu-0", 80 * GiB)]
    assert view.memory_requests == (), "no memory asked: nothing for the feasibility check to weigh"


def test_claim_view_names_a_pod_only_for_a_controlling_pod_owner() -> None:
    def owned_by(**ref: object) -> str | None:
        body = claim("c", results=[result("gpu", "gpu-0", "1Gi", "s")])
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", **ref}]
        view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
        assert view is not None
        return view.pod

    assert owned_by(controller=True) == "p"
    assert owned_by() is None, "not the controlling owner"
    assert owned_by(controller=True, kind="Job", apiVersion="batch/v1") is None
    view = claim_view(claim("c", results=[]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None and view.pod is None


def test_claim_view_ignores_claims_that_are_not_ours() -> None:
    body = claim(requests=[{"name": "nic", "exactly": {"deviceClassName": "other"}}])
    assert claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME) is None


def test_claim_view_of_a_pending_claim_collects_memory_requests_per_request() -> None:
    body = claim(
        requests=[
            memory_request("a", "100Gi"),
            {
                "name": "b",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": "90Gi"}}},
                    {
                        "name": "small",
                        "deviceClassName": DEVICE_CLASS_NAME,
                        "capacity": {"requests": {"memory": "1Gi"}},
                    },
                ],
            },
            {"name": "whole", "exactly": {"deviceClassName": DEVICE_CLASS_NAME}},
            {
                "name": "mixed",
                "firstAvailable": [
                    {
                        "name": "ours",
                        "deviceClassName": DEVICE_CLASS_NAME,
                        "capacity": {"requests": {"memory": "90Gi"}},
                    },
                    {"name": "theirs", "deviceClassName": "other"},
                ],
            },
        ]
    )
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None and not view.allocated and view.node is None and not view.shares
    assert [[(m.request, m.memory) for m in alts] for alts in view.memory_requests] == [
        [("a", 100 * GiB)],
        [("b/big", 90 * GiB), ("b/small", 1 * GiB)],
    ]


def test_claim_view_of_a_pending_claim_reads_counts_modes_and_constraints() -> None:
    body = claim(
        requests=[
            {"name": "many", "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "count": 3}},
            {"name": "every", "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "allocationMode": "All"}},
            {"name": "nic", "exactly": {"deviceClassName": "other"}},
        ]
    )
    body["spec"]["devices"]["constraints"] = [
        {"requests": ["many", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
        {"distinctAttribute": f"{DRIVER_NAME}/uuid"},
    ]
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    assert [[(m.request, m.memory, m.count, m.all) for m in alts] for alts in view.requests] == [
        [("many", None, 3, False)],
        [("every", None, 1, True)],
    ], "another driver's request is not ours to weigh"
    assert [(c.requests, c.attribute, c.distinct) for c in view.constraints] == [
        (("many", "nic"), "resource.kubernetes.io/pcieRoot", False),
        ((), f"{DRIVER_NAME}/uuid", True),
    ]
    assert view.memory_requests == (), "no memory amounts"


def test_claim_view_reads_memory_qualified_by_the_driver_domain_as_admission_does() -> None:
    qualified = {"deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {f"{DRIVER_NAME}/memory": "100Gi"}}}
    view = claim_view(claim(requests=[{"name": "q", "exactly": qualified}]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    assert [[(m.request, m.memory) for m in alts] for alts in view.memory_requests] == [[("q", 100 * GiB)]]
    allocated = claim(
        results=[{**result("q", "gpu-0", None, "s"), "consumedCapacity": {f"{DRIVER_NAME}/memory": "2Gi"}}]
    )
    view = claim_view(allocated, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None and view.shares[0].memory == 2 * GiB


def test_claim_view_carries_admin_access() -> None:
    body = claim(
        results=[{**result("mon", "gpu-0", None, None), "adminAccess": True}, result("a", "gpu-0", "1Gi", "s")]
    )
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    assert [s.admin_access for s in view.shares] == [True, False]


def test_quantity_bytes() -> None:
    assert quantity_bytes("10Gi") == 10 * GiB
    assert quantity_bytes("1.5Ki") == 1536
    assert quantity_bytes("100m") == 1
    assert quantity_bytes("lots") is None
    assert quantity_bytes(None) is None


def test_device_records_carry_cel_attributes_and_hami_core() -> None:
    (body,) = build_slices(NODE, "uid", DRIVER_NAME, [gpu(0)], step=256 * MiB, reserve=0, generation=1, hami_core=True)
    view = slice_view(body, DRIVER_NAME)
    assert view is not None
    (device,) = view.devices
    assert device.hami_core
    assert device.attributes[DRIVER_NAME]["productName"] == "NVIDIA H100 80GB HBM3"
    assert device.attributes[DRIVER_NAME]["index"] == 0 and device.attributes[DRIVER_NAME]["hamiCore"] is True
    assert device.attributes["resource.kubernetes.io"] == {"pciBusID": "0000:10:00.0"}
    assert "driverVersion" not in device.attributes[DRIVER_NAME], "version attributes are not evaluated"
    (plain,) = slices(count=1)
    assert not slice_view(plain, DRIVER_NAME).devices[0].hami_core  # type: ignore[union-attr]


def test_device_class_view_keeps_selectors_and_our_configs() -> None:
    body = {
        "metadata": {"name": DEVICE_CLASS_NAME},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'x'"}}],
            "config": [
                {"opaque": {"driver": DRIVER_NAME, "parameters": {"env": {}}}},
                {"opaque": {"driver": "other", "parameters": {"y": 1}}},
            ],
        },
    }
    view = device_class_view(body, DRIVER_NAME)
    assert (view.name, view.selectors, view.configs) == (DEVICE_CLASS_NAME, ("device.driver == 'x'",), ({"env": {}},))
