"""Quantity parsing (api/quantity.py) accepts exactly what the kubernetes package's `parse_quantity` accepts,
with the same value, without importing that package."""

from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as upstream

from api.quantity import MiB, granted_in_range, parse_quantity, to_bytes

#: Numbers as Decimal reads them (signs, exponents, points, underscores, NaN/Infinity, spaces) and suffixes.
PIECES = ["0", "1", "5", "9", "12", ".", "e", "E", "+", "-", "_", " ", "i", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
PIECES += ["n", "u", "m", "k", "K", "M", "G", "T", "P", "E", "ki", "mi", "NaN", "Infinity", "inf", "x"]


def outcome(parse: object, text: object) -> tuple[str, str]:
    try:
        value = parse(text)  # type: ignore[operator]
    except ValueError as err:
        return ("ValueError", str(err))
    assert isinstance(value, Decimal)
    return ("value", repr(value))


@given(st.lists(st.sampled_from(PIECES), max_size=6).map("".join) | st.text(max_size=12))
@example("1.5Gi")
@example("100m")
@example("1e3")
@example("1Ei")
@example("1E")
@example("5ki")
@example("9" * 30 + "Ei")
@example("")
def test_the_same_grammar_and_values_as_the_kubernetes_package(text: str) -> None:
    assert outcome(parse_quantity, text) == outcome(upstream, text)


@given(st.integers() | st.floats(allow_nan=False) | st.decimals(allow_nan=False, allow_infinity=False))
def test_numbers_are_taken_as_they_are(number: int | float | Decimal) -> None:
    assert parse_quantity(number) == upstream(number)


def test_to_bytes_rounds_up_and_names_bad_input() -> None:
    assert to_bytes("10Gi") == 10 << 30
    assert to_bytes("1500m") == 2
    assert to_bytes(512) == 512
    for bad in ("10GB", "ten", "NaN", "Infinity", "-Infinity"):
        with pytest.raises(ValueError, match=f"{bad!r} is not"):
            to_bytes(bad)


@pytest.mark.parametrize(
    ("request_bytes", "grant"),
    [(3_000_000_000, 3072 * MiB), (3072 * MiB, 3072 * MiB), (MiB, 256 * MiB), (256 * MiB + 1, 512 * MiB)],
)
def test_a_valid_range_grants_min_or_the_request_rounded_up_by_steps(request_bytes: int, grant: int) -> None:
    assert granted_in_range(request_bytes, 256 * MiB, 256 * MiB) == grant


def test_a_valid_range_counts_its_steps_from_min() -> None:
    assert granted_in_range(1500 * MiB, 1000 * MiB, 300 * MiB) == 1600 * MiB
