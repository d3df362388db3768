"""The Events the controller posts about a claim, once each: a device gone (`AllocatedDeviceGone`, after a grace
period, and for a deleted node at once), a request no published GPU can ever satisfy (`UnsatisfiableGpuRequest`,
told again when its reason changes), a MIG request that waits because every aligned placement that would hold it
overlaps an allocated partition (`MigPlacementsFragmented`, told again when the GPUs' state changes), a request for
MIG partitions where none is published (`MigPartitionsNotPublished`, in place of `UnsatisfiableGpuRequest`), a
request that names no memory and so waits for a whole GPU while shares hold every GPU it may use
(`WholeGpuRequested`), a share request that waits because no GPU it may use has the memory and compute it asks
free now, as the ledger counts them, where no other reason here or `MpsTrustDomainWaiting` speaks for it
(`GpuRoomWaiting`: such a claim undecided is looked at again 5 s later, then every 30 s, while it pends), a request
of a DeviceClass of ours that the cluster lacks (`DeviceClassNotInstalled`, in
place of every other pending reason: nothing can be allocated before the class exists), parts that could not be
decoded (`UnreadableClaimParts`), a status the API server refuses every write to (`ClaimStatusUnwritable`:
`api.kube_errors.UNWRITABLE_STATUS`). `MigPartitionsNotPublished`, `WholeGpuRequested`, `GpuRoomWaiting` and
`DeviceClassNotInstalled` are told once per request.

Event names are derived from (claim uid, key), so a post repeated after a restart meets AlreadyExists and counts as
posted; a key is remembered only once its post succeeded. Every Event posted here (the MPS trust domains' through
`tell`), but for `UnreadableClaimParts` (about the claim's text, not what its pods wait for), is also told to the
pods it concerns (`controller.status.pod_notices`).
"""

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from api.gpu_config import MAX_PARAMETERS_DEPTH
from api.kube_errors import UNWRITABLE_STATUS
from controller.core import metrics
from controller.core.claims import ClaimView, Share
from controller.core.context import ClaimKey, Context
from controller.core.settings import chart_classes
from controller.devices.catalogue import DeviceCatalogue
from controller.nodes.plan import NodeGonePlan, node_gone_message
from controller.status.class_missing import plan_class_missing
from controller.status.feasibility import plan_unsatisfiable, selected_by
from controller.status.gpu_room import plan_room_waiting
from controller.status.mig_only import plan_mig_unpublished
from controller.status.mig_room import plan_mig_fragmented
from controller.status.pod_notices import PodNotices
from controller.status.whole_gpu import plan_whole_gpu

log = logging.getLogger(__name__)

REASON_DEVICE_GONE = "AllocatedDeviceGone"
REASON_UNSATISFIABLE = "UnsatisfiableGpuRequest"
REASON_SKIPPED_PARTS = "UnreadableClaimParts"
REASON_MIG_FRAGMENTED = "MigPlacementsFragmented"
REASON_MIG_UNPUBLISHED = "MigPartitionsNotPublished"
REASON_WHOLE_GPU = "WholeGpuRequested"
REASON_CLASS_MISSING = "DeviceClassNotInstalled"
REASON_STATUS_UNWRITABLE = "ClaimStatusUnwritable"
REASON_GPU_ROOM = "GpuRoomWaiting"
ROOM_SETTLE_SECONDS = 1.0
"""How soon after a GPU object changes a pending claim the room check left undecided is looked at again."""
ROOM_SETTLE_AGE_SECONDS = 3.0
"""Only claims first looked at at least this long ago are looked at again on a GPU object's change: in a burst the
scheduler allocates a claim within a second or two, and an extra look then only races the claim's status write."""
ROOM_RECHECK_SECONDS = (5.0, 30.0)
"""When a pending claim left undecided by `plan_room_waiting` is looked at again: after the first, then after each
later look (the ledger it reads changes without the claim changing)."""


class _Found(Protocol):
    """What each plan finds: a request and what to tell about it."""

    @property
    def request(self) -> str: ...

    @property
    def message(self) -> str: ...


