"""Kubernetes resource quantities as integers of bytes."""

from decimal import Decimal

from kubernetes.utils import parse_quantity

MiB = 1 << 20
GiB = 1 << 30


def to_bytes(quantity: str | int) -> int:
    """Parse a quantity such as `10Gi`, `512Mi` or `1073741824`; ValueError names the bad input."""
    try:
        value: Decimal = parse_quantity(quantity)
    except ValueError as err:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (examples: 10Gi, 512Mi, 1073741824)") from err
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def format_bytes(value: int) -> str:
    """The shortest exact binary-suffixed quantity for `value` bytes (`80Gi`, `81408Mi`, `1000`)."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", GiB), ("Mi", MiB), ("Ki", 1 << 10)):
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
