"""Unit tests of admission review (controller/admission/verdict.py)."""

from typing import Any

import pytest

from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import GiB, MiB
from controller.admission.verdict import Review, is_extended_resource_claim, review_claim_spec
from controller.core.claims import EXTENDED_RESOURCE_CLAIM_ANNOTATION
from tests.unit.scheduler_claims import extended_resource_claim

HEAD = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig"}


def review(spec: dict[str, Any], largest: int | None = 80 * GiB, prefix: str = "spec") -> Review:
    return review_claim_spec(spec, prefix, driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=largest)


def spec(requests: list[dict[str, Any]], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if config is not None:
        devices["config"] = config
    return {"devices": devices}


def req(
    memory: object = None, name: str = "gpu", device_class: str = DEVICE_CLASS_NAME, **capacity: object
) -> dict[str, Any]:
    requests = dict(capacity)
    if memory is not None:
        requests["memory"] = memory
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if requests:
        exactly["capacity"] = {"requests": requests}
    return {"name": name, "exactly": exactly}


def opaque(parameters: object, driver: str = DRIVER_NAME) -> list[dict[str, Any]]:
    return [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}]


def test_valid_claims_pass_without_warnings() -> None:
    out = review(spec([req("10Gi"), req(None, "whole")], opaque({**HEAD, "computeLimitPercent": 30})))
    assert out.allowed and out.problems == () and out.warnings == () and out.message == ""


def test_the_schedulers_extended_resource_claim_is_admitted_without_warnings() -> None:
    """The claim kube-scheduler creates for `resources.limits: {gpu.fracgpu.dev/gpu: 2}` (no capacity, a count)."""
    made = extended_resource_claim(
        "p",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        pool="n",
        devices={"gpu-0": ("a", "80Gi"), "gpu-1": ("b", "80Gi")},
    )
    assert review(made["spec"]) == Review()


def test_claims_of_other_classes_and_drivers_are_not_judged() -> None:
    out = review(spec([req("0", device_class="other")], opaque({"anything": True}, driver="other.example.com")))
    assert out.allowed
    assert review_claim_spec(None, "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=None).allowed


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (
            "0",
            "spec.devices.requests[0].exactly.capacity.requests.memory: must be a positive quantity of bytes such as 10Gi or 512Mi, got '0'",
        ),
        ("-1Gi", "got '-1Gi'"),
        ("500m", "(whole bytes; fractions such as '500m' are not allowed)"),
        ("1.5", "fractions such as '1.5'"),
        ("ten", "got 'ten'"),
    ],
)
def test_memory_must_be_a_positive_whole_number_of_bytes(memory: str, expected: str) -> None:
    out = review(spec([req(memory)]))
    assert not out.allowed
    assert expected in out.message


def test_only_memory_and_compute_capacities_are_offered_and_hamis_cores_is_named_compute() -> None:
    out = review(spec([req("1Gi", cores="30", gpumem="2")]))
    assert out.problems == (
        "spec.devices.requests[0].exactly.capacity.requests.cores: unknown capacity; gpu.fracgpu.dev devices offer "
        "only 'memory' and 'compute': HAMi's 'cores' is 'compute' here (percent of the GPU, 100 per GPU), write "
        "capacity.requests.compute: 30",
        "spec.devices.requests[0].exactly.capacity.requests.gpumem: unknown capacity; gpu.fracgpu.dev devices offer "
        "only 'memory' and 'compute'",
    )
    assert (
        review(spec([req(None, **{f"{DRIVER_NAME}/gpucores": "30"})]))
        .problems[0]
        .endswith(
            "HAMi's 'gpucores' is 'compute' here (percent of the GPU, 100 per GPU), write capacity.requests.compute: 30"
        )
    )
    assert review(spec([req(None, **{f"{DRIVER_NAME}/memory": "1Gi"})])).allowed
    assert review(spec([req("1Gi", **{f"{DRIVER_NAME}/compute": "30"})])) == Review()