class _Rechecks:
    """One timer at a time per claim: a claim is looked at again after the first delay, then after the second, while
    it stays undecided (a claim allocated or told in between is not looked at: the bench's bursts cost nothing); a
    changed ledger (`soon`) brings the next look of every undecided claim first looked at a while ago forward."""

    def __init__(self, recheck: Callable[[ClaimKey, float], None]) -> None:
        self._recheck = recheck
        self._due: dict[str, tuple[float, int, ClaimKey, float]] = {}  # uid -> (due, looks, key, first look)

    def update(self, claim: ClaimView, *, undecided: bool) -> None:
        """Look at `claim` again later while it is `undecided`; forget it otherwise."""
        if not undecided:
            self._due.pop(claim.uid, None)
            return
        now = time.monotonic()
        due, looks, _, first = self._due.get(claim.uid, (0.0, 0, claim.key, now))
        if due > now:
            return  # its timer is set
        delay = ROOM_RECHECK_SECONDS[min(looks, len(ROOM_RECHECK_SECONDS) - 1)]
        self._set(claim.uid, claim.key, now + delay, looks + 1, first)

    def soon(self, delay: float) -> None:
        """The ledger changed: look again within `delay` at each claim still undecided, first looked at
        `ROOM_SETTLE_AGE_SECONDS` ago or more, whose next look is later."""
        now = time.monotonic()
        at = now + delay
        for uid, (due, looks, key, first) in list(self._due.items()):
            if due > at and now - first >= ROOM_SETTLE_AGE_SECONDS:
                self._set(uid, key, at, looks, first)

    def _set(self, uid: str, key: ClaimKey, due: float, looks: int, first: float) -> None:
        self._due[uid] = (due, looks, key, first)
        asyncio.get_running_loop().call_later(max(0.0, due - time.monotonic()), self._fire, uid, due)

    def _fire(self, uid: str, due: float) -> None:
        found = self._due.get(uid)
        if found is not None and found[0] == due:  # not a timer replaced by an earlier one
            self._recheck(found[2], 0.0)

    def forget(self, uid: str) -> None:
        self._due.pop(uid, None)


