"""A pending claim of a DeviceClass of ours that the install did not create (the MPS class without
`deviceClass.mps.create`, a page's example copied as it stands) is told which class and which chart value creates it
(`DeviceClassNotInstalled`), in place of the reasons that assume the class (issue 38)."""

from typing import Any

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME, MIG_DEVICE_CLASS_NAME, MPS_DEVICE_CLASS_NAME
from controller.core.claims import ClaimView, DeviceClassView, claim_view
from controller.core.settings import Settings, chart_classes
from controller.loops import Controller
from controller.status.class_missing import plan_class_missing
from controller.status.events import REASON_CLASS_MISSING, REASON_UNSATISFIABLE
from tests.unit.controller.test_loops import run
from tests.unit.controller_factories import FakeWriter, World, claim, result

D = DRIVER_NAME
SETTINGS = Settings()
CHART = chart_classes(SETTINGS)
ENFORCED = f"enforced.{D}"


def exactly(name: str, cls: str, memory: str | None = "10Gi") -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": cls}
    if memory is not None:
        spec["capacity"] = {"requests": {"memory": memory}}
    return {"name": name, "exactly": spec}


def first_available(name: str, *classes: str) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)]}


def view(*requests: dict[str, Any], **kw: Any) -> ClaimView:
    found = claim_view(claim("c", requests=list(requests), **kw), D, SETTINGS.claim_classes)
    assert found is not None
    return found


def messages(claim_: ClaimView, existing: tuple[str, ...] = (DEVICE_CLASS_NAME, MIG_DEVICE_CLASS_NAME)) -> list[str]:
    return [f.message for f in plan_class_missing(claim_, existing, CHART)]


def test_the_mps_and_enforced_classes_are_watched_whether_or_not_installed() -> None:
    assert (
        set(SETTINGS.claim_classes)
        == {DEVICE_CLASS_NAME, *CHART}
        == {DEVICE_CLASS_NAME, MIG_DEVICE_CLASS_NAME, MPS_DEVICE_CLASS_NAME, ENFORCED}
    )
    assert SETTINGS.indexed_classes == frozenset(SETTINGS.claim_classes)


def test_a_request_of_a_class_the_cluster_lacks_names_it_and_its_chart_value() -> None:
    assert messages(view(exactly("gpu", MPS_DEVICE_CLASS_NAME))) == [
        f"request 'gpu' asks for DeviceClass {MPS_DEVICE_CLASS_NAME}, which this cluster does not have, so no device "
        f"can be allocated to it: DeviceClass {MPS_DEVICE_CLASS_NAME} selects only MPS GPUs, those of chart value "
        "mps.gpus, and is created by the chart value deviceClass.mps.create=true"
    ]
    (enforced,) = messages(view(exactly("gpu", ENFORCED)))
    assert "deviceClass.enforced.create=true" in enforced and "\n" not in enforced
    (mig,) = messages(view(exactly("mig", MIG_DEVICE_CLASS_NAME)), existing=(DEVICE_CLASS_NAME,))
    assert "deviceClass.mig.create=true" in mig and "mig.gpus" in mig


def test_nothing_is_said_where_the_class_exists_some_alternative_may_be_allocated_or_the_claim_is_allocated() -> None:
    assert (
        messages(view(exactly("gpu", MPS_DEVICE_CLASS_NAME)), existing=(DEVICE_CLASS_NAME, MPS_DEVICE_CLASS_NAME)) == []
    )
    assert messages(view(first_available("gpu", MPS_DEVICE_CLASS_NAME, DEVICE_CLASS_NAME))) == []
    allocated = view(exactly("gpu", MPS_DEVICE_CLASS_NAME), results=[result("gpu", "gpu-0", "10Gi", "s-1")])
    assert allocated.allocated and messages(allocated) == []
    assert messages(view(exactly("gpu", DEVICE_CLASS_NAME)), existing=()) == [], "not an optional class"


def test_every_missing_class_of_a_request_and_each_request_are_named() -> None:
    found = plan_class_missing(
        view(first_available("gpu", MPS_DEVICE_CLASS_NAME, ENFORCED), exactly("other", MPS_DEVICE_CLASS_NAME)),
        (DEVICE_CLASS_NAME,),
        CHART,
    )
    assert [f.request for f in found] == ["gpu", "other"]
    assert f"DeviceClasses {MPS_DEVICE_CLASS_NAME}, {ENFORCED}," in found[0].message
    assert "deviceClass.mps.create=true" in found[0].message and "deviceClass.enforced.create=true" in found[0].message


def test_the_controller_posts_it_once_in_place_of_the_other_reasons() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        classes: dict[str, list[DeviceClassView]] = {DEVICE_CLASS_NAME: [DeviceClassView(name=DEVICE_CLASS_NAME)]}
        controller.bind(world.slices, world.claims, world.gpus, classes)
        small = view(exactly("gpu", MPS_DEVICE_CLASS_NAME))
        world.claims[small.key] = [small]
        await controller.status.reconcile(small.key)
        assert writer.events == [], "nothing known before the indexes are populated"
        controller.context.ready.set()
        big = view(exactly("gpu", MPS_DEVICE_CLASS_NAME, "500Gi"))  # also larger than any GPU
        world.claims[big.key] = [big]
        await controller.status.reconcile(big.key)
        await controller.status.reconcile(big.key)
        assert [(n, r) for n, r, _ in writer.events] == [("c", REASON_CLASS_MISSING)], "once, and only it"
        classes[MPS_DEVICE_CLASS_NAME] = [DeviceClassView(name=MPS_DEVICE_CLASS_NAME)]
        await controller.status.reconcile(big.key)
        assert [r for _, r, _ in writer.events] == [REASON_CLASS_MISSING, REASON_UNSATISFIABLE], "the class exists"

    run(test)
