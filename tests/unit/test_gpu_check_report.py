"""The real-GPU check's reading of its container's output and its verdict (e2e/gpu/report.py), and the bundle's
wheel selection (e2e/gpu/bundle.py)."""

import json
import subprocess

import pytest

from e2e.gpu import report
from e2e.gpu.bundle import _installs_on

GRANTED = "GPU-e311ac15-7c36-5bd0-91a6-3dc862bb53b2"
OTHER = "GPU-1d492704-49c3-5be7-977e-269165e18e2c"
M = report.MARKER


def probe_line(*uuids: str, alloc: str = "CUDA_SUCCESS") -> str:
    devices = [
        {"index": i, "name": "NVIDIA H200", "uuid": u, "total_mib": 143771, "free_mib": 143000}
        for i, u in enumerate(uuids)
    ]
    return json.dumps(
        {
            "driver_version": 13000,
            "device_count": len(uuids),
            "devices": devices,
            "alloc": {"mib": 64, "result": alloc, "free_mib_before": 143000, "free_mib_after": 142936},
        }
    )


def output(smi: list[str], probe: str, visible: str = "void", smi_rc: int = 0, probe_rc: int = 0) -> str:
    return "\n".join([
        f"{M} env", "PATH=/usr/bin", f"NVIDIA_VISIBLE_DEVICES={visible}", "FRACGPU_INFO_DIR=/run/fracgpu",
        f"{M} smi", *smi, f"{M} smi-rc {smi_rc}",
        f"{M} probe", probe, f"{M} probe-rc {probe_rc}",
        f"{M} dev", "null nvidia0", "nvidiactl zero", f"{M} end",
    ])  # fmt: skip


def smi_line(i: int, uuid: str) -> str:
    return f"GPU {i}: NVIDIA H200 (UUID: {uuid})"


def test_exactly_the_granted_gpu_passes() -> None:
    view = report.parse_output(output([smi_line(0, GRANTED)], probe_line(GRANTED)))
    assert view.smi_uuids == [GRANTED]
    assert view.probe is not None and view.probe["device_count"] == 1
    assert view.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert view.dev == ["null", "nvidia0", "nvidiactl", "zero"]
    assert report.problems(view, GRANTED) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (output([smi_line(0, GRANTED), smi_line(1, OTHER)], probe_line(GRANTED)), "nvidia-smi -L listed"),
        (output([smi_line(0, OTHER)], probe_line(GRANTED)), "not exactly the granted"),
        (output(["No devices were found"], probe_line(GRANTED), smi_rc=6), "nvidia-smi -L exited with 6"),
        (output([smi_line(0, GRANTED)], probe_line(GRANTED, OTHER)), "counted 2 devices, not 1"),
        (output([smi_line(0, GRANTED)], probe_line(OTHER)), "the CUDA probe saw"),
        (output([smi_line(0, GRANTED)], probe_line(GRANTED, alloc="CUDA_ERROR_OUT_OF_MEMORY")), "cuMemAlloc"),
        (
            output([smi_line(0, GRANTED)], '{"error":"cuInit","code":100,"result":"CUDA_ERROR_NO_DEVICE"}', probe_rc=1),
            "the CUDA probe failed (exit 1)",
        ),
        (output([smi_line(0, GRANTED)], probe_line(GRANTED), visible="all"), "NVIDIA_VISIBLE_DEVICES is 'all'"),
        (f"{M} env\nPATH=/bin\n", "nvidia-smi -L exited with None"),  # the script died early
    ],
)
def test_any_other_view_fails_with_the_reason(text: str, expected: str) -> None:
    reasons = report.problems(report.parse_output(text), GRANTED)
    assert any(expected in r for r in reasons), reasons


def test_the_script_runs_in_a_shell_and_marks_each_section() -> None:
    """The script's own output (sh, with stand-ins for busybox, nvidia-smi and the probe) parses back."""
    script = report.container_script("env", None, "echo")
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    view = report.parse_output(done.stdout)
    assert view.smi_rc == 127 and view.smi_lines == ["the driver edits mount no nvidia-smi"]
    assert view.probe_rc == 0 and view.probe_text == str(report.PROBE_ALLOC_MIB)
    assert "PATH" in view.env


@pytest.mark.parametrize(
    ("wheel", "python", "fits"),
    [
        ("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "3.12", True),
        ("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "3.11", False),
        ("protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl", "3.13", True),
        ("protobuf-7.36.2-cp312-abi3-manylinux2014_x86_64.whl", "3.11", False),
        ("kubernetes-37.0.2-py2.py3-none-any.whl", "3.11", True),
    ],
)
def test_a_wheel_is_carried_for_the_pythons_it_installs_on(wheel: str, python: str, fits: bool) -> None:
    assert _installs_on(wheel, python) is fits
