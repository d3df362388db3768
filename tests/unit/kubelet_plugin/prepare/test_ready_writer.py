"""The background writer of claims' Ready condition (kubelet_plugin/prepare/ready.py)."""

import threading
from typing import Any

from api.kube_errors import ApiTimeout, UndecodableResponse, api_error
from kubelet_plugin.prepare.ready import ReadyWriter


def claim(uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": "c", "namespace": "ns"}}


class Recorder:
    """A `write` that fails with the queued errors, then succeeds; counts calls and failures."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[str] = []
        self.failures = 0
        self.gate = threading.Event()
        self.gate.set()

    def write(self, c: dict[str, Any]) -> None:
        self.gate.wait(10)
        self.calls.append(c["metadata"]["uid"])
        if self.errors:
            raise self.errors.pop(0)

    def failed(self) -> None:
        self.failures += 1


def test_transient_failures_are_retried_until_written() -> None:
    throttled = api_error(429, "Too Many Requests", "", "0")
    rec = Recorder(ApiTimeout("no answer"), api_error(503, "Unavailable"), *[throttled] * 8)
    writer = ReadyWriter(rec.write, rec.failed, first_delay=0.001)
    writer.submit(claim())
    assert writer.wait_idle(10)
    assert (rec.calls, rec.failures) == (["u1"] * 11, 10), "delayed, not dropped"


def test_retries_end_when_the_claim_is_unprepared() -> None:
    rec = Recorder(*[ApiTimeout("no answer") for _ in range(1000)])
    writer = ReadyWriter(rec.write, rec.failed, first_delay=0.01)
    writer.submit(claim())
    kube_wait = threading.Event()
    while len(rec.calls) < 3:
        kube_wait.wait(0.01)
    writer.cancel("u1")
    assert writer.wait_idle(10)
    tried = len(rec.calls)
    kube_wait.wait(0.2)
    assert len(rec.calls) <= tried + 1, "a try in flight may finish; none after"


def test_a_refusal_is_final_and_an_undecodable_answer_is_a_success() -> None:
    rec = Recorder(api_error(403, "Forbidden"), UndecodableResponse(status=200, reason="deep"))
    writer = ReadyWriter(rec.write, rec.failed, first_delay=0.01)
    writer.submit(claim("u1"))
    assert writer.wait_idle(10)
    writer.submit(claim("u2"))
    assert writer.wait_idle(10)
    assert (rec.calls, rec.failures) == (["u1", "u2"], 1)


def test_a_claim_pending_is_not_written_twice() -> None:
    rec = Recorder()
    rec.gate.clear()
    writer = ReadyWriter(rec.write, rec.failed)
    writer.submit(claim("u1"))
    writer.submit(claim("u1"))
    writer.submit(claim("u2"))
    assert not writer.wait_idle(0.2)
    rec.gate.set()
    assert writer.wait_idle(10)
    assert sorted(rec.calls) == ["u1", "u2"]
