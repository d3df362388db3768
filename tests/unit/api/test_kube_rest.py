"""Plain-JSON API access (api/kube_rest.py): only documented errors, whatever the API server sends or
does not send; against a fake API server on 127.0.0.1 (tests/unit/fake_apiserver.py)."""

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from api.kube_config import KubeConfig
from api.kube_errors import (
    ApiAllocationImmutable,
    ApiAlreadyExists,
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiNamespaceTerminating,
    ApiNoConnection,
    ApiNotFound,
    ApiServerError,
    ApiThrottled,
    ApiTimeout,
    ApiTransient,
    ApiUidMismatch,
    ApiUnavailable,
    ApiUnreachable,
    UndecodableResponse,
    api_error,
)
from api.kube_metrics import ApiMetrics, resource_of
from api.kube_rest import KubeConnection, KubeRest, decode_json
from api.kube_retry import MAX_RETRIES
from tests.unit.fake_apiserver import RESET, FakeApiServer, connection, serve, throttled, unavailable

#: As deep as kube-apiserver stores opaque parameters: 10 KiB of `[` and `]` inside `{"a": …}`.
DEEP = b'{"a":' + b"[" * 5117 + b"]" * 5117 + b"}"


@pytest.fixture
def api_server() -> Iterator[tuple[FakeApiServer, str]]:
    with serve() as running:
        yield running


def rest_for(host: str, budget: float = 10) -> KubeRest:
    return KubeRest.bounded(connection(host), budget=budget)


