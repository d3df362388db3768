"""Keeps this node's ResourceSlices published: creates, updates (bumping the pool generation) and re-creates
them after anyone deletes them (the kubelet wipes a node's slices when it starts). Never deletes them on
shutdown: pods keep their devices while the plugin restarts.

It lists (and writes what differs), then watches its slices from the list's resourceVersion, as client-go's
reflector does: a change by someone else, an `ERROR` event (410: too old) or the resync period lists again; a
watch that could not start (throttled past the client's budget, unreachable) is started again from the same
resourceVersion after the reflector's backoff (`api.kube_retry.reflector_backoff`, at least the wait the API
server asked), without a new list; a failed list is retried after the same backoff."""

import hashlib
import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from api.kube_errors import ApiConflict, ApiError, ApiGone
from api.kube_rest import SLICES, KubeConnection, KubeRest, node_path
from api.kube_retry import reflector_backoff
from kubelet_plugin.core.coalesce import Coalescer
from kubelet_plugin.core.filelock import serialize_lock
from kubelet_plugin.core.model import GpuInfo, MigGpu
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.publishing.slices import build_slices

log = logging.getLogger(__name__)
SPEC_HASH_ANNOTATION = "fracgpu.dev/spec-hash"
PUBLISH_LOCK = "publish.lock"


