"""The controller on MIG GPUs: it reads the slices the node plugin publishes (built here by the plugin's own
builder), records a partition's GPU, profile, placement and MIG UUID in the claim status, keeps one GPU object per
MIG GPU with its slices and partitions, and never counts a MIG GPU itself as able to hold a request."""

from __future__ import annotations

from typing import Any

from api import mig
from api.names import DRIVER_NAME, MIG_DEVICE_CLASS_NAME
from controller.core.claims import DeviceClassView, claim_view
from controller.core.slices import current_devices, slice_view
from controller.ledger.plan import desired_ledger, family
from controller.status.feasibility import plan_unsatisfiable
from controller.status.plan import plan_status
from kubelet_plugin.core.model import MigGpu
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.fake_mig import H100_MIG
from tests.unit.kubelet_plugin.publishing.test_slices import NODE, NODE_UID, STEP, gpu

SMALL = mig.partition_device_name(1, "1g.10gb", 6)
HALF = mig.partition_device_name(1, "3g.40gb", 4)
MIG_UUID = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-0e1f2a3b4c5d"
MIG_CLASS = DeviceClassView(
    name=MIG_DEVICE_CLASS_NAME,
    selectors=(f'device.attributes["{DRIVER_NAME}"].type == "mig"',),
)
GPU_CLASS = DeviceClassView(
    name=DRIVER_NAME,
    selectors=(f'!("type" in device.attributes["{DRIVER_NAME}"]) || device.attributes["{DRIVER_NAME}"].type == "gpu"',),
)


def devices(state: str = "enabled") -> dict[Any, Any]:
    facts = H100_MIG if state == "enabled" else MigGpu(state=state)
    built = build_slices(NODE, NODE_UID, DRIVER_NAME, [gpu(0), gpu(1)], step=STEP, reserve=0, generation=1,
                         mig={"gpu-1": facts})  # fmt: skip
    views = [v for s in built if (v := slice_view(s, DRIVER_NAME)) is not None]
    return current_devices(views)


def claim(
    name: str, device: str | None = None, memory: str = "9984Mi", cls: str = MIG_DEVICE_CLASS_NAME
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": cls, "capacity": {"requests": {"memory": memory}}}}
        ]}},
        "status": {},
    }  # fmt: skip
    if device is not None:
        body["status"] = {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": NODE,
                                                    "device": device}]}},
            "devices": [{"driver": DRIVER_NAME, "pool": NODE, "device": device, "conditions": [
                {"type": mig.PARTITION_CONDITION, "status": "True", "reason": "Created", "message": MIG_UUID},
                {"type": "MemoryEnforcement", "status": "True", "reason": "Mig", "message": ""}]}],
        }  # fmt: skip
    view = claim_view(body, DRIVER_NAME, (DRIVER_NAME, MIG_DEVICE_CLASS_NAME))
    assert view is not None
    return {"view": view}


def test_the_slices_read_as_gpus_partitions_and_a_mig_gpu() -> None:
    found = devices()
    parent, part = found[NODE, "gpu-1"], found[NODE, SMALL]
    assert (parent.kind, parent.mig_state, parent.memory_slices, parent.compute_slices) == (
        "mig-parent",
        "enabled",
        8,
        7,
    )
    assert parent.max_request == 0, "a MIG GPU itself holds no request"
    assert (part.kind, part.profile, part.placement, part.partition_memory_mib) == ("mig", "1g.10gb", "6:1", 9984)
    assert (part.allow_multiple, part.memory_total, part.ledger_device) == (False, 9984 << 20, "gpu-1")
    assert found[NODE, "gpu-0"].kind == "gpu" and found[NODE, "gpu-0"].allow_multiple
    assert family((NODE, "gpu-1"), found)[1:] == sorted(k for k, d in found.items() if d.kind == "mig")


def test_the_claim_status_names_the_gpu_profile_placement_and_mig_uuid() -> None:
    """Its memory is the partition's own, never less than the request (a grant is a floor)."""
    found = devices()
    view = claim("a", SMALL)["view"]
    (entry,) = plan_status(view, found.get, DRIVER_NAME).entries
    assert entry["data"] == {
        "gpu": f"{NODE}-gpu-1", "node": NODE, "device": SMALL, "index": 1, "uuid": gpu(1).uuid,
        "productName": "NVIDIA H100 80GB HBM3", "request": "gpu", "memory": "9984Mi", "memoryTotal": "9984Mi",
        "enforcement": "mig", "profile": "1g.10gb", "placement": "6:1", "partitionMemory": "9984Mi",
        "migUUID": MIG_UUID,
    }  # fmt: skip


def test_one_gpu_object_per_mig_gpu_with_its_slices_and_partitions() -> None:
    found = devices()
    ledger = desired_ledger(found, [claim("a", SMALL)["view"], claim("b", HALF)["view"]], DRIVER_NAME, "m")
    assert sorted(ledger) == [f"{NODE}-gpu-0", f"{NODE}-gpu-1"], "no object per partition"
    status = ledger[f"{NODE}-gpu-1"].status
    assert status["mig"]["summary"] == "4/7 compute, 5/8 memory slices, 2 partitions"
    assert status["shares"] == 2 and status["enforcement"] == "mig" and status["shareEnforcement"] == "mig=2"
    assert status["allocatedMemory"] == f"{9984 + 40448}Mi", "each partition's own memory"
    assert [c["memory"] for c in status["claims"]] == ["9984Mi", "40448Mi"]
    assert [(c["device"], c["profile"], c["placement"]) for c in status["claims"]] == [
        (SMALL, "1g.10gb", "6:1"), (HALF, "3g.40gb", "4:4")]  # fmt: skip
    assert status["claims"][0]["migUUID"] == MIG_UUID
    assert "mig" not in ledger[f"{NODE}-gpu-0"].status


def test_a_mig_gpu_without_mig_says_why_on_its_object() -> None:
    ledger = desired_ledger(devices("disabled"), [], DRIVER_NAME, "m")
    state = ledger[f"{NODE}-gpu-1"].status["mig"]
    assert state["state"] == "disabled" and state["summary"] == "MIG disabled"
    assert "nvidia-smi -i 1 -mig 1" in state["message"]


def test_a_request_no_partition_can_ever_hold_is_unsatisfiable_and_one_that_fits_is_not() -> None:
    found = devices()
    classes = {MIG_DEVICE_CLASS_NAME: MIG_CLASS, DRIVER_NAME: GPU_CLASS}
    pending = claim("big", memory="80Gi")["view"]
    (found_,) = plan_unsatisfiable(pending, found.values(), classes, DRIVER_NAME)
    assert "asks for 80Gi" in found_.message and "the largest of them has 81152Mi" in found_.message
    assert plan_unsatisfiable(claim("fits", memory="70Gi")["view"], found.values(), classes, DRIVER_NAME) == ()
    whole = claim("whole", memory="80Gi", cls=DRIVER_NAME)["view"]
    assert plan_unsatisfiable(whole, found.values(), classes, DRIVER_NAME) != (), "gpu-0 has 79.5Gi; gpu-1 is MIG"
