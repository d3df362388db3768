"""Small helpers for tests that talk to a real API server."""

import contextlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.kube_rest import KubeRest

T = TypeVar("T")

GiB = 1 << 30


def wait_for(probe: Callable[[], T | None], timeout: float, interval: float = 0.2, what: str = "") -> T:
    """Call `probe` until it returns something truthy; return it, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or probe}")
        time.sleep(interval)


def exists(read: Callable[[], object]) -> bool:
    """True when `read()` succeeds, False on 404."""
    try:
        read()
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def resource(dyn: DynamicClient, api_version: str, kind: str) -> Any:
    """The dynamic resource for `kind` in `api_version`."""
    return dyn.resources.get(api_version=api_version, kind=kind)


def unique(prefix: str) -> str:
    """A DNS-label-safe unique name."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_fake_node(api_client: client.ApiClient, name: str) -> dict[str, Any]:
    """A Node object with capacity and a Ready condition, and no kubelet behind it."""
    core = client.CoreV1Api(api_client)
    node = core.create_node(
        {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "fracgpu.dev/test": "fake"}}}
    )
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "FakeNode", "message": "test node"}],
            }
        },
    )
    return dict(api_client.sanitize_for_serialization(node))


def gpu_slice(
    driver: str,
    node: dict[str, Any],
    devices: list[dict[str, Any]],
    *,
    generation: int = 1,
) -> dict[str, Any]:
    """A ResourceSlice for `node` published by `driver`, owned by the Node."""
    name = node["metadata"]["name"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{name}-{driver}".replace(".", "-")[:63].rstrip("-"),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"], "controller": True}
            ],
        },
        "spec": {
            "driver": driver,
            "nodeName": name,
            "pool": {"name": name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def shared_gpu(name: str, memory: str, uuid_: str, step: str = "256Mi") -> dict[str, Any]:
    """A device entry that can be shared by memory, as the architecture's resource model describes."""
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {"uuid": {"string": uuid_}, "productName": {"string": "NVIDIA H100 80GB HBM3"}},
        "capacity": {
            "memory": {
                "value": memory,
                "requestPolicy": {"default": memory, "validRange": {"min": step, "step": step}},
            }
        },
    }


def ensure_device_class(dyn: DynamicClient, name: str, driver: str, *also: str) -> None:
    """Create the DeviceClass selecting `driver` (and the CEL expressions `also`) unless it exists (tests in one
    session share it)."""
    expressions = [f'device.driver == "{driver}"', *also]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }
    try:
        resource(dyn, "resource.k8s.io/v1", "DeviceClass").create(body=body)
    except ApiException as err:
        if err.status != 409:
            raise


def claim_template(name: str, device_class: str, memory: str | None, config: object | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate with one request `gpu`, optionally for `memory`, with an opaque config."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if config is not None:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": device_class, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": spec},
    }


