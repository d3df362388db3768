"""Which requests of a pending claim name a DeviceClass of ours that the cluster lacks (pure).

Besides the GPU class, the chart creates the MIG class (`deviceClass.mig.create`, on by default), and the MPS
class (`deviceClass.mps.create`) and the enforced class (`deviceClass.enforced.create`) only when asked. A claim copied from a page that uses one the install did not create waits forever: kube-scheduler cannot
allocate a request whose DeviceClass does not exist, and says so only in the pod's scheduling message.
`plan_class_missing` names, for each request of which every alternative names such a class, the class and the chart
value that creates it (`controller.core.settings.chart_classes`). A request with an alternative of an existing class is left out
(that alternative may still be allocated).
"""

from collections.abc import Collection, Mapping

from pydantic import BaseModel, ConfigDict

from controller.core.claims import ClaimView
from controller.core.settings import ChartClass


class ClassMissing(BaseModel):
    """A request of a pending claim whose every alternative names a DeviceClass of ours that does not exist."""

    model_config = ConfigDict(frozen=True)

    request: str
    message: str


def plan_class_missing(
    claim: ClaimView, existing: Collection[str], chart_classes: Mapping[str, ChartClass]
) -> list[ClassMissing]:
    """The requests of `claim` (pending; none when allocated) of which every alternative names a class of
    `chart_classes` absent from `existing` (the DeviceClasses of ours the cluster has), each once."""
    if claim.allocated:
        return []
    found = []
    for alternatives in claim.requests:
        names = list(dict.fromkeys(m.device_class for m in alternatives))
        if not names or any(n in existing or n not in chart_classes for n in names):
            continue
        clauses = "; ".join(
            f"DeviceClass {n} selects {chart_classes[n].selects}, and is created by the chart value "
            f"{chart_classes[n].value}=true"
            for n in names
        )
        which = f"DeviceClass {names[0]}" if len(names) == 1 else f"DeviceClasses {', '.join(names)}"
        found.append(
            ClassMissing(
                request=alternatives[0].request.split("/")[0],
                message=(
                    f"request {alternatives[0].request.split('/')[0]!r} asks for {which}, which this cluster "
                    f"does not have, so no device can be allocated to it: {clauses}"
                ),
            )
        )
    return found
