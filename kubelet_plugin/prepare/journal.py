"""The checkpoint as the claim flow uses it: load it (reporting what is wrong with it), save it, rebuild it.

``load`` gives the checkpoint in the current schema. A corrupt file (moved aside by ``CheckpointStore``) is
rebuilt from the CDI specs present (claims, devices and, where a spec tells, GPU UUIDs), saved, counted, logged
and posted as a ``CheckpointCorrupt`` Node Event, so the claims of running pods stay known and their specs are
not taken for orphans. A file of a newer schema raises ``NewerSchemaError`` and stays untouched; it is logged
and posted (``CheckpointTooNew``) the first time in a row it is seen. Unknown fields are logged when they change.
Callers hold the node lock.

The node-wide lock every checkpoint and claim-file change happens under (``NodeLock``): this process's lock, then
the ``serialize.lock`` file lock shared with every plugin instance on the node (``filelock.serialize_lock``).
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from api.kube_rest import KubeRest
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.events import post_node_event
from kubelet_plugin.core.filelock import remove_temp_files, serialize_lock
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointStore, NewerSchemaError
from kubelet_plugin.state.claim_files import ClaimStore
from kubelet_plugin.state.spec_rebuild import entry_from_spec

log = logging.getLogger(__name__)


class ClaimJournal:
    """Loads and saves one node's checkpoint; see the module docstring."""

    def __init__(
        self,
        store: CheckpointStore,
        files: ClaimStore,
        *,
        rest: KubeRest,
        node_name: str,
        driver: str,
        metrics: PluginMetrics,
    ) -> None:
        self._store = store
        self._files = files
        self._rest = rest
        self._node = node_name
        self._driver = driver
        self._metrics = metrics
        self._reported: tuple[str | None, tuple[str, ...]] = (None, ())  # (too_new, unknown fields) logged last

    @property
    def boot_id(self) -> str:
        """This boot's ID (a checkpoint of another boot needs every spec re-written)."""
        return self._store.current_boot_id

    def load(self) -> Checkpoint:
        """The checkpoint on disk in the current schema (see the module docstring); raises NewerSchemaError."""
        result = self._store.load()
        self._metrics.checkpoint_too_new.set(1 if result.too_new else 0)
        reported, self._reported = self._reported, (result.too_new, result.unknown_fields)
        if result.too_new:
            if reported[0] != result.too_new:
                log.error(
                    "checkpoint is of a newer schema; refusing to prepare or unprepare",
                    extra={"problem": result.too_new},
                )
                post_node_event(self._rest, self._node, "CheckpointTooNew", result.too_new)
            raise NewerSchemaError(result.too_new)
        if result.unknown_fields and reported[1] != result.unknown_fields:
            log.warning(
                "checkpoint has fields this plugin does not know; they are kept as they are",
                extra={"path": str(self._store.path), "fields": list(result.unknown_fields)},
            )
        if result.migrated_from is not None:
            log.info("checkpoint migrated", extra={"from_schema": result.migrated_from})
        if not result.corruption:
            return result.checkpoint
        return self._rebuild(result.checkpoint, result.corruption)

    def _rebuild(self, checkpoint: Checkpoint, corruption: str) -> Checkpoint:
        for uid in sorted(self._files.spec_uids()):
            text = self._files.read_spec(uid)
            entry = None if text is None else entry_from_spec(text, uid, self._driver, self._node)
            if entry is not None:
                checkpoint = checkpoint.with_claim(uid, entry)
        self._store.save(checkpoint)
        unknown_gpu = sum(d.uuid is None for e in checkpoint.claims.values() for d in e.devices)
        message = f"{corruption}; recovered {len(checkpoint.claims)} prepared claims from their CDI specs" + (
            f" ({unknown_gpu} devices without a known GPU UUID)" if unknown_gpu else ""
        )
        self._metrics.checkpoint_corruptions.inc()
        log.error("checkpoint was corrupt and has been rebuilt", extra={"problem": message})
        post_node_event(self._rest, self._node, "CheckpointCorrupt", message)
        return checkpoint

    def save(self, checkpoint: Checkpoint) -> None:
        """Replace the file durably (the one fsynced write of a prepare or unprepare). Raises OSError."""
        self._store.save(checkpoint)

    def remove_temp_files(self) -> list[str]:
        """Delete temp files of interrupted checkpoint writes; their paths."""
        return [str(p) for p in remove_temp_files(self._store.path.parent, self._store.path.name)]


class NodeLockTimeoutError(PrepareError):
    """The node-wide lock was not free within the timeout."""


class NodeLock:
    """Holds both locks; bounded by `timeout_s` for kubelet calls, `on_timeout` called at each timeout."""

    def __init__(self, path: Path, timeout_s: float, on_timeout: Callable[[], None] = lambda: None) -> None:
        self._path = path
        self._timeout = timeout_s
        self._on_timeout = on_timeout
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, *, bounded: bool = True, timeout: float | None = None) -> Iterator[None]:
        """Hold both locks for the block; raises NodeLockTimeoutError when they are not ours within the
        timeout (`timeout` if given, else the lock's own). Unbounded (`bounded=False`) at start, when no kubelet
        call is waiting."""
        if not bounded:
            with self._lock, serialize_lock(self._path):
                yield
            return
        limit = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with ExitStack() as held:
            if not self._lock.acquire(timeout=limit):
                raise self._timed_out("another call of this fracgpu plugin", limit)
            held.callback(self._lock.release)
            try:
                held.enter_context(serialize_lock(self._path, timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                raise self._timed_out("another fracgpu plugin instance", limit) from None
            yield

    def _timed_out(self, holder: str, limit: float) -> NodeLockTimeoutError:
        self._on_timeout()
        waited = f"for {limit:.3g} s" if limit > 0 else "when this call had no time left to wait for it"
        return NodeLockTimeoutError(
            ErrorKind.LOCK_TIMEOUT, f"{holder} held the node lock {waited}; the kubelet retries"
        )