def pod_with_claim(name: str, template: str | None, node: str, claims: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod pinned to `node` (no kubelet needed: it is never started) whose container uses a claim `gpu`
    made from `template`, or, with `claims`, existing ResourceClaims (pod claim name -> claim name)."""
    resource_claims = (
        [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
        if claims is not None
        else [{"name": "gpu", "resourceClaimTemplateName": template}]
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],  # fake nodes have no kubelet and turn NotReady
            "resourceClaims": resource_claims,
            "containers": [
                {
                    "name": "app",
                    "image": "fracgpu.invalid/never-pulled:0",
                    "resources": {"claims": [{"name": c["name"]} for c in resource_claims]},
                }
            ],
        },
    }


def allocate_claims(
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
    node: str,
    *,
    device_class: str,
    memories: list[str | None],
    config: object | None = None,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """One pod per entry of `memories`, each with its own claim; wait until the real scheduler has
    allocated every claim; return the claims (in pod order)."""
    core = client.CoreV1Api(api_client)
    templates = resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
    pods = []
    for memory in memories:
        pod = unique("pod")
        templates.create(namespace=namespace, body=claim_template(pod, device_class, memory, config))
        core.create_namespaced_pod(namespace, pod_with_claim(pod, pod, node))
        pods.append(pod)
    claims_api = resource(dyn, "resource.k8s.io/v1", "ResourceClaim")

    def allocated() -> list[dict[str, Any]] | None:
        by_pod: dict[str, dict[str, Any]] = {}
        for claim in claims_api.get(namespace=namespace).to_dict()["items"]:
            owner = (claim["metadata"].get("ownerReferences") or [{}])[0].get("name")
            if owner in pods and (claim.get("status") or {}).get("allocation"):
                by_pod[owner] = claim
        return [by_pod[p] for p in pods] if len(by_pod) == len(pods) else None

    return wait_for(allocated, timeout, what=f"allocation of {len(pods)} claims in {namespace}")


# ----- controller tests and benchmark (issue #4) -----------------------------------------------------


def simulated_gpus(node: str, count: int, memory_gib: int = 80, model: str = "NVIDIA H100 80GB HBM3") -> list[Any]:
    """`count` GpuInfo values as NVML would report them on `node` (UUIDs unique per node and index)."""
    import hashlib

    from kubelet_plugin.core.model import GpuInfo

    gpus = []
    for i in range(count):
        digest = hashlib.sha256(f"{node}/{i}".encode()).hexdigest()
        gpus.append(
            GpuInfo(
                index=i,
                uuid=f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}",
                product_name=model,
                memory_total_bytes=memory_gib * GiB,
                minor=i,
                pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
                architecture="Hopper",
                cuda_compute_capability="9.0",
                driver_version="580.65.06",
            )
        )
    return gpus


def publish_gpus(
    dyn: DynamicClient,
    node: dict[str, Any],
    driver: str,
    gpus: list[Any],
    *,
    generation: int = 1,
    hami_core: bool = False,
    enforcement: Literal["none", "hami-core", "mps", "nvml"] = "none",
    mps_binding: bool = False,
    taints: dict[str, list[dict[str, str]]] | None = None,
) -> list[dict[str, Any]]:
    """Create or replace the node's ResourceSlices exactly as the node plugin builds them (`hami_core`: as a
    plugin that found the HAMi-core library; `enforcement`: every GPU's strongest tier; `mps_binding`: MPS GPUs
    with the trust-domain binding conditions, as a plugin whose MPS trust scope is not cluster; `taints`: device
    name -> its taints, as the plugin's health taints)."""
    from kubelet_plugin.publishing.slices import build_slices

    slices = resource(dyn, "resource.k8s.io/v1", "ResourceSlice")
    name = node["metadata"]["name"]
    bodies = build_slices(
        name,
        node["metadata"]["uid"],
        driver,
        gpus,
        step=256 * (1 << 20),
        reserve=0,
        generation=generation,
        hami_core=hami_core,
        enforcement={g.device_name: enforcement for g in gpus},
        mps_binding=mps_binding,
        taints=taints,
    )
    for body in bodies:
        try:
            current = slices.get(name=body["metadata"]["name"]).to_dict()
        except ApiException as err:
            if err.status != 404:
                raise
            slices.create(body=body)
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            slices.replace(body=body)
    return bodies


def apply_crd(api_client: client.ApiClient, body: dict[str, Any], timeout: float = 30) -> None:
    """Create (or replace) a CRD and wait until it is Established."""
    ext = client.ApiextensionsV1Api(api_client)
    name = body["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as err:
        if err.status != 409:
            raise
        current = ext.read_custom_resource_definition(name)
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version}}
        ext.replace_custom_resource_definition(name, body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, timeout, what=f"CRD {name} Established")


@contextlib.contextmanager
def chart_made_webhook_configuration(api_client: client.ApiClient, name: str) -> Iterator[None]:
    """The empty Validating- and MutatingWebhookConfiguration the chart makes (the controller may only patch them),
    removed afterwards so that a later `helm install` of the chart can create its own."""
    admission = client.AdmissionregistrationV1Api(api_client)
    kinds = [
        (admission.create_validating_webhook_configuration, admission.delete_validating_webhook_configuration),
        (admission.create_mutating_webhook_configuration, admission.delete_mutating_webhook_configuration),
    ]
    for create, _ in kinds:
        try:
            create({"metadata": {"name": name}})
        except ApiException as err:
            if err.status != 409:
                raise
    try:
        yield
    finally:
        for _, delete in kinds:
            try:
                delete(name)
            except ApiException as err:
                if err.status != 404:
                    raise


def service_account_kubeconfig(
    api_client: client.ApiClient,
    *,
    server: str,
    ca_cert: Path,
    namespace: str,
    name: str,
    rules: list[dict[str, Any]],
    path: Path,
) -> Path:
    """A ServiceAccount bound (cluster-wide) to exactly `rules`, and a kubeconfig with a 24 h token for it."""
    core = client.CoreV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    creates: list[Callable[[], object]] = [
        lambda: core.create_namespace({"metadata": {"name": namespace}}),
        lambda: core.create_namespaced_service_account(namespace, {"metadata": {"name": name}}),
        lambda: rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules}),
        lambda: rbac.create_cluster_role_binding(
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            }
        ),
    ]
    for create in creates:
        try:
            create()
        except ApiException as err:
            if err.status != 409:
                raise
    rbac.replace_cluster_role(name, {"metadata": {"name": name}, "rules": rules})
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 86400}}
    ).status.token
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: "{server}", certificate-authority: "{ca_cert}"}}
users:
- name: {name}
  user: {{token: "{token}"}}
