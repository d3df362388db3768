"""A local cluster of several nodes: one control plane, N kubelets, each node with its own simulated GPUs.

    cluster = MultiNodeCluster(state_dir, [NodeProfile("fracgpu-h100", H100X2), NodeProfile("fracgpu-a100", A100X1)])
    cluster.start()    # every node Ready
    cluster.stop()

Every node has its own network namespace (`fracgpu-<slot>`, cluster address 203.0.113.(4·slot+2), TEST-NET-3) with
containerd and kubelet in it; the control plane runs in the first node's, and each other node has a veth link to
it that routes exactly the two nodes' addresses (netns.link): no route leads anywhere else. Each node also has a
mount namespace (mountns.py) in which NODE_ROOT is its own directory `/run/fg<slot>`: the chart's host paths
(kubelet dir, CDI dir, driver root, NVML directory) are the same for every node, as on a real cluster, and name a
different directory on each. Each kubelet has its own cgroup root, so none cleans up another's pods.
"""

import contextlib
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.cluster import binaries
from harness.cluster.containerd import Containerd, ContainerdSettings, kill_shims
from harness.cluster.controlplane import ControlPlane
from harness.cluster.mountns import NODE_ROOT, MountNamespace
from harness.cluster.netns import Netns, free_slots, link
from harness.cluster.node import (
    NO_POD_NETWORK,
    RUNC,
    _make_shared_mount,
    _unmount_below,
    start_kubelet,
    wait_node_ready,
)
from harness.cluster.processes import ProcessGroup, stop_recorded
from harness.image import small
from harness.mocknvml import PROFILES

CGROUP_FS = Path("/sys/fs/cgroup")
H100X2 = PROFILES / "sim80gi-x2.profile"
A100X1 = PROFILES / "a100-40gb-x1.profile"
DEFAULT_PROFILES = (H100X2, A100X1)


@dataclass(frozen=True)
class NodeProfile:
    """A node to start: its name and the mock NVML profile of its simulated GPUs."""

    name: str
    gpus: Path


def default_profiles(count: int) -> list[NodeProfile]:
    """`count` nodes `fracgpu-node-<i>` alternating 2x H100 80GB and 1x A100 40GB."""
    if count < 1:
        raise ValueError(f"a cluster needs at least one node, not {count}")
    return [NodeProfile(f"fracgpu-node-{i}", DEFAULT_PROFILES[i % len(DEFAULT_PROFILES)]) for i in range(count)]


def _cgroup_mounts() -> list[Path]:
    """Every cgroup hierarchy under /sys/fs/cgroup (v1 controllers and the unified one)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2") and point.startswith(f"{CGROUP_FS}/"):
            found.append(Path(point))
    return found or [CGROUP_FS]


class ClusterNode:
    """One node: containerd and kubelet in its network and mount namespaces, state under `state_dir`."""

    def __init__(self, profile: NodeProfile, state_dir: Path, slot: int, *, detached: bool) -> None:
        self.name = profile.name
        self.profile = profile
        self.state_dir = state_dir
        self.netns = Netns(slot)
        self.short_dir = Path(f"/run/fg{slot}")  # NODE_ROOT inside the node
        self.mountns = MountNamespace(f"fg{slot}", self.short_dir)
        self.kubelet_dir = NODE_ROOT / "kubelet"  # as the node (and the chart) sees them
        self.cdi_dir = NODE_ROOT / "cdi"
        self.cgroup_root = f"/fracgpu-{self.name}"
        prefix = ["nsenter", f"--net={self.netns.path}", *self.mountns.exec_prefix(), "--"]
        self.procs = ProcessGroup(state_dir, detached=detached, prefix=prefix)
        self.containerd = Containerd(
            state_dir / "containerd",
            settings=ContainerdSettings(
                cdi_spec_dirs=[str(self.cdi_dir)],
                cni_conf_dir=str(state_dir / "cni"),
                cni_bin_dirs=[str(state_dir / "cni-bin")],
                # see SingleNodeCluster: our machines' root lacks CAP_SYS_RESOURCE
                extra={"plugins": {"io.containerd.cri.v1.runtime": {"restrict_oom_score_adj": True}}},
            ),
            socket=self.short_dir / "containerd.sock",
            procs=self.procs,
        )

    def host_path(self, inside: Path) -> Path:
        """The host path of a path below NODE_ROOT as this node sees it."""
        return self.mountns.host_path(inside)

    def read_file(self, inside: Path) -> str:
        """A file as this node sees it, mounts included (e.g. a pod's projected service-account token)."""
        return self.mountns.run("cat", str(inside))

    def prepare(self) -> None:
        """Directories, the namespaces and the kubelet's cgroup root."""
        (self.state_dir / "cni").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "cni" / "10-fracgpu.conflist").write_text(json.dumps(NO_POD_NETWORK))
        for directory in (self.host_path(self.kubelet_dir), self.host_path(self.cdi_dir)):
            directory.mkdir(parents=True, exist_ok=True)
        _make_shared_mount(self.short_dir)
        self.netns.create()
        self.mountns.create()
        for hierarchy in _cgroup_mounts():
            own = hierarchy / self.cgroup_root.lstrip("/")
            own.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # a new v1 cpuset is empty: nothing could run in it
                if (own / name).exists() and not (own / name).read_text().strip():
                    (own / name).write_text((hierarchy / name).read_text())

    def start(self, plane: ControlPlane, images: Path) -> None:
        """containerd (with the base images, built into `images`) and the kubelet."""
        self.containerd.start()
        for archive in (small.build_pause(images), small.build_busybox(images)):
            self.import_image(archive.path)
        start_kubelet(
            self.procs,
            plane,
            self.state_dir,
            node=self.name,
            address=self.netns.address,
            containerd_socket=self.containerd.socket,
            root_dir=self.kubelet_dir,
            config_extra={"cgroupRoot": self.cgroup_root},
        )

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into this node's containerd (CRI namespace `k8s.io`)."""
        self.containerd.ctr("images", "import", "--no-unpack=false", str(archive), namespace="k8s.io")

    def stop(self) -> None:
        """The kubelet, containerd and its containers (`remove` then drops the rest)."""
        if "kubelet" in self.procs.procs:
            self.procs.stop("kubelet")
        self.containerd.stop()
        self.procs.stop_all()

    def remove(self) -> None:
        """The namespaces, mounts and cgroups of this node (once nothing runs in them)."""
        self.mountns.delete()
        self.netns.delete()
        _unmount_below(self.short_dir)
        subprocess.run(["umount", "-l", str(self.short_dir)], check=False, capture_output=True)
        shutil.rmtree(self.short_dir, ignore_errors=True)
        _remove_cgroups(self.cgroup_root)

    def record(self) -> dict[str, object]:
        """What `down` needs to tear this node down from another process."""
        return {
            "name": self.name,
            "slot": self.netns.slot,
            "state_dir": str(self.state_dir),
            "short_dir": str(self.short_dir),
            "socket": str(self.containerd.socket),
            "cgroup_root": self.cgroup_root,
        }


