"""Recovery at start: bring the checkpoint, the claims' files and the kinds' host state back to one story.

Invariant after ``Recovery.recover()``: every checkpoint entry is ``PrepareCompleted``, and the set of claims with
devices in the checkpoint equals the set of this driver's spec files (no temp files either). Half-prepared entries
(``PrepareStarted``: written by plugins before the one-save order, or a claim that waited for its MPS GPU's domain
switch when the plugin stopped; the kubelet's retry prepares it again) are dropped with their files; files no entry
owns are orphans and removed; the MIG kind destroys instances no entry owns (``kinds/mig/partitions.py``); a
completed entry whose spec is missing (reboot, power loss, deleted) or whose MIG partition is gone gets them
written again from the API claim, and a claim that is gone or was replaced is dropped. When the spec cannot be
restored (API server unreachable or failing, device changed, claim no longer allocated, its MPS GPU's daemon not
serving its trust domain: the supervisor is asked for one) the entry is kept and
logged: the kubelet's next prepare of the claim re-writes it (or returns the reason), and so does the next
recovery once the API server answers. A checkpoint of a newer schema is left alone (``journal`` reports it).

May import: ``prepare/transaction.py``, ``prepare/journal.py``, ``prepare/reader.py``, ``kinds``, ``state``,
``core``, ``api``.
"""

import logging
from collections.abc import Callable

from kubelet_plugin.core.errors import PrepareError
from kubelet_plugin.core.model import ClaimRef
from kubelet_plugin.kinds.mig.partitions import Partitioner
from kubelet_plugin.prepare.journal import ClaimJournal
from kubelet_plugin.prepare.reader import ClaimReader
from kubelet_plugin.prepare.transaction import CallFacts, ClaimSteps
from kubelet_plugin.state.checkpoint import Checkpoint
from kubelet_plugin.state.claim_files import ClaimStore

log = logging.getLogger(__name__)


class Recovery:
    """Runs recovery over the preparer's parts; the caller holds the node lock (see the module docstring)."""

    def __init__(
        self,
        journal: ClaimJournal,
        files: ClaimStore,
        *,
        partitions: Partitioner,
        reader: ClaimReader,
        steps: ClaimSteps,
        facts: Callable[[], CallFacts],
    ) -> None:
        self._journal = journal
        self._files = files
        self._partitions = partitions
        self._reader = reader
        self._steps = steps
        self._facts = facts

    def recover(self, checkpoint: Checkpoint) -> Checkpoint:
        """The checkpoint `checkpoint` (just loaded) becomes after recovery; the caller saves it."""
        for uid, entry in list(checkpoint.claims.items()):
            if entry.state != "PrepareCompleted":
                log.warning("dropping half-prepared claim", extra={"claim": uid, "claim_name": entry.name})
                checkpoint = checkpoint.without_claim(uid)
        partitions_gone = self._partitions.sweep(checkpoint)
        specs = self._files.spec_uids()
        for what, which in self._files.remove_orphans(set(checkpoint.claims)):
            log.warning("removed an orphaned file of a claim", extra={"what": what, "claim": which})
        for tmp in self._journal.remove_temp_files():
            log.warning("removed a temp file of an interrupted write", extra={"path": tmp})
        if checkpoint.node_boot_id != self._journal.boot_id:
            restored = self._restore_specs(checkpoint, list(checkpoint.claims), "the node rebooted")
            return restored.with_boot_id(self._journal.boot_id)
        missing = [uid for uid, e in checkpoint.claims.items() if e.devices and uid not in specs]
        checkpoint = self._restore_specs(checkpoint, missing, "its CDI spec is missing")
        gone = [uid for uid in partitions_gone if uid not in missing]
        return self._restore_specs(checkpoint, gone, "its MIG partition is gone")

    def _restore_specs(self, checkpoint: Checkpoint, uids: list[str], why: str) -> Checkpoint:
        """Re-write the specs of completed claims ``uids`` from their API objects; drop claims that are gone.

        A claim that cannot be restored now keeps its entry. After the first API error the remaining claims are not
        fetched: the server is unreachable or refusing, and each attempt could take the client's full timeout while
        the plugin is not yet serving the kubelet.
        """
        api_failure: PrepareError | None = None
        facts = self._facts() if uids else None
        for uid in sorted(uids):
            assert facts is not None
            entry = checkpoint.claims[uid]
            what = {"claim": uid, "claim_name": f"{entry.namespace}/{entry.name}", "why": why}
            if api_failure is not None:
                log.warning(
                    "cannot restore the CDI spec of a claim now: not fetched after an API failure",
                    extra={**what, "error": str(api_failure)},
                )
                continue
            try:
                claim = self._reader.read(ClaimRef(namespace=entry.namespace, name=entry.name, uid=uid))
                checkpoint = checkpoint.with_claim(uid, self._steps.prepare(claim, entry, facts, checkpoint).entry)
            except PrepareError as err:
                if err.kind.claim_gone:  # nothing to restore
                    log.warning("claim gone; dropping it", extra={**what, "error": str(err)})
                    self._files.remove(uid)
                    checkpoint = checkpoint.without_claim(uid)
                    continue
                if err.kind.api_unavailable:
                    api_failure = err
                log.warning(
                    "cannot restore the CDI spec of a claim now; the kubelet's next prepare of it re-writes it",
                    extra={**what, "error": str(err)},
                )
            except Exception as err:  # a restart must not crash-loop on one claim
                log.exception("cannot restore the CDI spec of a claim", extra={**what, "error": str(err)})
            else:
                log.info("restored the CDI spec of a claim", extra=what)
        return checkpoint