def test_gpu_config_problems_name_the_field_inside_the_claim() -> None:
    out = review(spec([req("1Gi")], opaque({**HEAD, "computeLimitPercent": 0, "extra": 1})))
    assert out.problems == (
        "spec.devices.config[0].opaque.parameters.extra: unknown field; allowed fields are apiVersion, kind, enforcement, computeLimitPercent, env",
        "spec.devices.config[0].opaque.parameters.computeLimitPercent: must be an integer between 1 and 100, got 0",
    )
    assert "; " in out.message
    missing = review(spec([req("1Gi")], opaque(None)))
    assert missing.problems == (
        "spec.devices.config[0].opaque.parameters must be a JSON object with apiVersion and kind, got null",
    )


def test_a_sharing_config_for_our_driver_is_refused_naming_the_fracgpu_way() -> None:
    """A claim translated from NVIDIA's DRA driver, its TimeSlicing config kept, is refused at `kubectl apply`."""
    time_slicing = {**HEAD, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
    out = review(spec([req(None)], opaque(time_slicing)), prefix="spec.spec")
    assert len(out.problems) == 1
    assert out.problems[0].startswith("spec.spec.devices.config[0].opaque.parameters.sharing: unknown field")
    assert "capacity.requests.memory (e.g. 10Gi), of the DeviceClass gpu.fracgpu.dev" in out.message
    mps = review(spec([req("10Gi")], opaque({**HEAD, "sharing": {"strategy": "MPS"}})))
    assert "of the DeviceClass mps.gpu.fracgpu.dev" in mps.message
    partitions = review(spec([req("10Gi")], opaque({**HEAD, "sharing": {"strategy": "SpacePartitioning"}})))
    assert "of the DeviceClass mig.gpu.fracgpu.dev" in partitions.message
    # another driver's sharing config is that driver's business (issue #30 leaves its warning for later)
    assert review(spec([req("10Gi")], opaque({**HEAD, "sharing": {}}, driver="gpu.nvidia.com"))).allowed


def test_templates_use_their_own_field_path() -> None:
    out = review(spec([req("0")], opaque({**HEAD, "enforcement": "full"})), prefix="spec.spec")
    assert [p.split(":")[0] for p in out.problems] == [
        "spec.spec.devices.requests[0].exactly.capacity.requests.memory",
        "spec.spec.devices.config[0].opaque.parameters.enforcement",
    ]


def test_first_available_alternatives_are_checked_with_their_index() -> None:
    request = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": "40Gi"}}},
            {"name": "small", "deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": "-5"}}},
        ],
    }
    out = review(spec([req("1Gi", name="first"), request]))
    assert len(out.problems) == 1
    assert out.problems[0].startswith("spec.devices.requests[1].firstAvailable[1].capacity.requests.memory:")


def test_requests_larger_than_every_gpu_pass_with_a_warning() -> None:
    out = review(spec([req("81Gi")]))
    assert out.allowed
    (warning,) = out.warnings
    assert warning.startswith("spec.devices.requests[0].exactly.capacity.requests.memory: request 'gpu' asks for 81Gi")
    assert "largest GPU has 80Gi" in warning
    assert review(spec([req("80Gi")])).warnings == ()
    assert review(spec([req("81Gi")]), largest=None).warnings == (), "no GPU published yet: nothing to compare"


def _env(prefix: str, count: int) -> dict[str, str]:
    return {f"{prefix}_{i}": "1" for i in range(count)}


def test_configs_valid_alone_but_invalid_merged_are_refused_per_request() -> None:
    a = {"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": {**HEAD, "env": _env("A", 20)}}}
    b = {"opaque": {"driver": DRIVER_NAME, "parameters": {**HEAD, "env": _env("B", 20)}}}
    out = review(spec([req("1Gi"), req("1Gi", name="other")], [a, b]))
    assert out.problems == (
        "spec.devices.requests[0].exactly: request 'gpu' gets the GpuConfigs spec.devices.config[0], "
        "spec.devices.config[1] merged, and the result is invalid: env: at most 32 entries are allowed, got 40",
    ), "request 'other' gets config[1] alone (20 entries)"
    shared = {**HEAD, "env": _env("A", 20)}
    assert review(spec([req("1Gi")], [a, {"opaque": {"driver": DRIVER_NAME, "parameters": shared}}])).allowed, (
        "the same 20 names twice merge into 20"
    )


