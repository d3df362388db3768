"""What an admission review needs to know about the published devices (pure)."""

from collections.abc import Iterable
from typing import NamedTuple

from controller.core.claims import DeviceClassView
from controller.core.slices import DeviceRecord


class AdmissionFacts(NamedTuple):
    """What an admission review needs to know about the cluster. The event loop publishes a new one whenever it
    changes (one attribute assignment); the webhook's own thread only reads it."""

    largest: int | None = None
    """The largest memory amount any published GPU admits; None when no GPU is published."""
    hami_core: bool | None = None
    """Whether some published GPU offers HAMi-core enforcement; None when no GPU is published."""
    nvml: bool | None = None
    """Whether some published GPU offers nvml enforcement; None when no GPU is published."""
    mps: bool | None = None
    """Whether some published GPU is an MPS GPU; None when no GPU is published."""
    request_ranges: tuple[tuple[int, int], ...] = ()
    """The distinct `(min, step)` of the published GPUs' memory `requestPolicy.validRange`, sorted: how the
    scheduler rounds a memory request up to the grant it allocates (`api.quantity.granted_in_range`)."""
    device_class: DeviceClassView | None = None
    """Our DeviceClass as the cluster has it; None when it is not (or not yet) seen."""
    mps_class: bool | None = None
    """Whether the MPS DeviceClass (`api.names.MPS_DEVICE_CLASS_NAME`) exists; None while not known."""


def admission_facts(
    devices: Iterable[DeviceRecord], device_class: DeviceClassView | None, mps_class: bool | None = None
) -> AdmissionFacts:
    """The facts of the published `devices`, our DeviceClass (None: not seen) and whether the MPS class exists."""
    published = list(devices)
    if not published:
        return AdmissionFacts(device_class=device_class, mps_class=mps_class)
    return AdmissionFacts(
        largest=max(d.max_request for d in published),
        hami_core=any(d.hami_core for d in published),
        nvml=any(d.memory_enforcement == "nvml" for d in published),
        mps=any(d.memory_enforcement == "mps" for d in published),
        request_ranges=tuple(sorted({d.request_range for d in published if d.request_range is not None})),
        device_class=device_class,
        mps_class=mps_class,
    )
