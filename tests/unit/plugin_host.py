"""Shared factories of the node plugin's unit tests: a node's GPUs and device nodes, its settings, claims, a fake
API server as the Preparer sees it, and a Preparer on all of them. No root needed: device nodes are given to
the plugin as a snapshot (``HostNodes``), as ``devicenodes.snapshot`` would find them."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from api.kube_errors import api_error
from api.kube_rest import KubeConnection, KubeRest, claim_path
from api.names import DRIVER_NAME
from api.quantity import MiB
from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.model import ClaimRef, GpuInfo, PreparedDevice
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.prepare.preparer import Preparer
from kubelet_plugin.state import cdi
from kubelet_plugin.state.checkpoint import Checkpoint, CheckpointDevice, CheckpointStore, ClaimEntry
from tests.unit.fake_apiserver import connection, refused_url

NODE = "node-a"
NS = "team-a"
UID_A = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"
UID_B = "1c7a4d3f-6e2b-4c9f-8d80-3b2e4f5a6b7c"
UID_C = "2d8b5e40-7f3c-4da0-9e91-4c3f5a6b7c8d"
SHARE_A = "a671734a-e8e5-11e4-8fde-42010af09327"
SHARE_B = "b7d2c1e0-1111-4222-8333-444455556666"
UUID0 = "GPU-11111111-2222-4333-8444-555555555550"
UUID1 = "GPU-11111111-2222-4333-8444-555555555551"

#: The device nodes of a node with two GPUs: name -> (major, minor).
NODES: dict[str, tuple[int, int]] = {
    "nvidia0": (195, 0),
    "nvidia1": (195, 1),
    "nvidiactl": (195, 255),
    "nvidia-uvm": (510, 0),
    "nvidia-uvm-tools": (510, 1),
}


def gpu_info(index: int, uuid: str) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid,
        product_name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=81559 * MiB,
        minor=index,
        pci_bus_id=f"0000:{index + 1:02x}:00.0",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        driver_version="580.65.06",
    )


GPUS = [gpu_info(0, UUID0), gpu_info(1, UUID1)]


@dataclass
class HostNodes:
    """The device nodes of a test node's driver root: a table (name -> major, minor; delete an entry to take the
    node away) served as snapshots like ``devicenodes.snapshot`` serves the host's."""

    root: Path
    nodes: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(NODES))

    def __call__(self) -> DeviceNodeSnapshot:
        return DeviceNodeSnapshot.of(self.root, self.nodes)


def host_root(tmp_path: Path) -> Path:
    """`<tmp>/host`, the driver root of a test node (its device nodes are a ``HostNodes`` table)."""
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True, exist_ok=True)
    return root


def host_settings(tmp_path: Path, root: Path, **overrides: Any) -> Settings:
    """The plugin's settings for NODE with every host directory under `tmp_path` and the driver at `root`."""
    fields: dict[str, Any] = {
        "node_name": NODE,
        "kubelet_dir": tmp_path / "kubelet",
        "cdi_dir": tmp_path / "cdi",
        "driver_root": root,
        "dev_char_dir": tmp_path / "dev-char",
        "hami_core_lock_dir": tmp_path / "vgpulock",
    }
    return Settings(**(fields | overrides))


def make_preparer(
    api: KubeConnection,
    settings: Settings,
    store: CheckpointStore,
    metrics: PluginMetrics,
    *,
    gpus: list[GpuInfo] = GPUS,
    nodes: HostNodes | None = None,
    **kwargs: Any,
) -> Preparer:
    """A Preparer for `settings`' node whose device nodes are `nodes` (default: all of NODES); see
    `settle_ready_writes`."""
    nodes = nodes or HostNodes(settings.driver_root)
    preparer = Preparer(api, settings, gpus, store, metrics, device_nodes=nodes, **kwargs)
    _made.append(preparer)
    return preparer


#: The Preparers `make_preparer` made since the last `settle_ready_writes`.
_made: list[Preparer] = []


def settle_ready_writes(timeout: float = 10.0) -> None:
    """Wait for the background Ready writes of every Preparer made so far, so that none lands on the next
    test's FakeApi (`FakeApi.serve` patches KubeRest itself, which every thread sees)."""
    while _made:
        _made.pop().wait_ready_writes(timeout)


