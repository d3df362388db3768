"""The node plugins' heartbeats, as the ledger shows them: each node's `PluginReporting` condition.

With a namespace (`POD_NAMESPACE`), the heartbeat Leases are listed a few times per `--plugin-heartbeat-timeout`
and each listing planned by `plan_plugin_reporting`; the nodes whose condition changed are handed to `on_changed`
(the ledger marks their GPUs). A failed listing changes nothing: the controller's own outage says nothing about
the plugins. Before the first listing the conditions the ledger holds stand (a restart keeps their times).
"""

import asyncio
import datetime
import logging
from collections.abc import Callable, Iterable, Mapping
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
        self._tasks = Tasks()

    def start(self) -> None:
        namespace = self._context.settings.namespace
        if namespace is not None:
            self._tasks.spawn(self._loop(namespace), "heartbeats")

    async def stop(self) -> None:
        await self._tasks.cancel()

    async def _loop(self, namespace: str) -> None:
        period = min(15.0, max(0.5, self._context.settings.plugin_heartbeat_timeout_seconds / 4))
        await self._context.ready.wait()  # the GPU index holds the conditions written before (their transition times)
        while True:
            try:
                leases = await self._context.run(self._context.writer.list_heartbeats, namespace)
            except Exception as err:
                log.warning("cannot list the node plugins' heartbeat Leases", extra={"error": describe(err)})
            else:
                self.listed(namespace, leases, datetime.datetime.now(datetime.UTC))
            await asyncio.sleep(period)

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

    def reporting(self) -> Reporting:
        """Each node's condition for one ledger pass: as planned from the heartbeats, else (before the first
        listing) as the ledger holds it, else Unknown until a listing covers the node; without a namespace
        (heartbeats not listed) only what a listing planned."""
        namespace = self._context.settings.namespace
        known = self._planned if self._planned is not None or namespace is None else self._written()

        def of(node: str) -> Condition | None:
            planned = (known or {}).get(node)
            if planned is not None or namespace is None:
                return planned
            return unchecked_reporting(node, namespace)

        return of