contexts:
- name: {name}
  context: {{cluster: local, user: {name}}}
current-context: {name}
"""
    )
    path.chmod(0o600)
    return path


class ControllerProcess:
    """`python -m controller` as a child process with its webhook on 127.0.0.1 (reachable by the apiserver)."""

    def __init__(self, workdir: Path, kubeconfig: Path, *extra_args: str) -> None:
        import socket

        def free_port() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port: int = s.getsockname()[1]
                return port

        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "controller.log"

    @property
    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "controller",
            f"--kubeconfig={self.kubeconfig}",
            "--webhook-address=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            "--log-format=text",
            *self.extra_args,
        ]

    def start(self, timeout: float = 30) -> None:
        """Start and wait until its liveness endpoint answers."""
        import urllib.request

        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')}\n".encode())
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parents[1],
                start_new_session=True,
            )

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(healthy, timeout, what="controller liveness endpoint")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM and wait; the exit code (SIGKILL after `timeout`)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def metric(self, name: str, **labels: str) -> float:
        """Current value of a sample of the controller's Prometheus metrics (0 when absent)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        series = f"{name}{{{want}}}" if want else name
        for line in text.splitlines():
            if not line.startswith("#") and line.rsplit(" ", 1)[0] == series:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_for(self, probe: Callable[[], T | None], timeout: float, what: str) -> T:
        """`wait_for` that shows this controller's log when it times out."""
        try:
            return wait_for(probe, timeout, what=what)
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- controller log:\n{self.log_tail()}") from None


@contextlib.contextmanager
def controller_with_rbac(
    api_client: client.ApiClient,
    *,
    server: str,
    ca_cert: Path,
    workdir: Path,
    account: tuple[str, str],
    rules: list[dict[str, Any]],
    webhook_config: str,
    args: tuple[str, ...] = (),
) -> Iterator[ControllerProcess]:
    """The controller started as the ServiceAccount `account` (namespace, name) bound to exactly `rules`, in the
    webhook configurations named `webhook_config` as the chart makes them (`chart_made_webhook_configuration`);
    stopped at the end, its log's tail printed."""
    namespace, name = account
    kubeconfig = service_account_kubeconfig(
        api_client, server=server, ca_cert=ca_cert, namespace=namespace, name=name, rules=rules,
        path=workdir / "controller.kubeconfig",
    )  # fmt: skip
    with chart_made_webhook_configuration(api_client, webhook_config):
        proc = ControllerProcess(workdir, kubeconfig, *args)
        proc.start()
        try:
            yield proc
        finally:
            proc.terminate()
            print(f"controller log:\n{proc.log_tail(40)}")


# ----- acting as a service account (Helm chart tests, issue #5) ---------------------------------------


def token_client(server: str, ca_cert: Path, token: str) -> client.ApiClient:
    """An ApiClient that authenticates with `token` alone (no client certificate)."""
    cfg = client.Configuration()
    cfg.host = server
    cfg.ssl_ca_cert = str(ca_cert)
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg)


def node_bound_pod(
    api_client: client.ApiClient, namespace: str, name: str, *, node: str, service_account: str
) -> dict[str, Any]:
    """A Pod of `service_account` already bound to `node` (spec.nodeName), as a DaemonSet pod is; nothing runs it."""
    pod = client.CoreV1Api(api_client).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "serviceAccountName": service_account,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "fracgpu.invalid/never-pulled:0"}],
            },
        },
    )
    return dict(api_client.sanitize_for_serialization(pod))


def service_account_token(
    api_client: client.ApiClient,
    namespace: str,
    service_account: str,
    *,
    bound_pod: dict[str, Any] | None = None,
    seconds: int = 3600,
) -> str:
    """A TokenRequest token for a ServiceAccount; bound to `bound_pod` it carries the pod's node name and UID
    as user extras (`authentication.kubernetes.io/node-name`), exactly like a DaemonSet pod's mounted token."""
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if bound_pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": bound_pod["metadata"]["name"],
            "uid": bound_pod["metadata"]["uid"],
        }
    answer = client.CoreV1Api(api_client).create_namespaced_service_account_token(
        service_account, namespace, {"spec": spec}
    )
    token: str = answer.status.token
    return token


def whoami(rest: KubeRest) -> dict[str, Any]:
    """The caller's user info as the API server sees it (SelfSubjectReview): username, groups, extra."""
    review = rest.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    info: dict[str, Any] = review["status"]["userInfo"]
    return info
