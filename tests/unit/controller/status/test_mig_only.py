"""A claim written for MIG (a `profile` selector, `type == "mig"`, the MIG DeviceClass) where no MIG partition is
published is told so, naming the chart value `mig.gpus` and the MIG DeviceClass (`MigPartitionsNotPublished`);
and the feasibility check's sentences stay true for such selectors (issue 38: it said "each fits alone" and that
the selector "ruled out no GPU", while the scheduler fails on it for every GPU)."""

from typing import Any

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME, MIG_DEVICE_CLASS_NAME
from controller.core.claims import ClaimView, DeviceClassView, claim_view
from controller.core.slices import DeviceRecord
from controller.loops import Controller
from controller.status.events import REASON_MIG_UNPUBLISHED, REASON_UNSATISFIABLE
from controller.status.feasibility import plan_unsatisfiable
from controller.status.mig_only import plan_mig_unpublished
from tests.unit.controller.status.test_whole_gpu import published
from tests.unit.controller.test_loops import run
from tests.unit.controller.test_mig import GPU_CLASS, MIG_CLASS, devices
from tests.unit.controller_factories import NODE, FakeWriter, World, claim

D = DRIVER_NAME
CLASSES = {
    DEVICE_CLASS_NAME: GPU_CLASS.model_copy(update={"name": DEVICE_CLASS_NAME}),
    MIG_DEVICE_CLASS_NAME: MIG_CLASS,
}
NO_MIG_GPU = (
    "no GPU of this cluster is a MIG GPU (the node plugin publishes MIG partitions only for the GPUs the chart value "
    "mig.gpus names, with their MIG mode on)"
)


def profile(name: str) -> str:
    return f"device.attributes['{D}'].profile == '{name}'"


def request(name: str, expression: str | None = None, cls: str = DEVICE_CLASS_NAME) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if expression is not None:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"name": name, "exactly": exactly}


def pending(*requests: dict[str, Any]) -> ClaimView:
    view = claim_view(claim("mig", requests=list(requests)), D, (DEVICE_CLASS_NAME, MIG_DEVICE_CLASS_NAME))
    assert view is not None
    return view


def told(view: ClaimView, found: list[DeviceRecord], classes: dict[str, DeviceClassView] = CLASSES) -> list[str]:
    return [m.message for m in plan_mig_unpublished(view, found, classes, D, MIG_DEVICE_CLASS_NAME)]


NVIDIA_EXAMPLE = [request(n, profile(p)) for n, p in (("a", "1g.10gb"), ("b", "1g.10gb"), ("c", "2g.20gb"))]
"""NVIDIA's MIG example translated: several profiles, each a request of the default class."""


def test_the_old_false_sentences_are_gone() -> None:
    """Before: "...; each fits alone, but no node has GPUs for all of them at once ...; selector `...profile...`
    was not evaluated (...), so it ruled out no GPU": on every whole GPU the scheduler fails on that selector."""
    (found,) = plan_unsatisfiable(pending(*NVIDIA_EXAMPLE), published(), CLASSES, D)
    assert "; each fits alone," not in found.message and "so it ruled out no GPU" not in found.message
    assert (
        "; each would fit alone if the selectors not evaluated ruled out no GPU, but no node has GPUs" in found.message
    )
    assert f"; selector `{profile('2g.20gb')}` could not be evaluated here (" in found.message
    assert found.message.endswith("so this check assumed it rules out no GPU")
    assert plan_unsatisfiable(pending(*NVIDIA_EXAMPLE), published(), CLASSES, D, told={"a", "b", "c"}) == ()


def test_a_profile_selector_without_mig_gpus_is_told_so() -> None:
    (one,) = told(pending(request("a", profile("1g.10gb"))), published())
    assert one == (
        f"request 'a' has selector `{profile('1g.10gb')}` (of the request), which depends on what only MIG partitions "
        f"publish (profile) and matches none of the 2 published GPUs; but no MIG partition is published, as "
        f"{NO_MIG_GPU}; MIG partitions are asked for with DeviceClass {MIG_DEVICE_CLASS_NAME}"
    )
    assert [m.split(" has selector")[0] for m in told(pending(*NVIDIA_EXAMPLE), published())] == [
        "request 'a'",
        "request 'b'",
        "request 'c'",
    ]


def test_nvidias_mig_class_selector_and_the_mig_class_are_told_so() -> None:
    typed = f'"type" in device.attributes["{D}"] && device.attributes["{D}"].type == "mig"'
    (message,) = told(pending(request("a", typed)), published())
    assert '(of the request), which depends on what only MIG partitions publish (type "mig") and matches' in message
    (mig_class,) = told(pending(request("a", cls=MIG_DEVICE_CLASS_NAME)), published())
    assert mig_class == (
        f"request 'a' asks for a MIG partition (DeviceClass {MIG_DEVICE_CLASS_NAME}); but no MIG partition is "
        f"published, as {NO_MIG_GPU}"
    )
    (lacking,) = told(pending(request("a", cls=MIG_DEVICE_CLASS_NAME)), published(), {})
    assert lacking.endswith(
        f"; and the DeviceClass {MIG_DEVICE_CLASS_NAME}, which this cluster lacks too (chart value "
        "deviceClass.mig.create)"
    )


def test_mig_gpus_without_mig_mode_say_so() -> None:
    off = list(devices("disabled").values())
    (message,) = told(pending(request("a", profile("1g.10gb"))), off)
    assert message.endswith(
        f"no MIG partition is published, as the MIG GPUs published have none (GPU 1 (gpu-1) of node {NODE}: migState "
        "disabled; a MIG GPU publishes its partitions only while its MIG mode is on: nvidia-smi -i <index> -mig 1 "
        f"with the GPU idle); MIG partitions are asked for with DeviceClass {MIG_DEVICE_CLASS_NAME}"
    ), message


def test_nothing_is_said_where_partitions_are_published_or_the_selector_is_not_for_mig() -> None:
    assert told(pending(request("a", profile("1g.10gb"))), list(devices().values())) == []
    assert told(pending(request("a", f"device.attributes['{D}'].productName == 'B200'")), published()) == []
    assert told(pending(request("a", f"device.attributes['{D}'].index == 1")), published()) == [], "it matches"
    either = {"name": "a", "firstAvailable": [
        {"name": "mig", "deviceClassName": DEVICE_CLASS_NAME, "selectors": [{"cel": {"expression": profile("1g")}}]},
        {"name": "whole", "deviceClassName": DEVICE_CLASS_NAME},
    ]}  # fmt: skip
    assert told(pending(either), published()) == [], "another alternative may be allocated"
    assert told(pending(request("a", profile("1g.10gb"))), []) == [], "nothing published: a GPU may still join"


def test_the_controller_posts_it_instead_of_unsatisfiable() -> None:
    async def test(controller: Controller, world: World, writer: FakeWriter) -> None:
        view = pending(*NVIDIA_EXAMPLE)
        world.claims[view.key] = [view]
        await controller.status.reconcile(view.key)
        await controller.status.reconcile(view.key)
        assert [(n, r) for n, r, _ in writer.events] == [("mig", REASON_MIG_UNPUBLISHED)] * 3
        assert REASON_UNSATISFIABLE not in {r for _, r, _ in writer.events}

    run(test)