def make_claim(
    uid: str, name: str, device: str = "gpu-0", share: str = SHARE_A, memory: str = "10Gi"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 1},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER_NAME,
                            "pool": NODE,
                            "device": device,
                            "shareID": share,
                            "consumedCapacity": {"memory": memory},
                        }
                    ]
                }
            }
        },
    }


def ref(claim: dict[str, Any], uid: str | None = None) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=uid or meta["uid"])


def ready_only_entry(share_id: str) -> dict[str, Any]:
    """A claim's status.devices entry for share `share_id` of gpu-0 that says Ready and nothing else."""
    return {
        "driver": DRIVER_NAME,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": share_id,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": ""}],
    }


def completed_entry(uid: str, name: str) -> ClaimEntry:
    device = PreparedDevice(
        request_names=("gpu",),
        pool_name=NODE,
        device_name="gpu-0",
        cdi_device_ids=(cdi.cdi_device_id(DRIVER_NAME, uid, "gpu-0", SHARE_A),),
        share_id=SHARE_A,
    )
    return ClaimEntry(
        namespace=NS, name=name, state="PrepareCompleted", devices=[CheckpointDevice.from_prepared(device)]
    )


@dataclass
class FakeApi:
    """What the Preparer sees of the API server: claims by (namespace, name), recorded writes."""

    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: list[tuple[str, str]] = field(default_factory=list)
    status_patches: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, claim: dict[str, Any]) -> dict[str, Any]:
        self.claims[claim["metadata"]["namespace"], claim["metadata"]["name"]] = claim
        return claim

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        *_, namespace, kind, name = path.split("/")
        assert path == claim_path(namespace, name) and kind == "resourceclaims", path
        self.reads.append((namespace, name))
        claim = self.claims.get((namespace, name))
        if claim is None:
            raise api_error(404, "Not Found")
        return copy.deepcopy(claim)

    def apply(self, path: str, body: Any, field_manager: str, force: bool = True) -> dict[str, Any]:
        *_, namespace, _, name, subresource = path.split("/")
        assert subresource == "status", path
        self.status_patches.append(
            {"name": name, "namespace": namespace, "body": copy.deepcopy(body), "field_manager": field_manager}
        )
        return {}

    def create(self, path: str, body: Any) -> dict[str, Any]:
        assert path == "/api/v1/namespaces/default/events", path
        self.events.append({"namespace": "default", "body": copy.deepcopy(body)})
        return {}

    def serve(self, monkeypatch: pytest.MonkeyPatch) -> FakeApi:
        """Answer KubeRest's reads and writes from here (for the test's duration)."""
        monkeypatch.setattr(KubeRest, "get", self.get)
        monkeypatch.setattr(KubeRest, "apply", self.apply)
        monkeypatch.setattr(KubeRest, "create", self.create)
        return self


@dataclass
class Env:
    """A node plugin's Preparer on a fake API server, with its settings, checkpoint store, metrics and nodes."""

    api: FakeApi
    settings: Settings
    store: CheckpointStore
    metrics: PluginMetrics
    preparer: Preparer
    nodes: HostNodes

    def spec_file(self, uid: str) -> Path:
        return cdi.spec_path(self.settings.cdi_dir, DRIVER_NAME, uid)

    def checkpoint(self) -> Checkpoint:
        return self.store.load().checkpoint

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def new_preparer(self, boot: str = "boot-1", gpus: list[GpuInfo] = GPUS) -> Preparer:
        """A restarted plugin (same files, new process state), on boot `boot`."""
        self.store = CheckpointStore(self.store.path, current_boot_id=boot)
        self.metrics = PluginMetrics()
        self.preparer = make_preparer(
            connection(refused_url()), self.settings, self.store, self.metrics, gpus=gpus, nodes=self.nodes
        )
        return self.preparer


def make_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> Env:
    """An Env with every directory under `tmp_path`; `overrides` go to the settings."""
    api = FakeApi().serve(monkeypatch)
    settings = host_settings(tmp_path, host_root(tmp_path), **overrides)
    store = CheckpointStore(tmp_path / "ckpt.json", current_boot_id="boot-1")
    metrics = PluginMetrics()
    nodes = HostNodes(settings.driver_root)
    preparer = make_preparer(connection(refused_url()), settings, store, metrics, nodes=nodes)
    return Env(api, settings, store, metrics, preparer, nodes)
