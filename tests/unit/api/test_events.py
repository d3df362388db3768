"""Every Event message is one line (`api.events.event_body`, the one builder of both components' Events)."""

from api.events import MESSAGE_LIMIT, event_body, involved_object, one_line

SELECTOR = 'device.attributes["gpu.fracgpu.dev"].productName == "NVIDIA A100"\n  &&\tdevice.capacity["x"] > 0\r\n'


def test_whitespace_runs_newlines_included_become_one_space() -> None:
    assert one_line(f"  selector {SELECTOR} matches no GPU \n") == (
        'selector device.attributes["gpu.fracgpu.dev"].productName == "NVIDIA A100" && device.capacity["x"] > 0 '
        "matches no GPU"
    )
    assert one_line("a\u2028b\x0bc\x0cd") == "a b c d"
    assert one_line("plain") == "plain"


def test_the_built_event_carries_one_line_cut_after_collapsing() -> None:
    pod = involved_object("v1", "Pod", "p", namespace="ns", uid="u")
    body = event_body(pod, "UnsatisfiableGpuRequest", f"asks: {SELECTOR}", component="c", instance="i")
    assert "\n" not in body["message"] and "\t" not in body["message"] and "  " not in body["message"]
    assert body["message"].endswith("> 0")
    long = event_body(pod, "R", "x\n" * MESSAGE_LIMIT, component="c", instance="i")["message"]
    assert len(long) == MESSAGE_LIMIT and set(long) == {"x", " "}