def _remove_cgroups(root: str) -> None:
    """Remove a kubelet's cgroup tree (deepest first; only empty cgroups can go)."""
    for hierarchy in _cgroup_mounts():
        top = hierarchy / root.lstrip("/")
        if top.is_dir():
            for directory in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


class MultiNodeCluster:
    """A control plane (in the first node's network namespace) and one kubelet per profile, under `state_dir`."""

    def __init__(self, state_dir: Path, profiles: list[NodeProfile], *, detached: bool = False) -> None:
        if len({p.name for p in profiles}) != len(profiles) or not profiles:
            raise ValueError(f"node names must be unique and at least one: {[p.name for p in profiles]}")
        self.state_dir = state_dir.resolve()
        self.nodes = [
            ClusterNode(p, self.state_dir / "nodes" / p.name, slot, detached=detached)
            for p, slot in zip(profiles, free_slots(len(profiles)), strict=True)
        ]
        self.plane = ControlPlane(self.state_dir, netns=self.nodes[0].netns, detached=detached)
        self.procs = self.plane.procs  # the control plane's; each node's are `node.procs`

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def server(self) -> str:
        return self.plane.server

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.name == name)

    def start(self, timeout: float = 180.0) -> None:
        """Namespaces and links, the control plane, every node; returns when every node is Ready."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.nodes:
                node.prepare()
            hub = self.nodes[0].netns
            for node in self.nodes[1:]:
                link(hub, node.netns)
            self._record()
            self.plane.start(timeout)
            for node in self.nodes:
                node.start(self.plane, self.state_dir / "images")
            for node in self.nodes:
                self.wait_node_ready(node, timeout)
            runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNC}}
            self.kubectl("apply", "-f", "-", input_=json.dumps({**runtime_class, "handler": RUNC}))
        except BaseException:
            self.stop()
            raise

    def _record(self) -> None:
        record = {"nodes": [n.record() for n in self.nodes]}
        self.state_dir.joinpath("cluster.json").write_text(json.dumps(record))

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into every node's containerd."""
        for node in self.nodes:
            node.import_image(archive)

    def kubectl(self, *args: str, check: bool = True, input_: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl against this cluster, from the host."""
        argv = [str(binaries.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(argv, check=check, capture_output=True, text=True, input=input_, timeout=120)

    def wait_node_ready(self, node: ClusterNode, timeout: float) -> None:
        wait_node_ready(self.kubectl, node.procs, node.name, timeout)

    def stop(self) -> None:
        """Every node's processes, the control plane, then the nodes' namespaces and directories."""
        for node in reversed(self.nodes):
            node.stop()
        self.plane.stop()
        for node in self.nodes:
            node.remove()


def down_nodes(record: list[dict[str, str]]) -> list[str]:
    """Tear down the nodes of a detached multi-node cluster from their records (see ClusterNode.record)."""
    stopped: list[str] = []
    for info in record:
        state_dir, short_dir = Path(info["state_dir"]), Path(info["short_dir"])
        stopped += stop_recorded(state_dir)
        stopped += [f"shim {pid}" for pid in kill_shims(Path(info["socket"]))]
        time.sleep(0.5)
        MountNamespace(f"fg{info['slot']}", short_dir).delete()
        _unmount_below(short_dir)
        Netns(int(info["slot"])).delete()
        subprocess.run(["umount", "-l", str(short_dir)], check=False, capture_output=True)
        shutil.rmtree(short_dir, ignore_errors=True)
        _remove_cgroups(info["cgroup_root"])
    return stopped