def test_the_deviceclass_configs_are_merged_first() -> None:
    claim_config = opaque({**HEAD, "env": _env("B", 20)})
    out = review_claim_spec(
        spec([req("1Gi")], claim_config),
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=None,
        class_configs=[{**HEAD, "env": _env("A", 13)}],
    )
    (problem,) = out.problems
    assert f"GpuConfig 1 of DeviceClass {DEVICE_CLASS_NAME}, spec.devices.config[0] merged" in problem
    assert "got 33" in problem
    broken_class = review_claim_spec(
        spec([req("1Gi")]),
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=None,
        class_configs=[{"kind": "GpuConfig"}],
    )
    assert broken_class.allowed and "claims of it fail to prepare" in broken_class.warnings[0]


@pytest.mark.parametrize(("offered", "warned"), [(False, True), (True, False), (None, False)])
def test_hami_core_asked_where_no_gpu_offers_it_is_warned(offered: bool | None, warned: bool) -> None:
    out = review_claim_spec(
        spec([req("1Gi")], opaque({**HEAD, "enforcement": "hami-core"})),
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=None,
        hami_core_offered=offered,
    )
    assert out.allowed
    assert [w for w in out.warnings if "no published GPU offers it" in w] == (
        [
            "spec.devices.requests[0].exactly: request 'gpu' asks for enforcement 'hami-core', but no published GPU "
            "offers it (no node plugin found the HAMi-core library): the claim's pod fails to start on any node "
            "until one does"
        ]
        if warned
        else []
    )


@pytest.mark.parametrize(("offered", "warned"), [(False, True), (True, False), (None, False)])
def test_nvml_asked_where_no_gpu_offers_it_is_warned(offered: bool | None, warned: bool) -> None:
    out = review_claim_spec(
        spec([req("1Gi")], opaque({**HEAD, "enforcement": "nvml"})),
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=None,
        hami_core_offered=True,
        nvml_offered=offered,
    )
    assert out.allowed
    found = [w for w in out.warnings if "no published GPU offers it" in w]
    assert len(found) == (1 if warned else 0)
    if warned:
        assert found[0].startswith("spec.devices.requests[0].exactly: request 'gpu' asks for enforcement 'nvml'")
        assert "memoryEnforcement" in found[0] and "driverEdits: toolkit" in found[0]


@pytest.mark.parametrize(("offered", "warned"), [(False, True), (True, False), (None, False)])
def test_mps_asked_where_no_gpu_is_an_mps_gpu_is_warned_with_its_path(offered: bool | None, warned: bool) -> None:
    out = review_claim_spec(
        spec([req("10Gi")], opaque({**HEAD, "enforcement": "mps", "computeLimitPercent": 30})),
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=None,
        mps_offered=offered,
    )
    assert out.allowed
    found = [w for w in out.warnings if "no published GPU is an MPS GPU" in w]
    assert len(found) == (1 if warned else 0)
    if warned:
        assert found[0].startswith("spec.devices.requests[0].exactly: request 'gpu' asks for enforcement 'mps'")
        assert "mps.gpus" in found[0]


def test_mps_for_more_than_one_gpu_is_warned() -> None:
    two = req("10Gi")
    two["exactly"]["count"] = 2
    out = review_claim_spec(
        spec([two], opaque({**HEAD, "enforcement": "mps"})),
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=None,
        mps_offered=True,
    )
    assert out.allowed
    (warning,) = out.warnings
    assert warning.startswith("spec.devices.requests[0].exactly: request 'gpu' asks for enforcement 'mps' on more")
    assert "refuses such a claim" in warning


def test_a_thread_percentage_out_of_range_is_refused_with_its_path() -> None:
    out = review(spec([req("10Gi")], opaque({**HEAD, "enforcement": "mps", "computeLimitPercent": 101})))
    assert out.problems == (
        "spec.devices.config[0].opaque.parameters.computeLimitPercent: must be an integer between 1 and 100, got 101",
    )


# Settings dropped or changed on the way (issue 30): warned, never silent.

STEP_256MI = (256 * MiB, 256 * MiB)
"""The (min, step) of the node plugin's published memory requestPolicy.validRange (default --memory-step)."""


def test_a_request_the_request_policy_rounds_up_is_warned_naming_the_grant() -> None:
    out = review_claim_spec(
        spec([req("3000M")]), "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=80 * GiB,
        request_ranges=(STEP_256MI,),
    )  # fmt: skip
    assert out.allowed
    assert out.warnings == (
        "spec.devices.requests[0].exactly.capacity.requests.memory: request 'gpu' asks for 3000M of GPU memory "
        "(3000000000 bytes), which the GPUs' request policy does not grant as asked: the scheduler rounds it up to "
        "a 3072Mi grant where the GPU's memory requestPolicy.validRange has min 256Mi, step 256Mi; the share's "
        "limit, environment and info files are the grant, so ask for 3072Mi to write what it gets",
    )


