"""Unit tests of the MPS trust-domain tolerations at admission (controller/admission/mps_tolerations.py): the
toleration each request of the driver's classes is given, never twice in another form, and the tolerations
refused, each named with what it tolerates and what to do."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.mps_trust import LABEL_TAINT_KEY, NAMESPACE_TAINT_KEY, TrustDomain
from controller.admission.mps_tolerations import foreign_tolerations, tolerations_patch

DRIVER = "gpu.fracgpu.dev"
CLASSES = frozenset({DRIVER, f"mps.{DRIVER}"})
A = TrustDomain("namespace", "team-a")
OWN = {"key": NAMESPACE_TAINT_KEY, "operator": "Equal", "value": "team-a", "effect": "NoSchedule"}


def claim_spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def gpu(*tolerations: dict[str, Any], cls: str = DRIVER) -> dict[str, Any]:
    """A request of `cls` with `tolerations` (none: no field at all)."""
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if tolerations:
        exactly["tolerations"] = list(tolerations)
    return {"name": "gpu", "exactly": exactly}


# ----- given ----------------------------------------------------------------------------------------------


def test_admission_gives_each_request_of_our_classes_its_domains_toleration() -> None:
    spec = claim_spec(
        {"name": "gpu", "exactly": {"deviceClassName": DRIVER}},
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
        {"name": "alt", "firstAvailable": [{"name": "mps", "deviceClassName": f"mps.{DRIVER}",
                                             "tolerations": [{"key": "x", "operator": "Exists"}]},
                                            {"name": "other", "deviceClassName": "other.example.com"}]},
    )  # fmt: skip
    assert tolerations_patch(spec, CLASSES, A) == [
        {"op": "add", "path": "/spec/devices/requests/0/exactly/tolerations", "value": [OWN]},
        {"op": "add", "path": "/spec/devices/requests/2/firstAvailable/0/tolerations/-", "value": OWN},
    ]
    assert tolerations_patch(spec, CLASSES, TrustDomain("cluster")) == []
    labelled = TrustDomain("label", "ml", "team")
    assert tolerations_patch(claim_spec(gpu()), CLASSES, labelled) == [
        {
            "op": "add",
            "path": "/spec/devices/requests/0/exactly/tolerations",
            "value": [{"key": LABEL_TAINT_KEY, "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        }
    ]


@pytest.mark.parametrize(
    "own",
    [
        OWN,
        {"key": NAMESPACE_TAINT_KEY, "value": "team-a"},  # operator omitted (Equal), effect omitted (every effect)
        {"key": NAMESPACE_TAINT_KEY, "operator": "Equal", "value": "team-a"},
        {"key": NAMESPACE_TAINT_KEY, "value": "team-a", "effect": "NoSchedule", "tolerationSeconds": 60},
    ],
)
def test_a_request_that_tolerates_its_domains_taint_in_any_form_gets_no_second_toleration(own: dict[str, Any]) -> None:
    assert tolerations_patch(claim_spec(gpu(own)), CLASSES, A) == []
    assert foreign_tolerations(claim_spec(gpu(own)), A, CLASSES) == [], "and it is admitted"


@pytest.mark.parametrize(
    "unlike",
    [
        {"key": NAMESPACE_TAINT_KEY, "value": "team-a", "effect": "NoExecute"},  # not the NoSchedule taint
        {"key": LABEL_TAINT_KEY, "value": "team-a"},  # another key
        {"operator": "Exists", "effect": "NoExecute"},
    ],
)
def test_a_toleration_that_misses_the_domains_taint_gets_the_domains_added(unlike: dict[str, Any]) -> None:
    assert tolerations_patch(claim_spec(gpu(unlike)), CLASSES, A) == [
        {"op": "add", "path": "/spec/devices/requests/0/exactly/tolerations/-", "value": OWN}
    ]


# ----- refused ----------------------------------------------------------------------------------------------


def test_a_toleration_of_another_domains_taint_is_refused_naming_field_taint_and_what_to_do() -> None:
    other = {"key": NAMESPACE_TAINT_KEY, "operator": "Equal", "value": "team-b", "effect": "NoSchedule"}
    assert foreign_tolerations(claim_spec(gpu(OWN, other)), A, CLASSES) == [
        "spec.devices.requests[0].exactly.tolerations[1] tolerates the MPS trust-domain taint "
        "gpu.fracgpu.dev/mps-namespace=team-b, that of MPS GPUs of another trust domain, and this claim belongs to "
        "namespace team-a. Remove it: admission gives each request of the driver's DeviceClasses the toleration of "
        "its own domain, and a claim may reach only the MPS GPUs of its own domain (chart value "
        "mps.trustDomain.scope)"
    ]
    every_value = {"key": NAMESPACE_TAINT_KEY, "operator": "Exists"}
    (refused,) = foreign_tolerations(claim_spec(gpu(every_value, cls="nic.example.com")), A, CLASSES)
    assert refused.startswith(
        "spec.devices.requests[0].exactly.tolerations[0] tolerates the MPS trust-domain taint "
        "gpu.fracgpu.dev/mps-namespace with any value, so the MPS GPUs of other trust domains, and this claim "
        "belongs to namespace team-a. Remove it"
    ), "a domain taint key is refused on a request of any class"


@pytest.mark.parametrize(("effect", "what"), [(None, "every taint"), ("NoSchedule", "every NoSchedule taint")])
def test_a_toleration_of_every_taint_is_refused_on_our_classes_saying_why_it_would_loop(
    effect: str | None, what: str
) -> None:
    everything = {"operator": "Exists"} | ({"effect": effect} if effect else {})
    spec = claim_spec(
        gpu(OWN, everything),
        {"name": "alt", "firstAvailable": [{"name": "mps", "deviceClassName": f"mps.{DRIVER}",
                                             "tolerations": [everything]}]},
    )  # fmt: skip
    refused = foreign_tolerations(spec, A, CLASSES, "spec.spec")
    assert [r.split(" (")[0] for r in refused] == [
        "spec.spec.devices.requests[0].exactly.tolerations[1]",
        "spec.spec.devices.requests[1].firstAvailable[0].tolerations[0]",
    ], "the template's field paths"
    assert refused[0] == (
        f"spec.spec.devices.requests[0].exactly.tolerations[1] (operator Exists without a key) tolerates {what}, "
        "the MPS trust-domain taints of other trust domains than this claim's (namespace team-a) included: the "
        "scheduler could place the claim on an MPS GPU that serves another domain, where it is refused (the binding "
        "condition MpsTrustDomainConflict, or the node plugin at prepare) and the scheduler places it again, maybe "
        "there again, without end. Name the key of each taint the claim must tolerate instead (admission gives each "
        "request of the driver's DeviceClasses the toleration of its own domain), or write effect: NoExecute for a "
        "toleration meant only to keep the claim's pods from eviction"
    )


def test_what_tolerates_no_other_domains_taint_is_admitted() -> None:
    admitted = [
        {"operator": "Exists", "effect": "NoExecute"},  # tolerates no NoSchedule taint
        {"key": "example.com/maintenance", "operator": "Exists"},
        {"key": NAMESPACE_TAINT_KEY, "value": "team-b", "effect": "NoExecute"},
    ]
    assert foreign_tolerations(claim_spec(gpu(*admitted)), A, CLASSES) == []
    nic = gpu({"operator": "Exists"}, cls="nic.example.com")
    assert foreign_tolerations(claim_spec(nic), A, CLASSES) == [], "another driver's request never reaches our GPUs"
    anything = gpu({"operator": "Exists"}, {"key": NAMESPACE_TAINT_KEY, "value": "team-b"})
    assert foreign_tolerations(claim_spec(anything), TrustDomain("cluster"), CLASSES) == [], "cluster: no taints"
    labelled = TrustDomain("label", "ml", "team")
    assert foreign_tolerations(claim_spec(gpu({"key": LABEL_TAINT_KEY, "value": "ml"})), labelled, CLASSES) == []
    assert (
        len(foreign_tolerations(claim_spec(gpu({"key": NAMESPACE_TAINT_KEY, "value": "ml"})), labelled, CLASSES)) == 1
    )


TOLERATIONS: st.SearchStrategy[Any] = st.lists(
    st.dictionaries(
        st.sampled_from(["key", "operator", "value", "effect", "tolerationSeconds"]),
        st.sampled_from([None, "", "Exists", "Equal", "NoSchedule", NAMESPACE_TAINT_KEY, "team-a", 3, [], {}]),
    )
    | st.none()
    | st.integers(),
    max_size=3,
)
ODD = st.none() | st.integers() | st.text(max_size=3) | st.lists(st.none(), max_size=2)
TARGET = st.fixed_dictionaries(
    {}, optional={"deviceClassName": st.sampled_from([DRIVER, "x"]) | ODD, "tolerations": TOLERATIONS | ODD}
)
SPEC = st.fixed_dictionaries(
    {},
    optional={
        "devices": st.fixed_dictionaries(
            {},
            optional={
                "requests": st.lists(
                    st.fixed_dictionaries(
                        {},
                        optional={"exactly": TARGET | ODD, "firstAvailable": st.lists(TARGET | ODD, max_size=2) | ODD},
                    )
                    | ODD,
                    max_size=3,
                )
                | ODD
            },
        )
        | ODD
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPEC)
def test_odd_specs_never_raise(spec: dict[str, Any]) -> None:
    assert all(isinstance(r, str) for r in foreign_tolerations(spec, A, CLASSES))
    assert all(op["op"] == "add" for op in tolerations_patch(spec, CLASSES, A))


def test_the_controllers_review_refuses_them_with_mps_gpus_beside_the_specs_own_problems() -> None:
    from controller import handlers
    from controller.core.settings import Settings
    from controller.loops import Controller
    from tests.unit.controller_factories import FakeWriter

    spec = claim_spec(gpu({"operator": "Exists"}) | {"name": "gpu"})
    spec["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "-1Gi"}}
    with_mps = Controller(Settings(mps=True), FakeWriter())
    review = handlers._review(with_mps, spec, "spec", "team-a")
    assert [p.split(" ")[0] for p in review.problems] == [
        "spec.devices.requests[0].exactly.tolerations[0]",
        "spec.devices.requests[0].exactly.capacity.requests.memory:",
    ], "both refusals at once, the toleration's first"
    template = handlers._review(with_mps, spec, "spec.spec", "team-a")
    assert template.problems[0].startswith("spec.spec.devices.requests[0].exactly.tolerations[0] (operator Exists")
    without = handlers._review(Controller(Settings(), FakeWriter()), spec, "spec", "team-a")
    assert [p.split(" ")[0] for p in without.problems] == ["spec.devices.requests[0].exactly.capacity.requests.memory:"]
