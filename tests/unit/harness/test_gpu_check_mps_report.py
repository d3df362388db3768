"""The real-GPU check's MPS container scripts and their reading (harness/gpu/mps_report.py): the scripts run in a shell
with stand-ins for busybox (``env``: every applet they use is a program here too), the CUDA probe and the control
client, and what they print parses back; the verdicts on the read-only pipe directory and the client cap."""

import json
import subprocess
from pathlib import Path

import pytest

from harness.gpu import mps_report
from harness.gpu.report import MARKER as M
from harness.gpu.report import ProbeRun

ADMITTED = json.dumps(
    {"driver_version": 13000, "device_count": 1, "devices": [], "alloc": {"mib": 1, "result": "CUDA_SUCCESS"}}
)
REFUSED = json.dumps({"error": "cuInit", "code": 808, "result": "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"})


def fake_probe(tmp_path: Path, admits: int) -> Path:
    """A stand-in for the CUDA probe: the first `admits` runs print the report and hold (``probe 1 <seconds>``),
    later ones print the 808 refusal and exit 1, as a client past the cap does."""
    probe = tmp_path / "probe"
    count = tmp_path / "count"
    probe.write_text(
        "#!/bin/sh\n"
        f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
        f"if [ $n -gt {admits} ]; then echo '{REFUSED}'; exit 1; fi\n"
        f"echo '{ADMITTED}'\n"
        'exec sleep "$2"\n'
    )
    probe.chmod(0o755)
    return probe


