"""What the controller's parsers of API objects share (`controller.core.slices`, `controller.core.claims`).

`shape_errors` makes a parser total on bodies the API server never serves: any error of reading one becomes
`MalformedObjectError`, the parser's only error, and the caller skips the object. `quantity_bytes` reads a
Kubernetes quantity as whole bytes, or None when it is not one; it never raises.
"""

import functools
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import ParamSpec, TypeVar

from api.quantity import parse_quantity

P = ParamSpec("P")
R = TypeVar("R")


class MalformedObjectError(ValueError):
    """A body that does not have the shape of its kind (the API server never serves one): nothing is read."""


def shape_errors(kind: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Turn any error of a view function on an odd body into `MalformedObjectError` (its only error)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def view(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except (AttributeError, KeyError, TypeError, IndexError, ValueError) as err:
                raise MalformedObjectError(f"not a readable {kind}: {type(err).__name__}: {str(err)[:300]}") from err

        return view

    return wrap


def quantity_bytes(value: object) -> int | None:
    """A Kubernetes quantity as whole bytes (rounded up), or None when it is not a quantity."""
    try:
        parsed: Decimal = parse_quantity(value)
    except (ValueError, TypeError, InvalidOperation):
        return None
    return int(parsed.to_integral_value(rounding="ROUND_CEILING"))