class VirtualTime:
    """A monotonic clock that a `sleep` advances at once: a KubeRest that waits what the server asks, instantly."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        self.during_sleep: Callable[[], None] = lambda: None

    def now(self) -> float:
        return time.monotonic() + sum(self.slept)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.during_sleep()


def waiting_rest(
    host: str, budget: float = 10, metrics: ApiMetrics | None = None, **kwargs: Any
) -> tuple[KubeRest, VirtualTime]:
    """A bounded KubeRest on virtual time (its waits recorded, not slept), counting into `metrics`."""
    clock = VirtualTime()
    conn = KubeConnection(KubeConfig(server=host), metrics)
    return KubeRest(conn, timeout=budget / 2, budget=budget, clock=clock.now, sleep=clock.sleep, **kwargs), clock


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (DEEP, "nested deeper than the JSON decoder's limit"),
        (b'{"a": ' + b"9" * 5000 + b"}", "Exceeds the limit (4300 digits)"),
        (b'{"a": "\xff"}', "not valid UTF-8"),
        (b'{"a": ', "not valid JSON"),
    ],
)
def test_decode_raises_only_the_documented_error(data: bytes, problem: str) -> None:
    with pytest.raises(UndecodableResponse) as raised:
        decode_json(data)
    assert problem in raised.value.reason
    assert raised.value.status == 200


def test_decode_keeps_what_python_can_hold() -> None:
    assert decode_json(b'{"a": 1e999, "b": -0.0, "c": "\\ud800", "d": ' + b"9" * 4000 + b"}") == {
        "a": float("inf"),
        "b": -0.0,
        "c": "\ud800",
        "d": int("9" * 4000),
    }


def test_requests_raise_undecodable_response(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.objects["/deep"] = DEEP
    api.objects["/list"] = b"[1]"
    with pytest.raises(UndecodableResponse, match="nested deeper"):
        rest_for(host).get("/deep")
    with pytest.raises(UndecodableResponse, match="not a JSON object"):
        rest_for(host).get("/list")


def test_a_watch_event_that_cannot_be_decoded_ends_the_watch_with_the_documented_error(
    api_server: tuple[FakeApiServer, str],
) -> None:
    api, host = api_server
    api.objects["/things"] = b'{"type":"ADDED","object":{"a":1}}\n{"type":"ADDED","object":' + DEEP + b"}\n"
    events = rest_for(host).watch("/things", timeout_seconds=5)
    assert next(events) == {"type": "ADDED", "object": {"a": 1}}
    with pytest.raises(UndecodableResponse, match="nested deeper"):
        next(events)


def test_bounded_requests_report_a_timeout(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.objects["/x"] = b"{}"
    api.hang.add("/x")
    with pytest.raises(ApiTimeout) as raised:
        rest_for(host, budget=1).get("/x")
    where = host.removeprefix("http://")
    assert str(raised.value) == (
        f"timed out: the API server at {where} did not answer within 0.5 s; tried 2 times in {raised.value.seconds:.1f} s"
    )
    assert raised.value.status == 0 and 0.9 < raised.value.seconds < 1.5
    with api.lock:  # two attempts of 0.5 s, no more
        assert sum(1 for e in api.log if e == ("start", "GET", "/x")) == 2


def test_a_refused_connection_is_unreachable_not_a_timeout() -> None:
    with serve() as (_, host):
        pass  # stopped: nothing listens on its port any more
    with pytest.raises(ApiNoConnection) as raised:
        rest_for(host, budget=1).get("/x")  # the retry's 1 s wait does not fit
    assert (
        str(raised.value)
        == f"API server unreachable: cannot connect to {host.removeprefix('http://')}: connection refused"
    )
    assert not isinstance(raised.value, ApiTimeout)


def test_an_http_error_is_an_api_error_with_status_reason_and_body(api_server: tuple[FakeApiServer, str]) -> None:
    _, host = api_server
    with pytest.raises(ApiError) as raised:
        rest_for(host).get("/absent")
    err = raised.value
    assert not isinstance(err, ApiUnreachable)
    assert (err.status, err.reason) == (404, "Not Found")
    assert json.loads(err.body)["reason"] == "NotFound"
    assert str(err) == "not found (404)", "the fake's Status has no message; one kind, one message"
    with pytest.raises(ApiError) as watched:
        next(rest_for(host).watch("/absent", timeout_seconds=5))
    assert watched.value.status == 404


def test_requests_carry_json_and_the_apply_content_type(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    rest = rest_for(host)
    assert rest.create("/things", {"a": 1}) == {}
    assert rest.apply("/things/x", {"a": 1}, "me") == {}
    with api.lock:
        assert [e for e in api.log if e[0] == "answer"] == [
            ("answer", "POST", "/things"),
            ("answer", "PATCH", "/things/x"),
        ]


def test_every_kube_rest_on_a_connection_shares_its_pool_also_after_a_watch_left_early(
    api_server: tuple[FakeApiServer, str],
) -> None:
    api, host = api_server
    api.objects["/things"] = b'{"type":"ADDED","object":{"a":1}}\n{"type":"ADDED","object":{"a":2}}\n'
    api.objects["/x"] = b'{"x": 1}'
    shared = connection(host)
    plain, bounded = KubeRest(shared, budget=30), KubeRest.bounded(shared, budget=10)
    assert plain.get("/x") == bounded.get("/x") == {"x": 1}
    assert api.connections == 1  # one connection, kept open and reused
    events = bounded.watch("/things", timeout_seconds=5)
    assert next(events) == {"type": "ADDED", "object": {"a": 1}}
    events.close()  # the rest of the stream is unread: that connection must not serve the next request
    assert plain.get("/x") == {"x": 1}


def test_sixteen_threads_share_one_connection_pool(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    for i in range(16):
        api.objects[f"/claims/{i}"] = json.dumps({"i": i}).encode()
    rest = rest_for(host)
    with ThreadPoolExecutor(16) as pool:
        for _ in range(3):
            assert list(pool.map(lambda i: rest.get(f"/claims/{i}")["i"], range(16))) == list(range(16))
    assert api.connections <= 16  # connections are reused from round to round, not opened per request


def status_body(code: int, reason: str, message: str, **details: Any) -> bytes:
    """A `Status` as kube-apiserver sends it with an error."""
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}
    return json.dumps({**body, "message": message, **({"details": details} if details else {})}).encode()


CLAIM_STATUS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1/status"
#: What kube-apiserver v1.37 answers, by kind (shapes of k8s.io/apimachinery's NewNotFound, NewConflict, ... and its handlers).
ANSWERS: list[tuple[str, int, bytes, dict[str, str], type[ApiError]]] = [
    ("not found", 404, status_body(404, "NotFound", 'resourceclaims "c1" not found'), {}, ApiNotFound),
    ("exists", 409, status_body(409, "AlreadyExists", 'events "e" already exists'), {}, ApiAlreadyExists),
    ("conflict", 409, status_body(409, "Conflict", "the object has been modified"), {}, ApiConflict),
    ("forbidden", 403, status_body(403, "Forbidden", "cannot patch"), {}, ApiForbidden),
    (
        "terminating",
        403,
        status_body(
            403,
            "Forbidden",
            "unable to create new content in namespace ns because it is being terminated",
            causes=[{"reason": "NamespaceTerminating", "message": "namespace ns is being terminated"}],
        ),
        {},
        ApiNamespaceTerminating,
    ),
    ("throttled", 429, status_body(429, "TooManyRequests", "too many requests"), {"Retry-After": "3"}, ApiThrottled),
    (
        "unavailable",
        503,
        status_body(503, "ServiceUnavailable", "not ready", retryAfterSeconds=2),
        {},
        ApiUnavailable,
    ),
    ("internal", 500, status_body(500, "InternalError", "etcd: boom"), {}, ApiServerError),
    ("invalid", 422, status_body(422, "Invalid", "spec.x: Invalid value"), {}, ApiError),
    (
        "allocation immutable",
        422,
        status_body(
            422,
            "Invalid",
            'ResourceClaim.resource.k8s.io "c1" is invalid: status.allocation: Invalid value: null: field cannot be '
            "modified once set",
            causes=[
                {"reason": "FieldValueInvalid", "message": "field cannot be modified", "field": "status.allocation"}
            ],
        ),
        {},
        ApiAllocationImmutable,
    ),
    ("not a status", 400, b"<html>bad gateway</html>", {}, ApiError),
]


@pytest.mark.parametrize("answer", ANSWERS, ids=[a[0] for a in ANSWERS])
def test_each_answer_is_parsed_once_into_the_error_that_names_it(
    api_server: tuple[FakeApiServer, str], answer: tuple[str, int, bytes, dict[str, str], type[ApiError]]
) -> None:
    name, status, body, headers, kind = answer
    path = name.replace(" ", "-")
    api, host = api_server
    api.answers[f"/{path}"] = (status, body, headers)
    for watch in (False, True):
        rest, _ = waiting_rest(host, budget=100)  # transient answers are retried: instantly
        with pytest.raises(ApiError) as raised:
            next(rest.watch(f"/{path}", 5)) if watch else rest.get(f"/{path}")
        err = raised.value
        assert err.tries == (11 if isinstance(err, ApiTransient) else 1)
        assert type(err) is kind
        assert err.status == status and err.body == body.decode()
        decoded = json.loads(body) if body.startswith(b"{") else {}
        assert err.message == decoded.get("message", err.reason)
        assert err.status_reason == decoded.get("reason", "")
    assert isinstance(err, ApiTransient) == (status in (429, 500, 503))
    assert err.retry_after == {429: 3.0, 503: 2.0}.get(status)


def test_an_apply_naming_a_uid_of_a_replaced_or_deleted_object_is_a_uid_mismatch_and_other_failures_are_not(
    api_server: tuple[FakeApiServer, str],
) -> None:
    api, host = api_server
    gone = 'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "c1": uid mismatch: the provided object'
    api.answers[CLAIM_STATUS] = (409, status_body(409, "Conflict", gone), {})
    body = {"metadata": {"name": "c1", "namespace": "ns", "uid": "u1"}, "status": {}}
    for apply in (rest_for(host).apply, rest_for(host).apply_unread):
        with pytest.raises(ApiUidMismatch):
            apply(CLAIM_STATUS, body, "me")
    invalid = status_body(
        422,
        "Invalid",
        'ResourceClaim.resource.k8s.io "c1" is invalid: metadata.uid: Invalid value: "u1": field is immutable',
        causes=[{"reason": "FieldValueInvalid", "field": "metadata.uid", "message": "field is immutable"}],
    )
    api.answers[CLAIM_STATUS] = (422, invalid, {})
    with pytest.raises(ApiUidMismatch) as replaced:
        rest_for(host).apply_unread(CLAIM_STATUS, body, "me")  # replaced by a claim of the same name
    assert replaced.value.causes == (("FieldValueInvalid", "metadata.uid"),)
    other_field = status_body(422, "Invalid", "spec: bad", causes=[{"reason": "FieldValueInvalid", "field": "spec"}])
    api.answers[CLAIM_STATUS] = (422, other_field, {})
    with pytest.raises(ApiError) as invalid_spec:
        rest_for(host).apply(CLAIM_STATUS, body, "me")
    assert type(invalid_spec.value) is ApiError
    api.answers[CLAIM_STATUS] = (409, status_body(409, "Conflict", gone), {})
    without_uid = {"metadata": {"name": "c1", "namespace": "ns"}, "status": {}}
    with pytest.raises(ApiConflict) as plain:
        rest_for(host).apply(CLAIM_STATUS, without_uid, "me")
    assert type(plain.value) is ApiConflict
    fields = status_body(409, "Conflict", "Apply failed with 1 conflict", causes=[{"reason": "FieldManagerConflict"}])
    api.answers[CLAIM_STATUS] = (409, fields, {})
    with pytest.raises(ApiConflict) as field_conflict:
        rest_for(host).apply(CLAIM_STATUS, body, "me", force=False)
    assert type(field_conflict.value) is ApiConflict
    with pytest.raises(ApiConflict) as put:
        rest_for(host).replace(CLAIM_STATUS, body)  # a PUT's 409 may be a stale resourceVersion
    assert type(put.value) is ApiConflict


def test_retry_after_takes_the_header_first_and_ignores_what_is_no_number_of_seconds() -> None:
    throttled = status_body(429, "TooManyRequests", "slow down", retryAfterSeconds=5)
    assert api_error(429, "Too Many Requests", throttled.decode(), "1").retry_after == 1.0
    assert api_error(429, "Too Many Requests", throttled.decode()).retry_after == 5.0
    assert api_error(429, "Too Many Requests", "", "Wed, 21 Oct 2026 07:28:00 GMT").retry_after is None
    assert api_error(404, "Not Found", "", "3").retry_after is None, "only a transient answer asks for a wait"
    assert isinstance(api_error(502, "Bad Gateway"), ApiServerError)


# ----- retries under API pressure: client-go's rules (api/kube_retry.py) ---------------------------------------

CLAIM = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1"


def counted(metrics: ApiMetrics, name: str, **labels: str) -> float:
    """The sum of counter `name` (throttled, retries, gave_up) over the series with `labels`."""
    counter: Counter = getattr(metrics, name)
    return sum(
        float(s.value)
        for family in counter.collect()
        for s in family.samples
        if s.name.endswith("_total") and all(s.labels[k] == v for k, v in labels.items())
    )


def test_a_read_waits_out_429_and_503_as_asked_and_succeeds(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.objects[CLAIM] = b'{"metadata": {"name": "c1"}}'
    api.script[CLAIM] = [throttled("2"), unavailable(3), throttled("1")]
    metrics = ApiMetrics("test", CollectorRegistry())
    rest, clock = waiting_rest(host, budget=10, metrics=metrics)
    assert rest.get(CLAIM) == {"metadata": {"name": "c1"}}
    assert clock.slept == [2.0, 3.0, 1.0], "each wait the server asked, in order"
    assert api.answered("GET", CLAIM) == 4
    assert counted(metrics, "throttled", resource="resourceclaims", verb="GET") == 2
    assert counted(metrics, "retries", kind="throttled", verb="GET") == 2
    assert counted(metrics, "retries", kind="unavailable", verb="GET") == 1
    assert counted(metrics, "gave_up") == 0


def test_a_write_the_server_did_not_process_is_sent_again(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    status = CLAIM + "/status"
    calls: list[tuple[str, Callable[[KubeRest], object]]] = [
        ("PATCH", lambda rest: rest.apply_unread(status, {"metadata": {"name": "c1"}}, "me")),
        ("POST", lambda rest: rest.create(status, {})),
        ("PUT", lambda rest: rest.replace(status, {})),
    ]
    for method, call in calls:
        api.script[status] = [throttled("1"), unavailable(2)]
        rest, clock = waiting_rest(host)
        call(rest)
        assert clock.slept == [1.0, 2.0]
        assert api.answered(method, status) == 3, f"{method}: 429 and 503 say the write was not applied"


def test_a_reset_connection_is_retried_for_a_read_and_not_for_a_write(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.objects[CLAIM] = b"{}"
    api.script[CLAIM] = [RESET]
    metrics = ApiMetrics("test", CollectorRegistry())
    rest, clock = waiting_rest(host, metrics=metrics)
    assert rest.get(CLAIM) == {}
    assert clock.slept == [1.0], "after client-go's 1 s"
    assert counted(metrics, "retries", kind="connection_lost", verb="GET") == 1

    status = CLAIM + "/status"
    calls: list[tuple[str, Callable[[KubeRest], object]]] = [
        ("PATCH", lambda rest: rest.apply_unread(status, {"metadata": {"name": "c1"}}, "me")),
        ("POST", lambda rest: rest.create(status, {})),
    ]
    for method, call in calls:
        api.script[status] = [RESET]
        rest, clock = waiting_rest(host, metrics=metrics)
        with pytest.raises(ApiUnreachable) as raised:
            call(rest)
        assert not isinstance(raised.value, ApiNoConnection | ApiTimeout)
        assert str(raised.value) == (
            f"API server unreachable: the connection to {host.removeprefix('http://')} was lost before an answer: "
            "connection reset by the server"
        )
        assert clock.slept == [] and raised.value.tries == 1, f"{method}: the server may have applied it"
        with api.lock:
            assert api.log.count(("reset", method, status)) == 1
            assert ("start", method, status) == api.log[-2], "sent once, read by the server, never again"
        assert counted(metrics, "gave_up", kind="connection_lost", verb=method) == 1


def test_a_write_answered_500_or_timed_out_is_not_sent_again(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    status = CLAIM + "/status"
    internal = status_body(500, "InternalError", "etcdserver: request timed out")
    api.script[status] = [(500, internal, {"Retry-After": "1"})]
    rest, clock = waiting_rest(host)
    with pytest.raises(ApiServerError) as raised:
        rest.create(status, {})
    assert raised.value.tries == 1 and clock.slept == []
    assert str(raised.value) == "API server error (500 Internal Server Error): etcdserver: request timed out"
    api.script[CLAIM] = [(500, internal, {})]
    api.objects[CLAIM] = b"{}"
    assert rest.get(CLAIM) == {}, "a read is retried after any transient failure"

    api.hang_once.add(status)
    rest, clock = waiting_rest(host, budget=1)
    with pytest.raises(ApiTimeout) as timed_out:
        rest.create(status, {})
    assert timed_out.value.tries == 1
    with api.lock:
        assert api.log.count(("start", "POST", status)) == 2  # the 500 above, and this one: never sent again


def test_a_wait_that_does_not_fit_the_budget_is_not_waited_and_the_error_names_it(
    api_server: tuple[FakeApiServer, str],
) -> None:
    api, host = api_server
    api.script[CLAIM] = [throttled("4"), throttled("8")]
    metrics = ApiMetrics("test", CollectorRegistry())
    rest, clock = waiting_rest(host, budget=10, metrics=metrics)
    with pytest.raises(ApiThrottled) as raised:
        rest.get(CLAIM)
    assert clock.slept == [4.0], "4 s fit in 10 s; 8 s do not fit in the 6 s left"
    assert str(raised.value) == (
        "throttled by the API server (429 Too Many Requests; it asked to wait 8 s); "
        f"tried 2 times in {raised.value.seconds:.1f} s; the wait did not fit in the call's 10.0 s"
    )
    assert raised.value.retry_after == 8.0 and raised.value.status == 429
    assert counted(metrics, "throttled", resource="resourceclaims", verb="GET") == 2
    assert counted(metrics, "gave_up", kind="throttled", verb="GET") == 1


def test_at_most_ten_retries_like_client_go(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.script[CLAIM] = [throttled("0")] * 20
    rest, _ = waiting_rest(host)
    with pytest.raises(ApiThrottled) as raised:
        rest.get(CLAIM)
    assert raised.value.tries == MAX_RETRIES + 1 == api.answered("GET", CLAIM)


def test_a_refused_connection_is_retried_for_any_method_since_nothing_was_sent() -> None:
    with serve() as (_, host):
        pass
    rest, clock = waiting_rest(host, budget=30)
    with pytest.raises(ApiNoConnection) as raised:
        rest.create("/api/v1/namespaces/ns/events", {})
    assert raised.value.tries == MAX_RETRIES + 1 and clock.slept == [1.0] * MAX_RETRIES


def test_a_watch_whose_request_is_throttled_waits_and_streams(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.objects["/things"] = b'{"type":"ADDED","object":{"a":1}}\n{"type":"ERROR","object":{"code":410}}\n'
    api.script["/things"] = [throttled("2")]
    rest, clock = waiting_rest(host)
    events = rest.watch("/things", timeout_seconds=5)
    assert next(events) == {"type": "ADDED", "object": {"a": 1}}
    assert next(events)["object"] == {"code": 410}, "410 reaches the caller, which lists again (the reflector's rule)"
    assert clock.slept == [2.0]
    events.close()


def test_no_retry_once_the_gate_closes(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    status = CLAIM + "/status"
    api.script[status] = [throttled("1")]
    leading = [True]
    rest, clock = waiting_rest(host, resend_if=lambda: leading[0])
    clock.during_sleep = lambda: leading.__setitem__(0, False)  # the Lease runs out during the wait
    with pytest.raises(ApiThrottled):
        rest.apply_unread(status, {"metadata": {"name": "c1"}}, "me")
    assert api.answered("PATCH", status) == 1, "not sent again by a replica that no longer leads"


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1/status", "resourceclaims"),
        ("/apis/resource.k8s.io/v1/resourceslices", "resourceslices"),
        ("/apis/gpu.fracgpu.dev/v1alpha1/gpus/g/status", "gpus"),
        ("/api/v1/namespaces/ns/events", "events"),
        ("/api/v1/nodes/n1", "nodes"),
        ("/api/v1/namespaces/ns", "namespaces"),
        ("/version", ""),
    ],
)
def test_metrics_name_the_resource_of_a_path(path: str, resource: str) -> None:
    assert resource_of(path) == resource