def run(lines: list[str]) -> str:
    done = subprocess.run(["sh", "-c", "\n".join(lines)], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout


def test_the_cap_script_starts_clients_until_one_is_refused_and_ends_them(tmp_path: Path) -> None:
    probe = fake_probe(tmp_path, admits=5)
    out = run(mps_report.cap_lines("env", str(probe), max_clients=64, deadline_s=60, hold_s=30))
    view = mps_report.cap_view(out)
    assert [c.text for c in view.clients] == [ADMITTED] * 5 + [REFUSED]
    assert view.taken == 5 and view.seconds is not None and not view.deadline
    stopped = view.stopped_at
    assert stopped is not None and stopped[0] == 6
    summary = mps_report.cap_summary(view, max_clients=64, deadline_s=60)
    assert summary.startswith("5 clients taken in ")
    assert summary.endswith("; client 6 refused: cuInit CUDA_ERROR_MPS_MAX_CLIENTS_REACHED (808), as documented")
    assert mps_report.cap_problems(view, 5) == []
    assert mps_report.cap_problems(view, 48) == [
        "the MPS server took 5 clients, fewer than the 48 the plugin publishes as mpsClients (client 6 refused: "
        "cuInit CUDA_ERROR_MPS_MAX_CLIENTS_REACHED (808))"
    ]
    # the holding clients were ended (the script waited for them) and their files removed
    assert not list(Path("/tmp").glob("fracgpu-client-*.out"))


def test_the_cap_script_stops_at_its_bound(tmp_path: Path) -> None:
    probe = fake_probe(tmp_path, admits=100)
    view = mps_report.cap_view(run(mps_report.cap_lines("env", str(probe), max_clients=3, deadline_s=60, hold_s=30)))
    assert view.taken == 3 and view.stopped_at is None
    assert mps_report.cap_summary(view, max_clients=3, deadline_s=60).endswith(
        "; none refused among 3 (the bound is 3)"
    )


@pytest.mark.parametrize(
    ("client", "summary_end", "problem"),
    [
        ("", "client 3 printed nothing within 10 s (neither admitted nor refused)", True),
        (
            '{"error":"cuCtxCreate_v2","code":2,"result":"CUDA_ERROR_OUT_OF_MEMORY"}',
            "client 3 refused: cuCtxCreate_v2 CUDA_ERROR_OUT_OF_MEMORY (2), not CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
            True,
        ),
        (
            "./probe: error while loading shared libraries",
            "client 3 printed './probe: error while loading shared libraries'",
            True,
        ),
    ],
)
def test_a_client_neither_admitted_nor_refused_stops_the_run(client: str, summary_end: str, problem: bool) -> None:
    text = f"{M} clients\nclient 1 {ADMITTED}\nclient 2 {ADMITTED}\nclient 3 {client}\nelapsed 11\n{M} clients-end\n"
    view = mps_report.cap_view(text)
    assert view.taken == 2 and view.seconds == 11
    assert mps_report.cap_summary(view, max_clients=64, deadline_s=60) == f"2 clients taken in 11 s; {summary_end}"
    assert bool(mps_report.cap_problems(view, 48)) is problem


def test_a_run_that_reaches_its_time_bound_is_no_failure_and_says_so() -> None:
    text = f"{M} clients\nclient 1 {ADMITTED}\nclient 2 {ADMITTED}\ndeadline\nelapsed 60\n"
    view = mps_report.cap_view(text)
    assert view.deadline and view.taken == 2
    assert mps_report.cap_summary(view, max_clients=64, deadline_s=60) == (
        "2 clients taken in 60 s; stopped at the 60 s bound, none refused"
    )
    assert mps_report.cap_problems(view, 48) == []


def fake_control(tmp_path: Path) -> Path:
    """A stand-in for nvidia-cuda-mps-control's client: one server, 4242, with client 777."""
    control = tmp_path / "control"
    control.write_text(
        "#!/bin/sh\nread -r cmd arg\n"
        'case "$cmd" in get_server_list) echo 4242 ;; get_client_list) echo 777 ;; '
        'set_*) echo "Error: not allowed" ;; *) echo 20G ;; esac\n'
    )
    control.chmod(0o755)
    return control


def test_the_pipe_script_holds_a_client_and_asks_the_daemon_for_it(tmp_path: Path) -> None:
    out = run(mps_report.pipe_lines("env", str(fake_probe(tmp_path, admits=1)), str(fake_control(tmp_path)), 30))
    view = mps_report.pipe_view(out)
    assert view.held is not None and view.held.result is not None and view.held.text == ADMITTED
    assert view.servers_text == "4242" and view.clients == {4242: ["777"]} and view.clients_listed == 1
    # this machine has no mount at the container's pipe directory: the script says so, the verdict fails
    assert view.mount_options is None and view.write_rc not in (0, None)
    assert mps_report.pipe_problems(view, with_control=True) == [
        "the container has no mount at the pipe directory /run/fracgpu-mps/pipe"
    ]


def pipe(**changes: object) -> mps_report.PipeView:
    good: dict[str, object] = {
        "mount_options": "ro,nosuid,nodev,noexec,relatime",
        "write_rc": 1,
        "write_text": "touch: /run/fracgpu-mps/pipe/fracgpu-write-test: Read-only file system",
        "held": ProbeRun(result=json.loads(ADMITTED), text=ADMITTED),
        "servers_text": "4242",
        "clients": {4242: ["777"]},
    }
    return mps_report.PipeView.model_validate(good | changes)


@pytest.mark.parametrize(
    ("view", "with_control", "expected"),
    [
        (pipe(), True, None),
        (pipe(clients={}), False, None),  # no control client in the container: the probe's word only
        (
            pipe(mount_options="rw,nosuid,nodev,noexec,relatime"),
            True,
            "is mounted rw,nosuid,nodev,noexec,relatime, not read-only",
        ),
        (pipe(write_rc=0), True, "a write into the pipe directory /run/fracgpu-mps/pipe succeeded"),
        (
            pipe(held=ProbeRun(result=json.loads(REFUSED), text=REFUSED)),
            True,
            "an MPS client through the pipe directory /run/fracgpu-mps/pipe (read-only) failed: " + REFUSED,
        ),
        (pipe(held=None), True, "(read-only) failed: (no output)"),
        (
            pipe(clients={4242: []}),
            True,
            "the daemon listed no client while one was held through the pipe directory /run/fracgpu-mps/pipe "
            "(read-only) (servers: 4242): the client did not connect to it (CUDA then runs without MPS)",
        ),
    ],
)
def test_the_pipe_verdict(view: mps_report.PipeView, with_control: bool, expected: str | None) -> None:
    found = mps_report.pipe_problems(view, with_control=with_control)
    if expected is None:
        assert found == []
    else:
        assert any(expected in f for f in found), found


def test_replies_are_read_and_an_error_line_is_a_refusal_whatever_the_exit_status(tmp_path: Path) -> None:
    commands = ["get_default_device_pinned_mem_limit 0", "set_default_active_thread_percentage 100"]
    out = run(mps_report.reply_lines("env", str(fake_control(tmp_path)), commands))
    got, setting = mps_report.replies(out, commands)
    assert (got.text, got.rc, got.refused) == ("20G", 0, False)
    assert got.describe() == "`get_default_device_pinned_mem_limit 0` answered '20G' (exit 0)"
    assert (setting.text, setting.rc, setting.refused) == ("Error: not allowed", 0, True)
    assert mps_report.Reply(command="quit", lines=[], rc=1).refused  # no daemon answered
    assert mps_report.replies("", commands)[0].rc is None  # the script died before it


def test_the_shm_listing_leaves_out_dot_entries() -> None:
    assert mps_report.shm_names(f"{M} shm\n.\n..\ncuda.shm.0.1\n") == ["cuda.shm.0.1"]
