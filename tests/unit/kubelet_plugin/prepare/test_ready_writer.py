"""The background writer of claims' Ready condition (kubelet_plugin/prepare/ready_writer.py)."""

import threading
from typing import Any

from api.kube_errors import ApiTimeout, UndecodableResponse, api_error
from kubelet_plugin.prepare.ready_writer import ReadyWriter


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
    rec = Recorder(ApiTimeout("no answer"), api_error(503, "Unavailable"))
    writer = ReadyWriter(rec.write, rec.failed, attempts=5, first_delay=0.01)
    writer.submit(claim())
    assert writer.wait_idle(10)
    assert (rec.calls, rec.failures) == (["u1"] * 3, 2)


def test_retries_end_after_the_last_attempt() -> None:
    rec = Recorder(*[ApiTimeout("no answer") for _ in range(10)])
    writer = ReadyWriter(rec.write, rec.failed, attempts=3, first_delay=0.01)
    writer.submit(claim())
    assert writer.wait_idle(10)
    assert (len(rec.calls), rec.failures) == (3, 3)


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
