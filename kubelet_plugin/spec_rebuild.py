"""What a claim's CDI spec file tells about its checkpoint entry (pure): the rebuild of a corrupt checkpoint.

A spec names the claim (``FRACGPU_CLAIM=<namespace>/<name>``), each device (``<claimUID>-<device>[-<shareID>]``)
and the physical GPUs of the device's request (``NVIDIA_VISIBLE_DEVICES``). A device whose request has one
GPU gets that GPU's UUID back, so the guard against a device that became another GPU keeps working; with
several GPUs in one request the spec does not say which device is which, and the UUID stays unknown. The
spec does not record request names: the entry has none until the next prepare of the claim rewrites it.
"""

import re

from pydantic import ValidationError

from kubelet_plugin import cdi
from kubelet_plugin.checkpoint import CheckpointDevice, ClaimEntry

#: ``GpuInfo.device_name`` (``gpu-<NVML index>``), then the optional share ID.
_DEVICE_RE = re.compile(r"^(gpu-[0-9]+)(?:-(.+))?$")


def entry_from_spec(text: str, claim_uid: str, driver: str, node_name: str) -> ClaimEntry | None:
    """The ``PrepareCompleted`` entry a spec file of this driver describes; None if it is not one."""
    try:
        spec = cdi.Spec.model_validate_json(text)
    except ValidationError:
        return None
    if spec.kind != cdi.cdi_kind(driver):
        return None
    owner: tuple[str, str] | None = None
    devices: list[CheckpointDevice] = []
    for device in spec.devices:
        env = dict(e.split("=", 1) for e in device.container_edits.env)
        namespace, sep, name = env.get("FRACGPU_CLAIM", "").partition("/")
        if sep and namespace and name:
            owner = owner or (namespace, name)
        prefix = f"{claim_uid}-"
        match = _DEVICE_RE.match(device.name[len(prefix) :]) if device.name.startswith(prefix) else None
        if match is None:
            continue
        uuids = {u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u}
        devices.append(
            CheckpointDevice(
                request_names=[],
                pool_name=node_name,
                device_name=match[1],
                cdi_device_ids=[f"{spec.kind}={device.name}"],
                share_id=match[2],
                uuid=uuids.pop() if len(uuids) == 1 else None,
            )
        )
    if owner is None:
        return None
    return ClaimEntry(namespace=owner[0], name=owner[1], state="PrepareCompleted", devices=devices)
