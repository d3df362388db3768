"""kopf's own event processing and indexes, fed with watch events in a unit test (no API server).

`KopfWorld` registers the controller's real handlers (`controller.handlers.register`) in a kopf registry and
passes each event through `kopf._core.reactor.processing.process_resource_event`, the function kopf's watch
loop calls: its indexers update the indexes exactly as in the running operator (including keeping a value
when an indexer returns None), then the `on.event` handlers run. Only kopf internals made for tests are
used (the optional arguments kopf documents as "None for tests").
"""

import asyncio
from typing import Any

import kopf
from kopf._cogs.structs.ephemera import AnyMemo
from kopf._cogs.structs.references import Resource
from kopf._core.actions.lifecycles import all_at_once
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.reactor.inventory import ResourceMemories
from kopf._core.reactor.processing import process_resource_event

from api.gpu import GPU_PLURAL, GPU_VERSION
from api.names import API_GROUP
from controller import handlers
from controller.loops import Controller

RESOURCES = {
    "ResourceClaim": Resource("resource.k8s.io", "v1", "resourceclaims", kind="ResourceClaim", namespaced=True),
    "ResourceSlice": Resource("resource.k8s.io", "v1", "resourceslices", kind="ResourceSlice", namespaced=False),
    "DeviceClass": Resource("resource.k8s.io", "v1", "deviceclasses", kind="DeviceClass", namespaced=False),
    "DeviceTaintRule": Resource("resource.k8s.io", "v1", "devicetaintrules", kind="DeviceTaintRule", namespaced=False),
    "GPU": Resource(API_GROUP, GPU_VERSION, GPU_PLURAL, kind="GPU", namespaced=False),
}


class KopfWorld:
    """The controller's handlers in a kopf registry, with kopf's indexers bound to `controller`."""

    def __init__(self, controller: Controller) -> None:
        self.registry = kopf.OperatorRegistry()
        handlers.register(self.registry, controller.settings, controller)
        self.indexers = OperatorIndexers()
        self.indexers.ensure(self.registry._indexing.get_all_handlers())
        self.memories = ResourceMemories()
        self.settings = kopf.OperatorSettings()
        self._uids: dict[tuple[str, str, str], str] = {}
        controller.bind(
            *(self.index(i) for i in handlers.INDEX_IDS), taint_rules=self.index(handlers.TAINT_RULES_INDEX)
        )

    def index(self, id_: str) -> kopf.Index[Any, Any]:
        """kopf's live index of the handler `id_`."""
        index: kopf.Index[Any, Any] = self.indexers.indices[id_]
        return index

    async def event(self, type_: str | None, body: dict[str, Any]) -> None:
        """One watch event (`ADDED`, `MODIFIED`, `DELETED`; None: seen in the initial listing)."""
        meta = body.setdefault("metadata", {})
        ident = (body["kind"], meta.get("namespace", ""), meta["name"])
        meta.setdefault("uid", self._uids.setdefault(ident, f"uid-{'-'.join(ident)}"))
        await process_resource_event(
            lifecycle=all_at_once,
            indexers=self.indexers,
            registry=self.registry,
            settings=self.settings,
            memories=self.memories,
            memobase=AnyMemo(kopf.Memo()),
            resource=RESOURCES[body["kind"]],
            raw_event={"type": type_, "object": body},  # type: ignore[typeddict-item]  # None: listed
            event_queue=asyncio.Queue(),
            no_throttling=True,
        )
