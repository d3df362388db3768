"""What a claim's CDI spec file tells about its checkpoint entry (pure): the rebuild of a corrupt checkpoint.

A spec names the claim (annotation ``fracgpu.dev/claim=<namespace>/<name>``; specs of earlier versions:
env ``FRACGPU_CLAIM``), each device (``<claimUID>-<device>[-<shareID>]``) and each device's physical GPU (its
``FRACGPU_DEV_<KEY>_UUID`` env; earlier versions: ``NVIDIA_VISIBLE_DEVICES`` of the device's request, which
identifies the GPU only when the request has one). The UUID keeps the guard against a device that became
another GPU working. The spec does not record request names: the entry has none until the next prepare of the
claim rewrites it.
"""

import re

from pydantic import ValidationError

from kubelet_plugin.state import cdi, container_info
from kubelet_plugin.state.checkpoint import CheckpointDevice, ClaimEntry

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
    owner = _claim_name((spec.annotations or {}).get(cdi.CLAIM_ANNOTATION, ""))
    devices: list[CheckpointDevice] = []
    for device in spec.devices:
        env = dict(e.split("=", 1) for e in device.container_edits.env)
        owner = owner or _claim_name(env.get("FRACGPU_CLAIM", ""))
        prefix = f"{claim_uid}-"
        match = _DEVICE_RE.match(device.name[len(prefix) :]) if device.name.startswith(prefix) else None
        if match is None:
            continue
        uuids = {env.get(f"{container_info.env_prefix(device.name)}UUID", "")} - {""}
        uuids = uuids or {u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u}
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


def _claim_name(value: str) -> tuple[str, str] | None:
    namespace, sep, name = value.partition("/")
    return (namespace, name) if sep and namespace and name else None
