"""A new claim's opaque parameters rewritten as the API server encodes them (controller/admission/canonical.py).

The expected encodings are what kube-apiserver v1.37 writes: each was checked against a real one (a claim created
with its parameters spaced and unsorted, rewritten by a webhook with these bytes, allocated by the real scheduler,
then its status applied), tests/integration/test_canonical_parameters.py checks the common cases again."""

import base64
import json
from typing import Any

import pytest

from api import bounded_json
from api.names import DRIVER_NAME
from controller.admission.canonical import (
    NotCanonicalError,
    canonical_json,
    canonical_review,
    parameters_patch,
)

GO_ENCODED: list[tuple[str, str]] = [
    # (JSON as a client sent it, as the API server writes it)
    ('{"kind": "GpuConfig", "apiVersion": "v1", "z": {"b": 1, "a": [true, null]}}',
     '{"apiVersion":"v1","kind":"GpuConfig","z":{"a":[true,null],"b":1}}'),
    ('"<\\u00e9>&"', '"\\u003cé\\u003e\\u0026"'),  # HTML characters escaped, the rest of Unicode as it is
    ('"\\u2028\\u2029"', '"\\u2028\\u2029"'),
    ('"\\b\\f\\n\\r\\t\\u0001\\u007f\\"\\\\"', '"\\b\\f\\n\\r\\t\\u0001\x7f\\"\\\\"'),
    ("1.0", "1"),
    ("1e3", "1000"),
    ("0.5", "0.5"),
    ("1e-7", "1e-7"),
    ("1.5e-5", "0.000015"),
    ("1e16", "10000000000000000"),
    ("1e20", "100000000000000000000"),
    ("1e21", "1e+21"),
    ("1.7976931348623157e308", "1.7976931348623157e+308"),
    ("-1.5e-7", "-1.5e-7"),
    ("-0.0", "0"),  # the sign of a float zero does not survive the API server's decoding
    ("123456789012345678", "123456789012345678"),
    ("{}", "{}"),
    ("[]", "[]"),
]  # fmt: skip


@pytest.mark.parametrize(("sent", "written"), GO_ENCODED)
def test_values_are_written_as_the_api_server_writes_them(sent: str, written: str) -> None:
    assert canonical_json(json.loads(sent)) == written


def test_a_skipped_part_a_number_that_is_not_finite_or_a_value_the_api_server_would_change_is_not_written() -> None:
    deep = bounded_json.loads('{"a": ' + "[" * 200 + "]" * 200 + "}")
    lone_surrogate = json.loads('"\\ud800"')  # Go decodes it as U+FFFD
    past_int64 = 99999999999999999999  # Go decodes it as a float64: 100000000000000000000
    for value in (deep, {"x": float("nan")}, [float("inf")], {1, 2}, {"s": lone_surrogate}, [past_int64]):
        with pytest.raises(NotCanonicalError):
            canonical_json(value)


def spec(*configs: Any) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c"}}], "config": list(configs)}}


def opaque(driver: str, parameters: Any) -> dict[str, Any]:
    return {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}


def test_each_opaque_config_of_the_driver_is_replaced_and_nothing_else() -> None:
    ours = {"kind": "GpuConfig", "apiVersion": "fracgpu.dev/v1alpha1", "enforcement": "nvml"}
    theirs = {"z": 1, "a": 2}
    claim = spec(
        opaque("other.example.com", theirs),
        opaque(DRIVER_NAME, ours),
        {"requests": ["gpu"]},
        opaque(DRIVER_NAME, {"x": float("nan")}),  # cannot be written as the API server would: left alone
        opaque(DRIVER_NAME, {"b": "<&>", "a": 1.0}),
    )
    patch = parameters_patch(claim, DRIVER_NAME)
    assert patch is not None
    ops = json.loads(patch)
    assert [op["path"] for op in ops] == [
        "/spec/devices/config/1/opaque/parameters",
        "/spec/devices/config/4/opaque/parameters",
    ]
    assert all(op["op"] == "replace" for op in ops)
    assert [op["value"] for op in ops] == [ours, {"a": 1, "b": "<&>"}], "the same values"
    assert canonical_json(ours) in patch and '{"a":1,"b":"\\u003c\\u0026\\u003e"}' in patch, "in canonical bytes"
    assert parameters_patch(spec(opaque("other.example.com", theirs)), DRIVER_NAME) is None
    for odd in (None, {}, {"devices": None}, {"devices": {"config": "x"}}, spec("x", {"opaque": []})):
        assert parameters_patch(odd, DRIVER_NAME) is None


def review(obj: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-1", "object": obj}}


def test_the_review_is_always_allowed_with_the_patch_when_there_is_one() -> None:
    claim = {"metadata": {"name": "c"}, "spec": spec(opaque(DRIVER_NAME, {"b": 1, "a": 2}))}
    answer = canonical_review(review(claim), DRIVER_NAME)
    response = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert response["uid"] == "u-1" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert base64.b64decode(response["patch"]).decode() == parameters_patch(claim["spec"], DRIVER_NAME)
    plain = canonical_review(review({"spec": spec()}), DRIVER_NAME)["response"]
    assert plain == {"uid": "u-1", "allowed": True}
    bad: Any
    for bad in (None, [], {"request": None}, {"request": {"object": {}}}):
        with pytest.raises(ValueError):
            canonical_review(bad, DRIVER_NAME)
