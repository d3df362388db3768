"""DRA CEL selectors over sample devices (controller/status/selectors.py) and the Unsatisfiable messages
(controller/status/feasibility.py)."""

from typing import Any

import pytest

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import MiB
from controller.core.claims import DeviceClassView, claim_view
from controller.core.slices import DeviceRecord, current_devices, slice_view
from controller.status import feasibility
from controller.status.feasibility import plan_unsatisfiable
from controller.status.selectors import NotEvaluated, evaluate
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller_factories import claim, gpu, memory_request

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"
CLASS = DeviceClassView(name=DEVICE_CLASS_NAME, selectors=(f'device.driver == "{DRIVER_NAME}"',))
PRODUCT = f'device.attributes["{DRIVER_NAME}"].productName'


def devices(*models: tuple[str, int]) -> list[DeviceRecord]:
    """One node's GPUs as the node plugin publishes them: (product name, GiB) each."""
    infos = [gpu(i, gib).model_copy(update={"product_name": name}) for i, (name, gib) in enumerate(models)]
    (body,) = build_slices("n1", "uid-n1", DRIVER_NAME, infos, step=256 * MiB, reserve=0, generation=1)
    view = slice_view(body, DRIVER_NAME)
    assert view is not None
    return list(current_devices([view]).values())


CLUSTER = devices((A100, 40), (A100, 40), (A100, 40), (H100, 80))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'{PRODUCT} == "{A100}"', [True, True, True, False]),
        (f'{PRODUCT}.startsWith("NVIDIA H100")', [False, False, False, True]),
        (f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("40Gi")) >= 0', [True] * 4),
        (f'device.capacity["{DRIVER_NAME}"].memory.isGreaterThan(quantity("40Gi"))', [False, False, False, True]),
        (f'device.capacity["{DRIVER_NAME}"].memory.isLessThan(quantity("41Gi"))', [True, True, True, False]),
        (f'device.driver == "{DRIVER_NAME}"', [True] * 4),
        (f'device.attributes["{DRIVER_NAME}"].index == 1', [False, True, False, False]),
        ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:10:00.0"', [True, False, False, False]),
        (f'device.attributes["{DRIVER_NAME}"].architecture.lowerAscii() == "hopper"', [True] * 4),
    ],
)
def test_selectors_evaluate_kubernetes_dra_expressions(expression: str, expected: list[bool]) -> None:
    assert [evaluate(expression, d, DRIVER_NAME) for d in CLUSTER] == expected


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        (f'device.attributes["{DRIVER_NAME}"].driverVersion.isGreaterThan(semver("570.0.0"))', "semver"),
        (f'device.attributes["{DRIVER_NAME}"].cudaComputeCapability == "9.0.0"', "cudaComputeCapability"),
        (f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("0.5")) > 0', "not a whole number"),
        (f"{PRODUCT} ==", "Syntax error"),
        (PRODUCT, "STRING"),
    ],
)
def test_what_cannot_be_evaluated_says_so(expression: str, reason: str) -> None:
    outcome = evaluate(expression, CLUSTER[0], DRIVER_NAME)
    assert isinstance(outcome, NotEvaluated) and reason in outcome.reason, outcome