class ClaimEvents:
    """What has been posted about each claim (by uid), and since when each of its devices has been missing."""

    def __init__(
        self, context: Context, catalogue: DeviceCatalogue, recheck: Callable[[ClaimKey, float], None]
    ) -> None:
        """`recheck(key, seconds)`: reconcile the claim again after that long (a device gone within its grace)."""
        self._context = context
        self._catalogue = catalogue
        self._recheck = recheck
        self._posted: dict[str, set[tuple[str, ...]]] = {}  # claim uid -> event keys already posted
        self._missing_since: dict[tuple[str, str, str], float] = {}  # (uid, pool, device) -> monotonic
        self._whole: dict[str, ClaimKey] = {}  # uid -> key of pending claims with requests that name no memory
        self.pods = PodNotices(context, recheck)
        self._room_rechecks = _Rechecks(recheck)

    def forget(self, uid: str, *, posted: bool) -> None:
        """The claim left the index (`posted=False`: it may come back; its Events stay told) or is deleted."""
        if posted:
            self._posted.pop(uid, None)
            self.pods.forget(uid)
        self._whole.pop(uid, None)
        self._room_rechecks.forget(uid)
        for k in [k for k in self._missing_since if k[0] == uid]:
            del self._missing_since[k]

    async def post(
        self, claim: ClaimView, missing: tuple[Share, ...], gone: NodeGonePlan, told: frozenset[str] = frozenset()
    ) -> bool:
        """Post every Event `claim` needs now (`missing`: its shares whose device is not published, apart from
        those on a deleted node, `gone`; `told`: requests another Event explains, as `MpsTrustDomainWaiting`); False
        when some post failed and a later try may succeed."""
        posted = await self._device_gone(claim, missing)
        posted = await self._node_gone(claim, gone) and posted
        no_class, ok = await self._class_missing(claim)
        if no_class:
            self._whole.pop(claim.uid, None)
            return ok and posted
        unpublished, ok = await self._mig_unpublished(claim)
        unsatisfiable, posted = await self._unsatisfiable(claim, unpublished), ok and posted
        posted = await self._fragmented(claim) and unsatisfiable[1] and posted
        whole, ok = await self._whole_gpu(claim)
        return await self._room(claim, told | unpublished | unsatisfiable[0] | whole) and ok and posted

    def ledger_changed(self) -> None:
        """A GPU object changed (its free memory or compute may have): pending claims left undecided by the room
        check are looked at again within `ROOM_SETTLE_SECONDS` (the GPU objects of one ledger pass come together)."""
        self._room_rechecks.soon(ROOM_SETTLE_SECONDS)

    def waiting_whole(self) -> list[ClaimKey]:
        """The pending claims last seen with a request of a shared class that names no memory: whether they wait
        for a whole GPU changes when a share of a GPU is allocated or freed."""
        return list(self._whole.values())

    async def tell(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        """Post the Event `key` about `claim` once and tell it to the pods it concerns; False when some post failed
        (retry later)."""
        return await self._post_once(claim, key, reason, message)

    async def status_unwritable(self, claim: ClaimView) -> bool:
        """Tell once that the API server refuses every write to the claim's status (`ApiAllocationImmutable` to the
        controller's apply of its entries), to the claim and its pods; False when a post failed."""
        message = (
            f"{self._context.driver}: {UNWRITABLE_STATUS}. The controller cannot write its status.devices entries "
            "(nor an MPS GPU's binding condition, which its pod waits for)"
        )
        return await self._post_once(claim, (REASON_STATUS_UNWRITABLE,), REASON_STATUS_UNWRITABLE, message)

    async def _post_once(
        self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str, *, pods: bool = True
    ) -> bool:
        """Post the Event `key` unless it was posted already, then (`pods`) tell it to the pods it concerns
        (`PodNotices`); False when a post failed (retry later)."""
        if key not in self._posted.get(claim.uid, ()):
            if not await self._context.run(self._context.writer.post_claim_event, claim, key, reason, message):
                return False
            self._posted.setdefault(claim.uid, set()).add(key)
            metrics.EVENTS.labels(reason).inc()
            log.warning(message, extra={"claim": f"{claim.namespace}/{claim.name}", "reason": reason})
        return not pods or await self.pods.tell(claim, key, reason, message)

    async def _device_gone(self, claim: ClaimView, missing: tuple[Share, ...]) -> bool:
        ok = True
        now = time.monotonic()
        gone = {(claim.uid, s.pool, s.device) for s in missing}
        for k in [k for k in self._missing_since if k[0] == claim.uid and k not in gone]:
            del self._missing_since[k]  # published again
        grace = self._context.settings.device_gone_grace_seconds
        driver = self._context.driver
        for share in missing:
            since = self._missing_since.setdefault((claim.uid, share.pool, share.device), now)
            if now - since < grace:
                self._recheck(claim.key, since + grace - now + 0.05)
                continue
            message = (
                f"request {share.request!r} was allocated device {share.device} of pool {share.pool} "
                f"(driver {driver}), which no longer exists: the GPU was removed or its node plugin "
                "stopped publishing it; delete the pod and its claim to get another GPU"
            )
            key = (REASON_DEVICE_GONE, share.pool, share.device)
            ok = await self._post_once(claim, key, REASON_DEVICE_GONE, message) and ok
        return ok

    async def _node_gone(self, claim: ClaimView, gone: NodeGonePlan) -> bool:
        if gone.node is None:
            return True
        message = node_gone_message(claim, gone.node, self._context.driver)
        return await self._post_once(claim, (REASON_DEVICE_GONE, "node", gone.node), REASON_DEVICE_GONE, message)

    async def _class_missing(self, claim: ClaimView) -> tuple[bool, bool]:
        """Tell each request of a DeviceClass of ours that the cluster lacks; (whether there is one, whether every
        post succeeded). Nothing is known before the indexes are populated."""
        if claim.allocated or not self._context.ready.is_set():
            return False, True
        found = plan_class_missing(claim, self._context.claim_classes(), chart_classes(self._context.settings))
        return bool(found), await self._each(claim, REASON_CLASS_MISSING, found)

    async def _mig_unpublished(self, claim: ClaimView) -> tuple[frozenset[str], bool]:
        """Tell each request that asks for MIG partitions where none is published; (those requests, whether every
        post succeeded)."""
        if claim.allocated:
            return frozenset(), True
        devices = self._catalogue.devices().values()
        mig_class = self._context.settings.mig_device_class
        found = plan_mig_unpublished(claim, devices, self._context.claim_classes(), self._context.driver, mig_class)
        return frozenset(f.request for f in found), await self._each(claim, REASON_MIG_UNPUBLISHED, found)

    async def _unsatisfiable(self, claim: ClaimView, told: frozenset[str]) -> tuple[frozenset[str], bool]:
        """Tell each request no published GPU can ever satisfy; (those requests, whether every post succeeded)."""
        devices = self._catalogue.devices().values()
        found = plan_unsatisfiable(claim, devices, self._context.claim_classes(), self._context.driver, told=told)
        ok = await self._each(claim, REASON_UNSATISFIABLE, found, again=True)  # a changed reason is told again
        return frozenset(f.request for f in found), ok

    async def _fragmented(self, claim: ClaimView) -> bool:
        mig_class = self._context.settings.mig_device_class
        if (
            claim.allocated
            or claim.extended_resource
            or not any(m.device_class == mig_class for r in claim.memory_requests for m in r)
        ):
            return True
        selected = selected_by(self._context.claim_classes(), self._context.driver)
        devices = self._catalogue.devices().values()
        found = plan_mig_fragmented(claim, devices, self._context.claims(), selected, mig_class)
        return await self._each(claim, REASON_MIG_FRAGMENTED, found, again=True)  # told again when the GPUs change

    async def _whole_gpu(self, claim: ClaimView) -> tuple[frozenset[str], bool]:
        shared = self._context.settings.device_classes
        if (
            claim.allocated
            or claim.extended_resource
            or not any(all(m.memory is None and m.device_class in shared for m in r) for r in claim.requests)
        ):
            self._whole.pop(claim.uid, None)
            return frozenset(), True
        self._whole[claim.uid] = claim.key
        selected = selected_by(self._context.claim_classes(), self._context.driver)
        devices = self._catalogue.devices().values()
        found = plan_whole_gpu(claim, devices, self._context.claims(), selected, shared)  # told once: its amounts
        return frozenset(f.request for f in found), await self._each(claim, REASON_WHOLE_GPU, found)  # change often

    async def _room(self, claim: ClaimView, told: frozenset[str]) -> bool:
        """Tell each share request that no GPU it may use has room for now (`GpuRoomWaiting`), once; look again
        later at a claim left undecided (the ledger it reads changes without the claim changing)."""
        if claim.allocated or not claim.memory_requests:
            self._room_rechecks.update(claim, undecided=False)
            return True
        selected = selected_by(self._context.claim_classes(), self._context.driver)
        skip = (self._context.settings.mig_device_class,)
        devices, free = self._catalogue.devices().values(), self._catalogue.free
        found = plan_room_waiting(claim, devices, lambda d: free(d.key), selected, told=told, skip_classes=skip)
        self._room_rechecks.update(claim, undecided=found.undecided)
        return await self._each(claim, REASON_GPU_ROOM, found.waiting)

    async def _each(self, claim: ClaimView, reason: str, found: Iterable[_Found], *, again: bool = False) -> bool:
        """Post `reason` once per request of `found` (`again`: once per request and message: a changed message is
        told again); False when a post failed."""
        ok = True
        for f in found:
            key = (reason, f.request, f.message) if again else (reason, f.request)
            ok = await self._post_once(claim, key, reason, f.message) and ok
        return ok

    async def skipped_parts(self, claim: ClaimView) -> bool:
        """Tell once which parts of `claim` could not be decoded (before its status write: the API server may
        refuse that one); False when the post failed."""
        if not claim.skipped:
            return True
        message = (
            f"{self._context.driver}: parts of this claim cannot be decoded safely and were skipped by the "
            "controller: "
            + "; ".join(claim.skipped)
            + f". The rest of the claim is handled as usual; GpuConfig parameters may nest at most "
            f"{MAX_PARAMETERS_DEPTH} levels"
        )
        key = (REASON_SKIPPED_PARTS, *claim.skipped)
        return await self._post_once(claim, key, REASON_SKIPPED_PARTS, message, pods=False)
