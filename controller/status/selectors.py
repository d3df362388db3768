"""DRA CEL selectors evaluated against our published devices (pure; CEL's C++ runtime via cel-expr-python).

A device is seen as the scheduler sees it: `device.driver`, `device.attributes[<domain>].<name>` (bool, int
and string attributes; unqualified names are in the driver's domain) and
`device.capacity[<driver>].memory`. Besides standard CEL and its strings extension, these Kubernetes
functions are provided: `quantity(string)`, `isQuantity(string)`, and on quantities `compareTo`,
`isGreaterThan`, `isLessThan`, `asInteger`, `sign` (a quantity is its whole number of bytes here).

Not evaluated (the outcome is `NotEvaluated`, never a guess): `version` attributes and `semver()`, the other
Kubernetes CEL libraries (lists, regex, url, ip, cidr, format, `quantity()` of a fractional amount), and any
expression that does not compile or yields a runtime error or a non-boolean value.
"""

import functools
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

from api.names import MEMORY_CAPACITY
from api.quantity import parse_quantity
from controller.core.slices import DeviceRecord


@dataclass(frozen=True)
class NotEvaluated:
    """A selector whose outcome on some device is unknown, and why."""

    expression: str
    reason: str


def _quantity(text: str) -> int:
    try:
        value: Decimal = parse_quantity(text)
    except (ValueError, TypeError, InvalidOperation):
        raise ValueError(f"quantity: invalid quantity {text!r}") from None
    if value != value.to_integral_value():
        raise ValueError(f"quantity: {text!r} is not a whole number (not evaluated here)")
    return int(value)


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except (ValueError, TypeError, InvalidOperation):
        return False
    return True


def _member(name: str, result: Any, impl: Any, *params: Any) -> Any:
    overload = cel.Overload(
        f"fracgpu_{name}_{len(params)}", return_type=result, parameters=list(params), is_member=True, impl=impl
    )
    return cel.FunctionDecl(name, [overload])


@functools.cache
def _env() -> Any:
    i, b, s = cel.Type.INT, cel.Type.BOOL, cel.Type.STRING
    functions = [
        cel.FunctionDecl("quantity", [cel.Overload("fracgpu_quantity", return_type=i, parameters=[s], impl=_quantity)]),
        cel.FunctionDecl(
            "isQuantity", [cel.Overload("fracgpu_is_quantity", return_type=b, parameters=[s], impl=_is_quantity)]
        ),
        _member("compareTo", i, lambda a, c: (a > c) - (a < c), i, i),
        _member("isGreaterThan", b, lambda a, c: a > c, i, i),
        _member("isLessThan", b, lambda a, c: a < c, i, i),
        _member("asInteger", i, lambda a: a, i),
        _member("sign", i, lambda a: (a > 0) - (a < 0), i),
    ]
    return cel.NewEnv(variables={"device": cel.Type.DYN}, extensions=[ext_strings.ExtStrings()], functions=functions)


@functools.lru_cache(maxsize=512)
def _compile(expression: str) -> Any:
    """The compiled expression, or the compiler's message as a string."""
    try:
        return _env().compile(expression)
    except RuntimeError as err:
        return str(err).splitlines()[0].removeprefix("INVALID_ARGUMENT: ")


def device_input(device: DeviceRecord, driver: str) -> dict[str, Any]:
    """The `device` variable of a selector for one of our devices."""
    return {
        "driver": driver,
        "attributes": device.attributes,
        "capacity": {driver: {MEMORY_CAPACITY: device.memory_total}},
        "allowMultipleAllocations": device.allow_multiple,
    }


def evaluate(expression: str, device: DeviceRecord, driver: str) -> bool | NotEvaluated:
    """Whether `device` passes the selector `expression`; NotEvaluated when that cannot be known here."""
    compiled = _compile(expression)
    if isinstance(compiled, str):
        return NotEvaluated(expression, compiled)
    try:
        value = compiled.eval(data={"device": device_input(device, driver)})
    except RuntimeError as err:
        return NotEvaluated(expression, str(err))
    if value.type() != cel.Type.BOOL:
        detail = value.value() if value.type() == cel.Type.ERROR else f"{value.type().name()} result"
        return NotEvaluated(expression, str(detail))
    return bool(value.value())
