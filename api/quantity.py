"""Kubernetes resource quantities as integers of bytes.

`parse_quantity` accepts exactly what `kubernetes.utils.parse_quantity` accepts, with the same value (a
property test compares the two), without importing the kubernetes package: a number as Python's `Decimal`
reads it, optionally followed by a decimal SI suffix (`n u m k K M G T P E`) or a binary one (`Ki Mi Gi Ti
Pi Ei`).
"""

from decimal import Decimal, DecimalException

MiB = 1 << 20
GiB = 1 << 30

_EXPONENTS = {"n": -3, "u": -2, "m": -1, "K": 1, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_BINARY_PREFIXES = "KMGTPE"  # Ki … Ei; "ki", "mi", "ni", "ui" are not suffixes


def parse_quantity(quantity: object) -> Decimal:
    """The value of a quantity such as `10Gi`, `1.5G`, `500m` or `1e3` (a number as it is; anything else as
    its `str`); ValueError on anything else."""
    if isinstance(quantity, int | float | Decimal):
        return Decimal(quantity)
    text = str(quantity)
    number, suffix = text, ""
    if len(text) >= 2 and text[-1] == "i":
        if text[-2] in _EXPONENTS:
            number, suffix = text[:-2], text[-2:]
    elif text and text[-1] in _EXPONENTS:
        number, suffix = text[:-1], text[-1]
    try:
        value = Decimal(number)
    except DecimalException:
        raise ValueError(f"Invalid number format: {number}") from None
    if not suffix:
        return value
    if suffix.endswith("i") and suffix[0] not in _BINARY_PREFIXES:
        raise ValueError(f"{text} has unknown suffix")
    base = 1024 if suffix.endswith("i") else 1000
    try:
        return value * (base ** Decimal(_EXPONENTS[suffix[0]]))
    except DecimalException as err:
        raise ValueError(f"Invalid quantity: {text}") from err


def to_bytes(quantity: str | int) -> int:
    """Parse a quantity such as `10Gi`, `512Mi` or `1073741824` (a fraction of a byte rounds up); ValueError
    names the bad input, also for the numbers that are no amount of bytes (`NaN`, `Infinity`)."""
    try:
        value = parse_quantity(quantity)
    except ValueError as err:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (examples: 10Gi, 512Mi, 1073741824)") from err
    if not value.is_finite():
        raise ValueError(f"{quantity!r} is not an amount of bytes (examples: 10Gi, 512Mi, 1073741824)")
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def format_bytes(value: int) -> str:
    """The shortest exact binary-suffixed quantity for `value` bytes (`80Gi`, `81408Mi`, `1000`)."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", GiB), ("Mi", MiB), ("Ki", 1 << 10)):
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def granted_in_range(request: int, minimum: int, step: int) -> int:
    """The amount a consumable capacity's `requestPolicy.validRange {min, step}` grants for `request`, as the
    scheduler computes the allocation's `consumedCapacity`: `min` for a request below it, else the request rounded
    up to `min` plus a whole number of steps (a `max` it exceeds makes the device ineligible instead)."""
    if request <= minimum:
        return minimum
    return minimum + -(-(request - minimum) // step) * step
