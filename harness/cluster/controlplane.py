"""A local Kubernetes control plane of upstream binaries: etcd, kube-apiserver, controller-manager, scheduler.

Everything binds to one loopback address; TLS everywhere between components, service-account signing,
`--authorization-mode=Node,RBAC`. `ControlPlane(...).start()` returns when all components are healthy.
"""

import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.cluster import binaries
from harness.cluster.netns import Netns
from harness.cluster.pki import CertPair, Pki
from harness.cluster.processes import ProcessGroup, stop_recorded

# Service addresses come from a documentation range, so a stray packet to a ClusterIP can never reach a
# real host; pods in our clusters use hostNetwork and the apiserver's own address instead.
SERVICE_CIDR = "198.51.100.0/24"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def free_port(host: str, netns: Netns | None = None, default: int = 0) -> int:
    """A TCP port on `host` that is free right now (`default` inside a namespace of our own)."""
    if netns is not None:
        return default
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def write_kubeconfig(path: Path, server: str, ca: Path, client: CertPair, user: str) -> Path:
    """Write a kubeconfig for `server` authenticating with a client certificate."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {client.cert}
    client-key: {client.key}
contexts:
- name: {user}@local
  context: {{cluster: local, user: {user}}}
current-context: {user}@local
"""
    )
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler under `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        *,
        host: str = "127.0.0.1",
        detached: bool = False,
        netns: Netns | None = None,
        component_qps: int | None = None,
    ) -> None:
        """`component_qps`: requests per second the controller-manager and the scheduler may send (their
        `--kube-api-qps`, burst twice that); None keeps their defaults (20 and 50)."""
        self.state_dir = state_dir.resolve()
        self.component_qps = component_qps
        self.netns = netns
        self.host = netns.address if netns else host
        self.procs = ProcessGroup(self.state_dir, detached=detached, prefix=netns.exec_prefix() if netns else ())
        self.pki_dir = self.state_dir / "pki"
        self.api_port = 0
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self.bin: dict[str, Path] = {}

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.api_port}"

    @property
    def ca_cert(self) -> Path:
        return self.pki_dir / "ca.crt"

    def start(self, timeout: float = 120.0) -> None:
        """Build missing binaries, start every component and wait until each is healthy."""
        self.bin = binaries.ensure_built(*COMPONENTS)
        stop_recorded(self.state_dir)  # leftovers of a run that was killed
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process this control plane started."""
        self.procs.stop_all()

    def _start(self, timeout: float) -> None:
        host = self.host
        pki = Pki(self.pki_dir)
        self.pki = pki
        self.api_port = free_port(host, self.netns, 6443)
        serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            ips=(host, SERVICE_CIDR.rsplit(".", 1)[0] + ".1"),
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            server=True,
        )
        sa = pki.service_account_keys()
        admin = pki.issue("admin", "fracgpu-admin", organizations=("system:masters",), client=True)
        write_kubeconfig(self.kubeconfig, self.server, pki.ca.cert, admin, "admin")
        apiserver_client = pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organizations=("system:masters",),
            client=True,
        )  # fmt: skip

        etcd_port, etcd_peer = free_port(host, self.netns, 2379), free_port(host, self.netns, 2380)
        etcd_url = f"http://{host}:{etcd_port}"
        peer_url = f"http://{host}:{etcd_peer}"
        self.procs.start(
            "etcd",
            [
                self.bin["etcd"],
                "--name=default",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", f"{etcd_url}/health", timeout)

        self.procs.start(
            "kube-apiserver",
            [
                self.bin["kube-apiserver"],
                f"--etcd-servers={etcd_url}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.pki_dir}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--endpoint-reconciler-type=none",
                "--kubelet-preferred-address-types=InternalIP",  # never a DNS lookup for a node name
                "--allow-privileged=true",
                f"--kubelet-client-certificate={apiserver_client.cert}",
                f"--kubelet-client-key={apiserver_client.key}",
                f"--kubelet-certificate-authority={pki.ca.cert}",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", f"{self.server}/readyz", timeout)

        for name, default_port, extra in (
            (
                "kube-controller-manager",
                10257,
                [
                    f"--service-account-private-key-file={sa.key}",
                    f"--root-ca-file={pki.ca.cert}",
                    f"--cluster-signing-cert-file={pki.ca.cert}",
                    f"--cluster-signing-key-file={pki.ca.key}",
                    "--use-service-account-credentials=true",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--controllers=*",
                ],
            ),
            ("kube-scheduler", 10259, []),
        ):
            cert = pki.issue(name, f"system:{name}", client=True, server=True, ips=(host,))
            kubeconfig = write_kubeconfig(self.state_dir / f"{name}.kubeconfig", self.server, pki.ca.cert, cert, name)
            port = free_port(host, self.netns, default_port)
            self.procs.start(
                name,
                [
                    self.bin[name],
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    f"--bind-address={host}",
                    f"--secure-port={port}",
                    f"--tls-cert-file={cert.cert}",
                    f"--tls-private-key-file={cert.key}",
                    "--leader-elect=false",
                    "--v=1",
                    *extra,
                    *self._qps_flags(),
                ],
            )
            self._wait(name, f"https://{host}:{port}/healthz", timeout)

    def _qps_flags(self) -> list[str]:
        if self.component_qps is None:
            return []
        return [f"--kube-api-qps={self.component_qps}", f"--kube-api-burst={2 * self.component_qps}"]

    def _wait(self, name: str, url: str, timeout: float) -> None:
        """Poll `url` until it answers 200, failing early with the log when the process dies."""
        context = ssl.create_default_context(cafile=str(self.ca_cert)) if url.startswith("https") else None
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self.procs.check_alive(name)
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.2)
        raise TimeoutError(f"{name} not healthy at {url} after {timeout}s ({last}):\n{self.procs.log_tail(name)}")
