"""The real-GPU check's reading of its container's output and its verdict (harness/gpu/report.py), and the bundle's
wheel selection (harness/gpu/bundle.py)."""

import json
import subprocess

import pytest

from harness.gpu import report
from harness.gpu.bundle import _installs_on

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


def cap_section(mib: int, result: str) -> str:
    alloc = {"mib": mib, "result": result, "free_mib_before": 143000, "free_mib_after": 143000}
    line = json.dumps({"driver_version": 13000, "device_count": 1, "devices": [], "alloc": alloc})
    return f"{M} cap-{mib}\n{line}\n{M} cap-{mib}-rc 0"


def capped_output(above: str, below: str) -> str:
    """The container's output at the nvml tier: the usual sections, then the probe at 12 GiB and 8 GiB."""
    text = output([smi_line(0, GRANTED)], probe_line(GRANTED))
    return "\n".join([text, cap_section(12288, above), cap_section(8192, below)])


def test_a_cap_that_refuses_12gi_and_allows_8gi_passes() -> None:
    view = report.parse_output(capped_output("CUDA_ERROR_OUT_OF_MEMORY", "CUDA_SUCCESS"))
    assert report.cap_sizes(10240) == (12288, 8192)
    assert {mib: run.alloc_result for mib, run in view.caps.items()} == {
        12288: "CUDA_ERROR_OUT_OF_MEMORY",
        8192: "CUDA_SUCCESS",
    }
    reasons = report.problems(view, GRANTED) + report.cap_problems(view, 10240)
    assert reasons == []
    line = report.verdict(reasons, report.cap_summary(view, 10240))
    assert line.startswith("PASS: ") and line.endswith(
        "memory cap 10240 MiB (nvml) enforced: cuMemAlloc 12288 MiB: CUDA_ERROR_OUT_OF_MEMORY, 8192 MiB: CUDA_SUCCESS"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            capped_output("CUDA_SUCCESS", "CUDA_SUCCESS"),
            "memory cap not enforced: cuMemAlloc of 12288 MiB succeeded in a container capped at 10240 MiB",
        ),
        (
            capped_output("CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_OUT_OF_MEMORY"),
            "cuMemAlloc of 8192 MiB, under the 10240 MiB cap, gave CUDA_ERROR_OUT_OF_MEMORY",
        ),
        (  # the script died before the cap probes: no section is no pass
            output([smi_line(0, GRANTED)], probe_line(GRANTED)),
            "the 12288 MiB CUDA probe did not allocate (exit None): (no output)",
        ),
        (
            output([smi_line(0, GRANTED)], probe_line(GRANTED))
            + f'\n{M} cap-12288\n{{"error":"cuCtxCreate","code":2}}\n{M} cap-12288-rc 1',
            'the 12288 MiB CUDA probe did not allocate (exit 1): {"error":"cuCtxCreate","code":2}',
        ),
    ],
)
def test_a_cap_that_does_not_hold_fails_with_the_reason(text: str, expected: str) -> None:
    reasons = report.cap_problems(report.parse_output(text), 10240)
    assert expected in reasons, reasons
    assert report.verdict(reasons, "").startswith("FAIL: ")


def test_without_nvml_the_verdict_passes_and_says_the_cap_was_not_checked() -> None:
    view = report.parse_output(output([smi_line(0, GRANTED)], probe_line(GRANTED)))
    note = report.not_checked("the node has no cgroup v2 unified hierarchy at /sys/fs/cgroup")
    line = report.verdict(report.problems(view, GRANTED), note)
    assert line.startswith("PASS: ")
    assert line.endswith(
        "; nvml not available: the node has no cgroup v2 unified hierarchy at /sys/fs/cgroup; memory cap not checked"
    )
    assert report.verdict(["nvidia-smi -L exited with 6"], note) == "FAIL: nvidia-smi -L exited with 6"


def test_the_script_runs_the_probe_once_per_cap_size() -> None:
    script = report.container_script("env", None, "echo", (12288, 8192))
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    view = report.parse_output(done.stdout)
    assert {mib: (run.text, run.rc) for mib, run in view.caps.items()} == {12288: ("12288", 0), 8192: ("8192", 0)}
    assert view.probe_text == str(report.PROBE_ALLOC_MIB)


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
