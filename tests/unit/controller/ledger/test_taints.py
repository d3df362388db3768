"""The taints a GPU object shows (controller/ledger/plan.py `device_taints`): its slice's and those of the
DeviceTaintRules whose selector (resource.k8s.io/v1: driver, pool, device) matches, as the scheduler applies them."""

from typing import Any

from api import mig
from api.names import DRIVER_NAME
from controller.core.slices import DeviceKey, DeviceRecord, TaintRuleView, current_devices, slice_view, taint_rule_view
from controller.ledger.plan import desired_ledger, plan_ledger
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller.ledger.test_plan import MANAGER, existing
from tests.unit.controller_factories import NODE, gpu
from tests.unit.fake_mig import H100_MIG
from tests.unit.kubelet_plugin.publishing.test_slices import STEP

UNHEALTHY = {"key": "gpu.fracgpu.dev/xid", "value": "48-double-bit-ecc-error", "effect": "NoExecute"}


def devices(taints: dict[str, list[dict[str, str]]] | None = None, *, mig_gpu: bool = False) -> dict[DeviceKey, Any]:
    built = build_slices(
        NODE,
        f"uid-{NODE}",
        DRIVER_NAME,
        [gpu(0), gpu(1)],
        step=STEP,
        reserve=0,
        generation=1,
        taints=taints,
        mig={"gpu-1": H100_MIG} if mig_gpu else None,
    )
    return current_devices(v for s in built if (v := slice_view(s, DRIVER_NAME)) is not None)


def rule(name: str, selector: dict[str, str] | None, effect: str = "NoSchedule", value: str = "") -> TaintRuleView:
    spec: dict[str, Any] = {"taint": {"key": "example.com/maintenance", "value": value, "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    view = taint_rule_view({"kind": "DeviceTaintRule", "metadata": {"name": name}, "spec": spec}, DRIVER_NAME)
    assert view is not None
    return view


def statuses(found: dict[DeviceKey, DeviceRecord], *rules: TaintRuleView) -> dict[str, dict[str, Any]]:
    return {n: o.status for n, o in desired_ledger(found, [], DRIVER_NAME, MANAGER, rules=rules).items()}


def test_a_gpu_without_taints_shows_none() -> None:
    status = statuses(devices())[f"{NODE}-gpu-0"]
    assert not {"taints", "taintSummary", "taintedBy"} & set(status)


def test_slice_taints_and_matching_rules_show_strongest_first_with_their_source() -> None:
    found = devices({"gpu-0": [UNHEALTHY]})
    slice_name = next(iter({d.taints[0].source for d in found.values() if d.taints}))
    assert slice_name.startswith("ResourceSlice/")
    out = statuses(
        found,
        rule("maint", {"driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0"}, value="planned"),
        rule("other-device", {"driver": DRIVER_NAME, "device": "gpu-7"}),
        rule("other-pool", {"pool": "another-node"}),
        rule("note", {"device": "gpu-0"}, effect="None"),
    )
    gpu0, gpu1 = out[f"{NODE}-gpu-0"], out[f"{NODE}-gpu-1"]
    assert gpu0["taints"] == [
        {**UNHEALTHY, "source": slice_name},
        {
            "key": "example.com/maintenance",
            "value": "planned",
            "effect": "NoSchedule",
            "source": "DeviceTaintRule/maint",
        },
        {"key": "example.com/maintenance", "effect": "None", "source": "DeviceTaintRule/note"},
    ]
    assert gpu0["taintSummary"] == "NoExecute=1,NoSchedule=1,None=1"
    assert gpu0["taintedBy"] == (
        "gpu.fracgpu.dev/xid=48-double-bit-ecc-error:NoExecute,example.com/maintenance=planned:NoSchedule,"
        "example.com/maintenance:None"
    )
    assert "taints" not in gpu1, "no rule and no slice taint selects gpu-1"


def test_an_empty_selector_selects_every_device_and_no_selector_or_another_driver_none() -> None:
    everything = rule("all", {})
    out = statuses(devices(), everything)
    assert {s["taintSummary"] for s in out.values()} == {"NoSchedule=1"} and len(out) == 2
    taint = {"key": "k", "effect": "NoSchedule"}
    body = {"metadata": {"name": "r"}, "spec": {"taint": taint}}
    assert taint_rule_view(body, DRIVER_NAME) is None, "a rule without a selector selects nothing"
    other = {**body, "spec": {"taint": taint, "deviceSelector": {"driver": "nic.example.com"}}}
    assert taint_rule_view(other, DRIVER_NAME) is None


def test_a_mig_gpu_shows_its_partitions_taints_once_but_not_its_own_parent_marker() -> None:
    found = devices(mig_gpu=True)
    parent = found[(NODE, "gpu-1")]
    assert parent.kind == mig.TYPE_MIG_PARENT and [t.key for t in parent.taints] == [mig.PARENT_TAINT_KEY]
    assert "taints" not in statuses(found)[f"{NODE}-gpu-1"], "the mig-parent marker is how MIG GPUs are published"
    partition = next(d.device for d in found.values() if d.kind == mig.TYPE_MIG)
    out = statuses(found, rule("pool", {"pool": NODE}), rule("one-partition", {"device": partition}, "NoExecute"))
    assert [t["source"] for t in out[f"{NODE}-gpu-1"]["taints"]] == [
        "DeviceTaintRule/one-partition",
        "DeviceTaintRule/pool",  # selects the GPU and each of its partitions: listed once
    ]
    assert [t["source"] for t in out[f"{NODE}-gpu-0"]["taints"]] == ["DeviceTaintRule/pool"]


def test_a_rule_added_and_deleted_writes_the_status_and_back() -> None:
    found = devices()
    before = desired_ledger(found, [], DRIVER_NAME, MANAGER)
    have = {n: existing(o) for n, o in before.items()}
    tainted = desired_ledger(found, [], DRIVER_NAME, MANAGER, rules=[rule("maint", {"device": "gpu-1"})])
    plan = plan_ledger(tainted, have, DRIVER_NAME)
    assert [o.name for o in plan.apply_status] == [f"{NODE}-gpu-1"] and not plan.apply_identity
    back = plan_ledger(before, {n: existing(o) for n, o in tainted.items()}, DRIVER_NAME)
    assert [o.name for o in back.apply_status] == [f"{NODE}-gpu-1"]
    assert "taints" not in back.apply_status[0].status