def test_each_published_request_policy_that_rounds_is_named() -> None:
    out = review_claim_spec(
        spec([req("100Mi")]), "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=80 * GiB,
        request_ranges=(STEP_256MI, (GiB, GiB)),
    )  # fmt: skip
    (warning,) = out.warnings
    assert (
        "rounds it up to a 256Mi grant where the GPU's memory requestPolicy.validRange has min 256Mi, step 256Mi, "
        "and a 1024Mi grant where the GPU's memory requestPolicy.validRange has min 1Gi, step 1Gi;" in warning
    ), warning


@pytest.mark.parametrize(("memory", "ranges"), [("3Gi", (STEP_256MI,)), ("3072Mi", (STEP_256MI,)), ("3000M", ())])
def test_requests_granted_as_asked_or_with_no_published_policy_are_not_warned(
    memory: str, ranges: tuple[tuple[int, int], ...]
) -> None:
    out = review_claim_spec(
        spec([req(memory)]), "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=80 * GiB,
        request_ranges=ranges,
    )  # fmt: skip
    assert out == Review()


NVIDIA_MPS = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi"}},
}


def foreign(requests: list[str] | None) -> list[dict[str, Any]]:
    config: dict[str, Any] = {"opaque": {"driver": "gpu.nvidia.com", "parameters": NVIDIA_MPS}}
    if requests is not None:
        config["requests"] = requests
    return [config]


def review_ours(claim: dict[str, Any]) -> Review:
    return review_claim_spec(
        claim, "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=80 * GiB,
        our_classes={"mps.gpu.fracgpu.dev", "mig.gpu.fracgpu.dev"},
    )  # fmt: skip


@pytest.mark.parametrize("requests", [["gpu"], None])
def test_another_drivers_config_on_only_our_requests_is_warned_as_ignored(requests: list[str] | None) -> None:
    out = review_ours(spec([req("10Gi", device_class="mps.gpu.fracgpu.dev")], foreign(requests)))
    assert out.allowed
    assert out.warnings == (
        "spec.devices.config[0].opaque: a config for driver 'gpu.nvidia.com' on request(s) 'gpu', which only "
        "gpu.fracgpu.dev prepares: gpu.fracgpu.dev ignores other drivers' configs, so none of its settings take "
        "effect; to configure these requests write a GpuConfig (apiVersion fracgpu.dev/v1alpha1, kind GpuConfig) "
        "under opaque with driver: gpu.fracgpu.dev (GPU memory is asked as capacity.requests.memory, compute as "
        "computeLimitPercent)",
    )


def test_another_drivers_config_on_a_first_available_request_of_ours_is_warned() -> None:
    request = {"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": DEVICE_CLASS_NAME}]}
    out = review_ours(spec([request], foreign(["gpu/big"])))
    (warning,) = out.warnings
    assert warning.startswith("spec.devices.config[0].opaque: a config for driver 'gpu.nvidia.com' on request(s) "
                              "'gpu/big', which only gpu.fracgpu.dev prepares")  # fmt: skip


@pytest.mark.parametrize(
    "claim",
    [
        spec([req("10Gi"), req(None, "nic", device_class="nic.example.com")], foreign(None)),
        spec([req("10Gi"), req(None, "nic", device_class="nic.example.com")], foreign(["gpu", "nic"])),
        spec([req(None, "nic", device_class="nic.example.com")], foreign(["nic"])),
        spec([{"name": "gpu", "firstAvailable": [
            {"name": "ours", "deviceClassName": DEVICE_CLASS_NAME},
            {"name": "theirs", "deviceClassName": "gpu.nvidia.com"},
        ]}], foreign(None)),
    ],
)  # fmt: skip
def test_another_drivers_config_that_may_reach_its_own_devices_is_not_warned(claim: dict[str, Any]) -> None:
    assert review_ours(claim) == Review()


