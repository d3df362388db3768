"""Keeps this node's ResourceSlices published: creates, updates (bumping the pool generation) and re-creates
them after anyone deletes them (the kubelet wipes a node's slices when it starts). Never deletes them on
shutdown: pods keep their devices while the plugin restarts."""

import hashlib
import json
import logging
import threading
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kubelet_plugin.model import GpuInfo
from kubelet_plugin.settings import Settings
from kubelet_plugin.slices import build_slices

log = logging.getLogger(__name__)
SPEC_HASH_ANNOTATION = "fracgpu.dev/spec-hash"


def _spec_hash(body: dict[str, Any]) -> str:
    spec = dict(body["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class SlicePublisher:
    """Reconciles the node's pool of ResourceSlices with the discovered GPUs."""

    def __init__(self, api: client.ApiClient, settings: Settings, gpus: list[GpuInfo]) -> None:
        self._resource = client.ResourceV1Api(api)
        self._core = client.CoreV1Api(api)
        self._settings = settings
        self._gpus = gpus
        self._generation = 0
        self._selector = f"spec.nodeName={settings.node_name},spec.driver={settings.driver_name}"
        self.synced = threading.Event()

    def _existing(self) -> dict[str, dict[str, Any]]:
        resp = self._resource.list_resource_slice(field_selector=self._selector, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data)["items"]
        return {item["metadata"]["name"]: item for item in items}

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
        )
        for body in slices:
            body["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: _spec_hash(body)}
        return slices

    def sync(self) -> bool:
        """Make the published pool match the GPUs; return True when something was written."""
        node_uid: str = self._core.read_node(self._settings.node_name).metadata.uid
        existing = self._existing()
        generation = max([self._generation, *(s["spec"]["pool"]["generation"] for s in existing.values())])
        desired = self._desired(node_uid, generation)
        up_to_date = set(existing) == {d["metadata"]["name"] for d in desired} and all(
            (existing[d["metadata"]["name"]]["metadata"].get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
            == d["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
            and existing[d["metadata"]["name"]]["spec"]["pool"]["generation"] == generation
            and existing[d["metadata"]["name"]]["metadata"]["ownerReferences"][0]["uid"] == node_uid
            for d in desired
        )
        if up_to_date and generation > 0:
            self._generation = generation
            self.synced.set()
            return False
        generation += 1
        for body in self._desired(node_uid, generation):
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                self._resource.replace_resource_slice(name, body)
            else:
                self._resource.create_resource_slice(body)
        for name in set(existing) - {d["metadata"]["name"] for d in desired}:
            self._resource.delete_resource_slice(name)
        self._generation = generation
        log.info(
            "published ResourceSlices",
            extra={"node": self._settings.node_name, "generation": generation, "devices": len(self._gpus)},
        )
        self.synced.set()
        return True

    def run(self, stop: threading.Event) -> None:
        """Sync, then re-sync whenever a slice of ours changes or every `resync_seconds`, until `stop`."""
        while not stop.is_set():
            try:
                self.sync()
                self._watch_until_change(stop)
            except ApiException as err:
                if err.status == 409:  # raced with another writer: sync again right away
                    continue
                log.warning("ResourceSlice sync failed; retrying", extra={"status": err.status, "reason": err.reason})
                stop.wait(2)
            except Exception:
                log.exception("ResourceSlice sync failed; retrying")
                stop.wait(2)

    def _watch_until_change(self, stop: threading.Event) -> None:
        """Return after the first change made by someone else, or after the resync period."""
        w = watch.Watch()
        seconds = max(1, int(self._settings.resync_seconds))
        for event in w.stream(
            self._resource.list_resource_slice, field_selector=self._selector, timeout_seconds=seconds
        ):
            if stop.is_set():
                break
            obj = event["object"]
            annotations = obj.metadata.annotations or {}
            ours = obj.spec.pool.generation == self._generation and SPEC_HASH_ANNOTATION in annotations
            if event["type"] == "DELETED" or not ours:
                log.info("ResourceSlice changed by someone else; re-publishing", extra={"slice": obj.metadata.name})
                break
        w.stop()
