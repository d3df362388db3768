"""Unit tests of the controller's one claim -> devices index (controller/devices/claim_index.py) and of its use by
the entry (controller/loops.py): updated once per claim event, read by the ledger and the MPS trust domains."""

import asyncio

from controller.core.context import Context
from controller.core.settings import Settings
from controller.devices.claim_index import ClaimIndex
from controller.loops import Controller
from tests.unit.controller_factories import NODE, FakeWriter, World, claim, result

GPU_0, GPU_1 = (NODE, "gpu-0"), (NODE, "gpu-1")


def index_over(world: World) -> ClaimIndex:
    context = Context(Settings(), FakeWriter())
    context.bind(context.indexes._replace(slices=world.slices, claims=world.claims, gpus=world.gpus))
    return ClaimIndex(context)


def test_a_claim_moves_between_devices_and_leaves() -> None:
    world = World()
    index = index_over(world)
    key = world.put(claim("a", results=[result("gpu", "gpu-0", "1Gi", "s-1")]))
    assert index.update(key) == {GPU_0} and index.knows(key)
    world.put(claim("a", results=[result("gpu", "gpu-1", "1Gi", "s-1"), result("gpu", "gpu-1", "1Gi", "s-2")]))
    assert index.update(key) == {GPU_0, GPU_1}, "the devices it was and is on"
    assert index.claims_on(GPU_0) == frozenset() and index.claims_on(GPU_1) == {key}
    assert index.devices_of(key) == {GPU_1}
    world.put(claim("a"))  # deallocated: still ours, on nothing
    assert index.update(key) == {GPU_1} and index.knows(key) and index.claims_on(GPU_1) == frozenset()
    del world.claims[key]
    assert index.update(key) == frozenset() and not index.knows(key), "gone from kopf's index: gone from this one"
    other = world.put(claim("b", results=[result("gpu", "gpu-0", "1Gi", "s-3")]))
    index.update(other)
    assert index.remove(other) == {GPU_0} and index.claims_on(GPU_0) == frozenset()


def test_a_rebuild_finds_what_the_events_built() -> None:
    world = World()
    index = index_over(world)
    keys = [world.put(claim(n, results=[result("gpu", d, "1Gi", n)])) for n, d in (("a", "gpu-0"), ("b", "gpu-0"))]
    for key in keys:
        index.update(key)
    rebuilt = index_over(world)
    rebuilt.rebuild()
    assert rebuilt.claims_on(GPU_0) == index.claims_on(GPU_0) == set(keys)
    assert [rebuilt.devices_of(k) for k in keys] == [index.devices_of(k) for k in keys]


def test_the_ledger_and_the_mps_domains_read_the_entrys_one_index() -> None:
    async def main() -> None:
        world, writer = World(), FakeWriter()
        controller = Controller(Settings(ledger_delay_seconds=0.0, mps=True), writer)
        controller.bind(world.slices, world.claims, world.gpus)
        key = world.put(claim("a", results=[result("gpu", "gpu-1", "10Gi", "s-1")]))
        controller.claim_changed(key)  # the one update, by the entry
        assert controller.claim_index.claims_on(GPU_1) == {key}
        assert await controller.ledger.reconcile({f"{NODE}-gpu-1"})
        status = writer.gpu_status[f"{NODE}-gpu-1"]
        assert status["allocatedMemory"] == "10Gi", "the ledger found the claim through the shared index"
        controller.claim_index.reset()  # the ledger keeps no index of its own: without the shared one, no claim
        assert await controller.ledger.reconcile({f"{NODE}-gpu-1"})
        assert writer.gpu_status[f"{NODE}-gpu-1"]["allocatedMemory"] == "0"
        await controller.stop()

    asyncio.run(main())
