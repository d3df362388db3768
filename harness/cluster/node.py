"""A single-node cluster of upstream binaries in a network namespace of its own:

control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) + containerd 2.x (CDI on) +
kubelet, all inside `fracgpu-<slot>`; the host reaches the API server through a veth pair. Pods use
`hostNetwork: true`, i.e. the namespace's network: there is no pod network and no default route, so no
packet can leave the machine. Images are imported from local archives, never pulled.

containerd's runtime handlers: `runc` (the default), or with `nvidia_runtime=True` NVIDIA's
`nvidia-container-runtime` in `cdi` mode as the default and `runc` a second handler (nvidia_runtime.py).
Each handler has a RuntimeClass of its name, so a pod can say `runtimeClassName: runc` to run without NVIDIA's
runtime whatever the default.
"""

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from harness.cluster import binaries
from harness.cluster import nvidia_runtime as nvidia_runtime_module
from harness.cluster.containerd import Containerd, ContainerdSettings, kill_shims
from harness.cluster.controlplane import ControlPlane, write_kubeconfig
from harness.cluster.netns import Netns, free_slot
from harness.cluster.processes import ProcessGroup, stop_recorded
from harness.image import small

NODE_NAME = "fracgpu-node"
RUNC = "runc"
"""containerd's runc handler and its RuntimeClass: no NVIDIA runtime involved."""
# containerd's CRI plugin reports the network ready once it has loaded a CNI config; this one names a
# plugin that does not exist, so only hostNetwork pods can run: a pod asking for a pod network fails to
# start instead of getting an address that could route anywhere.
NO_POD_NETWORK = {
    "cniVersion": "1.0.0",
    "name": "fracgpu-host-network-only",
    "plugins": [{"type": "fracgpu-no-pod-network"}],
}


