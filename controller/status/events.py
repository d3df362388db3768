"""The Events the controller posts about a claim, once each: a device gone (`AllocatedDeviceGone`, after a grace
period, and for a deleted node at once), a request no published GPU can ever satisfy (`UnsatisfiableGpuRequest`,
told again when its reason changes), a MIG request that waits because every aligned placement that would hold it
overlaps an allocated partition (`MigPlacementsFragmented`, told again when the GPUs' state changes), a request for
MIG partitions where none is published (`MigPartitionsNotPublished`, in place of `UnsatisfiableGpuRequest`), a
request that names no memory and so waits for a whole GPU while shares hold every GPU it may use
(`WholeGpuRequested`), a request of a DeviceClass of ours that the cluster lacks (`DeviceClassNotInstalled`, in
place of every other pending reason: nothing can be allocated before the class exists), parts that could not be
decoded (`UnreadableClaimParts`), a status the API server refuses every write to (`ClaimStatusUnwritable`:
`api.kube_errors.UNWRITABLE_STATUS`). `MigPartitionsNotPublished`, `WholeGpuRequested` and `DeviceClassNotInstalled`
are told once per request.

Event names are derived from (claim uid, key), so a post repeated after a restart meets AlreadyExists and counts as
posted; a key is remembered only once its post succeeded. Every Event posted here (the MPS trust domains' through
`tell`), but for `UnreadableClaimParts` (about the claim's text, not what its pods wait for), is also told to the
pods it concerns (`controller.status.pod_notices`).
"""

import logging
import time
from collections.abc import Callable

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

    def forget(self, uid: str, *, posted: bool) -> None:
        """The claim left the index (`posted=False`: it may come back; its Events stay told) or is deleted."""
        if posted:
            self._posted.pop(uid, None)
            self.pods.forget(uid)
        self._whole.pop(uid, None)
        for k in [k for k in self._missing_since if k[0] == uid]:
            del self._missing_since[k]

    async def post(self, claim: ClaimView, missing: tuple[Share, ...], gone: NodeGonePlan) -> bool:
        """Post every Event `claim` needs now (`missing`: its shares whose device is not published, apart from
        those on a deleted node, `gone`); False when some post failed and a later try may succeed."""
        posted = await self._device_gone(claim, missing)
        posted = await self._node_gone(claim, gone) and posted
        no_class, ok = await self._class_missing(claim)
        if no_class:
            self._whole.pop(claim.uid, None)
            return ok and posted
        told, ok = await self._mig_unpublished(claim)
        posted = await self._unsatisfiable(claim, told) and ok and posted
        posted = await self._fragmented(claim) and posted
        return await self._whole_gpu(claim) and posted

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
        ok = True
        for f in found:
            ok = await self._post_once(claim, (REASON_CLASS_MISSING, f.request), REASON_CLASS_MISSING, f.message) and ok
        return bool(found), ok

    async def _mig_unpublished(self, claim: ClaimView) -> tuple[frozenset[str], bool]:
        """Tell each request that asks for MIG partitions where none is published; (those requests, whether every
        post succeeded)."""
        if claim.allocated:
            return frozenset(), True
        devices = self._catalogue.devices().values()
        mig_class = self._context.settings.mig_device_class
        found = plan_mig_unpublished(claim, devices, self._context.claim_classes(), self._context.driver, mig_class)
        ok = True
        for f in found:
            ok = (
                await self._post_once(claim, (REASON_MIG_UNPUBLISHED, f.request), REASON_MIG_UNPUBLISHED, f.message)
                and ok
            )
        return frozenset(f.request for f in found), ok

    async def _unsatisfiable(self, claim: ClaimView, told: frozenset[str]) -> bool:
        ok = True
        devices = self._catalogue.devices().values()
        classes = self._context.claim_classes()
        for found in plan_unsatisfiable(claim, devices, classes, self._context.driver, told=told):
            key = (REASON_UNSATISFIABLE, found.request, found.message)  # a changed reason is told again
            ok = await self._post_once(claim, key, REASON_UNSATISFIABLE, found.message) and ok
        return ok

    async def _fragmented(self, claim: ClaimView) -> bool:
        mig_class = self._context.settings.mig_device_class
        if (
            claim.allocated
            or claim.extended_resource
            or not any(m.device_class == mig_class for r in claim.memory_requests for m in r)
        ):
            return True
        ok = True
        selected = selected_by(self._context.claim_classes(), self._context.driver)
        devices = self._catalogue.devices().values()
        for found in plan_mig_fragmented(claim, devices, self._context.claims(), selected, mig_class):
            key = (REASON_MIG_FRAGMENTED, found.request, found.message)  # told again when the GPUs change
            ok = await self._post_once(claim, key, REASON_MIG_FRAGMENTED, found.message) and ok
        return ok

    async def _whole_gpu(self, claim: ClaimView) -> bool:
        shared = self._context.settings.device_classes
        if (
            claim.allocated
            or claim.extended_resource
            or not any(all(m.memory is None and m.device_class in shared for m in r) for r in claim.requests)
        ):
            self._whole.pop(claim.uid, None)
            return True
        self._whole[claim.uid] = claim.key
        selected = selected_by(self._context.claim_classes(), self._context.driver)
        devices = self._catalogue.devices().values()
        ok = True
        for found in plan_whole_gpu(claim, devices, self._context.claims(), selected, shared):
            key = (REASON_WHOLE_GPU, found.request)  # told once: the amounts in it change with every share
            ok = await self._post_once(claim, key, REASON_WHOLE_GPU, found.message) and ok
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
