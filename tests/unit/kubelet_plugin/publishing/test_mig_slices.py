"""The ResourceSlices of MIG GPUs (kubelet_plugin/publishing/slices.py): the counter model, the partitions'
attributes, never a MIG GPU whole, a partition's memory exactly its own (a grant is never below its request), and
the publication order that makes the scheduler's first fit the partition that draws the fewest counters. The order is checked here with a first-fit allocator over the published slices, as kube-scheduler's
walks them (pools, then slices by name, then devices in order, skipping those whose counters are spent); the
real scheduler does the same in tests/integration/test_mig.py."""

from __future__ import annotations

from typing import Any

import pytest

from api import mig as names
from api import published
from api.names import DRIVER_NAME, MEMORY_CAPACITY, NUMA_NODE_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE
from api.quantity import MiB, to_bytes
from kubelet_plugin.core.model import MigGpu, MigProfile
from kubelet_plugin.kinds.mig.publish import mig_devices
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.fake_mig import H100_MIG, PRODUCTS
from tests.unit.harness.test_mock_mig import TABLES
from tests.unit.kubelet_plugin.publishing.test_slices import NODE, NODE_UID, STEP, gpu

GPUS = [gpu(0), gpu(1), gpu(2)]


def slices(mig: dict[str, MigGpu], taints: dict[str, list[dict[str, str]]] | None = None) -> list[dict[str, Any]]:
    return build_slices(NODE, NODE_UID, DRIVER_NAME, GPUS, step=STEP, reserve=0, generation=1, mig=mig, taints=taints)


def devices(built: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in built for d in s["spec"].get("devices", [])]