class SingleNodeCluster:
    """Everything under `state_dir` (logs, PKI, etcd, containerd) and `/run/fg<slot>` (short socket paths)."""

    def __init__(
        self, state_dir: Path, *, detached: bool = False, node_name: str = NODE_NAME, nvidia_runtime: bool = False
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.nvidia_runtime = nvidia_runtime
        self.runtime_classes = [RUNC, nvidia_runtime_module.HANDLER] if nvidia_runtime else [RUNC]
        self.nvidia_runtime_dir = self.state_dir / "nvidia-container-runtime"  # its config and log
        self.netns = Netns(free_slot())
        self.node_name = node_name
        self.short_dir = Path(f"/run/fg{self.netns.slot}")
        self.kubelet_dir = self.short_dir / "kubelet"
        self.cdi_dir = self.short_dir / "cdi"
        self.plane = ControlPlane(self.state_dir, netns=self.netns, detached=detached)
        self.procs = self.plane.procs
        # Sandboxes get oom_score_adj -998, which needs CAP_SYS_RESOURCE; our machines' root lacks it, so
        # clamp every score to containerd's own instead of failing each pod start.
        cri: dict[str, object] = {"restrict_oom_score_adj": True}
        env: dict[str, str] = {}
        if nvidia_runtime:
            cri |= nvidia_runtime_module.containerd_runtimes(binaries.binary(nvidia_runtime_module.BINARY))
            env[nvidia_runtime_module.CONFIG_ENV] = str(self.nvidia_runtime_dir / "config.toml")
        self.containerd = Containerd(
            self.state_dir / "containerd",
            settings=ContainerdSettings(
                cdi_spec_dirs=[str(self.cdi_dir)],
                cni_conf_dir=str(self.state_dir / "cni"),
                cni_bin_dirs=[str(self.state_dir / "cni-bin")],
                extra={"plugins": {"io.containerd.cri.v1.runtime": cri}},
                env=env,
            ),
            socket=self.short_dir / "containerd.sock",
            procs=self.procs,
        )

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def server(self) -> str:
        return self.plane.server

    def start(self, timeout: float = 180.0) -> None:
        """Create the namespace, start every component, import the base images, wait for the Node Ready."""
        (self.state_dir / "cni").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "cni" / "10-fracgpu.conflist").write_text(json.dumps(NO_POD_NETWORK))
        for directory in (self.kubelet_dir, self.cdi_dir):
            directory.mkdir(parents=True, exist_ok=True)
        _make_shared_mount(self.short_dir)
        self.netns.create()
        self.state_dir.joinpath("cluster.json").write_text(
            json.dumps(
                {"slot": self.netns.slot, "short_dir": str(self.short_dir), "socket": str(self.containerd.socket)}
            )
        )
        try:
            self.plane.start(timeout)
            if self.nvidia_runtime:
                binaries.ensure_built(nvidia_runtime_module.BINARY)
                nvidia_runtime_module.write_config(self.nvidia_runtime_dir, self.cdi_dir)
            self.containerd.start()
            images = self.state_dir / "images"
            for archive in (small.build_pause(images), small.build_busybox(images)):
                self.import_image(archive.path)
            self._start_kubelet()
            self.wait_node_ready(timeout)
            self._create_runtime_classes()
        except BaseException:
            self.stop()
            raise

    def _create_runtime_classes(self) -> None:
        classes = [
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": h}, "handler": h}
            for h in self.runtime_classes
        ]
        self.kubectl("apply", "-f", "-", input_=json.dumps({"apiVersion": "v1", "kind": "List", "items": classes}))

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into the node's containerd (CRI namespace `k8s.io`)."""
        self.containerd.ctr("images", "import", "--no-unpack=false", str(archive), namespace="k8s.io")

    def _start_kubelet(self) -> None:
        start_kubelet(
            self.procs,
            self.plane,
            self.state_dir,
            node=self.node_name,
            address=self.netns.address,
            containerd_socket=self.containerd.socket,
            root_dir=self.kubelet_dir,
        )

    def restart_kubelet(self) -> None:
        """Stop and start the kubelet process (pods keep running)."""
        self.procs.stop("kubelet")
        self._start_kubelet()

    def kubectl(self, *args: str, check: bool = True, input_: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl against this cluster, from the host."""
        argv = [str(binaries.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(argv, check=check, capture_output=True, text=True, input=input_, timeout=120)

    def wait_node_ready(self, timeout: float) -> None:
        wait_node_ready(self.kubectl, self.procs, self.node_name, timeout)

    def stop(self) -> None:
        """Stop the kubelet, containerd (and its containers), the control plane, and delete the namespace."""
        if "kubelet" in self.procs.procs:
            self.procs.stop("kubelet")
        self.containerd.stop()
        self.plane.stop()
        self.netns.delete()
        _unmount_below(self.short_dir)
        subprocess.run(["umount", "-l", str(self.short_dir)], check=False, capture_output=True)
        shutil.rmtree(self.short_dir, ignore_errors=True)


def start_kubelet(
    procs: ProcessGroup,
    plane: ControlPlane,
    state_dir: Path,
    *,
    node: str,
    address: str,
    containerd_socket: Path,
    root_dir: Path,
    config_extra: dict[str, object] | None = None,
) -> None:
    """Start the kubelet of `node` (certificates from the plane's PKI, files under `state_dir`) in `procs`:
    serving on `address`, root dir `root_dir`, containerd at `containerd_socket`, `config_extra` merged into
    its KubeletConfiguration."""
    pki = plane.pki
    client = pki.issue(f"kubelet-client-{node}", f"system:node:{node}", organizations=("system:nodes",), client=True)
    serving = pki.issue(f"kubelet-serving-{node}", node, ips=(address,), dns=(node,), server=True)
    kubeconfig = write_kubeconfig(
        state_dir / "kubelet.kubeconfig", plane.server, pki.ca.cert, client, f"system:node:{node}"
    )
    resolv = state_dir / "resolv.conf"
    resolv.write_text("")  # pods get no name servers: nothing to query outside the namespace
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this machine has cgroup v1 (hybrid); kubelet >= 1.35 refuses it otherwise
        "cgroupDriver": "cgroupfs",  # no systemd as PID 1
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "address": address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": address,
        "healthzPort": 10248,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca.cert)},
        },
        "authorization": {"mode": "Webhook"},
        "resolvConf": str(resolv),
        "failSwapOn": False,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 32,
        **(config_extra or {}),
    }
    config_path = state_dir / "kubelet-config.json"
    config_path.write_text(json.dumps(config, indent=2))
    kubelet = binaries.ensure_built("kubelet")["kubelet"]
    procs.start(
        "kubelet",
        [
            kubelet,
            f"--config={config_path}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={root_dir}",
            f"--cert-dir={state_dir / 'kubelet-pki'}",
            f"--hostname-override={node}",
            f"--node-ip={address}",
            "--node-labels=nvidia.com/gpu.present=true",
            "--v=1",
        ],
    )


def down(state_dir: Path) -> list[str]:
    """Tear down a detached cluster from its recorded state: processes, containers, mounts, namespace."""
    state_dir = state_dir.resolve()
    info_file = state_dir / "cluster.json"
    stopped = stop_recorded(state_dir)
    if not info_file.exists():
        return stopped
    info = json.loads(info_file.read_text())
    if "nodes" in info:  # a MultiNodeCluster
        from harness.cluster.multinode import down_nodes  # a cycle at import time: multinode builds on node

        return stopped + down_nodes(info["nodes"])
    stopped += [f"shim {pid}" for pid in kill_shims(Path(info["socket"]))]  # they outlive containerd
    time.sleep(0.5)
    for directory in (state_dir, Path(info["short_dir"])):
        _unmount_below(directory)
    Netns(int(info["slot"])).delete()
    subprocess.run(["umount", "-l", info["short_dir"]], check=False, capture_output=True)
    shutil.rmtree(info["short_dir"], ignore_errors=True)
    return stopped


def _make_shared_mount(directory: Path) -> None:
    """Bind `directory` onto itself as a shared mount: on a real node / is shared (systemd does it), and
    the kubelet refuses mountPropagation for paths on a private mount, which / is on our machines."""
    directory.mkdir(parents=True, exist_ok=True)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    if str(directory) not in mounts:
        subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    subprocess.run(["mount", "--make-rshared", str(directory)], check=True)


def _unmount_below(directory: Path) -> None:
    prefix = f"{directory}/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)


def wait_node_ready(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], procs: ProcessGroup, node: str, timeout: float
) -> None:
    """Wait until Node `node` is Ready, failing early when its kubelet (in `procs`) died; TimeoutError with the
    kubelet's last log lines."""
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        procs.check_alive("kubelet")
        result = kubectl(
            "get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
        )  # fmt: skip
        status = result.stdout.strip() or result.stderr.strip()
        if status == "True":
            return
        time.sleep(1)
    raise TimeoutError(f"node {node} not Ready ({status}):\n{procs.log_tail('kubelet', 40)}")
