"""Under API pressure the plugin and the controller wait as told (issue #31), on the real kube-apiserver with API
Priority and Fairness: one service account runs the controller, reads claims as a node plugin's prepare does
(`ClaimReader`, 10 s budget) and floods the API server with LISTs from 8 threads, all in a priority level of the
fewest seats with `limitResponse: Reject`. The flood is answered 429 (the storm is real); the prepare reads wait
it out and succeed, or fail with the throttled message; the controller's status and ledger writes are delayed, not
dropped, and the backlog drains once the storm ends (how long the ledger takes is printed)."""

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient
from prometheus_client import CollectorRegistry

from api.crds import CRD_DIR
from api.gpu import GPU_API_VERSION, GPU_CRD_NAME, NODE_LABEL
from api.kube_config import from_kubeconfig
from api.kube_errors import ApiError, ApiThrottled
from api.kube_metrics import ApiMetrics
from api.kube_rest import KubeConnection, KubeRest
from controller.core.rbac import cluster_role_rules
from harness import kube
from harness.apf import FLOW, create_apf_reject
from harness.cluster.controlplane import ControlPlane
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import ClaimRef
from kubelet_plugin.prepare.reader import ClaimReader

pytestmark = pytest.mark.integration

STORM_S = 20.0
FLOOD_THREADS = 8
CONFIGMAPS = 200
CLAIMS = 12


