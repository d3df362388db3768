"""Each MPS GPU's DeviceTaintRule, kept as its verdict wants it by a loop of its own, and restored within seconds
when someone deletes or edits it.

`MpsDomains` (`controller/mps/manager.py`) gives each GPU's verdict; it marks the GPUs whose claims or rule
changed (`mark`, `deleted`: from the claim and DeviceTaintRule watch events) and asks for every MPS GPU at a start,
a resync or a change of the published devices (`resync`). A pass reads each marked GPU's rule from kopf's index of
DeviceTaintRules (there is no other copy) and:

- creates the rule the verdict wants when there is none (a create, never an apply: when one exists already,
  409 AlreadyExists, it is read back and the verdict made again over it, so one domain is never replaced by another
  unseen);
- writes it again when it differs (edited: its selector, taint, domain annotation or labels), with a Warning Event
  `MpsTaintRuleRestored` on the rule that says what was found and what was written;
- deletes it when no claim of the domain it records holds or waits for the GPU (stale; the rule the verdict wants
  then, if any, is created once the watch shows it gone); a full pass also deletes every rule of ours whose GPU is
  no longer a published MPS GPU.

A rule deleted by someone else while it recorded a domain is created again with an Event saying so. Two things are
remembered, neither a decision: the rules this loop deleted until the watch shows them gone (`_deleting`: their
deletion is no one else's, so no Event), and the domain a rule recorded when someone else deleted it, until the
rule is created again (`_lost`: only for the Event's words). An API error (NotLeaderError at a leadership loss too:
`stop` follows) is logged and that GPU looked at again 2 s later; the pass goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from api.kube_errors import ApiAlreadyExists
from api.mps_trust import RULE_LABEL
from controller.core import metrics
from controller.core.context import Context, Tasks
from controller.core.kube import describe
from controller.core.slices import DeviceKey, TaintRuleView, taint_rule_view
from controller.mps.plan import (
    DeviceVerdict,
    deleted_message,
    edited_message,
    rewritten_message,
    rule_findings,
    rule_name,
    taint_rule,
)

log = logging.getLogger(__name__)
RESTORED_REASON = "MpsTaintRuleRestored"


class MpsTaintRules:
    """The DeviceTaintRules of the MPS GPUs, over the verdicts `MpsDomains` gives (`devices`, `verdict`)."""

    def __init__(
        self,
        context: Context,
        devices: Callable[[], Iterable[DeviceKey]],
        verdict: Callable[[DeviceKey, TaintRuleView | None], DeviceVerdict],
    ) -> None:
        """`devices`: the published MPS GPUs; `verdict`: a GPU's verdict over the rule given (as the index shows
        it, or as read back)."""
        self._context = context
        self._devices = devices
        self._verdict = verdict
        self._marks: set[DeviceKey] = set()
        self._all = True  # the next pass looks at every MPS GPU and every rule of ours (start, resync)
        self._wake = asyncio.Event()
        self._deleting: set[str] = set()
        self._lost: dict[DeviceKey, str] = {}
        self._tasks = Tasks()

    def start(self) -> None:
        self.resync()
        self._tasks.spawn(self._loop(), "mps-taint-rules")

    async def stop(self) -> None:
        await self._tasks.cancel()

    def resync(self) -> None:
        """Look at every MPS GPU and every rule of ours at the next pass."""
        self._all = True
        self._wake.set()

    def mark(self, devices: Iterable[DeviceKey]) -> None:
        """The claims or the rule of these MPS GPUs changed: look at their rules at the next pass."""
        before = len(self._marks)
        self._marks.update(devices)
        if len(self._marks) > before:
            self._wake.set()

    def deleted(self, name: str, device: DeviceKey, recorded: str | None) -> None:
        """The watch saw `device`'s rule `name` deleted; `recorded`: the domain id its annotation held then."""
        if name in self._deleting:
            self._deleting.discard(name)  # this loop's own deletion of a stale rule
        elif recorded is not None:
            self._lost[device] = recorded
        self.mark([device])

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.run_pass():
                await asyncio.sleep(2.0)
                self._wake.set()

    async def run_pass(self) -> bool:
        """Look at what was marked since the last pass (every MPS GPU and rule of ours after a `resync`); False
        when an API call failed: its GPU (or the full pass) stays marked for the next pass, the others are done."""
        every, marked = self._all, self._marks
        self._all, self._marks = False, set()
        mps = set(self._devices())
        ok = True
        for device in sorted(mps if every else marked & mps):
            if not await self._attempt(self._keep(device), "/".join(device)):
                self._marks.add(device)
                ok = False
        if every:
            names = {rule_name(self._context.driver, *d) for d in mps}
            ours = [r.name for r in self._context.taint_rules() if r.labels.get(RULE_LABEL) == "true"]
            for name in (n for n in ours if n not in names):  # its GPU is no published MPS GPU now
                if not await self._attempt(self._delete(name), name):
                    self._all = True
                    ok = False
        return ok

    async def _attempt(self, step: Coroutine[Any, Any, None], what: str) -> bool:
        try:
            await step
        except Exception as err:  # NotLeaderError at a leadership loss too: stop() follows
            log.warning("cannot keep an MPS DeviceTaintRule; trying again", extra={"of": what, "error": describe(err)})
            return False
        return True

    async def _keep(self, device: DeviceKey) -> None:
        """Bring `device`'s rule, as kopf's index shows it, in line with its verdict."""
        await self._bring(device, self._context.taint_rule(rule_name(self._context.driver, *device)), read_back=True)

    async def _bring(self, device: DeviceKey, rule: TaintRuleView | None, *, read_back: bool) -> None:
        """Bring `device`'s rule, `rule` as last seen, in line with the verdict over it; `read_back`: a create that
        meets an existing rule reads it and starts again over it (once)."""
        driver, writer = self._context.driver, self._context.writer
        name = rule_name(driver, *device)
        verdict = self._verdict(device, rule)
        if verdict.mixed:
            log.error(
                "an MPS GPU holds claims of several trust domains (allocated without binding conditions): the node "
                "plugin refuses those of the other domains at prepare",
                extra={"device": "/".join(device), "serves": verdict.owner.id if verdict.owner else None,
                       "also": [d.id for d in verdict.mixed]},
            )  # fmt: skip
        owner = verdict.owner
        desired = taint_rule(driver, *device, owner) if owner is not None else None
        if desired is None or owner is None or verdict.stale:  # stale: a rule for the owner is created after
            self._lost.pop(device, None)
            if rule is not None:
                await self._delete(name)
            return
        if rule is None:
            try:
                uid = await self._context.run(writer.create_taint_rule, desired)
            except ApiAlreadyExists:  # not in the index yet (or not selecting our driver): read it back
                body = await self._context.run(writer.read_taint_rule, name) if read_back else None
                if body is None:
                    self.mark([device])  # gone again meanwhile (or read once already): look once more
                    return
                await self._bring(device, taint_rule_view(body, driver, any_selector=True), read_back=False)
                return
            log.info("MPS DeviceTaintRule created", extra={"rule": name, "domain": owner.id})
            if self._lost.pop(device, None) == owner.id:
                await self._report(name, uid, deleted_message(name, *device, owner))
            return
        findings = rule_findings(desired, rule)
        if not findings:
            self._lost.pop(device, None)
            return
        await self._context.run(writer.apply_taint_rule, desired)
        recorded = verdict.recorded
        message = (
            rewritten_message(name, *device, recorded, owner)
            if recorded is not None
            else edited_message(name, *device, owner, findings)
        )
        await self._report(name, rule.uid, message)

    async def _delete(self, name: str) -> None:
        self._deleting.add(name)
        try:
            await self._context.run(self._context.writer.delete_taint_rule, name)
        except BaseException:
            self._deleting.discard(name)
            raise
        if self._context.taint_rule(name) is None:
            self._deleting.discard(name)  # its DELETED event came during the call, or someone else's did
        log.info("stale MPS DeviceTaintRule deleted", extra={"rule": name})

    async def _report(self, name: str, uid: str, message: str) -> None:
        log.warning(message, extra={"rule": name, "reason": RESTORED_REASON})
        post = self._context.writer.post_taint_rule_event
        if await self._context.run(post, name, uid, RESTORED_REASON, message):
            metrics.EVENTS.labels(RESTORED_REASON).inc()
