"""Unit tests of rebuilding checkpoint entries from CDI spec files (kubelet_plugin/state/spec_rebuild.py)."""

from api.names import DRIVER_NAME
from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state.spec_rebuild import entry_from_spec

UID = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"
SHARE = "a671734a-e8e5-11e4-8fde-42010af09327"
UUID0 = "GPU-11111111-2222-4333-8444-555555555550"
UUID1 = "GPU-11111111-2222-4333-8444-555555555551"


def device(gpu: str, share: str | None, uuids: list[str], claim: str = "team-a/claim-a") -> cdi.Device:
    env = [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}", "FRACGPU_MEMORY_LIMIT_MIB=10240"]
    if claim:
        env.append(f"FRACGPU_CLAIM={claim}")
    return cdi.Device(
        name=cdi.cdi_device_name(UID, gpu, share),
        container_edits=cdi.ContainerEdits(env=env, device_nodes=[cdi.DeviceNode(path="/dev/nvidiactl")]),
    )


def spec_text(*devices: cdi.Device, kind: str = cdi.cdi_kind(DRIVER_NAME)) -> str:
    return cdi.Spec(kind=kind, devices=list(devices)).to_json()


def test_a_share_and_a_whole_gpu_get_their_uuids() -> None:
    entry = entry_from_spec(
        spec_text(device("gpu-0", SHARE, [UUID0]), device("gpu-1", None, [UUID1])), UID, DRIVER_NAME, "node-a"
    )
    assert entry is not None
    assert (entry.namespace, entry.name, entry.state) == ("team-a", "claim-a", "PrepareCompleted")
    assert [(d.device_name, d.share_id, d.uuid, d.pool_name) for d in entry.devices] == [
        ("gpu-0", SHARE, UUID0, "node-a"),
        ("gpu-1", None, UUID1, "node-a"),
    ]
    assert entry.devices[0].cdi_device_ids == [cdi.cdi_device_id(DRIVER_NAME, UID, "gpu-0", SHARE)]
    assert entry.devices[0].request_names == []  # not in the spec; the next prepare records them


def test_several_gpus_in_one_request_leave_the_uuid_unknown() -> None:
    both = [UUID0, UUID1]
    entry = entry_from_spec(
        spec_text(device("gpu-0", None, both), device("gpu-1", None, both)), UID, DRIVER_NAME, "node-a"
    )
    assert entry is not None
    assert [(d.device_name, d.uuid) for d in entry.devices] == [("gpu-0", None), ("gpu-1", None)]
    same = entry_from_spec(spec_text(device("gpu-0", SHARE, [UUID0, UUID0])), UID, DRIVER_NAME, "node-a")
    assert same is not None and same.devices[0].uuid == UUID0  # two shares of one GPU: unambiguous


def test_what_is_not_a_spec_of_this_driver_gives_nothing() -> None:
    assert entry_from_spec("{ truncated", UID, DRIVER_NAME, "node-a") is None
    assert entry_from_spec(spec_text(device("gpu-0", SHARE, [UUID0])), UID, "other.example.com", "node-a") is None
    assert entry_from_spec(spec_text(device("gpu-0", SHARE, [UUID0], claim="")), UID, DRIVER_NAME, "node-a") is None


def test_current_specs_name_the_claim_by_annotation_and_each_gpu_by_its_device_env() -> None:
    """Specs of this version: claim from the annotation, each device's own UUID even with several GPUs in one
    request (the per-device FRACGPU_DEV_<KEY>_UUID variable), whatever NVIDIA_VISIBLE_DEVICES says."""
    both = [UUID0, UUID1]
    devices = []
    for gpu, uuid in (("gpu-0", UUID0), ("gpu-1", UUID1)):
        name = cdi.cdi_device_name(UID, gpu, None)
        prefix = container_info.env_prefix(name)
        env = [f"NVIDIA_VISIBLE_DEVICES={','.join(both)}", f"{prefix}UUID={uuid}", f"{prefix}CLAIM=team-b/claim-b"]
        edits = cdi.ContainerEdits(env=env, device_nodes=[cdi.DeviceNode(path="/dev/nvidiactl")])
        devices.append(cdi.Device(name=name, container_edits=edits))
    text = cdi.Spec(
        kind=cdi.cdi_kind(DRIVER_NAME), annotations={cdi.CLAIM_ANNOTATION: "team-b/claim-b"}, devices=devices
    ).to_json()
    entry = entry_from_spec(text, UID, DRIVER_NAME, "node-a")
    assert entry is not None
    assert (entry.namespace, entry.name) == ("team-b", "claim-b")
    assert [(d.device_name, d.uuid) for d in entry.devices] == [("gpu-0", UUID0), ("gpu-1", UUID1)]
