"""GPU compute as a capacity (pure): the ``compute`` capacity every shared GPU publishes beside ``memory``, in
percent of the GPU, and how a share's reserved compute and a GpuConfig's ``computeLimitPercent`` make its ceiling.

A shared GPU offers ``compute`` 100 with ``requestPolicy`` ``{default: 0, validRange: {min: 0, max: 100, step:
1}}``: a request that names no compute (a memory share, a whole GPU, an admin-access monitor) consumes none, so
claims of memory alone are placed as before; one that asks ``compute: 50`` reserves 50 of the GPU's 100, and the
scheduler places no more than 100 of them on a GPU. Step 1: the tiers that enforce it take whole percentages (the
MPS active thread percentage, HAMi-core's ``CUDA_DEVICE_SM_LIMIT``). A MIG partition publishes its compute slices'
share of its GPU, rounded down (``partition_percent``), without a policy: it is allocated whole, so a request's
``compute`` only selects partitions with at least that much.

The ceiling of a share (``ceiling``) is what the tier enforces: the reserved compute, or ``computeLimitPercent``
when the GpuConfig sets one no larger; a ``computeLimitPercent`` larger than the reservation is cut to it (the
reservation is what the scheduler counted, and a larger ceiling would let the GPU's shares exceed 100 together).

May import: ``api.names``, ``api.quantity``.
"""

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, Final

from api.names import COMPUTE_CAPACITY
from api.quantity import parse_quantity

TOTAL: Final = 100
"""A GPU's compute: 100 percent."""
HAMI_NAMES: Final = frozenset({"cores", "gpucores"})
"""HAMi's names for the same share of a GPU (its DRA driver's capacity ``cores``, its device plugin's resource
``gpucores``): not an alias here (a scheduler that reads them would find no such capacity on any device), refused
at admission naming ``compute``."""


def gpu_capacity() -> dict[str, object]:
    """The ``compute`` capacity of a shared GPU's device: 100, consumed only when asked for (default 0)."""
    return {
        "value": str(TOTAL),
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": str(TOTAL), "step": "1"}},
    }


def partition_percent(compute_slices: int, total_slices: int) -> int:
    """A MIG partition's ``compute``: its share of its GPU's compute slices in percent, rounded down (a floor:
    a request of that much never gets less); 0 for a GPU of no slices."""
    return compute_slices * TOTAL // total_slices if total_slices > 0 else 0


def consumed_percent(consumed: Mapping[str, Any] | None) -> int:
    """The compute an allocation result's ``consumedCapacity`` map reserves, in whole percent (rounded up, as the
    scheduler's step 1 grants it); 0 when it names none or not a quantity."""
    value = (consumed or {}).get(COMPUTE_CAPACITY)
    if value is None:
        return 0
    try:
        parsed: Decimal = parse_quantity(value)
    except (ValueError, TypeError, InvalidOperation):
        return 0
    return max(0, int(parsed.to_integral_value(rounding=ROUND_CEILING)))


def ceiling(reserved: int, limit: int | None) -> int | None:
    """A share's compute ceiling in percent: `reserved` (consumed ``compute``) and `limit` (``computeLimitPercent``)
    the smaller of the two when both are set, else the one set; None when neither is (the GPU's default)."""
    if reserved <= 0:
        return limit
    return reserved if limit is None else min(reserved, limit)
