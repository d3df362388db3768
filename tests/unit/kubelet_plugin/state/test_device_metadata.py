"""Kubernetes' device metadata (KEP-5304) in a claim's plan: one file per request, true to the allocation (several
requests, a subrequest, several GPUs, two shares of one GPU, a template's claim), mounted read-only by the
request's own CDI devices only, in the JSON stream Kubernetes' readers decode
(kubelet_plugin/state/device_metadata.py, plan.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from api.names import DRIVER_NAME
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.prepare.plan import ClaimPlan
from kubelet_plugin.publishing.slices import device_entry
from kubelet_plugin.state import device_metadata as meta
from tests.unit.kubelet_plugin.prepare.test_plan import GPUS, claim, make_settings, planned, result
from tests.unit.plugin_host import NODE, SHARE_A, SHARE_B, UID_B, UUID0, UUID1

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
SHARE_C = "c0c0c0c0-2222-4333-8444-555566667777"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "driver-root" / "dev").mkdir(parents=True)
    return make_settings(tmp_path / "driver-root")


def published(settings: Settings, device: str, *, hami_core: bool = False) -> dict[str, Any]:
    """The device's attributes as the plugin's ResourceSlice publishes them on this node."""
    tiers = EnforcementDetector.without_nvml(settings, list(GPUS.values()), "no nvml").tiers()
    entry = device_entry(
        GPUS[device], settings.memory_step_bytes, settings.memory_reserve_bytes, hami_core, tiers[device].published
    )
    attributes: dict[str, Any] = entry["attributes"]
    return attributes


def files(plan: ClaimPlan) -> dict[str, tuple[meta.MetadataFile, list[dict[str, Any]]]]:
    """Base request -> its metadata file and the decoded JSON objects of its stream."""
    out = {}
    for file in plan.metadata:
        objects = []
        text, at = file.content().decode(), 0
        while at < len(text):
            obj, at = json.JSONDecoder().raw_decode(text, at)
            objects.append(obj)
            at += 1  # the newline after each object
        out[file.container_path.split("/")[-2]] = (file, objects)
    return out


def test_each_request_gets_its_devices_with_their_published_attributes(settings: Settings) -> None:
    allocated = claim(
        [
            result("gpu-1", request="a", share=SHARE_B, memory="20Gi"),  # out of PCI order
            result(request="a", share=SHARE_A, memory="10Gi"),
            result(request="b/small", share=SHARE_C, memory="1Gi"),  # a firstAvailable subrequest
        ]
    )
    plan = planned(allocated, settings, GPUS)
    by_request = files(plan)
    assert set(by_request) == {"a", "b"}
    for request, (file, objects) in by_request.items():
        assert file.host_path == settings.plugin_data_dir / "claim-info" / allocated["metadata"]["uid"] / (
            f"{request}.metadata"
        )
        assert file.container_path == f"{CONTAINER_DIR}/resourceclaims/my-claim/{request}/{DRIVER_NAME}-metadata.json"
        beta, alpha = objects
        assert [list(o)[:2] for o in objects] == [["kind", "apiVersion"]] * 2, "Kubernetes' field order"
        assert (beta["kind"], beta["apiVersion"]) == ("DeviceMetadata", "metadata.resource.k8s.io/v1beta1")
        assert (alpha["kind"], alpha["apiVersion"]) == ("DeviceMetadata", "metadata.resource.k8s.io/v1alpha1")
        assert {k: v for k, v in alpha.items() if k != "apiVersion"} == {
            k: v for k, v in beta.items() if k != "apiVersion"
        }, "the same metadata in each version"
        assert beta["metadata"] == {
            "name": "my-claim",
            "namespace": "team-a",
            "uid": allocated["metadata"]["uid"],
            "generation": 1,
        }
        assert "podClaimName" not in beta, "a claim the pod names itself"
    (a,) = by_request["a"][1][0]["requests"]
    assert a["name"] == "a"
    assert [(d["driver"], d["pool"], d["name"]) for d in a["devices"]] == [
        (DRIVER_NAME, NODE, "gpu-0"),  # the info file's order: CUDA's (PCI bus ID)
        (DRIVER_NAME, NODE, "gpu-1"),
    ]
    assert [d["attributes"] for d in a["devices"]] == [published(settings, "gpu-0"), published(settings, "gpu-1")]
    assert a["devices"][0]["attributes"]["uuid"] == {"string": UUID0}
    assert a["devices"][1]["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:02:00.0"}
    assert "capacity" not in json.dumps(a), "the schema has no capacity"
    (b,) = by_request["b"][1][0]["requests"]
    assert b["name"] == "b/small", "the file's request names the subrequest; its path only the request"
    assert [d["name"] for d in b["devices"]] == ["gpu-0"]


def test_two_shares_of_one_gpu_are_two_devices_and_the_attributes_follow_the_node(settings: Settings) -> None:
    allocated = claim([result(share=SHARE_A, memory="10Gi"), result(share=SHARE_B, memory="20Gi")])
    (file,) = planned(allocated, settings, GPUS, hami_core_installed=True).metadata
    (request,) = file.metadata.requests
    assert [(d.name, d.attributes["uuid"].string) for d in request.devices] == [("gpu-0", UUID0), ("gpu-0", UUID0)]
    dumped = json.loads(file.metadata.to_json())["requests"][0]["devices"][0]["attributes"]
    assert dumped == published(settings, "gpu-0", hami_core=True)
    assert dumped["hamiCore"] == {"bool": True}
    (without,) = planned(allocated, settings, GPUS).metadata
    assert without.metadata.requests[0].devices[0].attributes["hamiCore"].bool_ is False


def test_a_templates_claim_is_found_under_the_pods_claim_name(settings: Settings) -> None:
    allocated = claim([result("gpu-1")], name="pod-0-gpu-x7k2p")
    allocated["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    (file,) = planned(allocated, settings, GPUS).metadata
    assert file.container_path == f"{CONTAINER_DIR}/resourceclaimtemplates/gpu/gpu/{DRIVER_NAME}-metadata.json"
    beta, _ = meta.read_stream(file.content().decode())
    assert (beta.pod_claim_name, beta.metadata.name) == ("gpu", "pod-0-gpu-x7k2p")
    assert [d.attributes["uuid"].string for d in beta.requests[0].devices] == [UUID1]


@pytest.mark.parametrize("annotation", ["../../etc", "GPU", "a/b", "x" * 64])
def test_a_pod_claim_name_that_is_no_dns_label_is_refused(settings: Settings, annotation: str) -> None:
    allocated = claim([result()])
    allocated["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": annotation}
    with pytest.raises(PrepareError) as err:
        planned(allocated, settings, GPUS)
    assert err.value.kind is ErrorKind.INVALID_NAME
    assert annotation in str(err.value)


def test_a_device_mounts_only_its_own_requests_metadata_and_never_another_claims(settings: Settings) -> None:
    first = planned(
        claim([result("gpu-1", request="b", share=SHARE_B, memory="20Gi"), result(request="a")]), settings, GPUS
    )
    second = planned(claim([result("gpu-1", share=SHARE_C, memory="30Gi")], uid=UID_B, name="other"), settings, GPUS)
    for plan, name in ((first, "my-claim"), (second, "other")):
        assert plan.spec is not None
        own = {str(f.host_path): f for f in plan.metadata}
        uid = plan.metadata[0].metadata.metadata.uid
        for device in plan.spec.devices:
            (mount,) = [m for m in device.container_edits.mounts if m.container_path.startswith(CONTAINER_DIR)]
            file = own[mount.host_path]
            assert f"/claim-info/{uid}/" in mount.host_path and f"/resourceclaims/{name}/" in mount.container_path
            (request,) = file.metadata.requests
            gpu = "-".join(device.name.removeprefix(f"{uid}-").split("-")[:2])  # <claimUID>-gpu-<i>-<shareID>
            assert gpu in {d.name for d in request.devices}, "the file of the device's own request"
            assert mount.container_path == file.container_path
            assert mount.options[0] == "ro"


def test_the_stream_reads_back_and_a_value_is_one_of_its_kinds() -> None:
    metadata = meta.DeviceMetadata(
        metadata=meta.ObjectMeta(name="c", namespace="n", uid="u"),
        requests=[
            meta.Request(
                name="r",
                devices=[
                    meta.Device(
                        driver=DRIVER_NAME,
                        pool=NODE,
                        name="gpu-0",
                        attributes=meta.attributes({"index": {"int": 0}, "driverVersion": {"version": "580.65.6"}}),
                    )
                ],
            )
        ],
    )
    text = meta.to_stream(metadata).decode()
    assert text.endswith("}\n") and text.count('"kind": "DeviceMetadata"') == 2
    assert [m.api_version for m in meta.read_stream(text)] == list(meta.VERSIONS)
    assert meta.read_stream(text)[0] == metadata
    with pytest.raises(ValidationError, match=r"exactly one value, this one has \['int', 'string'\]"):
        meta.Attribute.model_validate({"int": 1, "string": "1"})
    with pytest.raises(ValidationError, match="exactly one value"):
        meta.Attribute.model_validate({})
    raw = {"driver": DRIVER_NAME, "pool": NODE, "name": "gpu-0", "attributes": {"x": {"int": 1, "bool": True}}}
    with pytest.raises(ValidationError, match=r"exactly one value, this one has \['int', 'bool'\]"):
        meta.Device.model_validate(raw, strict=False)  # as a file is read: the check runs on what was not checked
    with pytest.raises(ValidationError):
        meta.Device(
            driver=DRIVER_NAME,
            pool=NODE,
            name="gpu-0",
            attributes=meta.attributes({f"a{i}": {"int": i} for i in range(33)}),
        )
