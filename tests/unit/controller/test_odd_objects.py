"""Issue #9: no object the API server stores makes the controller's pure functions raise anything but their
documented error. Arbitrary JSON-like values (hypothesis), odd numbers and strings, and claims as deep as
the API server stores them (decoded by api.bounded_json, as kopf_json decodes them)."""

import asyncio
import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import bounded_json
from api.gpu_config import MAX_PARAMETERS_DEPTH, GpuConfigError, decode_gpu_config
from api.kube_errors import ApiError, api_error
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.admission.verdict import review_claim_spec
from controller.core.claims import claim_view
from controller.core.parsing import MalformedObjectError
from controller.core.settings import Settings
from controller.core.slices import slice_view
from controller.loops import Controller
from controller.status.events import REASON_SKIPPED_PARTS
from tests.unit.controller_factories import FakeWriter, World, claim, memory_request, result, slices

HEAD = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig"}
ODD_NUMBERS = st.sampled_from([10**400, -(10**30), 2**63, 1e308, -0.0, float("inf"), 1e-320, 0, -1, 101, 1.0])
ODD_STRINGS = st.sampled_from(["\ud800", "\udfff\ud800", "\x00", "x" * 20000, "", "é", "[{", "GpuConfig"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | ODD_NUMBERS | ODD_STRINGS
KEYS = st.sampled_from(
    [
        *("metadata", "spec", "status", "devices", "requests", "config", "opaque", "driver", "parameters"),
        *("exactly", "firstAvailable", "deviceClassName", "capacity", "memory", "name", "allocation", "results"),
        *("pool", "device", "shareID", "consumedCapacity", "adminAccess", "nodeSelector", "data", "apiVersion"),
        *("kind", "env", "enforcement", "computeLimitPercent", "generation", "nodeName", "attributes", "A"),
    ]
) | st.text(max_size=4)
VALUES = st.recursive(
    SCALARS
    | st.sampled_from([DRIVER_NAME, DEVICE_CLASS_NAME, "10Gi", "fracgpu.dev/v1alpha1", "hami-core"])
    | st.just(bounded_json.Skipped("<skipped>")),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=30,
)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@FUZZ
@given(VALUES)
def test_views_raise_only_malformed_object(body: Any) -> None:
    for view in (lambda: claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME), lambda: slice_view(body, DRIVER_NAME)):
        with contextlib.suppress(MalformedObjectError):
            view()


@FUZZ
@given(VALUES)
def test_views_of_claim_shaped_bodies_with_odd_parts_raise_only_malformed_object(part: Any) -> None:
    body = claim(results=[result("gpu", "gpu-0", "10Gi", "s-1")], requests=[memory_request("gpu", "10Gi")])
    for where in ("spec.devices", "status.allocation.devices", "status"):
        *parents, last = where.split(".")
        copy = json.loads(json.dumps(body))
        node = copy
        for p in parents:
            node = node[p]
        node[last] = part
        with contextlib.suppress(MalformedObjectError):
            claim_view(copy, DRIVER_NAME, DEVICE_CLASS_NAME)


@FUZZ
@given(VALUES, VALUES)
def test_admission_review_never_raises(spec: Any, parameters: Any) -> None:
    for s in (
        spec,
        {
            "devices": {
                "requests": [memory_request("gpu", "10Gi")],
                "config": [{"opaque": {"driver": DRIVER_NAME, "parameters": parameters}}],
            }
        },
    ):
        review = review_claim_spec(s, "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=None)
        assert isinstance(review.message, str)
        json.dumps(review.message)  # the webhook can send it


@FUZZ
@given(VALUES)
def test_decode_gpu_config_raises_only_gpu_config_error(parameters: Any) -> None:
    for raw in (parameters, {**HEAD, "env": parameters}, {**HEAD, "computeLimitPercent": parameters}):
        try:
            decode_gpu_config(raw)
        except GpuConfigError as err:
            assert err.problems and all(isinstance(p, str) and len(p) < 2000 for p in err.problems)
            json.dumps(str(err))


def test_deep_and_odd_gpu_configs_are_refused_naming_field_and_limit() -> None:
    cases: list[tuple[Any, str]] = [
        ({**HEAD, "env": {"A": _deep(5000)}}, f"parameters: nested deeper than {MAX_PARAMETERS_DEPTH} levels"),
        ('{"a":' + "[" * 5000 + "]" * 5000 + "}", "parameters: nested deeper than 16 levels (at a[0][0][0][0][0]..."),
        ('{"a":' * 1600 + "1" + "}" * 1600, f"nested deeper than {MAX_PARAMETERS_DEPTH} levels (at a.a.a.a.a.a..."),
        ("x" * 20000, "parameters: 20000 bytes of JSON, at most 10240 are allowed"),
        ({**HEAD, "env": {"A": "x" * 20000}}, "bytes of JSON, at most 10240 are allowed"),
        ({**HEAD, "computeLimitPercent": 10**5000}, "parameters.computeLimitPercent: integer with more than 4300"),
        (
            {**HEAD, "computeLimitPercent": 10**400},
            "computeLimitPercent: must be an integer between 1 and 100, got 1000",
        ),
        ({**HEAD, "computeLimitPercent": 1e308}, "must be an integer between 1 and 100, got 1e+308"),
        ({**HEAD, "computeLimitPercent": -0.0}, "must be an integer between 1 and 100, got -0.0"),
        (
            {**HEAD, "env": {"A": "\ud800"}},
            'parameters.env.A: not valid Unicode (lone surrogate "\\ud800" at character 0)',
        ),
        ({**HEAD, "env": {"\ud800": "x"}}, "parameters.env: field name"),
        ({**HEAD, "env": {"A": "\x00"}}, "must not contain a NUL character"),
        ({**HEAD, **{f"k{i}": 1 for i in range(100)}}, "parameters: 80 more problems not listed"),
        ({**HEAD, "y" * 5000: 1}, '"yyyyyyyyyyyyyy'),
        ({**HEAD, "env": bounded_json.Skipped("<x>")}, "parameters: nested deeper than"),
    ]
    for raw, expected in cases:
        try:
            decode_gpu_config(raw)
        except GpuConfigError as err:
            assert expected in str(err), (expected, str(err)[:300])
            assert len(str(err)) < 5000
        else:
            raise AssertionError(f"accepted {str(raw)[:80]}")


def test_admission_refuses_a_deep_gpu_config_with_its_path() -> None:
    spec = {
        "devices": {
            "requests": [memory_request("gpu", "10Gi")],
            "config": [{"opaque": {"driver": DRIVER_NAME, "parameters": {**HEAD, "env": _deep(5000)}}}],
        }
    }
    review = review_claim_spec(spec, "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=None)
    assert not review.allowed
    assert review.message.startswith(
        f"spec.devices.config[0].opaque.parameters: nested deeper than {MAX_PARAMETERS_DEPTH} levels (at env[0][0]"
    ), review.message
    odd = review_claim_spec(
        {"devices": [1]}, "spec.spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=None
    )
    assert odd.message == "spec.spec: not a readable ResourceClaimSpec (AttributeError)"


def _deep_claim_text() -> str:
    body = claim(results=[result("gpu", "gpu-0", "10Gi", "s-1")], requests=[memory_request("gpu", "10Gi")])
    body["spec"]["devices"]["config"] = [{"opaque": {"driver": DRIVER_NAME, "parameters": "DEEP"}}]
    return json.dumps(body).replace('"DEEP"', '{"a":' + "[" * 5000 + "]" * 5000 + "}")


def test_a_claim_as_deep_as_the_api_server_stores_is_read_and_its_skipped_part_named() -> None:
    body = bounded_json.loads(_deep_claim_text())
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None and view.shares and view.shares[0].memory == 10 << 30
    assert view.skipped == (
        "spec.devices.config[0].opaque.parameters.a[0]... (92 more levels): "
        "array or object nested deeper than 100 levels, not decoded",
    )
    other = json.loads(json.dumps(body).replace(DRIVER_NAME, "other.example.com").replace(DEVICE_CLASS_NAME, "other"))
    assert claim_view(other, DRIVER_NAME, DEVICE_CLASS_NAME) is None
    assert (
        slice_view(bounded_json.loads('{"spec":{"driver":"x","devices":' + "[" * 5000 + "]" * 5000 + "}}"), DRIVER_NAME)
        is None
    )
    assert slice_view(slices()[0], DRIVER_NAME) is not None


def test_the_reconciler_writes_status_and_posts_one_event_for_a_claim_with_skipped_parts() -> None:
    async def main() -> None:
        writer = FakeWriter()
        world = World()
        controller = Controller(Settings(ledger_delay_seconds=0.0), writer)
        controller.bind(world.slices, world.claims, world.gpus)
        key = world.put(bounded_json.loads(_deep_claim_text()))
        for _ in range(2):
            await controller.status.reconcile(key)
        assert writer.claims[0][2]["status"]["devices"][0]["device"] == "gpu-0", "status written as for any claim"
        [(name, reason, message)] = writer.events
        assert (name, reason) == ("c1", REASON_SKIPPED_PARTS)
        assert "spec.devices.config[0].opaque.parameters.a[0]... (92 more levels)" in message
        assert "nested deeper than 100 levels" in message
        # a claim whose status the API server refuses to apply still gets its Event
        body = bounded_json.loads(_deep_claim_text().replace('"c1"', '"c2"').replace("uid-c1", "uid-c2"))
        refused = world.put(body)
        writer.fail = [api_error(422, "Invalid")]
        with pytest.raises(ApiError):
            await controller.status.reconcile(refused)
        assert [(n, r) for n, r, _ in writer.events] == [("c1", REASON_SKIPPED_PARTS), ("c2", REASON_SKIPPED_PARTS)]
        await controller.stop()

    asyncio.run(main())