def review_compute(
    parameters: dict[str, Any], mps: bool | None, hami_core: bool | None, mps_class: bool | None = None
) -> Review:
    return review_claim_spec(
        spec([req("10Gi")], opaque(parameters)), "spec", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME,
        largest=80 * GiB, mps_offered=mps, hami_core_offered=hami_core, nvml_offered=True, mps_class=mps_class,
    )  # fmt: skip


def test_compute_limit_percent_no_published_gpu_can_enforce_is_warned() -> None:
    out = review_compute({**HEAD, "computeLimitPercent": 30}, mps=False, hami_core=False)
    assert out.allowed
    assert out.warnings == (
        "spec.devices.requests[0].exactly: request 'gpu' sets computeLimitPercent 30, but no published GPU can "
        "enforce it (none is an MPS GPU or offers hami-core): the share gets the GPU's compute unlimited; only the "
        "mps tier applies it, as the MPS active thread percentage (MPS GPUs, attribute mps: ask the DeviceClass "
        "mps.gpu.fracgpu.dev), and the hami-core tier, as CUDA_DEVICE_SM_LIMIT",
    )


@pytest.mark.parametrize("exists", [True, None])
def test_advice_naming_the_mps_class_says_how_to_get_it_where_the_cluster_lacks_it(exists: bool | None) -> None:
    (lacking,) = review_compute(
        {**HEAD, "computeLimitPercent": 30}, mps=False, hami_core=False, mps_class=False
    ).warnings
    assert lacking.endswith(
        "(MPS GPUs, attribute mps: ask the DeviceClass mps.gpu.fracgpu.dev, which this cluster lacks: the chart "
        "creates it with the value deviceClass.mps.create, and its GPUs are those the chart value mps.gpus names), "
        "and the hami-core tier, as CUDA_DEVICE_SM_LIMIT"
    ), lacking
    (there,) = review_compute(
        {**HEAD, "computeLimitPercent": 30}, mps=False, hami_core=False, mps_class=exists
    ).warnings
    assert "lacks" not in there, "an existing (or not yet known) class is named plainly"


def test_compute_limit_percent_with_enforcement_nvml_is_warned_as_not_applied() -> None:
    out = review_compute({**HEAD, "enforcement": "nvml", "computeLimitPercent": 40}, mps=True, hami_core=True)
    (warning,) = out.warnings
    assert warning.startswith(
        "spec.devices.requests[0].exactly: request 'gpu' sets computeLimitPercent 40, but enforcement 'nvml' does "
        "not apply it: the share gets the GPU's compute unlimited;"
    ), warning


@pytest.mark.parametrize(
    ("mps", "hami_core"), [(True, False), (False, True), (None, None)]
)  # fmt: skip
def test_compute_limit_percent_some_gpu_can_enforce_or_none_published_is_not_warned(
    mps: bool | None, hami_core: bool | None
) -> None:
    assert review_compute({**HEAD, "computeLimitPercent": 30}, mps=mps, hami_core=hami_core) == Review()


# --- a capacity-less request in a ResourceClaim pods share ------------------------------------------------

MPS_CLASS = "mps.gpu.fracgpu.dev"
MIG_CLASS = "mig.gpu.fracgpu.dev"


def standalone(spec: dict[str, Any], standalone: bool = True) -> Review:
    return review_claim_spec(
        spec,
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=80 * GiB,
        our_classes={MPS_CLASS, MIG_CLASS},
        shared_classes={MPS_CLASS},
        standalone=standalone,
    )


def test_a_whole_gpu_request_in_a_resource_claim_is_warned_as_shared_by_its_pods() -> None:
    out = standalone(spec([req(None, "whole"), req("10Gi", "share")]))
    (warning,) = out.warnings
    assert out.allowed
    assert warning.startswith(
        "spec.devices.requests[0].exactly: request 'whole' asks for no capacity.requests.memory, so it takes a whole "
        "GPU (all of its memory: no share can join it), and every pod that references this ResourceClaim shares"
    ), warning
    assert "write a ResourceClaimTemplate whose request asks for capacity.requests.memory" in warning