def attr(device: dict[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


class FirstFit:
    """kube-scheduler's structured allocator for one request of count 1 on our pool, as it walks it."""

    def __init__(self, built: list[dict[str, Any]]) -> None:
        ordered = sorted(built, key=lambda s: s["metadata"]["name"])
        self.devices = [d for s in ordered for d in s["spec"].get("devices", [])]
        self.counters = {
            cs["name"]: {c: int(v["value"]) for c, v in cs["counters"].items()}
            for s in built
            for cs in s["spec"].get("sharedCounters", [])
        }
        self.taken: set[str] = set()

    def allocate(self, memory: str, kind: str = names.TYPE_MIG) -> str | None:
        for device in self.devices:
            if device["name"] in self.taken or attr(device, names.TYPE_ATTRIBUTE) != kind:
                continue
            if to_bytes(device["capacity"][MEMORY_CAPACITY]["value"]) < to_bytes(memory):
                continue
            use = device.get("consumesCounters", [])
            if any(self.counters[u["counterSet"]][c] < int(v["value"]) for u in use for c, v in u["counters"].items()):
                continue
            for u in use:
                for c, v in u["counters"].items():
                    self.counters[u["counterSet"]][c] -= int(v["value"])
            self.taken.add(device["name"])
            return f"{attr(device, 'index')}:{attr(device, names.PROFILE_ATTRIBUTE)}@{attr(device, names.PLACEMENT_ATTRIBUTE)}"
        return None


def test_a_mig_gpu_is_never_offered_whole_or_as_a_share() -> None:
    built = slices({"gpu-1": H100_MIG})
    by_name = {d["name"]: d for d in devices(built)}
    parent = by_name["gpu-1"]
    assert attr(parent, names.TYPE_ATTRIBUTE) == names.TYPE_MIG_PARENT
    assert "allowMultipleAllocations" not in parent and "requestPolicy" not in parent["capacity"][MEMORY_CAPACITY]
    assert {"key": names.PARENT_TAINT_KEY, "value": "enabled", "effect": "NoSchedule"} in parent["taints"]
    assert [attr(d, names.TYPE_ATTRIBUTE) for n, d in by_name.items() if n in ("gpu-0", "gpu-2")] == ["gpu", "gpu"]
    assert not [d for d in devices(built) if attr(d, names.TYPE_ATTRIBUTE) == names.TYPE_GPU and attr(d, "index") == 1]


def test_counters_one_per_memory_slice_and_the_compute_slices_in_a_slice_of_their_own() -> None:
    built = slices({"gpu-1": H100_MIG, "gpu-2": H100_MIG})
    counter_slices = [s for s in built if "sharedCounters" in s["spec"]]
    assert [s["metadata"]["name"] for s in counter_slices] == [f"{NODE}-{DRIVER_NAME}-counters-0"]
    assert all("devices" not in s["spec"] for s in counter_slices)
    sets = counter_slices[0]["spec"]["sharedCounters"]
    assert [cs["name"] for cs in sets] == ["gpu-1", "gpu-2"]
    assert sets[0]["counters"] == {
        **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
        "compute-slices": {"value": "7"},
    }
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in built} == {len(built)}


def test_a_partition_consumes_its_placements_memory_slices_and_its_compute_slices() -> None:
    built = slices({"gpu-1": H100_MIG})
    part = next(d for d in devices(built) if d["name"] == names.partition_device_name(1, "3g.40gb", 4))
    assert part["consumesCounters"] == [
        {"counterSet": "gpu-1", "counters": {
            "memory-slice-4": {"value": "1"}, "memory-slice-5": {"value": "1"}, "memory-slice-6": {"value": "1"},
            "memory-slice-7": {"value": "1"}, "compute-slices": {"value": "3"}}}
    ]  # fmt: skip
    assert attr(part, names.PROFILE_ATTRIBUTE) == "3g.40gb" and attr(part, "productName") == "NVIDIA H100 80GB HBM3"
    assert attr(part, "uuid") == GPUS[1].uuid and attr(part, "index") == 1, "the parent's uuid and index"
    assert attr(part, names.PARTITION_MEMORY_ATTRIBUTE) == 40448 and attr(part, "memoryEnforcement") == "mig"
    assert part["capacity"][MEMORY_CAPACITY] == {"value": "40448Mi"}, "exactly the partition's memory"
    assert "allowMultipleAllocations" not in part


@pytest.mark.parametrize("memory_mib", [9984, 16384, 4864, 143360])
def test_the_published_memory_is_exactly_the_partitions(memory_mib: int) -> None:
    assert names.partition_memory(memory_mib) == memory_mib * MiB


@pytest.mark.parametrize(
    ("request_memory", "expected"),
    [("9984Mi", "1g.10gb"), ("1Gi", "1g.10gb"), ("10Gi", "1g.20gb"), ("12Gi", "1g.20gb"), ("19Gi", "1g.20gb"),
     ("20096Mi", "1g.20gb"), ("20Gi", "3g.40gb"), ("30Gi", "3g.40gb"), ("40448Mi", "3g.40gb"), ("40Gi", "7g.80gb"),
     ("81152Mi", "7g.80gb"), ("80Gi", None)],
)  # fmt: skip
def test_the_first_fit_is_the_partition_of_fewest_counters_that_holds_the_request(
    request_memory: str, expected: str | None
) -> None:
    """A grant is never below its request: 10Gi does not fit a 1g.10gb (9984 MiB) and 80Gi fits no partition of
    an H100 80GB; 12Gi and 19Gi get a 1g.20gb (two memory slices, one compute slice), never a 2g.20gb."""
    got = FirstFit(slices({"gpu-1": H100_MIG})).allocate(request_memory)
    assert (got.split(":")[1].split("@")[0] if got else None) == expected, got


def test_the_product_tables_are_the_mock_drivers() -> None:
    """The tables the order is tested on are those the mock driver serves (harness/mocknvml/mock_mig.c, held to
    NVIDIA's `nvidia-smi mig -lgip` listings by tests/unit/harness/test_mock_mig.py)."""
    by_index = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA A100-SXM4-40GB", 2: "NVIDIA A100-SXM4-80GB", 3: "NVIDIA H200"}
    for index, product in by_index.items():
        mock = sorted((n, i, mib, sms, starts) for n, i, mib, sms, _, starts in TABLES[index] if "+" not in n)
        ours = sorted(
            (p.name, p.profile_id, p.memory_mib, p.multiprocessors, list(p.placements)) for p in PRODUCTS[product]
        )
        assert ours == mock, product
        assert all(p.name.startswith(f"{p.compute_slices}g.") for p in PRODUCTS[product]), product


def _product_fit(product: str, gpus: int = 1) -> FirstFit:
    placed = [gpu(i, product_name=product) for i in range(gpus)]
    mig = {g.device_name: _mig(product) for g in placed}
    return FirstFit(build_slices(NODE, NODE_UID, DRIVER_NAME, placed, step=STEP, reserve=0, generation=1, mig=mig))


def _mig(product: str) -> MigGpu:
    return MigGpu(state="enabled", memory_slices=8, compute_slices=7, profiles=PRODUCTS[product])


def _fewest(profiles: tuple[MigProfile, ...], memory_mib: int) -> MigProfile:
    """The profile the rule gives `memory_mib`: of those that hold it, the fewest memory then compute slices."""
    return min(
        (p for p in profiles if p.memory_mib >= memory_mib),
        key=lambda p: names.size_key(p.memory_slices, p.compute_slices),
    )


@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_every_profiles_memory_and_just_above_the_next_smaller_get_the_partition_of_fewest_counters(
    product: str,
) -> None:
    profiles = PRODUCTS[product]
    sizes = sorted({p.memory_mib for p in profiles})
    by_name = {p.name: p for p in profiles}
    for memory_mib in (*sizes, *(s + 1 for s in sizes[:-1])):
        got = _product_fit(product).allocate(f"{memory_mib}Mi")
        assert got is not None, (product, memory_mib)
        taken = by_name[got.split(":")[1].split("@")[0]]
        holding = [p for p in profiles if p.memory_mib >= memory_mib]
        assert taken.memory_mib >= memory_mib, (product, memory_mib, taken.name)
        assert taken == _fewest(profiles, memory_mib), (product, memory_mib, taken.name)
        assert taken.memory_slices + taken.compute_slices == min(p.memory_slices + p.compute_slices for p in holding)
        assert taken.memory_mib == min(p.memory_mib for p in holding), "and the least memory that holds it"
    assert _product_fit(product).allocate(f"{sizes[-1] + 1}Mi") is None, "more than the largest: no partition"


ORDER = {
    "NVIDIA A100-SXM4-40GB": ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "NVIDIA A100-SXM4-80GB": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "NVIDIA H100 80GB HBM3": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "NVIDIA H200": ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
}
"""The tables of docs/architecture.md ("MIG partitions"): each product's profiles, smallest first."""


@pytest.mark.parametrize("product", sorted(ORDER))
def test_the_publication_order_is_the_documented_table(product: str) -> None:
    order = [d.profile.name for d in mig_devices([gpu(0, product_name=product)], {"gpu-0": _mig(product)})]
    assert list(dict.fromkeys(order)) == ORDER[product], "every placement of a profile before the next profile"
    memory = [next(p.memory_mib for p in PRODUCTS[product] if p.name == n) for n in ORDER[product]]
    assert memory == sorted(memory), "on one GPU memory never shrinks along the order"


def test_a_larger_profile_is_not_taken_while_a_smaller_one_fits() -> None:
    fit = FirstFit(slices({"gpu-1": H100_MIG, "gpu-2": H100_MIG}))
    got = [fit.allocate("9984Mi") for _ in range(7)]
    assert got == [f"1:1g.10gb@{s}" for s in (6, 5, 4, 3, 2, 1, 0)], "one GPU is filled first, from the top"
    assert fit.allocate("9984Mi") == "2:1g.10gb@6", "then the next GPU: never a 2g.20gb of the full one"
    fit = FirstFit(slices({"gpu-1": H100_MIG, "gpu-2": H100_MIG}))
    got = [fit.allocate("10Gi") for _ in range(5)]
    assert got == [*(f"1:1g.20gb@{s}" for s in (6, 4, 2, 0)), "2:1g.20gb@6"], "four 1g.20gb fill a GPU's memory"


def test_mixed_requests_in_any_order_fit_one_gpu() -> None:
    for order in (
        ["9Gi", "15Gi", "30Gi"],
        ["30Gi", "15Gi", "9Gi"],
        ["15Gi", "30Gi", "9Gi"],
        ["30Gi", "9Gi", "15Gi"],
    ):
        fit = FirstFit(slices({"gpu-1": H100_MIG}))
        got = sorted(g.split(":")[1].split("@")[0] for g in (fit.allocate(m) for m in order) if g)
        assert got == ["1g.10gb", "1g.20gb", "3g.40gb"], order
    fit = FirstFit(slices({"gpu-1": H100_MIG}))
    assert [fit.allocate("39Gi"), fit.allocate("39Gi"), fit.allocate("1Gi")] == ["1:3g.40gb@4", "1:3g.40gb@0", None]


@pytest.mark.parametrize("state", ["disabled", "pending-enable", "unsupported", "error"])
def test_a_mig_gpu_without_mig_publishes_only_itself_and_why(state: str) -> None:
    built = slices({"gpu-1": MigGpu(state=state)})
    parent = next(d for d in devices(built) if d["name"] == "gpu-1")
    assert attr(parent, names.STATE_ATTRIBUTE) == state
    assert not any("sharedCounters" in s["spec"] for s in built)
    assert not [d for d in devices(built) if attr(d, names.TYPE_ATTRIBUTE) == names.TYPE_MIG]
    assert [d["name"] for d in devices(built) if attr(d, names.TYPE_ATTRIBUTE) == "gpu"] == ["gpu-0", "gpu-2"]


def test_slices_keep_the_limits_of_the_api() -> None:
    many = [gpu(i) for i in range(12)]
    built = build_slices(
        NODE,
        NODE_UID,
        DRIVER_NAME,
        many,
        step=STEP,
        reserve=0,
        generation=1,
        mig={g.device_name: H100_MIG for g in many},
    )
    for s in built:
        spec = s["spec"]
        assert len(spec.get("devices", [])) <= 64 and len(spec.get("sharedCounters", [])) <= 8
    mig_names = [s["metadata"]["name"] for s in built if s["metadata"]["name"].startswith(f"{NODE}-{DRIVER_NAME}-mig-")]
    assert mig_names == sorted(mig_names) and len(mig_names) == -(-12 * 18 // 64)
    order = [
        d["name"]
        for s in sorted(built, key=lambda s: s["metadata"]["name"])
        for d in s["spec"].get("devices", [])
        if "-mig-" in d["name"]
    ]
    assert order == [d.name for d in mig_devices(many, {g.device_name: H100_MIG for g in many})]


def test_a_gpu_wide_taint_reaches_every_partition_and_a_partitions_only_it() -> None:
    xid = {"key": "gpu.fracgpu.dev/xid", "value": "79-fell-off", "effect": "NoExecute"}
    one = {"key": "gpu.fracgpu.dev/xid", "value": "31", "effect": "NoSchedule"}
    small = names.partition_device_name(1, "1g.10gb", 6)
    built = slices({"gpu-1": H100_MIG}, {"gpu-1": [xid], small: [one]})
    by_name = {d["name"]: d for d in devices(built)}
    assert all(xid in d["taints"] for n, d in by_name.items() if n.startswith("gpu-1"))
    assert by_name[small]["taints"] == [xid, one]
    assert one not in by_name[names.partition_device_name(1, "1g.10gb", 5)]["taints"]


def test_every_name_published_is_in_the_list_admission_reads() -> None:
    """api/published.py is the list admission warns against: a name published and missing there would make
    admission warn of a selector that matches."""
    built = build_slices(
        NODE,
        NODE_UID,
        DRIVER_NAME,
        [gpu(0, pcie_root="pci0000:17", numa_node=0), *GPUS[1:], gpu(3), gpu(4)],
        step=STEP,
        reserve=0,
        generation=1,
        mig={GPUS[0].device_name: H100_MIG, GPUS[1].device_name: H100_MIG.model_copy(update={"state": "disabled"})},
        hami_core=True,
        enforcement={gpu(3).device_name: "mps", gpu(4).device_name: "nvml"},
    )
    attributes: dict[str, set[str]] = {}
    capacities: dict[str, set[str]] = {}
    for device in devices(built):
        for name in device["attributes"]:
            domain, _, short = name.rpartition("/")
            attributes.setdefault(domain or DRIVER_NAME, set()).add(short)
        for name in device.get("capacity", {}):
            domain, _, short = name.rpartition("/")
            capacities.setdefault(domain or DRIVER_NAME, set()).add(short)
    assert {names.TYPE_MIG, names.TYPE_MIG_PARENT, names.TYPE_GPU} <= {attr(d, "type") for d in devices(built)}
    for domain, found in attributes.items():
        assert found <= published.attributes(DRIVER_NAME).get(domain, frozenset()), domain
    for domain, found in capacities.items():
        assert found <= published.capacities(DRIVER_NAME).get(domain, frozenset()), domain
    # and every name listed is published on some device
    assert attributes[DRIVER_NAME] == published.DRIVER_ATTRIBUTES
    assert attributes[published.STANDARD_DOMAIN] == published.STANDARD_ATTRIBUTES
    assert capacities[DRIVER_NAME] == published.DRIVER_CAPACITIES


def test_a_mig_gpu_and_each_of_its_partitions_carry_the_gpus_topology() -> None:
    placed = [gpu(0, pcie_root="pci0000:17", numa_node=0), gpu(1, pcie_root="pci0000:29")]
    built = build_slices(NODE, NODE_UID, DRIVER_NAME, placed, step=STEP, reserve=0, generation=1, mig={
        "gpu-0": H100_MIG, "gpu-1": H100_MIG})  # fmt: skip
    by_gpu: dict[int, set[tuple[Any, ...]]] = {}
    for device in devices(built):
        attributes = device["attributes"]
        topology = (
            attributes.get(PCIE_ROOT_ATTRIBUTE, {}).get("string"),
            attributes.get(NUMA_NODE_ATTRIBUTE, {}).get("int"),
        )
        by_gpu.setdefault(attr(device, "index"), set()).add(topology)
    assert by_gpu == {0: {("pci0000:17", 0)}, 1: {("pci0000:29", None)}}
    assert sum(1 for d in devices(built) if attr(d, names.TYPE_ATTRIBUTE) == names.TYPE_MIG) > 2  # partitions too
