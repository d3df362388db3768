"""The GPU CRD is generated from api/gpu.py; this fails when the checked-in YAML is stale."""

from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from api.crds import CRD_DIR, generated_files, gpu_crd, openapi_schema, stale_files
from api.crds.__main__ import main
from api.gpu import GPU_CRD_NAME, Gpu, GpuShare, GpuSpec, GpuStatus


def test_checked_in_crd_yaml_is_current() -> None:
    assert stale_files() == [], "run `python -m api.crds` and commit the result"
    assert main(["--check"]) == 0


def test_crd_shape() -> None:
    crd = yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text())
    assert crd == gpu_crd()
    spec = crd["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "fracgpu.dev",
        "Cluster",
        "GPU",
        "gpus",
    )
    (version,) = spec["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["MODEL", "TOTAL", "ALLOCATED", "FREE", "SHARES", "ENFORCEMENT", "REPORTING", "AGE"]
    wide = [c["name"].upper() for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == [
        "NODE",  # the object's name is <node>-<device>
        "USED",
        "COMPUTE",  # allocated compute, percent of the GPU; blank where no share reserves any
        "TAINTS",  # blank but on tainted GPUs: NoSchedule=1
        "MIG",
        "TRUST-DOMAIN",
        "INDEX",
        "UUID",
        "SHARE-ENFORCEMENT",
        "TAINTED-BY",
    ]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert {
        "node",
        "index",
        "uuid",
        "model",
        "totalMemory",
        "allocatedMemory",
        "freeMemory",
        "allocatedCompute",
        "shares",
        "claims",
    } <= set(status["properties"])
    assert status["properties"]["index"] == {
        "type": "integer",
        "nullable": True,
        "description": "NVML index of the GPU on its node",
    }
    assert set(status["properties"]["claims"]["items"]["properties"]) == {
        "namespace",
        "name",
        "pod",
        "request",
        "shareID",
        "memory",
        "adminAccess",
        "enforcement",
        "compute",
        "device",
        "profile",
        "placement",
        "migUUID",
    }
    mig = status["properties"]["mig"]["properties"]
    assert {"state", "message", "usedComputeSlices", "totalComputeSlices", "usedMemorySlices", "totalMemorySlices",
            "partitions", "summary"} == set(mig)  # fmt: skip


def _walk(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [*node.keys(), *(k for v in node.values() for k in _walk(v))]
    if isinstance(node, list):
        return [k for v in node for k in _walk(v)]
    return []


def test_schema_is_structural() -> None:
    keys = set(_walk(gpu_crd()["spec"]["versions"][0]["schema"]))
    assert not keys & {"$ref", "$defs", "anyOf", "title", "allOf", "oneOf"}


def test_models_round_trip_through_their_wire_names() -> None:
    gpu = Gpu(
        spec=GpuSpec(driver="d", pool="n", device="gpu-0", node="n"),
        status=GpuStatus(
            node="n",
            index=0,
            total_memory="80Gi",
            allocated_memory="1Gi",
            free_memory="79Gi",
            shares=1,
            claims=[GpuShare(namespace="ns", name="c", request="r", share_id="s", memory="1Gi")],
        ),
    )
    wire = gpu.model_dump(by_alias=True)
    assert wire["status"]["claims"][0]["shareID"] == "s" and wire["status"]["totalMemory"] == "80Gi"
    assert Gpu.model_validate(wire) == gpu


def test_unsupported_constructs_fail_generation() -> None:
    class Bad(BaseModel):
        either: int | str

    with pytest.raises(ValueError, match=r"only `X \| None` unions"):
        openapi_schema(Bad)


def test_generator_writes_and_checks(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "crd.yaml"
    monkeypatch.setattr("api.crds.__main__.generated_files", lambda: {target: "x\n"})
    monkeypatch.setattr("api.crds.__main__.stale_files", lambda: [target])
    assert main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert main([]) == 0 and target.read_text() == "x\n"
    assert list(generated_files()) == [CRD_DIR / f"{GPU_CRD_NAME}.yaml"]