def _pending(memory: str, *selectors: str, alternatives: list[tuple[str, str]] | None = None) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": memory}}}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    request: dict[str, Any] = {"name": "gpu", "exactly": exactly}
    if alternatives is not None:
        request = {
            "name": "gpu",
            "firstAvailable": [
                {"name": n, **exactly, "capacity": {"requests": {"memory": m}}} for n, m in alternatives
            ],
        }
    view = claim_view(claim(requests=[request]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    return view


def _messages(view: Any, device_class: DeviceClassView | None = CLASS) -> list[str]:
    return [u.message for u in plan_unsatisfiable(view, CLUSTER, device_class, DRIVER_NAME)]


def test_an_a100_only_request_larger_than_an_a100_names_the_selector() -> None:
    a100 = f'{PRODUCT} == "{A100}"'
    (message,) = _messages(_pending("50Gi", a100))
    assert message == (
        f"no GPU of {DRIVER_NAME} can ever satisfy this claim: request 'gpu' asks for 50Gi of GPU memory, but only "
        f'3 published GPUs of 4 match selectors `device.driver == "{DRIVER_NAME}"` (of DeviceClass '
        f"{DEVICE_CLASS_NAME}), `{a100}` (of the request), and the largest of them has 40Gi"
    )
    assert _messages(_pending("40Gi", a100)) == [], "an A100 has 40Gi"
    assert _messages(_pending("50Gi")) == [], "the H100 has 80Gi"


def test_no_device_matching_a_selector_is_named() -> None:
    b200 = f'{PRODUCT} == "NVIDIA B200"'
    (message,) = _messages(_pending("10Gi", b200))
    assert message.endswith(f"but no published GPU matches selector `{b200}` (of the request)"), message
    a100, big = f'{PRODUCT} == "{A100}"', f'device.capacity["{DRIVER_NAME}"].memory.isGreaterThan(quantity("50Gi"))'
    (together,) = _messages(_pending("10Gi", a100, big))
    assert "no published GPU matches all of its selectors together" in together
    assert f"`{a100}` (of the request: 3)" in together and f"`{big}` (of the request: 1)" in together


def test_the_deviceclass_selectors_apply_too() -> None:
    only_h100 = DeviceClassView(name="gpus", selectors=(f'{PRODUCT}.startsWith("NVIDIA H100")',))
    a100 = f'{PRODUCT} == "{A100}"'
    (message,) = _messages(_pending("10Gi", a100), only_h100)
    assert "no published GPU matches all of its selectors together" in message
    assert "(of DeviceClass gpus: 1)" in message


def test_without_selectors_the_largest_gpu_is_compared() -> None:
    (message,) = _messages(_pending("100Gi"), None)
    assert message == (
        f"no GPU of {DRIVER_NAME} can ever satisfy this claim: request 'gpu' asks for 100Gi of GPU memory, "
        "and the largest GPU has 80Gi"
    )


def test_a_selector_not_evaluated_never_rules_a_gpu_out() -> None:
    version = f'device.attributes["{DRIVER_NAME}"].driverVersion.isGreaterThan(semver("570.0.0"))'
    assert _messages(_pending("60Gi", version)) == [], "the H100 might match"
    (message,) = _messages(_pending("100Gi", version))
    assert "the largest GPU has 80Gi" in message
    assert message.endswith(
        f"; selector `{version}` could not be evaluated here (ERROR: <input>:1:72: undeclared reference to 'semver' "
        "(in container '')), so this check assumed it rules out no GPU"
    ), message
    assert "ruled out no GPU" not in message, "the scheduler may rule GPUs out with it: only the check assumed not"
    a100 = f'{PRODUCT} == "{A100}"'
    (both,) = _messages(_pending("50Gi", a100, version))
    assert "but at most 3 published GPUs of 4 match" in both and "could not be evaluated here" in both


def test_every_alternative_must_be_unsatisfiable() -> None:
    a100 = f'{PRODUCT} == "{A100}"'
    assert _messages(_pending("", a100, alternatives=[("big", "50Gi"), ("small", "20Gi")])) == []
    (message,) = _messages(_pending("", a100, alternatives=[("big", "60Gi"), ("bigger", "70Gi")]))
    assert "request 'gpu/big' asks for 60Gi" in message and "; or request 'gpu/bigger' asks for 70Gi" in message


def test_nothing_is_said_without_published_gpus_or_once_allocated() -> None:
    view = _pending("100Gi")
    assert plan_unsatisfiable(view, [], CLASS, DRIVER_NAME) == ()
    assert plan_unsatisfiable(view.model_copy(update={"allocated": True}), CLUSTER, CLASS, DRIVER_NAME) == ()


def test_a_claim_that_fits_stops_at_the_first_device_that_satisfies_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # a pending claim is re-checked on each of its events: it must not evaluate selectors on every GPU
    evaluated: list[str] = []

    def counting(expression: str, device: DeviceRecord, driver: str) -> bool | NotEvaluated:
        evaluated.append(device.device)
        return evaluate(expression, device, driver)

    monkeypatch.setattr(feasibility, "evaluate", counting)
    many = devices(*[(H100, 80)] * 8)
    fits = claim_view(claim(requests=[memory_request("gpu", "10Gi")]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert fits is not None
    assert plan_unsatisfiable(fits, many, CLASS, DRIVER_NAME) == ()
    assert evaluated == ["gpu-0"], "one device's selectors, not all eight"
    evaluated.clear()
    big = claim_view(claim(requests=[memory_request("gpu", "100Gi")]), DRIVER_NAME, DEVICE_CLASS_NAME)
    assert big is not None
    assert plan_unsatisfiable(big, many, CLASS, DRIVER_NAME), "still found unsatisfiable"


# ----- whole GPUs, count, All, firstAvailable, and requests that fit only alone ---------------------------------

UUID = f"{DRIVER_NAME}/uuid"


def node(name: str, *models: tuple[str, int]) -> list[DeviceRecord]:
    """The GPUs of node `name` as its plugin publishes them: (product name, GiB) each."""
    infos = [
        gpu(i, gib).model_copy(update={"product_name": model, "uuid": f"GPU-{name}-{i}"})
        for i, (model, gib) in enumerate(models)
    ]
    (body,) = build_slices(name, f"uid-{name}", DRIVER_NAME, infos, step=256 * MiB, reserve=0, generation=1)
    view = slice_view(body, DRIVER_NAME)
    assert view is not None
    return list(current_devices([view]).values())


def _ask(name: str, memory: str | None = None, *selectors: str, **fields: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NAME, **fields}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exactly}


def _said(
    requests: list[dict[str, Any]], cluster: list[DeviceRecord], constraints: list[dict[str, Any]] | None = None
) -> list[str]:
    body = claim(requests=requests)
    if constraints:
        body["spec"]["devices"]["constraints"] = constraints
    view = claim_view(body, DRIVER_NAME, DEVICE_CLASS_NAME)
    assert view is not None
    return [u.message for u in plan_unsatisfiable(view, cluster, CLASS, DRIVER_NAME)]


PREFIX = f"no GPU of {DRIVER_NAME} can ever satisfy this claim: "
B200 = f'{PRODUCT} == "NVIDIA B200"'
A100_ONLY = f'{PRODUCT} == "{A100}"'
TWO_NODES = node("n1", (A100, 40), (H100, 80)) + node("n2", (H100, 80), (H100, 80))


def test_a_whole_gpu_request_no_gpu_matches_names_the_selector() -> None:
    (message,) = _said([_ask("gpu", None, B200)], CLUSTER)
    assert (
        message
        == PREFIX
        + f"request 'gpu' asks for a whole GPU, but no published GPU matches selector `{B200}` (of the request)"
    )
    big = f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("100Gi")) >= 0'
    (by_memory,) = _said([_ask("gpu", None, big)], CLUSTER)
    assert f"asks for a whole GPU, but no published GPU matches selector `{big}`" in by_memory
    assert _said([_ask("gpu", None, A100_ONLY)], CLUSTER) == [], "three A100s"


def test_a_count_beyond_any_node_says_the_most_one_node_has() -> None:
    (message,) = _said([_ask("gpu", "10Gi", count=3)], TWO_NODES)
    assert message == PREFIX + (
        "request 'gpu' asks for 3 GPUs with 10Gi of GPU memory each, but a claim's GPUs all come from one node, and "
        "no node has 3 GPUs it can use (GPUs its selectors and its DeviceClass's do not rule out with at least "
        "10Gi): the most on one node is 2 (node n1), of 4 published GPUs it can use"
    )
    (whole,) = _said([_ask("gpu", None, f'{PRODUCT}.startsWith("NVIDIA H100")', count=3)], TWO_NODES)
    assert "asks for 3 whole GPUs" in whole and "the most on one node is 2 (node n2), of 3 published GPUs" in whole
    assert _said([_ask("gpu", "10Gi", count=2)], TWO_NODES) == []
    assert _said([_ask("gpu", "50Gi", count=2)], TWO_NODES) == [], "n2 has two 80Gi H100s"
    (large,) = _said([_ask("gpu", "50Gi", count=3)], TWO_NODES)
    assert "the most on one node is 2 (node n2), of 3 published GPUs it can use" in large


def test_allocation_mode_all_needs_one_matching_gpu_on_some_node() -> None:
    (message,) = _said([_ask("gpu", None, B200, allocationMode="All")], TWO_NODES)
    assert message == PREFIX + (
        "request 'gpu' asks for every GPU of a node it matches (allocationMode All), but no published GPU matches "
        f"selector `{B200}` (of the request)"
    )
    (memory,) = _said([_ask("gpu", "100Gi", allocationMode="All")], TWO_NODES)
    assert "(allocationMode All) with 100Gi of GPU memory each, and the largest GPU has 80Gi" in memory
    assert _said([_ask("gpu", None, A100_ONLY, allocationMode="All")], TWO_NODES) == []


def test_first_available_is_reported_only_when_every_alternative_is_impossible() -> None:
    many: dict[str, Any] = {"name": "many", "deviceClassName": DEVICE_CLASS_NAME, "count": 4}
    b200 = {"name": "b200", "deviceClassName": DEVICE_CLASS_NAME, "selectors": [{"cel": {"expression": B200}}]}
    (message,) = _said([{"name": "gpu", "firstAvailable": [many, b200]}], TWO_NODES)
    assert message.startswith(PREFIX + "request 'gpu/many' asks for 4 whole GPUs, but "), message
    assert "; or request 'gpu/b200' asks for a whole GPU, but no published GPU matches selector" in message
    two = {"name": "two", "deviceClassName": DEVICE_CLASS_NAME, "count": 2}
    assert _said([{"name": "gpu", "firstAvailable": [many, two]}], TWO_NODES) == [], "two whole GPUs of one node"


def test_match_attribute_no_node_satisfies_while_each_request_fits_alone() -> None:
    requests = [_ask("a", "10Gi", A100_ONLY), _ask("b", "10Gi", count=2)]
    constraint = [{"requests": ["a", "b"], "matchAttribute": f"{DRIVER_NAME}/productName"}]
    (message,) = _said(requests, TWO_NODES, constraint)
    assert message == PREFIX + (
        "request 'a' asks for 10Gi of GPU memory; request 'b' asks for 2 GPUs with 10Gi of GPU memory each; each "
        f"fits alone, but constraint matchAttribute {DRIVER_NAME}/productName ('a', 'b'): no node has GPUs of one "
        f"value for all of them (the values each can use: 'a': {A100}; 'b': {A100}, {H100})"
    )
    assert _said(requests, TWO_NODES) == [], "without the constraint n1 serves both"
    assert _said(requests, TWO_NODES + node("n3", (A100, 40), (A100, 40)), constraint) == [], "n3: two A100s"


def test_distinct_attribute_needs_more_gpus_than_a_node_has() -> None:
    requests = [_ask("a", "10Gi", count=2), _ask("b", "10Gi")]
    (message,) = _said(requests, TWO_NODES, [{"distinctAttribute": UUID}])
    assert message.endswith(
        f"each fits alone, but constraint distinctAttribute {UUID} (all requests) needs 3 GPUs with different "
        f"{UUID} on one node, and no node has more than 2 such values among the GPUs they can use"
    ), message
    assert _said(requests, TWO_NODES) == [], "without it 'b' shares a GPU with 'a'"


def test_shares_of_one_gpu_by_match_attribute_add_up() -> None:
    requests = [_ask("a", "30Gi"), _ask("b", "30Gi")]
    constraint = [{"matchAttribute": UUID}]
    forty = node("n1", (A100, 40), (A100, 40))
    (message,) = _said(requests, forty, constraint)
    assert message == PREFIX + (
        "request 'a' asks for 30Gi of GPU memory; request 'b' asks for 30Gi of GPU memory; each fits alone, but "
        f"constraint matchAttribute {UUID} (all requests) puts them on one GPU (each {UUID} is one GPU), and "
        "together they ask for 60Gi of GPU memory, where the largest GPU they can all use has 40Gi"
    )
    assert _said(requests, forty) == [], "on two GPUs"
    assert _said([_ask("a", "20Gi"), _ask("b", "20Gi")], forty, constraint) == [], "40Gi: both fit on one"
    assert _said(requests, forty + node("n2", (H100, 80)), constraint) == []


def test_whole_gpus_are_not_shared_within_a_claim() -> None:
    one_each = node("n1", (H100, 80)) + node("n2", (H100, 80))
    (message,) = _said([_ask("a"), _ask("b")], one_each)
    assert message == PREFIX + (
        "request 'a' asks for a whole GPU; request 'b' asks for a whole GPU; each fits alone, but no node has GPUs "
        "for all of them at once (a request's GPUs are distinct, a whole GPU or a MIG partition is not shared, and "
        "shares of one GPU add up to at most its memory)"
    )
    assert _said([_ask("a", "40Gi"), _ask("b", "40Gi")], one_each) == [], "two shares fit one GPU"
    assert _said([_ask("a"), _ask("b", "40Gi", adminAccess=True)], one_each) == [], "admin access consumes nothing"


def test_what_is_not_known_rules_nothing_out() -> None:
    version = f'device.attributes["{DRIVER_NAME}"].driverVersion.isGreaterThan(semver("570.0.0"))'
    assert _said([_ask("gpu", None, version, count=2)], TWO_NODES) == []
    (count,) = _said([_ask("gpu", None, version, count=3)], TWO_NODES)
    assert f"selector `{version}` could not be evaluated here" in count, "assumed to rule nothing out: still too few"
    assert "the most on one node is at most 2 (node n1), of at most 4 published GPUs it can use" in count, count
    # a constraint on an attribute our records do not hold (a version) is left out, not taken as unmet
    requests = [_ask("a", "10Gi", A100_ONLY), _ask("b", "10Gi", count=2)]
    assert _said(requests, TWO_NODES, [{"matchAttribute": f"{DRIVER_NAME}/driverVersion"}]) == []
    # devices of a slice that names no node may serve a claim with devices of any node: no count is proven
    anywhere = [d.model_copy(update={"node_local": False}) for d in TWO_NODES]
    assert _said([_ask("gpu", None, count=3)], anywhere) == []
    assert _said(requests, anywhere, [{"matchAttribute": f"{DRIVER_NAME}/productName"}]) == []


def test_past_the_search_bound_nothing_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = [_ask("a", "10Gi", A100_ONLY), _ask("b", "10Gi", count=2)]
    constraint = [{"matchAttribute": f"{DRIVER_NAME}/productName"}]
    assert _said(requests, TWO_NODES, constraint), "impossible"
    monkeypatch.setattr(feasibility, "MAX_PLACEMENTS", 2)
    assert _said(requests, TWO_NODES, constraint) == [], "not proven within the bound"
