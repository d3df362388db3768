"""How serious an NVIDIA XID or an NVML recovery action is for the GPU: data, no logic.

Classes: ``ignore`` (caused by an application, the GPU is fine: nothing changes), ``degraded`` (the GPU still
works but should take no new work: taint effect NoSchedule by default), ``fatal`` (the GPU cannot be trusted
until it is reset: NoExecute by default). The XIDs follow NVIDIA's XID catalogue; an XID it does not list here
(and eventData 999, NVML's "unknown XID") is ``degraded``. Operators add XIDs to ignore with
``--health-ignored-xids``.
"""

from typing import Literal, NamedTuple

HealthClass = Literal["ignore", "degraded", "fatal"]
SEVERITY: dict[HealthClass, int] = {"ignore": 0, "degraded": 1, "fatal": 2}


class XidClass(NamedTuple):
    """One XID: its class and a short name (a label-value-safe slug for taint values and Events)."""

    cls: HealthClass
    name: str


XIDS: dict[int, XidClass] = {
    # caused by the application (bad kernel, page fault, its channel reset): the GPU is healthy
    13: XidClass("ignore", "graphics-engine-exception"),
    31: XidClass("ignore", "gpu-memory-page-fault"),
    43: XidClass("ignore", "gpu-stopped-processing"),
    45: XidClass("ignore", "preemptive-cleanup"),
    68: XidClass("ignore", "nvdec-exception"),
    109: XidClass("ignore", "context-switch-timeout"),
    # the GPU works, with less margin or capacity: no new work until it is looked at
    63: XidClass("degraded", "ecc-page-retirement-or-row-remap"),
    74: XidClass("degraded", "nvlink-error"),
    92: XidClass("degraded", "high-single-bit-ecc-rate"),
    94: XidClass("degraded", "contained-ecc-error"),
    # the GPU cannot be trusted until it is reset (or the node rebooted)
    48: XidClass("fatal", "double-bit-ecc-error"),
    61: XidClass("fatal", "internal-microcontroller-breakpoint"),
    62: XidClass("fatal", "internal-microcontroller-halt"),
    64: XidClass("fatal", "row-remap-failure"),
    79: XidClass("fatal", "fallen-off-the-bus"),
    95: XidClass("fatal", "uncontained-ecc-error"),
    119: XidClass("fatal", "gsp-rpc-timeout"),
    120: XidClass("fatal", "gsp-error"),
    140: XidClass("fatal", "unrecovered-ecc-error"),
}
UNLISTED_XID = XidClass("degraded", "unlisted-xid")

#: NVML_GPU_RECOVERY_ACTION_* (nvmlDeviceGetFieldValues, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) -> class and name.
RECOVERY_ACTIONS: dict[int, XidClass] = {
    0: XidClass("ignore", "none"),
    1: XidClass("fatal", "gpu-reset"),
    2: XidClass("fatal", "node-reboot"),
    3: XidClass("degraded", "drain-p2p"),
    4: XidClass("fatal", "drain-and-reset"),
    5: XidClass("degraded", "recover-imex-domain"),
    6: XidClass("fatal", "bus-reset"),
    7: XidClass("fatal", "system-reboot"),
}
UNLISTED_ACTION = XidClass("fatal", "unlisted-recovery-action")


def classify_xid(xid: int, ignored: frozenset[int] = frozenset()) -> XidClass:
    """The class of ``xid``; one in ``ignored`` (the operator's allow-list) is ``ignore`` whatever the table says."""
    if xid in ignored:
        return XidClass("ignore", XIDS.get(xid, UNLISTED_XID).name)
    return XIDS.get(xid, UNLISTED_XID)


def classify_action(action: int) -> XidClass:
    """The class of an NVML recovery action the driver reports for a GPU."""
    return RECOVERY_ACTIONS.get(action, UNLISTED_ACTION)