def _spec_hash(body: dict[str, Any]) -> str:
    spec = dict(body["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class SlicePublisher:
    """Reconciles the node's pool of ResourceSlices with the discovered GPUs."""

    def __init__(
        self,
        api: KubeConnection,
        settings: Settings,
        gpus: list[GpuInfo],
        enforcement: EnforcementDetector | None = None,
        *,
        taints: Callable[[], Mapping[str, list[dict[str, str]]]] | None = None,
        changes: Coalescer | None = None,
        on_write: Callable[[], None] | None = None,
        mig: Mapping[str, MigGpu] | None = None,
    ) -> None:
        """`enforcement`: the tiers each GPU offers (default: HAMi-core where its library is, no nvml);
        `taints`: device name -> its taints now (GPU health); `changes`: notified when they change, each
        coalesced burst is one re-sync; `on_write`: called for every slice written (created, replaced, deleted);
        `mig`: the MIG GPUs (``--mig-gpus``) -> what they offer (``kinds/mig/discovery.py``), published as MIG GPUs."""
        self._rest = KubeRest.bounded(api, settings.api_timeout_seconds)
        self._taints = taints or dict
        self._changes = changes
        self._on_write = on_write or (lambda: None)
        self._sync_lock = threading.Lock()
        self._settings = settings
        self._gpus = gpus
        self._mig = dict(mig or {})
        self._enforcement = enforcement or EnforcementDetector.without_nvml(settings, gpus, "nvml was not detected")
        self._generation = 0
        self._list_version = ""
        self._selector = f"spec.nodeName={settings.node_name},spec.driver={settings.driver_name}"
        self.synced = threading.Event()

    def _existing(self) -> dict[str, dict[str, Any]]:
        listed = self._rest.get(SLICES, fieldSelector=self._selector)
        self._list_version = str(listed["metadata"].get("resourceVersion", ""))  # the watch starts here
        return {item["metadata"]["name"]: item for item in listed["items"]}

    def _desired(self, node_uid: str, generation: int) -> list[dict[str, Any]]:
        s = self._settings
        slices = build_slices(
            s.node_name,
            node_uid,
            s.driver_name,
            self._gpus,
            step=s.memory_step_bytes,
            reserve=s.memory_reserve_bytes,
            generation=generation,
            hami_core=s.hami_core_library.is_file(),
            enforcement={name: tiers.published for name, tiers in self._enforcement.tiers().items()},
            taints=self._taints(),
            mig=self._mig,
            mps_binding=s.mps_trust_scope != "cluster",
        )
        for body in slices:
            body["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: _spec_hash(body)}
        return slices

    @staticmethod
    def _current(existing: dict[str, Any], desired: dict[str, Any], generation: int, node_uid: str) -> bool:
        annotations = existing["metadata"].get("annotations") or {}
        owners = existing["metadata"].get("ownerReferences") or [{}]
        return bool(
            annotations.get(SPEC_HASH_ANNOTATION) == desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
            and existing["spec"]["pool"]["generation"] == generation
            and owners[0].get("uid") == node_uid
        )

    def sync(self) -> bool:
        """Make the published pool match the GPUs; return True when something was written."""
        with self._sync_lock:
            return self._sync()

    def _sync(self) -> bool:
        node_uid: str = self._rest.get(node_path(self._settings.node_name))["metadata"]["uid"]
        existing = self._existing()
        generation = max([self._generation, *(s["spec"]["pool"]["generation"] for s in existing.values())])
        desired = self._desired(node_uid, generation)
        names = {d["metadata"]["name"] for d in desired}
        if (
            generation > 0
            and set(existing) == names
            and all(self._current(existing[d["metadata"]["name"]], d, generation, node_uid) for d in desired)
        ):
            self._generation = generation
            self.synced.set()
            return False
        generation += 1
        for body in self._desired(node_uid, generation):
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                self._rest.replace(f"{SLICES}/{name}", body)
            else:
                self._rest.create(SLICES, body)
            self._on_write()
        for name in set(existing) - names:
            self._rest.delete(f"{SLICES}/{name}")
            self._on_write()
        self._generation = generation
        log.info(
            "published ResourceSlices",
            extra={"node": self._settings.node_name, "generation": generation, "devices": len(self._gpus)},
        )
        self.synced.set()
        return True

    def run(self, stop: threading.Event) -> None:
        """Sync, then re-sync whenever a slice of ours changes or every `resync_seconds`, until `stop`.

        Only one plugin instance per node publishes at a time (a file lock next to the checkpoint): during a
        rolling update the new pod takes over when the old one exits, instead of both rewriting the pool.
        """
        with serialize_lock(self._settings.plugin_data_dir / PUBLISH_LOCK):
            if self._changes is not None:
                threading.Thread(target=self._sync_changes, args=(stop,), name="slice-taints", daemon=True).start()
            listed, failures = False, 0
            while not stop.is_set():
                try:
                    if not listed:
                        self.sync()
                        listed = True
                    self._watch_until_change(stop)
                    listed, failures = False, 0  # changed, or the resync period is over: list again
                except ApiError as err:
                    failures += 1
                    listed = listed and not isinstance(err, ApiGone)
                    # raced with another writer: at once; else the reflector's backoff
                    delay = 0.2 if isinstance(err, ApiConflict) else reflector_backoff(failures, err, random.random())
                    what = "watch" if listed else "sync"
                    log.warning(f"ResourceSlice {what} failed; retrying", extra={"error": str(err), "retry_in": delay})
                    stop.wait(delay)
                except Exception:
                    log.exception("ResourceSlice sync failed; retrying")
                    listed = False
                    stop.wait(2)

    def _sync_changes(self, stop: threading.Event) -> None:
        """Re-sync once per coalesced burst of `changes` (GPU health), while this instance publishes."""
        assert self._changes is not None
        while self._changes.wait_due(stop):
            self._changes.flushed()
            try:
                self.sync()
            except Exception:
                log.exception("ResourceSlice sync after a GPU health change failed; retrying")
                self._changes.notify()

    def _watch_until_change(self, stop: threading.Event) -> None:
        """Return after the first change made by someone else, or after the resync period."""
        seconds = max(1, int(self._settings.resync_seconds))
        events = self._rest.watch(
            SLICES, seconds, fieldSelector=self._selector, resourceVersion=self._list_version or None
        )
        for event in events:
            if stop.is_set():
                return
            obj = event.get("object") or {}
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            ours = obj.get("spec", {}).get("pool", {}).get("generation") == self._generation
            if event.get("type") in ("DELETED", "ERROR") or not (ours and SPEC_HASH_ANNOTATION in annotations):
                log.info("ResourceSlice changed by someone else; re-publishing", extra={"event": event.get("type")})
                return
