"""The real-GPU check's MIG step, its pure parts (harness/gpu/mig_step.py): the claim it plans, what it reads from the
container and why a view fails; and the container config giving the simulated driver's state (harness/gpu/container.py).
The step itself runs on the simulated driver in tests/integration/test_gpu_check.py."""

import json
from pathlib import Path

import pytest

from api.names import DRIVER_NAME
from harness.gpu import container, mig_step, report
from kubelet_plugin.core.model import GpuInfo, MigGpu, MigRecord
from kubelet_plugin.kinds.mig.publish import mig_devices
from kubelet_plugin.kinds.share import PreparedPartition
from tests.unit.fake_mig import H100_MIG

M = report.MARKER
GPU = GpuInfo(
    index=1, uuid="GPU-1d492704-49c3-5be7-977e-269165e18e2c", product_name="NVIDIA H100 80GB HBM3",
    memory_total_bytes=80 * 2**30, minor=1, pci_bus_id="0000:2a:00.0", architecture="Hopper",
    cuda_compute_capability="9.0", driver_version="580.65.06",
)  # fmt: skip
MIG = "MIG-23781e97-5fb2-5da6-9b15-ef804869da6f"
OTHER_MIG = "MIG-00000000-5fb2-5da6-9b15-ef804869da6f"
PARTITION = PreparedPartition(
    MigRecord(
        parent_uuid=GPU.uuid, gpu_instance=9, compute_instance=0, profile="1g.10gb", profile_id=19,
        placement_start=6, memory_slices=1, uuid=MIG, memory_mib=9984, multiprocessors=16,
    ),
    (219, 220),
)  # fmt: skip


def probe(*migs: str, total: int = 9984, sms: int = 16, alloc: str = "CUDA_SUCCESS") -> str:
    devices = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "uuid": GPU.uuid, "mig_uuid": m,
         "total_mib": total, "free_mib": total, "multiprocessor_count": sms}
        for i, m in enumerate(migs)
    ]  # fmt: skip
    return json.dumps({"device_count": len(migs), "devices": devices, "alloc": {"mib": 64, "result": alloc}})


def smi(*migs: str, gpus: tuple[str, ...] = (GPU.uuid,)) -> list[str]:
    lines = [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {u})" for i, u in enumerate(gpus)]
    return lines + [f"  MIG 1g.10gb      Device {i:2}: (UUID: {m})" for i, m in enumerate(migs)]


def output(
    smi_lines: list[str], probe_json: str, *, dev: str = "nvidia-caps nvidia1 nvidiactl", visible: str = "void"
) -> str:
    return "\n".join([
        f"{M} env", f"NVIDIA_VISIBLE_DEVICES={visible}",
        f"{M} smi", *smi_lines, f"{M} smi-rc 0",
        f"{M} probe", probe_json, f"{M} probe-rc 0",
        f"{M} dev", dev, f"{M} end",
    ])  # fmt: skip


def problems(text: str) -> list[str]:
    return mig_step.problems(report.parse_output(text), text, GPU, PARTITION)


def test_exactly_the_partition_passes() -> None:
    text = output(smi(MIG), probe(MIG))
    assert mig_step.seen(text) == ([("0", GPU.uuid)], [("1g.10gb", MIG)])
    assert problems(text) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (output(smi(MIG, OTHER_MIG), probe(MIG)), "nvidia-smi -L listed MIG devices"),
        (output(smi(gpus=(GPU.uuid,)), probe(MIG)), "not only 1g.10gb"),
        (output(smi(MIG, gpus=(GPU.uuid, "GPU-e311ac15-7c36-5bd0-91a6-3dc862bb53b2")), probe(MIG)), "listed GPUs"),
        (output(smi(MIG), probe(MIG, OTHER_MIG)), "saw 2 devices"),
        (output(smi(MIG), probe(OTHER_MIG)), f"not {MIG}"),
        (output(smi(MIG), probe(MIG, sms=132)), "132 multiprocessors, not the 16 of 1g.10gb"),
        (output(smi(MIG), probe(MIG, total=81920)), "more than the 9984 MiB partition"),
        (output(smi(MIG), probe(MIG, alloc="CUDA_ERROR_OUT_OF_MEMORY")), "cuMemAlloc of 64 MiB"),
        (output(smi(MIG), '{"error":"cuInit","result":"CUDA_ERROR_NO_DEVICE"}'), "the CUDA probe failed"),
        (output(smi(MIG), probe(MIG), visible="all"), "NVIDIA_VISIBLE_DEVICES is 'all'"),
        (output(smi(MIG), probe(MIG), dev="nvidia0 nvidia1"), "not nvidia1 alone"),
    ],
)
def test_any_other_view_fails_with_the_reason(text: str, expected: str) -> None:
    found = problems(text)
    assert any(expected in p for p in found), found


def test_the_claim_is_one_whole_partition_as_the_scheduler_allocates_it() -> None:
    device = mig_devices([GPU], {GPU.device_name: H100_MIG})[0]
    claim = mig_step.mig_claim(device, "gpu-check")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result == {"request": "gpu", "driver": DRIVER_NAME, "pool": "gpu-check", "device": device.name}
    assert device.profile.name == "1g.10gb" and device.start == 6  # the smallest, from the top


def test_the_modes_are_reported_with_the_profiles_or_nvmls_words() -> None:
    line = mig_step.mode_line(GPU, H100_MIG)
    assert line.startswith("MIG gpu-1: enabled, 8 memory / 7 compute slices; profiles 1g.10gb, 1g.20gb, 2g.20gb")
    assert mig_step.mode_line(GPU, MigGpu(state="disabled")) == "MIG gpu-1: disabled"
    off = MigGpu(state="unsupported", detail="Not Supported")
    assert mig_step.mode_line(GPU, off) == "MIG gpu-1: unsupported: Not Supported"


def test_the_minors_table_is_the_driver_roots_where_it_has_one(tmp_path: Path) -> None:
    assert mig_step.minors_file(tmp_path) == Path("/proc/driver/nvidia-caps/mig-minors")
    (tmp_path / mig_step.MIG_MINORS).parent.mkdir(parents=True)
    (tmp_path / mig_step.MIG_MINORS).write_text("")
    assert mig_step.minors_file(tmp_path) == tmp_path / mig_step.MIG_MINORS


def test_only_the_simulated_driver_gets_its_state_into_the_container(tmp_path: Path) -> None:
    template = {"process": {"args": ["sh"]}, "mounts": [{"destination": "/proc"}]}
    plain = container.bundle_config(template, tmp_path, ["true"], "gpu.fracgpu.dev/claim=x", "n")
    assert plain["mounts"] == [{"destination": "/proc"}] and plain["process"]["env"] == [container.CONTAINER_PATH]
    state = tmp_path / "state"
    config = container.bundle_config(template, tmp_path, ["true"], "x", "n", simulated_state=state)
    assert config["mounts"][-1] == {
        "destination": str(state),
        "type": "bind",
        "source": str(state),
        "options": ["rbind", "ro"],
    }
    assert f"{container.STATE_ENV}={state}" in config["process"]["env"]
