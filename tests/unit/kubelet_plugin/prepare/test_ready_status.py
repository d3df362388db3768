"""Unit tests of the claim status the node plugin writes (kubelet_plugin/prepare/ready.py): the
MemoryEnforcement condition says when computeLimitPercent is not enforced on the share's tier, and what admin access
gives (and, on an MPS GPU, does not)."""

from typing import Any, cast

import pytest

from api.kube_rest import KubeRest
from api.names import DRIVER_NAME
from kubelet_plugin.prepare.ready import apply_ready

HEAD = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig"}


class RecordingRest:
    """Records each server-side apply (the only call apply_ready makes)."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def apply(self, path: str, body: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        self.applied.append(body)
        return body


def claim(parameters: dict[str, Any] | None) -> dict[str, Any]:
    config = (
        [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}]
        if parameters is not None
        else []
    )
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER_NAME, "pool": "n", "device": "gpu-0", "shareID": "s1"}
    result["consumedCapacity"] = {"memory": "10Gi"}
    return {
        "metadata": {"name": "c", "namespace": "ns", "generation": 1},
        "status": {"allocation": {"devices": {"results": [result], "config": config}}},
    }


def enforcement_message(body: dict[str, Any], tier: str) -> str:
    rest = RecordingRest()
    apply_ready(cast(KubeRest, rest), body, DRIVER_NAME, "n", {("n", "gpu-0", "s1"): tier})
    (applied,) = rest.applied
    (entry,) = applied["status"]["devices"]
    (condition,) = [c for c in entry["conditions"] if c["type"] == "MemoryEnforcement"]
    return str(condition["message"])


@pytest.mark.parametrize("tier", ["none", "nvml"])
def test_compute_limit_percent_on_a_tier_that_ignores_it_is_said_not_enforced(tier: str) -> None:
    message = enforcement_message(claim({**HEAD, "computeLimitPercent": 30}), tier)
    assert message.endswith(
        "; computeLimitPercent 30 is not enforced on this tier: only mps (MPS GPUs, DeviceClass "
        "mps.gpu.fracgpu.dev) and hami-core apply it"
    ), message


@pytest.mark.parametrize(
    ("tier", "parameters"),
    [("hami-core", {**HEAD, "computeLimitPercent": 30}), ("none", {**HEAD}), ("nvml", None)],
)
def test_no_note_where_the_tier_applies_it_or_none_is_set(tier: str, parameters: dict[str, Any] | None) -> None:
    assert "computeLimitPercent" not in enforcement_message(claim(parameters), tier)


@pytest.mark.parametrize("on_mps", [False, True])
def test_an_admin_access_result_is_said_to_be_admin_access_and_on_an_mps_gpu_monitoring_only(on_mps: bool) -> None:
    body = claim(None)
    body["status"]["allocation"]["devices"]["results"][0] |= {"adminAccess": True, "consumedCapacity": {"memory": "0"}}
    rest = RecordingRest()
    key = ("n", "gpu-0", "s1")
    apply_ready(cast(KubeRest, rest), body, DRIVER_NAME, "n", {key: "none"}, admin_on_mps={key} if on_mps else ())
    (entry,) = rest.applied[0]["status"]["devices"]
    (condition,) = [c for c in entry["conditions"] if c["type"] == "MemoryEnforcement"]
    assert (condition["status"], condition["reason"]) == ("False", "None")
    assert condition["message"].startswith(
        "admin access (monitoring): the whole GPU's memory is visible to this claim, none of it reserved for it"
    ), condition["message"]
    assert ("EXCLUSIVE_PROCESS" in condition["message"]) is on_mps
    assert ("cannot create a CUDA context while that server runs" in condition["message"]) is on_mps
