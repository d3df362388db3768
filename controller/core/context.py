"""What every manager of the controller shares: settings, the writer, the pool of API threads, kopf's indexes and
one ready flag, built once by the entry (`controller.loops`).

Managers read the cluster through the accessors here (`claims`, `claim`, `gpus`, `device_class`, `node_names`, ...);
the indexes themselves are kopf's, bound by the entry at startup. Nothing here decides anything.
"""

import asyncio
import contextlib
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol, TypeVar

from controller.core.claims import ClaimView, DeviceClassView, PodRef
from controller.core.settings import Settings
from controller.core.slices import SliceView, TaintRuleView

T = TypeVar("T")
ClaimKey = tuple[str, str]
Index = Mapping[Any, Iterable[Any]]
"""kopf.Index shape: key -> collection of values."""


class Writer(Protocol):
    """The API writes the controller makes (blocking; called from the context's threads)."""

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...
    def apply_gpu(self, body: dict[str, Any], *, status: bool) -> None: ...
    def delete_gpu(self, name: str) -> None: ...
    def post_claim_event(self, claim: ClaimView, key: tuple[str, ...], reason: str, message: str) -> bool:
        """Post the Event `key` about `claim` (idempotent per claim uid and key); never raises.

        True once it exists (or can never be posted); False when a retry may succeed.
        """
        ...

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod `name` as the API server has it now (None: there is none). Raises on other API errors."""
        ...

    def list_unbound_pods(self, namespace: str) -> list[dict[str, Any]]:
        """The Pods of `namespace` not bound to a node (`spec.nodeName` empty). Raises on API errors."""
        ...

    def post_pod_event(self, namespace: str, pod: PodRef, about: tuple[str, ...], reason: str, message: str) -> bool:
        """Post the Event `about` (a claim uid and its Event's key) on `pod` (idempotent per pod uid and `about`);
        never raises. True once it exists (or can never be posted); False when a retry may succeed."""
        ...

    def list_heartbeats(self, namespace: str) -> list[dict[str, Any]]:
        """The node plugins' heartbeat Leases of our driver in `namespace` (api/heartbeat.py). Raises on API errors."""
        ...

    def create_taint_rule(self, body: dict[str, Any]) -> str:
        """Create a DeviceTaintRule; its uid. Raises ApiAlreadyExists when one of that name exists."""
        ...

    def read_taint_rule(self, name: str) -> dict[str, Any] | None:
        """The DeviceTaintRule `name` as the API server has it now (None: there is none). Raises on API errors."""
        ...

    def apply_taint_rule(self, body: dict[str, Any]) -> None:
        """Server-side apply a DeviceTaintRule (forced: our fields are written back whoever changed them)."""
        ...

    def delete_taint_rule(self, name: str) -> None:
        """Delete a DeviceTaintRule; already gone is fine."""
        ...

    def post_taint_rule_event(self, name: str, uid: str, reason: str, message: str) -> bool:
        """Post a Warning Event about the DeviceTaintRule `name`; never raises. True when posted."""
        ...


class Indexes(NamedTuple):
    """kopf's live indexes (handlers.INDEX_IDS, in this order)."""

    slices: Index
    claims: Index
    gpus: Index
    classes: Index
    nodes: Index | None = None
    """Node name -> uid; None: Nodes are not watched."""
    namespaces: Index | None = None
    """Namespace name -> its labels; None: Namespaces are not watched (only MPS trust scope namespaceLabel does)."""
    taint_rules: Index | None = None
    """DeviceTaintRule name -> its view (those that may select our devices); None: not watched."""


class Tasks:
    """The loops one manager runs on the event loop: started by `spawn`, all cancelled and awaited by `cancel`."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def spawn(self, loop: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(loop, name=name))

    async def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []


def first(index: Index, key: Any) -> Any:
    """The first value under `key` (kopf keeps a collection per key), or None."""
    values = index.get(key)
    return next(iter(values), None) if values is not None else None


class Context:
    """Settings, writer, API threads, indexes and the ready flag, shared read-only by every manager."""

    def __init__(self, settings: Settings, writer: Writer) -> None:
        self.settings = settings
        self.driver = settings.driver_name
        self.writer = writer
        self.indexes = Indexes({}, {}, {}, {})
        self.ready = asyncio.Event()
        """Set once kopf delivered the first event after the indexes were populated."""
        self._executor = self._new_executor()

    def bind(self, indexes: Indexes) -> None:
        """Attach kopf's live indexes (passed to startup handlers before they are populated)."""
        self.indexes = indexes

    def _new_executor(self) -> ThreadPoolExecutor:
        workers = self.settings.workers + self.settings.ledger_workers + 4  # status, ledger writers; Event posts
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fracgpu-api")

    def open(self) -> None:
        """A new pool of API threads after `close` (leadership regained)."""
        self._executor = self._new_executor()

    def close(self) -> None:
        """Stop taking API calls; those in flight finish in their threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in an API thread (a blocking call of the writer)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    # ----- read-only accessors over the indexes ------------------------------------------------------

    def claim(self, key: ClaimKey) -> ClaimView | None:
        view: ClaimView | None = first(self.indexes.claims, key)
        return view

    def claim_keys(self) -> list[ClaimKey]:
        return list(self.indexes.claims)

    def claims(self) -> list[ClaimView]:
        return [v for values in self.indexes.claims.values() for v in values]

    def slices(self) -> list[SliceView]:
        return [v for values in self.indexes.slices.values() for v in values]

    def gpu(self, name: str) -> Any:
        """The indexed GPU object `name` (`controller.ledger.plan.ExistingGpu`), or None."""
        return first(self.indexes.gpus, name)

    def gpus(self) -> list[Any]:
        return [v for values in self.indexes.gpus.values() for v in values]

    def device_class(self) -> DeviceClassView | None:
        """Our DeviceClass as the cluster has it; None when it is not (or not yet) seen."""
        view: DeviceClassView | None = first(self.indexes.classes, self.settings.device_class)
        return view

    def claim_classes(self) -> dict[str, DeviceClassView]:
        """Our DeviceClasses as the cluster has them (the GPU class and the MIG class), by name; one not (yet)
        seen is absent."""
        return {n: v for n in self.settings.claim_classes if (v := first(self.indexes.classes, n)) is not None}

    def has_class(self, name: str) -> bool | None:
        """Whether the DeviceClass `name` exists, for one of `Settings.indexed_classes`; None while the indexes are
        not yet populated (or for another name)."""
        if name not in self.settings.indexed_classes or not self.ready.is_set():
            return None
        return first(self.indexes.classes, name) is not None

    def taint_rule(self, name: str) -> TaintRuleView | None:
        """The DeviceTaintRule `name`, if it may select our devices."""
        if self.indexes.taint_rules is None:
            return None
        view: TaintRuleView | None = first(self.indexes.taint_rules, name)
        return view

    def taint_rules(self) -> list[TaintRuleView]:
        """The DeviceTaintRules that may select our devices."""
        if self.indexes.taint_rules is None:
            return []
        return [v for values in self.indexes.taint_rules.values() for v in values]

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels of `namespace`; None when Namespaces are not watched or it is not (yet) seen."""
        if self.indexes.namespaces is None:
            return None
        labels: Mapping[str, str] | None = first(self.indexes.namespaces, namespace)
        return labels

    def node_names(self) -> Collection[str] | None:
        """The Nodes that exist; None while they are not known (not watched, or kopf's indexes not yet populated)."""
        if self.indexes.nodes is None or not self.ready.is_set():
            return None
        return self.indexes.nodes.keys()
