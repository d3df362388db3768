"""Plain-JSON API access (api/kube_rest.py): only documented errors, whatever the API server sends or
does not send; against a fake API server on 127.0.0.1 (tests/unit/fake_apiserver.py)."""

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from api.kube_errors import (
    ApiAlreadyExists,
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiNamespaceTerminating,
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
from api.kube_rest import KubeRest, decode_json
from tests.unit.fake_apiserver import FakeApiServer, connection, serve

#: As deep as kube-apiserver stores opaque parameters: 10 KiB of `[` and `]` inside `{"a": …}`.
DEEP = b'{"a":' + b"[" * 5117 + b"]" * 5117 + b"}"


@pytest.fixture
def api_server() -> Iterator[tuple[FakeApiServer, str]]:
    with serve() as running:
        yield running


def rest_for(host: str, budget: float = 10) -> KubeRest:
    return KubeRest.bounded(connection(host), budget=budget)


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
    with pytest.raises(ApiTimeout, match=r"did not answer \(waited 0.5 s per attempt\)") as raised:
        rest_for(host, budget=1).get("/x")
    assert raised.value.status == 0
    with api.lock:  # two attempts of 0.5 s, no more
        assert sum(1 for e in api.log if e == ("start", "GET", "/x")) == 2


def test_a_refused_connection_is_unreachable_not_a_timeout() -> None:
    with serve() as (_, host):
        pass  # stopped: nothing listens on its port any more
    with pytest.raises(ApiUnreachable, match="cannot reach the API server") as raised:
        rest_for(host).get("/x")
    assert not isinstance(raised.value, ApiTimeout)


def test_an_http_error_is_an_api_error_with_status_reason_and_body(api_server: tuple[FakeApiServer, str]) -> None:
    _, host = api_server
    with pytest.raises(ApiError) as raised:
        rest_for(host).get("/absent")
    err = raised.value
    assert not isinstance(err, ApiUnreachable)
    assert (err.status, err.reason) == (404, "Not Found")
    assert json.loads(err.body)["reason"] == "NotFound"
    assert str(err).startswith("404 Not Found: {")
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
    plain, bounded = KubeRest(shared, attempts=1), KubeRest.bounded(shared, budget=10)
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
        with pytest.raises(ApiError) as raised:
            next(rest_for(host).watch(f"/{path}", 5)) if watch else rest_for(host).get(f"/{path}")
        err = raised.value
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