def test_whole_gpu_warnings_name_each_alternative_and_the_count() -> None:
    counted = {"name": "two", "exactly": {"deviceClassName": MPS_CLASS, "count": 2}}
    every = {"name": "all", "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "allocationMode": "All"}}
    listed = {
        "name": "pick",
        "firstAvailable": [
            {"name": "small", "deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": "4Gi"}}},
            {"name": "whole", "deviceClassName": DEVICE_CLASS_NAME},
        ],
    }
    warnings = standalone(spec([counted, every, listed])).warnings
    assert [w.split(":")[0] for w in warnings] == [
        "spec.devices.requests[0].exactly",
        "spec.devices.requests[1].exactly",
        "spec.devices.requests[2].firstAvailable[1]",
    ]
    assert "request 'two' asks for no capacity.requests.memory, so it takes 2 whole GPUs" in warnings[0]
    assert "so it takes every matching GPU of its node, each whole" in warnings[1]
    assert "request 'pick/whole' asks for no capacity.requests.memory" in warnings[2]


@pytest.mark.parametrize(
    ("requests", "is_standalone"),
    [
        ([req(None)], False),  # a template's request: each pod gets its own claim
        ([req(None, device_class=MIG_CLASS)], True),  # a MIG partition is never shared: nothing to join
        ([req(None, device_class="other.example.com")], True),  # not ours
        ([{"name": "watch", "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "adminAccess": True}}], True),
        ([req("1Gi")], True),
    ],
)
def test_whole_gpu_requests_that_are_not_warned(requests: list[dict[str, Any]], is_standalone: bool) -> None:
    warnings = standalone(spec(requests), standalone=is_standalone).warnings
    assert not [w for w in warnings if "every pod that references this ResourceClaim" in w]
    assert warnings == () or requests[0]["exactly"].get("adminAccess")  # adminAccess has its own warning


def test_the_schedulers_extended_resource_claim_is_recognised_by_its_annotation() -> None:
    made = extended_resource_claim(
        "p", driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, pool="n", devices={"gpu-0": ("a", "80Gi")}
    )
    assert is_extended_resource_claim(made)
    assert not is_extended_resource_claim({"metadata": {"name": "p-extended-resources-x", "annotations": {}}})
    assert not is_extended_resource_claim({"metadata": {"annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "no"}}})
    assert not is_extended_resource_claim({})


# --- selectors that read what no fracgpu device publishes --------------------------------------------------


def selected(*expressions: str, device_class: str = DEVICE_CLASS_NAME) -> dict[str, Any]:
    request = req("1Gi", device_class=device_class)
    request["exactly"]["selectors"] = [{"cel": {"expression": e}} for e in expressions]
    return request


A = f'device.attributes["{DRIVER_NAME}"]'
C = f'device.capacity["{DRIVER_NAME}"]'


@pytest.mark.parametrize(
    ("expression", "read", "meant"),
    [
        (f'{A}.model == "A100"', f"{A}.model", f"{A}.productName"),
        (f"{A}.Productname == 'A100'", f"{A}.Productname", f"{A}.productName"),  # a close spelling
        (f"{C}.gpumem.compareTo(quantity('10Gi')) >= 0", f"{C}.gpumem", f"{C}.memory"),  # HAMi's name
        (f"{C}.cores.compareTo(quantity('30')) >= 0", f"{C}.cores", f"{C}.compute"),  # HAMi's name
        (f"{A}.memory.compareTo(quantity('10Gi')) >= 0", f"{A}.memory", f"{C}.memory"),  # a capacity, not attribute
        (f'{A}.pcieBusID == "0000:3b:00.0"', f"{A}.pcieBusID", 'device.attributes["resource.kubernetes.io"].pciBusID'),
        (
            'device.attributes["gpu.nvidia.com"].productName == "x"',
            'device.attributes["gpu.nvidia.com"].productName',
            f"{A}.productName",
        ),
    ],
)
def test_a_selector_reading_an_unpublished_name_is_warned_with_the_published_one(
    expression: str, read: str, meant: str
) -> None:
    (warning,) = review(spec([selected(expression)])).warnings
    assert warning.startswith(
        f"spec.devices.requests[0].exactly.selectors[0].cel.expression: request 'gpu' reads {read}"
    )
    assert warning.endswith(f"; did you mean {meant}?"), warning
    assert " has the attribute names " not in warning  # the list only where nothing is close
    assert 'is an error on every device (CEL: "no such key")' in warning


def test_unpublished_tests_domains_and_drivers_say_what_they_do() -> None:
    out = review(
        spec(
            [
                selected(f'"profilename" in {A}', f'{A}.foo == "x"'),
                selected('device.driver == "gpu.nvidia.com"'),
            ]
        )
    )
    tested, unknown, driver = out.warnings
    assert f"reads {A}.profilename, but no {DRIVER_NAME} device publishes attribute 'profilename'" in tested
    assert (
        "so it is absent on every device (a test of it is false, an optional read has no value); did you mean" in tested
    )
    assert unknown.startswith("spec.devices.requests[0].exactly.selectors[1].cel.expression:")
    assert f"{DRIVER_NAME} has the attribute names architecture, " in unknown  # no close name: the list
    assert "productName" in unknown
    assert driver.startswith("spec.devices.requests[1].exactly.selectors[0].cel.expression: request 'gpu' reads ")
    assert f'the comparison is false on every device; write device.driver == "{DRIVER_NAME}" or drop it' in driver


def test_published_names_are_not_warned() -> None:
    expressions = [
        f'{A}.productName.contains("H100") && {A}.type == "gpu" && {A}.mps',
        f'{C}.memory.compareTo(quantity("40Gi")) >= 0 && {C}.mpsClients.isGreaterThan(quantity("1"))',
        'device.attributes["resource.kubernetes.io"].pcieRoot != "" && device.attributes["resource.kubernetes.io"]'
        ".numaNode >= 0",
        f'device.driver == "{DRIVER_NAME}" && "profile" in {A}',
    ]
    assert review(spec([selected(*expressions)])).warnings == ()


def test_selectors_of_first_available_and_of_our_other_classes_are_read_and_others_not() -> None:
    listed = {
        "name": "pick",
        "firstAvailable": [
            {"name": "mig", "deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression": f"{A}.gi == 1"}}]},
            {"name": "gpu", "deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"memory": "1Gi"}}},
        ],
    }
    other = selected(f"{A}.model == 'x'", device_class="other.example.com")
    (warning,) = standalone(spec([listed, other])).warnings
    assert warning.startswith(
        "spec.devices.requests[0].firstAvailable[0].selectors[0].cel.expression: request 'pick/mig'"
    )


def admin(memory: object = None) -> dict[str, Any]:
    """An adminAccess request, as Kubernetes' docs write one (no capacity) or with a memory amount."""
    request = req(memory, name="mon")
    request["exactly"]["adminAccess"] = True
    return request


def test_an_admin_access_request_without_capacity_is_warned_that_it_waits_for_an_empty_gpu() -> None:
    out = review(spec([admin()]))
    assert out.allowed
    assert out.warnings == (
        "spec.devices.requests[0].exactly: request 'mon' has adminAccess and no capacity: to place it, the scheduler "
        "charges it the GPU's default memory request (all of the GPU's memory), though it never counts an "
        "admin-access allocation once made, so it stays Pending while any share is on the GPU; write capacity: "
        "{requests: {memory: 0}} to reach any GPU, busy or not",
    )


def test_memory_0_is_admitted_on_an_admin_access_request_only() -> None:
    ranges = [(0, 256 * MiB), (256 * MiB, 256 * MiB)]  # a node plugin of this release and one before it
    out = review_claim_spec(
        spec([admin("0")]),
        "spec",
        driver=DRIVER_NAME,
        device_class=DEVICE_CLASS_NAME,
        largest=80 * GiB,
        request_ranges=ranges,
    )
    assert out == Review()  # no rounding warning either: an admin-access allocation has no grant
    assert review(spec([req("0")])).problems == (
        "spec.devices.requests[0].exactly.capacity.requests.memory: must be a positive quantity of bytes such as "
        "10Gi or 512Mi, got '0'",
    )
    assert review(spec([admin("-1")])).problems == (
        "spec.devices.requests[0].exactly.capacity.requests.memory: must be 0 (the adminAccess way: placed on any "
        "GPU) or a positive quantity of bytes such as 10Gi, got '-1'",
    )


def test_an_admin_access_request_with_memory_is_warned_that_it_needs_that_much_free() -> None:
    out = review(spec([admin("1Gi")]))
    assert out.allowed
    assert out.warnings == (
        "spec.devices.requests[0].exactly.capacity.requests.memory: request 'mon' has adminAccess, which reserves no "
        "memory, but the scheduler places it only on a GPU with 1Gi free; write memory: 0 to reach any GPU, busy "
        "or not",
    )
