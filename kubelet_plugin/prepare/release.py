"""Unprepare: the kinds' release hooks over one call's claims, under the node lock.

Order (crash safety, see ``preparer``): the MIG kind destroys each claim's partitions first (``kinds/mig/partitions.py``;
a claim whose partitions cannot be destroyed stays prepared and that is its error); the checkpoint is saved without
the claims; then their files go (``state/claim_files.py``) and the MPS kind lowers the ceiling of each MPS GPU they
had shares on (``kinds/mps/shares.py``).

May import: ``prepare/journal.py``, ``prepare/reader.py``, ``kinds``, ``enforcement``, ``state``, ``core``, ``api``.
"""

import logging
from collections.abc import Callable

from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import ClaimRef
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.kinds.mig.partitions import Partitioner
from kubelet_plugin.kinds.mps.control import MpsControlError
from kubelet_plugin.kinds.mps.shares import MpsShares
from kubelet_plugin.prepare.journal import ClaimJournal
from kubelet_plugin.prepare.reader import show
from kubelet_plugin.state.checkpoint import Checkpoint
from kubelet_plugin.state.claim_files import ClaimStore

log = logging.getLogger(__name__)


def count_error(metrics: PluginMetrics, operation: str, kind: ErrorKind) -> None:
    """Count a failed claim of `operation` (``prepare``/``unprepare``) by its error kind."""
    metrics.requests.labels(operation, "error").inc()
    metrics.errors.labels(operation, kind).inc()


class ClaimRelease:
    """Unprepares claims (see the module docstring); `forget`: the Ready writer's, for a claim gone."""

    def __init__(
        self,
        journal: ClaimJournal,
        files: ClaimStore,
        *,
        partitions: Partitioner,
        mps: MpsShares,
        enforcement: EnforcementDetector,
        metrics: PluginMetrics,
        forget: Callable[[str], None],
    ) -> None:
        self._journal = journal
        self._files = files
        self._partitions = partitions
        self._mps = mps
        self._enforcement = enforcement
        self._metrics = metrics
        self._forget = forget

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        checkpoint = self._journal.load()
        kept: dict[str, str] = {}  # claims whose MIG partitions could not be destroyed: they stay prepared
        for ref in claims:
            entry = checkpoint.claims.get(ref.uid)
            if entry is None:
                continue
            try:
                self._partitions.destroy(ref.uid, entry)
            except PrepareError as err:
                count_error(self._metrics, "unprepare", err.kind)
                log.warning("unprepare failed", extra={"claim": show(ref), "error": str(err)})
                kept[ref.uid] = str(err)
        claims, failed = [r for r in claims if r.uid not in kept], claims
        updated = checkpoint
        for ref in claims:
            updated = updated.without_claim(ref.uid)
        if updated is not checkpoint:
            try:
                self._journal.save(updated)
            except OSError as err:
                return self.refuse(
                    claims,
                    ErrorKind.INTERNAL,
                    f"cannot save the checkpoint without these claims ({err}); nothing was removed, retry the unprepare",
                )
        errors: dict[str, str] = {r.uid: kept[r.uid] for r in failed if r.uid in kept}
        for ref in claims:
            try:
                self._files.remove(ref.uid)
            except OSError as err:
                count_error(self._metrics, "unprepare", ErrorKind.INTERNAL)
                errors[ref.uid] = f"cannot remove CDI spec of claim {show(ref)}: {err}"
                continue
            errors[ref.uid] = ""
            self._forget(ref.uid)
            self._metrics.requests.labels("unprepare", "ok").inc()
        self._metrics.prepared_claims.set(len(updated.claims))
        self._lower_mps(checkpoint, updated, claims)
        return errors

    def _lower_mps(self, before: Checkpoint, after: Checkpoint, claims: list[ClaimRef]) -> None:
        """The MPS kind's release: lower the ceiling of each MPS GPU the unprepared claims had shares on."""
        gpus = {
            d.uuid
            for ref in claims
            if ref.uid in before.claims
            for d in before.claims[ref.uid].devices
            if d.uuid is not None and self._enforcement.is_mps(d.uuid)
        }
        for uuid in sorted(gpus):
            try:
                self._mps.lower(uuid, after)
            except MpsControlError as err:
                log.warning("cannot lower the MPS ceiling", extra={"uuid": uuid, "error": str(err)})

    def refuse(self, claims: list[ClaimRef], kind: ErrorKind, message: str) -> dict[str, str]:
        for _ in claims:
            count_error(self._metrics, "unprepare", kind)
        log.warning("unprepare failed", extra={"claims": [show(r) for r in claims], "error": message})
        return {ref.uid: message for ref in claims}
