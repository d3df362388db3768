"""Each MPS GPU's DeviceTaintRule, kept in step with the trust domains it holds by a loop of its own.

`MpsDomains` (`controller/mps/manager.py`) owns the claims on each MPS GPU and the verdicts; it tells this keeper
which GPUs changed (`mark`) and when to look at every rule (`resync`, and `start`). A pass applies each desired
rule (`controller/mps/plan.py` `desired_taint_rules`) that is missing or differs from the one last seen, and
deletes the stale ones: of the marked GPUs, or at a resync every rule of ours that is not desired. The rules are
listed once at start and at each resync; between them what this keeper wrote is what it assumes. An API error
(NotLeaderError at a leadership loss too: `stop` follows) is logged and the pass retried 2 s later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from api.kube_errors import ApiError
from controller.core.context import Context, Tasks
from controller.core.kube import describe
from controller.core.slices import DeviceKey
from controller.mps.plan import DeviceVerdict, desired_taint_rules, rule_differs, rule_name

log = logging.getLogger(__name__)


class MpsTaintRules:
    """The DeviceTaintRules of the MPS GPUs, over the verdicts `MpsDomains` gives (`indexed`, `verdict`)."""

    def __init__(
        self,
        context: Context,
        indexed: Callable[[], Iterable[DeviceKey]],
        verdict: Callable[[DeviceKey], DeviceVerdict | None],
    ) -> None:
        """`indexed`: the MPS GPUs the claim index has seen; `verdict`: a GPU's verdict, None when it holds no
        claim (its rule, if any, is stale)."""
        self._context = context
        self._indexed = indexed
        self._verdict = verdict
        self._marks: set[DeviceKey] = set()
        self._all = True  # the next pass looks at every rule (start, resync)
        self._wake = asyncio.Event()
        self._rules: dict[str, dict[str, Any]] = {}
        self._tasks = Tasks()

    def start(self) -> None:
        self._all = True
        self._wake.set()
        self._tasks.spawn(self._rule_loop(), "mps-taint-rules")

    async def stop(self) -> None:
        await self._tasks.cancel()

    def resync(self) -> None:
        """Look at every rule at the next pass (listed again)."""
        self._all = True
        self._wake.set()

    def mark(self, devices: set[DeviceKey]) -> None:
        """The claims on `devices` changed: look at their rules at the next pass."""
        self._marks |= devices
        if devices:
            self._wake.set()

    async def _rule_loop(self) -> None:
        listed = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if not listed or self._all:
                    existing = await self._context.run(self._context.writer.list_taint_rules)
                    self._rules = {r["metadata"]["name"]: r for r in existing}
                    listed = True
                await self._pass()
            except (ApiError, Exception) as err:  # NotLeaderError at a leadership loss too: stop() follows
                log.warning("cannot keep the MPS DeviceTaintRules; trying again", extra={"error": describe(err)})
                self._wake.set()
                await asyncio.sleep(2.0)

    async def _pass(self) -> None:
        every = self._all
        devices = set(self._indexed()) if every else set(self._marks)
        self._marks.clear()
        self._all = False
        verdicts = [v for d in sorted(devices) if (v := self._verdict(d)) is not None]
        desired = desired_taint_rules(self._context.driver, verdicts)
        names = {rule_name(self._context.driver, d[0], d[1]) for d in devices}
        writer = self._context.writer
        for name, rule in desired.items():
            if name not in self._rules or rule_differs(rule, self._rules[name]):
                await self._context.run(writer.apply_taint_rule, rule)
                self._rules[name] = rule
        stale = [n for n in self._rules if n not in desired and (every or n in names)]
        for name in stale:
            await self._context.run(writer.delete_taint_rule, name)
            self._rules.pop(name, None)
