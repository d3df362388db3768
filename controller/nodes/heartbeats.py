"""The node plugins' heartbeats, as the ledger shows them: each node's `PluginReporting` condition.

With a namespace (`POD_NAMESPACE`), the heartbeat Leases are listed a few times per `--plugin-heartbeat-timeout`
and each listing planned by `plan_plugin_reporting`; the nodes whose condition changed are handed to `on_changed`
(the ledger marks their GPUs). A ledger pass over a node that no listing covered yet (the controller's first
pass, a node whose GPUs were just published) lists them first (`cover`), so that a GPU object's first status
already says whether its plugin reports: the node plugin renews its Lease before it publishes its slices. A failed
listing changes nothing: the controller's own outage says nothing about the plugins. Until a listing succeeds the
conditions the ledger holds stand (a restart keeps their times).
"""

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from api.gpu import PLUGIN_REPORTING_CONDITION
from controller.core.context import Context, Tasks
from controller.core.kube import describe
from controller.devices.catalogue import DeviceCatalogue
from controller.nodes.plan import Heartbeat, observe, plan_plugin_reporting, unchecked_reporting

log = logging.getLogger(__name__)
Condition = dict[str, Any]
Reporting = Callable[[str], Condition | None]
"""A node -> its `PluginReporting` condition for its GPU objects (None: none is written)."""


class NodeReporting:
    """Heartbeat listings and each node's `PluginReporting` condition."""

    def __init__(self, context: Context, catalogue: DeviceCatalogue, on_changed: Callable[[set[str]], None]) -> None:
        self._context = context
        self._catalogue = catalogue
        self._on_changed = on_changed
        self._heartbeats: dict[str, Heartbeat] = {}
        self._planned: dict[str, Condition] | None = None  # node -> condition; None: not listed yet
        self._listing = asyncio.Lock()
        self._failed_at: float | None = None  # monotonic time of the last failed listing
        self._tasks = Tasks()

    def start(self) -> None:
        namespace = self._context.settings.namespace
        if namespace is not None:
            self._tasks.spawn(self._loop(namespace), "heartbeats")

    async def stop(self) -> None:
        await self._tasks.cancel()

    def _period(self) -> float:
        return min(15.0, max(0.5, self._context.settings.plugin_heartbeat_timeout_seconds / 4))

    async def _loop(self, namespace: str) -> None:
        await self._context.ready.wait()  # the GPU index holds the conditions written before (their transition times)
        while True:
            async with self._listing:
                await self._list(namespace)
            await asyncio.sleep(self._period())

    async def _list(self, namespace: str) -> None:
        """One listing, planned (`listed`); a failure is logged and changes nothing."""
        try:
            leases = await self._context.run(self._context.writer.list_heartbeats, namespace)
        except Exception as err:
            self._failed_at = time.monotonic()
            log.warning("cannot list the node plugins' heartbeat Leases", extra={"error": describe(err)})
        else:
            self._failed_at = None
            self.listed(namespace, leases, datetime.datetime.now(datetime.UTC))

    async def cover(self, nodes: Collection[str]) -> None:
        """Before a ledger pass over the GPUs of `nodes`: list the heartbeat Leases now when some node is not
        covered by a listing yet, rather than at the next periodic one (up to 15 s later), unless a listing failed
        within that period. Without a namespace, or before the indexes are populated, nothing."""
        namespace = self._context.settings.namespace
        if namespace is None or not nodes or not self._context.ready.is_set():
            return
        async with self._listing:
            if self._planned is not None and self._planned.keys() >= set(nodes):
                return
            if self._failed_at is not None and time.monotonic() - self._failed_at < self._period():
                return
            await self._list(namespace)

    def _written(self) -> dict[str, Condition]:
        """node -> the `PluginReporting` condition its GPU objects carry now (the GPU index)."""
        return {
            str(gpu.status.get("node")): c
            for gpu in self._context.gpus()
            if gpu.status
            for c in gpu.status.get("conditions") or []
            if c.get("type") == PLUGIN_REPORTING_CONDITION
        }

    def listed(self, namespace: str, leases: Iterable[Mapping[str, Any]], now: datetime.datetime) -> None:
        """Record a listing of the heartbeat Leases at `now`; the nodes whose condition changed go to `on_changed`."""
        self._heartbeats = observe(self._heartbeats, leases, now)
        before = self._planned if self._planned is not None else self._written()
        nodes = self._catalogue.nodes()
        self._planned = plan_plugin_reporting(
            nodes,
            self._heartbeats,
            before,
            now=now,
            timeout_s=self._context.settings.plugin_heartbeat_timeout_seconds,
            namespace=namespace,
        )
        changed = {n for n in nodes if before.get(n) != self._planned[n]}
        if changed:
            self._on_changed(changed)

    async def reporting(self, nodes: Collection[str]) -> Reporting:
        """Each node's condition for one ledger pass over the GPUs of `nodes`, after a listing covered them
        (`cover`): as planned from the heartbeats, else (no listing succeeded yet) as the ledger holds it, else
        Unknown until a listing covers the node; without a namespace (heartbeats not listed) only what a listing
        planned."""
        await self.cover(nodes)
        namespace = self._context.settings.namespace
        known = self._planned if self._planned is not None or namespace is None else self._written()

        def of(node: str) -> Condition | None:
            planned = (known or {}).get(node)
            if planned is not None or namespace is None:
                return planned
            return unchecked_reporting(node, namespace)

        return of