def counter_total(port: int, name: str) -> float:
    """The sum of a counter's series on a component's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def status_written(claim: dict[str, Any], driver: str) -> bool:
    return any(d.get("driver") == driver for d in (claim.get("status") or {}).get("devices") or [])


@pytest.fixture
def storm_account(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> Iterator[tuple[str, Path]]:
    """A service account with the controller's rights and a LIST of ConfigMaps (the flood), in the APF trap."""
    account = kube.unique("storm")
    driver = f"{account}.fracgpu.test"
    kubeconfig = kube.service_account_kubeconfig(
        api_client,
        server=control_plane.server,
        ca_cert=control_plane.ca_cert,
        namespace=namespace,
        name=account,
        rules=[*cluster_role_rules(driver), {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        path=tmp_path / "storm.kubeconfig",
    )
    admin = KubeRest(KubeConnection.of(api_client))
    create_apf_reject(admin, account, namespace, account)
    try:
        yield account, kubeconfig
    finally:
        for kind in ("flowschemas", "prioritylevelconfigurations"):
            admin.delete(f"{FLOW}/{kind}/{account}")


def test_throttled_prepares_wait_and_the_controllers_backlog_drains(  # noqa: PLR0917 - pytest fixtures
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
    tmp_path: Path,
    storm_account: tuple[str, Path],
) -> None:
    account, kubeconfig = storm_account
    driver = f"{account}.fracgpu.test"  # the storm account's RBAC names it
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kube.ensure_device_class(dyn, driver, driver)
    node_body = kube.create_fake_node(api_client, kube.unique("stormnode"))
    node = node_body["metadata"]["name"]
    kube.publish_gpus(dyn, node_body, driver, kube.simulated_gpus(node, 2))
    core = client.CoreV1Api(api_client)
    payload = {"blob": "x" * 16384}
    for i in range(CONFIGMAPS):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"bulk-{i}"}, "data": payload})

    proc = kube.ControllerProcess(
        tmp_path, kubeconfig, "--no-admission", f"--driver-name={driver}", "--ledger-delay=0.2"
    )
    proc.start()
    try:
        storm = KubeConnection(from_kubeconfig([kubeconfig]))
        flood = KubeRest(storm, timeout=10, budget=0)  # the flood itself never waits
        rejected = [0, 0]  # 429s, answers
        stop = threading.Event()

        def flood_loop() -> None:
            while not stop.is_set():
                try:
                    flood.send("GET", f"/api/v1/namespaces/{namespace}/configmaps")
                    rejected[1] += 1
                except ApiThrottled:
                    rejected[0] += 1
                except ApiError:
                    time.sleep(0.05)

        flooders = [threading.Thread(target=flood_loop, daemon=True) for _ in range(FLOOD_THREADS)]
        for thread in flooders:
            thread.start()
        started = time.monotonic()
        # during the storm: the scheduler allocates claims (the controller must write their status), and the plugin
        # reads each as its prepare does
        claims = kube.allocate_claims(
            api_client, dyn, namespace, node, device_class=driver, memories=["10Gi"] * CLAIMS, timeout=STORM_S
        )
        registry = CollectorRegistry()
        plugin_metrics = ApiMetrics("plugin", registry=registry)
        reader = ClaimReader(
            KubeRest.bounded(KubeConnection(from_kubeconfig([kubeconfig]), plugin_metrics), 10.0), 10.0
        )
        outcomes: list[dict[str, Any] | PrepareError] = []
        latencies: list[float] = []
        while time.monotonic() - started < STORM_S:
            for claim in claims:
                meta = claim["metadata"]
                began = time.monotonic()
                outcomes.append(reader.read_all([ClaimRef(meta["namespace"], meta["uid"], meta["name"])])[meta["uid"]])
                latencies.append(time.monotonic() - began)
                if time.monotonic() - started >= STORM_S:
                    break
        stop.set()
        for thread in flooders:
            thread.join(15)
        storm_ended = time.monotonic()

        throttled_reads = (
            registry.get_sample_value(
                "fracgpu_plugin_api_throttled_total", {"resource": "resourceclaims", "verb": "GET"}
            )
            or 0.0
        )
        failures = [o for o in outcomes if isinstance(o, PrepareError)]
        latencies.sort()
        print(
            f"storm {STORM_S:.0f} s: flood {rejected[0]} rejected / {rejected[1]} served; prepare reads "
            f"{len(outcomes) - len(failures)}/{len(outcomes)} ok, {throttled_reads:.0f} answers 429 waited out, "
            f"latency p50 {latencies[len(latencies) // 2]:.2f} s max {latencies[-1]:.2f} s"
        )
        assert rejected[0] > 0, "the storm must be real: the flood was answered 429"
        assert throttled_reads > 0, "the prepare reads must have been throttled, or this test shows nothing"
        retried = registry.get_sample_value("fracgpu_plugin_api_retries_total", {"kind": "throttled", "verb": "GET"})
        asked = sorted({str(f).split("wait ", 1)[1].split(" s)", 1)[0] for f in failures if "wait " in str(f)})
        print(f"throttled reads sent again: {retried}; waits asked of the reads that failed: {asked} s")
        assert retried, "a 429 whose wait fits the prepare's 10 s is waited out and the read sent again"
        assert len(failures) < len(outcomes), "reads succeed during the storm"
        for failure in failures:
            assert failure.kind == ErrorKind.API_THROTTLED, failure
            assert "throttled by the API server (429 Too Many Requests; it asked to wait" in str(failure)
            assert " 0 " not in str(failure) and "HTTPSConnectionPool" not in str(failure)

        # the controller: nothing crashed, every claim's status is written and the ledger is current
        assert proc.proc is not None and proc.proc.poll() is None, proc.log_tail()
        claims_api = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")
        gpus_api = kube.resource(dyn, GPU_API_VERSION, "GPU")

        def drained() -> bool:
            written = [c for c in claims_api.get(namespace=namespace).to_dict()["items"] if status_written(c, driver)]
            if len(written) < CLAIMS:
                return False
            ledger = gpus_api.get(label_selector=f"{NODE_LABEL}={node}").to_dict()["items"]
            granted = sum(int((g.get("status") or {}).get("shares") or 0) for g in ledger)
            return granted == CLAIMS

        # A write refused near the storm's end waits what the server asked (APF asks up to about 32 s) before its
        # next try, so draining may take a few such rounds: the bound says "drains", not how fast (printed below).
        started = time.monotonic()
        kube.wait_for(drained, 180, what="every claim's status and the ledger written after the storm")
        print(f"backlog drained {time.monotonic() - started:.1f} s after the storm")
        print(f"ledger current {time.monotonic() - storm_ended:.2f} s after the storm ended")
        assert counter_total(proc.metrics_port, "fracgpu_controller_api_throttled_total") > 0, (
            "the controller's own writes were throttled too"
        )
        assert proc.proc.poll() is None, proc.log_tail()
    finally:
        proc.terminate()
        print(f"controller log:\n{proc.log_tail(20)}")
