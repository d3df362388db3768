"""Unit tests of api/bounded_json.py: json.loads semantics, with a depth bound and no recursion."""

import copy
import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api import bounded_json
from api.bounded_json import REASON_DEEP, REASON_NUMBER, Skipped, decode, loads, nesting_depth, skipped_parts

# strings with the characters that could confuse a bracket scan: brackets, quotes, backslashes, escapes
TEXT = st.text(alphabet=st.sampled_from(list('[]{}"\\/,:ab \n\t\x00\u00e9\U0001f600')), max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=40
)


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


def reference_prune(value: Any, max_depth: int, depth: int = 0) -> Any:
    """What `loads` must return: containers below `max_depth` levels replaced by a marker."""
    if isinstance(value, dict | list) and depth == max_depth:
        return "MARKER"
    if isinstance(value, dict):
        return {k: reference_prune(v, max_depth, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [reference_prune(v, max_depth, depth + 1) for v in value]
    return value


def markers_as_text(value: Any) -> Any:
    if isinstance(value, Skipped):
        return "MARKER"
    if isinstance(value, dict):
        return {k: markers_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [markers_as_text(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(JSON, st.sampled_from([None, 2]))
def test_decodes_like_json_loads_and_measures_depth_exactly(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    assert nesting_depth(text) == reference_depth(value)
    assert decode(text) == (json.loads(text), 0)


@settings(max_examples=300, deadline=None)
@given(JSON, st.integers(min_value=0, max_value=3))
def test_replaces_exactly_the_subtrees_below_the_bound(value: Any, max_depth: int) -> None:
    text = json.dumps(value)
    decoded, count = decode(text, max_depth)
    assert markers_as_text(decoded) == reference_prune(json.loads(text), max_depth)
    parts = list(skipped_parts(decoded))
    assert count == len(parts)
    assert all(marker.reason == REASON_DEEP for _, marker in parts)


def test_documents_as_deep_as_the_api_server_stores_keep_everything_but_the_deep_part() -> None:
    # 10 KiB of parameters: 5000 levels of arrays (what the API server stores in a claim)
    deep = "[" * 5000 + "]" * 5000
    text = '{"metadata":{"name":"c","uid":"u"},"spec":{"config":[{"parameters":{"a":' + deep + ',"b":[1]}}]}}'
    with pytest.raises(RecursionError):
        json.loads(text)
    value = loads(text)
    assert value["metadata"] == {"name": "c", "uid": "u"}
    assert value["spec"]["config"][0]["parameters"]["b"] == [1]
    [(path, marker)] = skipped_parts(value)
    assert path.startswith("spec.config[0].parameters.a[0][0]")
    assert marker.reason == REASON_DEEP and "deeper than 100 levels" in marker
    assert copy.deepcopy(value) == value, "the decoded value is shallow enough for recursive code"
    objects = '{"a":' * 3000 + "null" + "}" * 3000
    assert bounded_json.short_path(next(skipped_parts(loads(objects)))[0]) == "a.a.a.a.a.a.a.a... (92 more levels)"


def test_integers_too_long_to_convert_become_markers() -> None:
    text = '{"big":' + "9" * 5000 + ',"small":10000000000000000000000000,"f":1e308,"neg":-0.0}'
    with pytest.raises(ValueError, match="4300 digits"):
        json.loads(text)
    value, count = decode(text)
    assert count == 1 and value["big"].reason == REASON_NUMBER and "5000 digits" in value["big"]
    assert value["small"] == 10**25 and value["f"] == 1e308 and str(value["neg"]) == "-0.0"


def test_odd_strings_are_kept_as_json_loads_keeps_them() -> None:
    text = '{"s":"\\ud800","n":"\\u0000","q":"[\\"{"}'
    assert loads(text) == json.loads(text) == {"s": "\ud800", "n": "\x00", "q": '["{'}


def test_markers_survive_copies_and_serialise() -> None:
    marker = Skipped("<x>", REASON_NUMBER)
    for copied in (copy.copy(marker), copy.deepcopy(marker), pickle.loads(pickle.dumps(marker))):
        assert isinstance(copied, Skipped) and copied == "<x>" and copied.reason == REASON_NUMBER
    assert json.dumps({"a": marker}) == '{"a": "<x>"}'


@pytest.mark.parametrize("text", ['{"a":[1,2}', "[" * 5000, '{"a":' + "[" * 200 + "]" * 199 + "}", '"abc', ""])
def test_invalid_json_raises_json_decode_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads(text)


def test_bytes_are_utf8() -> None:
    assert loads('{"a":"é"}'.encode()) == {"a": "é"}
    with pytest.raises(UnicodeDecodeError):
        loads(b'{"a":"\xff"}')


def test_a_claim_of_the_largest_size_the_api_server_stores_decodes_like_json_loads() -> None:
    # 250 KiB of annotations (the API server's limit is 256 KiB) and 32 configs of 10 KiB parameters
    configs = [{"opaque": {"driver": "x", "parameters": {"s": "y\\" * 2500 + '"[{'}}} for _ in range(32)]
    body = {"metadata": {"annotations": {"a": "z" * 250_000}}, "spec": {"devices": {"config": configs}}}
    text = json.dumps(body)
    assert len(text) > 480_000
    assert decode(text) == (body, 0)
