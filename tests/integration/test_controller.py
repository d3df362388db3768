"""The controller against the real control plane (issue #4): claim status, GPU ledger, admission, Events.

The controller runs as a process under a ServiceAccount bound to exactly the rules of `controller.core.rbac`
(so a missing permission fails here); the real scheduler allocates; ResourceSlices are built by the node
plugin's own `build_slices` on fake Nodes.
"""

import functools
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import GPU_API_VERSION, GPU_CRD_NAME, NODE_LABEL, gpu_object_name
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from api.quantity import format_bytes, to_bytes
from controller.core.rbac import cluster_role_rules
from harness import kube
from harness.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration

OTHER_DRIVER = "nic.other.example.com"  # a second driver on the same nodes: its entries must stay untouched
SA_NAMESPACE = "fracgpu-system"
KOPF_MARK = "kopf.zalando.org"


# ----- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def controller(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[kube.ControllerProcess]:
    """The GPU CRD (the generated YAML), our DeviceClass, and the controller running with its RBAC only."""
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kube.ensure_device_class(dyn, DEVICE_CLASS_NAME, DRIVER_NAME)
    kube.ensure_device_class(dyn, OTHER_DRIVER, OTHER_DRIVER)
    workdir = tmp_path_factory.mktemp("controller")
    kubeconfig = kube.service_account_kubeconfig(
        api_client,
        server=control_plane.server,
        ca_cert=control_plane.ca_cert,
        namespace=SA_NAMESPACE,
        name="fracgpu-controller-it",  # not the chart's ClusterRole name: the chart tests install the chart
        rules=cluster_role_rules(),
        path=workdir / "controller.kubeconfig",
    )
    with kube.chart_made_webhook_configuration(api_client, DRIVER_NAME):
        proc = kube.ControllerProcess(workdir, kubeconfig, "--device-gone-grace=1", "--ledger-delay=0.2")
        proc.start()
        _wait_for_webhook(dyn, proc)
        yield proc
        proc.terminate()
        print(f"controller log:\n{proc.log_tail(40)}")


@pytest.fixture(scope="module")
def gpu_node(controller: kube.ControllerProcess, api_client: client.ApiClient, dyn: DynamicClient) -> str:
    """A node with two 80Gi GPUs, so that admission knows the largest GPU."""
    return _gpu_node(api_client, dyn, 2)


# ----- helpers ----------------------------------------------------------------------------------------


def _claim_body(
    name: str, requests: list[dict[str, Any]], config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def _request(
    name: str, memory: str | None = None, device_class: str = DEVICE_CLASS_NAME, **extra: Any
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, **extra}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": name, "exactly": exactly}


def _gpu_config(**fields: Any) -> list[dict[str, Any]]:
    params = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", **fields}
    return [{"opaque": {"driver": DRIVER_NAME, "parameters": params}}]


def _wait_for_webhook(dyn: DynamicClient, proc: kube.ControllerProcess) -> None:
    """The apiserver picks up the webhook configuration asynchronously: wait until it refuses a bad claim."""
    bad = _claim_body("probe", [_request("gpu", "0")])

    def refused() -> bool:
        try:
            _claims(dyn).create(namespace="default", body=bad, query_params=[("dryRun", "All")])
        except ApiException as err:
            return err.status == 422 and "fracgpu" in str(err.body)
        return False

    proc.wait_for(refused, 30, "the validating webhook to refuse a bad claim")


def _claims(dyn: DynamicClient) -> Any:
    return kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")


def _gpus(dyn: DynamicClient) -> Any:
    return kube.resource(dyn, GPU_API_VERSION, "GPU")


def _gpu_node(api_client: client.ApiClient, dyn: DynamicClient, count: int) -> str:
    node = kube.create_fake_node(api_client, kube.unique("gpunode"))
    name: str = node["metadata"]["name"]
    kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(name, count))
    return name


def _node_ledger(dyn: DynamicClient, node: str) -> dict[str, dict[str, Any]]:
    items = _gpus(dyn).get(label_selector=f"{NODE_LABEL}={node}").to_dict()["items"]
    return {g["metadata"]["name"]: g for g in items}


def _our_entries(claim: dict[str, Any]) -> dict[tuple[str, str, str], Any]:
    return {
        (d["pool"], d["device"], d.get("shareID") or ""): d.get("data")
        for d in (claim.get("status") or {}).get("devices") or []
        if d["driver"] == DRIVER_NAME
    }


def _our_results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [r for r in allocation.get("devices", {}).get("results", []) if r["driver"] == DRIVER_NAME]


def _status_written(claim: dict[str, Any]) -> bool:
    """Every result of our driver has an entry with data."""
    results = _our_results(claim)
    entries = _our_entries(claim)
    return bool(results) and all(entries.get((r["pool"], r["device"], r.get("shareID") or "")) for r in results)


def _written_claim(dyn: DynamicClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The claim once its status data is written, else None."""
    claim: dict[str, Any] = _claims(dyn).get(namespace=namespace, name=name).to_dict()
    return claim if _status_written(claim) else None


def _expected_data(claim: dict[str, Any], gpus_by_node: dict[str, list[Any]]) -> dict[tuple[str, str, str], Any]:
    """What the controller must write, derived independently from the allocation and the simulated GPUs."""
    out = {}
    for r in _our_results(claim):
        gpu = next(g for g in gpus_by_node[r["pool"]] if g.device_name == r["device"])
        out[(r["pool"], r["device"], r.get("shareID") or "")] = {
            "gpu": gpu_object_name(r["pool"], r["device"]),
            "node": r["pool"],
            "device": r["device"],
            "index": gpu.index,
            "uuid": gpu.uuid,
            "productName": gpu.product_name,
            "request": r["request"],
            "memory": format_bytes(to_bytes(r["consumedCapacity"]["memory"])),
            "memoryTotal": format_bytes(gpu.memory_total_bytes),
        }
    return out


def _expected_ledger(claims: list[dict[str, Any]], node: str, gpus: list[Any]) -> dict[str, dict[str, Any]]:
    """Per GPU object name: allocated bytes, share count and the (namespace, name, request, shareID, memory) set."""
    out: dict[str, dict[str, Any]] = {
        gpu_object_name(node, g.device_name): {"allocated": 0, "shares": 0, "claims": set()} for g in gpus
    }
    for claim in claims:
        for r in _our_results(claim):
            if r["pool"] != node:
                continue
            memory = to_bytes(r["consumedCapacity"]["memory"])
            entry = out[gpu_object_name(node, r["device"])]
            entry["allocated"] += memory
            entry["shares"] += 1
            meta = claim["metadata"]
            entry["claims"].add((meta["namespace"], meta["name"], r["request"], r["shareID"], format_bytes(memory)))
    return out


def _ledger_matches(dyn: DynamicClient, node: str, expected: dict[str, dict[str, Any]]) -> bool:
    ledger = _node_ledger(dyn, node)
    if set(ledger) != set(expected):
        return False
    for name, want in expected.items():
        status = ledger[name].get("status") or {}
        got_claims = {
            (c["namespace"], c["name"], c["request"], c["shareID"], c["memory"]) for c in status.get("claims") or []
        }
        if (
            status.get("shares") != want["shares"]
            or to_bytes(status.get("allocatedMemory", "-1")) != want["allocated"]
            or to_bytes(status.get("freeMemory", "-1")) != to_bytes(status["totalMemory"]) - want["allocated"]
            or got_claims != want["claims"]
        ):
            return False
    return True


def _no_kopf_marks(obj: dict[str, Any]) -> bool:
    meta = obj["metadata"]
    return not any(KOPF_MARK in k for k in meta.get("annotations") or {}) and not any(
        KOPF_MARK in f for f in meta.get("finalizers") or []
    )


def _events(api_client: client.ApiClient, namespace: str, claim: str, reason: str) -> list[Any]:
    return list(
        client.CoreV1Api(api_client)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={claim},reason={reason}")
        .items
    )


def _largest_gpu(dyn: DynamicClient) -> int:
    """The largest memory any GPU of our driver offers, as published in the cluster right now."""
    slices = kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice").get().to_dict()["items"]
    return max(
        to_bytes(d["capacity"]["memory"]["value"])
        for s in slices
        if s["spec"]["driver"] == DRIVER_NAME
        for d in s["spec"].get("devices") or []
    )


def _columns(table: str) -> list[dict[str, str]]:
    """The rows of a kubectl table by column name (kubectl aligns columns; MODEL has spaces)."""
    header, *rows = table.splitlines()
    starts = [header.index(name) for name in header.split()]
    return [
        {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], len(row)], strict=True)}
        for row in rows
    ]


def _kubectl(control_plane: ControlPlane, *args: str) -> str:
    """Run the upstream kubectl with the admin kubeconfig; its stdout."""
    out = subprocess.run(
        [str(control_plane.bin["kubectl"]), f"--kubeconfig={control_plane.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout


# ----- claim status -----------------------------------------------------------------------------------


def test_status_names_the_physical_gpu_and_leaves_other_drivers_alone(  # noqa: PLR0917 - pytest fixtures
    control_plane: ControlPlane,
    controller: kube.ControllerProcess,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    node_body = kube.create_fake_node(api_client, kube.unique("gpunode"))
    node = node_body["metadata"]["name"]
    gpus = kube.simulated_gpus(node, 2)
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, gpus)
    nics = [{"name": f"nic-{i}", "attributes": {"port": {"int": i}}} for i in range(2)]
    other_slice = kube.gpu_slice(OTHER_DRIVER, node_body, nics)
    kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice").create(body=other_slice)

    claims = _claims(dyn)
    claims.create(
        namespace=namespace,
        body=_claim_body("mixed", [_request("a", "10Gi"), _request("b", "20Gi"), _request("nic", None, OTHER_DRIVER)]),
    )
    claims.create(namespace=namespace, body=_claim_body("foreign", [_request("nic", None, OTHER_DRIVER)]))
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, kube.pod_with_claim("p-mixed", None, node, {"c": "mixed"}))
    core.create_namespaced_pod(namespace, kube.pod_with_claim("p-foreign", None, node, {"c": "foreign"}))

    mixed = controller.wait_for(
        lambda: _written_claim(dyn, namespace, "mixed"),
        60,
        "status data of claim 'mixed'",
    )
    # two requests of ours -> two entries, each naming the GPU, its UUID/index/node and the granted memory
    assert _our_entries(mixed) == _expected_data(mixed, {node: gpus})
    assert sorted(d["memory"] for d in _our_entries(mixed).values()) == ["10Gi", "20Gi"]
    assert len(_our_entries(mixed)) == 2
    assert not [d for d in mixed["status"]["devices"] if d["driver"] == OTHER_DRIVER], "we wrote for another driver"

    # the other driver writes its own entry; an unrelated change makes the controller look at the claim again
    nic_result = next(r for r in mixed["status"]["allocation"]["devices"]["results"] if r["driver"] == OTHER_DRIVER)
    other_entry = {
        "driver": OTHER_DRIVER,
        "pool": nic_result["pool"],
        "device": nic_result["device"],
        "data": {"port": 7},
    }
    reconciles = controller.metric("fracgpu_controller_claim_reconciles_total")
    client.ResourceV1Api(api_client).patch_namespaced_resource_claim_status(
        "mixed",
        namespace,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "mixed", "namespace": namespace},
            "status": {"devices": [other_entry]},
        },
        field_manager="other-driver",
        _content_type="application/apply-patch+yaml",
    )
    writes = controller.metric("fracgpu_controller_claim_status_writes_total", result="ok")
    for change in ("the other driver's entry", "a label"):
        if change == "a label":
            labelled = claims.patch(
                namespace=namespace,
                name="mixed",
                body={"metadata": {"labels": {"touched": "yes"}}},
                content_type="application/merge-patch+json",
            ).to_dict()
        before = reconciles

        def reconciled(before: float = before) -> bool:
            return controller.metric("fracgpu_controller_claim_reconciles_total") > before

        controller.wait_for(reconciled, 20, f"the controller to reconcile the claim after {change}")
        reconciles = controller.metric("fracgpu_controller_claim_reconciles_total")
    # idempotent: reconciled, but nothing written (same resourceVersion as after our own label patch)
    assert controller.metric("fracgpu_controller_claim_status_writes_total", result="ok") == writes
    after = claims.get(namespace=namespace, name="mixed").to_dict()
    assert after["metadata"]["resourceVersion"] == labelled["metadata"]["resourceVersion"]
    assert _our_entries(after) == _expected_data(mixed, {node: gpus})
    theirs = [d for d in after["status"]["devices"] if d["driver"] == OTHER_DRIVER]
    assert [d["data"] for d in theirs] == [{"port": 7}]

    # our field manager owns only `data` (and the shared key fields) of our driver's entries
    ours = next(m for m in after["metadata"]["managedFields"] if m["manager"] == "fracgpu-controller")
    assert ours["operation"] == "Apply" and ours["subresource"] == "status"
    owned = ours["fieldsV1"]["f:status"]["f:devices"]
    assert set(ours["fieldsV1"]) == {"f:status"} and set(ours["fieldsV1"]["f:status"]) == {"f:devices"}
    for key, fields in owned.items():
        assert json.loads(key.removeprefix("k:"))["driver"] == DRIVER_NAME
        assert set(fields) <= {".", "f:data", "f:driver", "f:pool", "f:device", "f:shareID"}

    foreign = claims.get(namespace=namespace, name="foreign").to_dict()
    assert foreign["status"]["allocation"], "the other driver's claim was allocated"
    assert not _our_entries(foreign) and not [
        m for m in foreign["metadata"]["managedFields"] if m["manager"] == "fracgpu-controller"
    ]
    for claim in claims.get(namespace=namespace).to_dict()["items"]:
        assert _no_kopf_marks(claim), claim["metadata"]
    for s in kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice").get().to_dict()["items"]:
        assert _no_kopf_marks(s), s["metadata"]

    # the ledger shows both shares on their GPU
    assert controller.wait_for(
        lambda: _ledger_matches(dyn, node, _expected_ledger([after], node, gpus)),
        20,
        "the ledger to show claim 'mixed'",
    )

    # what a user sees with kubectl
    shown = yaml.safe_load(_kubectl(control_plane, "get", "resourceclaim", "mixed", "-n", namespace, "-o", "yaml"))
    shown_data = [d["data"] for d in shown["status"]["devices"] if d["driver"] == DRIVER_NAME]
    assert sorted(d["memory"] for d in shown_data) == ["10Gi", "20Gi"]
    assert {(d["uuid"], d["index"], d["node"]) for d in shown_data} == {
        (g.uuid, g.index, node) for g in gpus if g.device_name == shown_data[0]["device"]
    }

    # Kubernetes >= 1.36 checks resourceclaims/driver `arbitrary-node:patch` for status.devices: without that
    # rule, the same apply is refused (so the rule in controller.rbac is needed, not decorative); RBAC
    # propagation to the new role can take a moment, hence the wait
    rules = [r for r in cluster_role_rules() if r["resources"] != ["resourceclaims/driver"]]
    limited = kube.service_account_kubeconfig(
        api_client,
        server=control_plane.server,
        ca_cert=control_plane.ca_cert,
        namespace=SA_NAMESPACE,
        name="fracgpu-without-driver-rule",
        rules=rules,
        path=tmp_path / "limited.kubeconfig",
    )
    as_limited = config.new_client_from_config(config_file=str(limited))
    result = _our_results(after)[0]
    entry = {"driver": DRIVER_NAME, "pool": result["pool"], "device": result["device"], "shareID": result["shareID"]}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mixed", "namespace": namespace},
        "status": {"devices": [{**entry, "data": {"tampered": True}}]},
    }

    def refused() -> ApiException | None:
        try:
            client.ResourceV1Api(as_limited).patch_namespaced_resource_claim_status(
                "mixed",
                namespace,
                body,
                field_manager="intruder",
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except ApiException as err:
            # refused by the claim strategy as an invalid change (422), not by RBAC on the request (403)
            return err if err.status == 422 and "resourceclaims/driver" in str(err.body) else None
        raise AssertionError("status.devices written without the resourceclaims/driver permission")

    denial = str(controller.wait_for(refused, 10, "a refusal naming resourceclaims/driver").body)
    assert 'requires resource=\\"resourceclaims/driver\\", verb=\\"[arbitrary-node:patch]\\"' in denial, denial


# ----- admission --------------------------------------------------------------------------------------

ALLOWED_FIELDS = "allowed fields are apiVersion, kind, enforcement, computeLimitPercent, env"


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


POSITIVE = "must be a positive quantity of bytes such as 10Gi or 512Mi"
BAD_CLAIMS: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown config field",
        _claim_body("c", [_request("gpu", "10Gi")], _gpu_config(memoryLimit=5)),
        f"spec.devices.config[0].opaque.parameters.memoryLimit: unknown field; {ALLOWED_FIELDS}",
    ),
    (
        "NVIDIA's MPS sharing config",
        _claim_body("c", [_request("gpu", "10Gi")], _gpu_config(sharing={"strategy": "MPS"})),
        "spec.devices.config[0].opaque.parameters.sharing: unknown field (the sharing config of NVIDIA's DRA driver "
        "or the example driver); for MPS ask capacity.requests.memory (e.g. 10Gi) of the DeviceClass "
        "mps.gpu.fracgpu.dev",
    ),
    (
        "wrong type",
        _claim_body("c", [_request("gpu", "10Gi")], _gpu_config(computeLimitPercent="50")),
        'spec.devices.config[0].opaque.parameters.computeLimitPercent: must be an integer between 1 and 100, got "50"',
    ),
    (
        "out of range",
        _claim_body("c", [_request("gpu", "10Gi")], _gpu_config(computeLimitPercent=150)),
        "spec.devices.config[0].opaque.parameters.computeLimitPercent: must be an integer between 1 and 100, got 150",
    ),
    (
        "unknown enforcement",
        _claim_body("c", [_request("gpu")], _gpu_config(enforcement="strict")),
        "spec.devices.config[0].opaque.parameters.enforcement: must be one of 'none', 'hami-core', 'mps', 'nvml', got \"strict\"",
    ),
    (
        "missing kind",
        _claim_body(
            "c",
            [_request("gpu")],
            [{"opaque": {"driver": DRIVER_NAME, "parameters": {"apiVersion": "fracgpu.dev/v1alpha1"}}}],
        ),
        "spec.devices.config[0].opaque.parameters.kind: required, must be 'GpuConfig'",
    ),
    (
        "nested too deep",
        _claim_body("c", [_request("gpu")], _gpu_config(env={"A": _nested(20)})),
        "spec.devices.config[0].opaque.parameters: nested deeper than 16 levels (at env.A[0][0][0][0]... (10 more "
        "levels)); at most 16 levels of arrays and objects are allowed",
    ),
    (
        "lone surrogate",
        _claim_body("c", [_request("gpu")], _gpu_config(env={"A": "\ud800"})),
        'spec.devices.config[0].opaque.parameters.env.A: not valid Unicode (lone surrogate "\\ud800" at character 0)',
    ),
    (
        "huge integer",
        _claim_body("c", [_request("gpu")], _gpu_config(computeLimitPercent=10**25)),
        "spec.devices.config[0].opaque.parameters.computeLimitPercent: must be an integer between 1 and 100, "
        "got 10000000000000000000000000",
    ),
    (
        "zero memory",
        _claim_body("c", [_request("gpu", "0")]),
        f"spec.devices.requests[0].exactly.capacity.requests.memory: {POSITIVE}, got '0'",
    ),
    (
        "negative memory",
        _claim_body("c", [_request("gpu", "-1Gi")]),
        f"spec.devices.requests[0].exactly.capacity.requests.memory: {POSITIVE}, got '-1Gi'",
    ),
    (
        "fractional memory",
        _claim_body("c", [_request("gpu", "0.5")]),
        f"spec.devices.requests[0].exactly.capacity.requests.memory: {POSITIVE} (whole bytes",
    ),
    (
        "unknown capacity",
        _claim_body(
            "c",
            [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": DEVICE_CLASS_NAME, "capacity": {"requests": {"cores": "2"}}},
                }
            ],
        ),
        "spec.devices.requests[0].exactly.capacity.requests.cores: unknown capacity; gpu.fracgpu.dev devices offer only "
        "'memory' and 'compute': HAMi's 'cores' is 'compute' here (percent of the GPU, 100 per GPU), write "
        "capacity.requests.compute: 2",
    ),
    (
        "bad alternative",
        _claim_body(
            "c",
            [
                {
                    "name": "gpu",
                    "firstAvailable": [
                        {
                            "name": "big",
                            "deviceClassName": DEVICE_CLASS_NAME,
                            "capacity": {"requests": {"memory": "40Gi"}},
                        },
                        {
                            "name": "small",
                            "deviceClassName": DEVICE_CLASS_NAME,
                            "capacity": {"requests": {"memory": "0"}},
                        },
                    ],
                }
            ],
        ),
        f"spec.devices.requests[0].firstAvailable[1].capacity.requests.memory: {POSITIVE}, got '0'",
    ),
    (
        "configs valid alone, invalid merged",
        _claim_body(
            "c",
            [_request("gpu", "1Gi")],
            _gpu_config(env={f"A_{i}": "1" for i in range(20)}) + _gpu_config(env={f"B_{i}": "1" for i in range(20)}),
        ),
        "spec.devices.requests[0].exactly: request 'gpu' gets the GpuConfigs spec.devices.config[0], "
        "spec.devices.config[1] merged, and the result is invalid: env: at most 32 entries are allowed, got 40",
    ),
]


def test_the_tier_the_plugin_reports_reaches_status_data_and_the_ledger(
    control_plane: ControlPlane,
    controller: kube.ControllerProcess,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    """The node plugin's MemoryEnforcement condition (its own field manager) and the controller's `data` (atomic,
    the controller's) coexist on one entry; the controller copies the tier into data and the ledger."""
    from api.kube_rest import KubeConnection, KubeRest
    from kubelet_plugin.prepare.ready import FIELD_MANAGER, apply_ready

    node_body = kube.create_fake_node(api_client, kube.unique("tiernode"))
    node = node_body["metadata"]["name"]
    gpus = kube.simulated_gpus(node, 1)
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, gpus)
    _claims(dyn).create(namespace=namespace, body=_claim_body("tiered", [_request("a", "10Gi"), _request("b", "5Gi")]))
    client.CoreV1Api(api_client).create_namespaced_pod(
        namespace, kube.pod_with_claim("p-tiered", None, node, {"c": "tiered"})
    )
    claim = controller.wait_for(lambda: _written_claim(dyn, namespace, "tiered"), 60, "status data of 'tiered'")
    assert all("enforcement" not in d for d in _our_entries(claim).values()), "no tier before the plugin says one"
    results = {r["request"]: r for r in _our_results(claim)}
    nvml_key = (results["a"]["pool"], results["a"]["device"], results["a"]["shareID"])
    apply_ready(KubeRest(KubeConnection.of(api_client)), claim, DRIVER_NAME, node, {nvml_key: "nvml"})

    def tiers() -> dict[str, Any] | None:
        fresh = _claims(dyn).get(namespace=namespace, name="tiered").to_dict()
        data = {d["request"]: d.get("enforcement") for d in _our_entries(fresh).values()}
        return fresh if data == {"a": "nvml", "b": "none"} else None

    fresh = controller.wait_for(tiers, 30, "data.enforcement from the plugin's condition")
    for entry in fresh["status"]["devices"]:
        assert {c["type"] for c in entry["conditions"]} == {"Ready", "MemoryEnforcement"}
    managers = {m["manager"] for m in fresh["metadata"]["managedFields"] if m.get("subresource") == "status"}
    assert {"fracgpu-controller", FIELD_MANAGER} <= managers

    def ledger() -> dict[str, Any] | None:
        (gpu,) = _node_ledger(dyn, node).values()
        shares = {c["request"]: c.get("enforcement") for c in gpu["status"].get("claims") or []}
        return gpu if shares == {"a": "nvml", "b": "none"} else None

    gpu = controller.wait_for(ledger, 30, "the ledger's share tiers")
    assert gpu["status"]["enforcement"] == "none"  # the GPU's published memoryEnforcement
    table = _kubectl(control_plane, "get", "gpus", "-l", f"{NODE_LABEL}={node}", "-o", "wide")
    header, row = table.splitlines()[:2]
    starts = [header.index(name) for name in header.split()]  # kubectl aligns columns; MODEL has spaces
    columns = {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], len(row)], strict=True)}
    assert (columns["ENFORCEMENT"], columns["SHARE-ENFORCEMENT"]) == ("none", "nvml=1,none=1")


@pytest.mark.parametrize("case", BAD_CLAIMS, ids=[c[0] for c in BAD_CLAIMS])
def test_admission_refuses_bad_claims_with_field_and_rule(
    controller: kube.ControllerProcess,
    gpu_node: str,
    dyn: DynamicClient,
    namespace: str,
    case: tuple[str, dict[str, Any], str],
) -> None:
    _, body, message = case
    with pytest.raises(ApiException) as refused:
        _claims(dyn).create(namespace=namespace, body=body)
    assert refused.value.status == 422, refused.value.body
    text = json.loads(refused.value.body)["message"]
    assert 'admission webhook "resourceclaims.gpu.fracgpu.dev" denied the request' in text
    assert message in text, text


def test_admission_checks_templates_and_passes_valid_claims_with_a_warning_for_oversized_requests(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    reviewed = controller.metric("fracgpu_controller_admission_review_seconds_count")
    templates = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
    bad_template = kube.claim_template(
        "bad",
        DEVICE_CLASS_NAME,
        "10Gi",
        {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "env": {"CUDA_X": "1"}},
    )
    with pytest.raises(ApiException) as refused:
        templates.create(namespace=namespace, body=bad_template)
    assert refused.value.status == 422
    assert "spec.spec.devices.config[0].opaque.parameters.env: variable name 'CUDA_X' is reserved" in refused.value.body

    good = kube.claim_template(
        "good",
        DEVICE_CLASS_NAME,
        "10Gi",
        {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": 50},
    )
    assert templates.create(namespace=namespace, body=good).metadata.name == "good"
    valid = _claim_body("valid", [_request("gpu", "512Mi")], _gpu_config(enforcement="none", env={"MY_VAR": "1"}))
    assert _claims(dyn).create(namespace=namespace, body=valid).metadata.name == "valid"
    # another driver's claim with a config we could not decode is not ours to judge
    foreign = _claim_body(
        "foreign", [_request("nic", None, OTHER_DRIVER)], [{"opaque": {"driver": OTHER_DRIVER, "parameters": {"x": 1}}}]
    )
    assert _claims(dyn).create(namespace=namespace, body=foreign).metadata.name == "foreign"

    largest = _largest_gpu(dyn)
    huge = _claim_body("huge", [_request("gpu", "4Ti")])
    response = client.ResourceV1Api(api_client).create_namespaced_resource_claim(
        namespace, huge, _preload_content=False
    )
    assert response.status == 201
    headers = response.headers
    warning = headers.get("Warning", "")
    assert "spec.devices.requests[0].exactly.capacity.requests.memory" in warning, headers
    assert f"largest GPU has {format_bytes(largest)}" in warning
    # the webhook's own time of each review it answered (2 templates, 3 claims, and `valid` once more: its GpuConfig
    # is rewritten in canonical bytes by the mutating webhook) is in its histogram
    assert controller.metric("fracgpu_controller_admission_review_seconds_count") == reviewed + 6


def _create_warnings(api_client: client.ApiClient, namespace: str, body: dict[str, Any], dry_run: bool) -> str:
    """Create a claim (or only try, `dry_run`); the Warning header of the answer."""
    response = client.ResourceV1Api(api_client).create_namespaced_resource_claim(
        namespace, body, _preload_content=False, **({"dry_run": "All"} if dry_run else {})
    )
    assert response.status == 201
    return str(response.headers.get("Warning", ""))


def test_admission_warns_when_hami_core_is_asked_and_no_gpu_offers_it(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    hami = _claim_body("hami", [_request("gpu", "1Gi")], _gpu_config(enforcement="hami-core"))
    warning = _create_warnings(api_client, namespace, hami, dry_run=False)
    assert "request 'gpu' asks for enforcement 'hami-core', but no published GPU offers it" in warning, warning
    assert "no published GPU offers it" not in _create_warnings(
        api_client, namespace, _claim_body("plain", [_request("gpu", "1Gi")]), dry_run=True
    )
    # a node plugin that found the HAMi-core library publishes hamiCore: true, and the warning goes
    probe = {**hami, "metadata": {"name": "hami-probe"}}
    node = kube.create_fake_node(api_client, kube.unique("haminode"))
    kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], 1), hami_core=True)
    controller.wait_for(
        lambda: "no published GPU offers it" not in _create_warnings(api_client, namespace, probe, dry_run=True),
        20,
        "no hami-core warning once a GPU offers it",
    )


def test_admission_warns_when_nvml_is_asked_and_no_gpu_offers_it(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    nvml = _claim_body("nvml", [_request("gpu", "1Gi")], _gpu_config(enforcement="nvml"))
    warning = _create_warnings(api_client, namespace, nvml, dry_run=True)
    assert "request 'gpu' asks for enforcement 'nvml', but no published GPU offers it" in warning, warning
    # a node plugin on a cgroup-v2 node with an r615+ driver publishes memoryEnforcement: nvml, and the warning goes
    node = kube.create_fake_node(api_client, kube.unique("nvmlnode"))
    kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], 1), enforcement="nvml")
    controller.wait_for(
        lambda: "no published GPU offers it" not in _create_warnings(api_client, namespace, nvml, dry_run=True),
        20,
        "no nvml warning once a GPU offers it",
    )


def test_admission_warns_when_mps_is_asked_and_no_gpu_is_an_mps_gpu(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    mps = _claim_body("mps", [_request("gpu", "1Gi")], _gpu_config(enforcement="mps"))
    warning = _create_warnings(api_client, namespace, mps, dry_run=True)
    assert "request 'gpu' asks for enforcement 'mps', but no published GPU is an MPS GPU" in warning, warning
    # a node plugin with an MPS GPU (mps.gpus) publishes mps: true and memoryEnforcement: mps, and the warning goes
    node = kube.create_fake_node(api_client, kube.unique("mpsnode"))
    kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], 1), enforcement="mps")
    controller.wait_for(
        lambda: "no published GPU is an MPS GPU" not in _create_warnings(api_client, namespace, mps, dry_run=True),
        20,
        "no mps warning once a GPU is an MPS GPU",
    )


def test_admission_warns_of_settings_that_would_be_dropped_or_rounded(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """Another driver's config on our request, a request the published 256Mi step rounds up, and
    computeLimitPercent under enforcement nvml: each a warning on the real API server's answer."""
    nvidia_mps = {
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi"}},
            },
        }
    }
    config = [*_gpu_config(enforcement="nvml", computeLimitPercent=30), nvidia_mps]
    body = _claim_body("dropped", [_request("gpu", "3000M")], config)
    warning = _create_warnings(api_client, namespace, body, dry_run=True)
    assert (
        "spec.devices.config[1].opaque: a config for driver 'gpu.nvidia.com' on request(s) 'gpu', which only "
        "gpu.fracgpu.dev prepares: gpu.fracgpu.dev ignores other drivers' configs" in warning
    ), warning
    assert (
        "rounds it up to a 3072Mi grant where the GPU's memory requestPolicy.validRange has min 0, step 256Mi"
        in warning
    )
    assert "request 'gpu' sets computeLimitPercent 30, but enforcement 'nvml' does not apply it" in warning


def _warnings_text(header: str) -> str:
    """The Warning header's texts as written (`299 - "text"`, the API server escapes quotes in the text)."""
    return header.replace('\\"', '"')


def test_admission_warns_of_a_whole_gpu_that_a_claims_pods_share(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """A ResourceClaim's request without capacity.requests.memory takes a whole GPU that every pod naming the claim
    shares: warned on the real API server's answer; not for a template, nor for kube-scheduler's claim for an
    extended resource (as the scheduler writes it: annotation, generateName, the pod as controlling owner)."""
    whole = "request 'gpu' asks for no capacity.requests.memory, so it takes a whole GPU"
    warning = _create_warnings(api_client, namespace, _claim_body("whole", [_request("gpu")]), dry_run=True)
    assert f"spec.devices.requests[0].exactly: {whole}" in warning, warning
    assert "write a ResourceClaimTemplate whose request asks for capacity.requests.memory" in warning
    assert "takes" not in _create_warnings(api_client, namespace, _claim_body("share", [_request("gpu", "1Gi")]), True)

    template = kube.claim_template("whole", DEVICE_CLASS_NAME, None)
    response = client.ResourceV1Api(api_client).create_namespaced_resource_claim_template(
        namespace, template, _preload_content=False, dry_run="All"
    )
    assert response.status == 201
    assert str(response.headers.get("Warning", "")) == ""

    pod = client.CoreV1Api(api_client).create_namespaced_pod(
        namespace, kube.pod_with_claim("extended", None, gpu_node, claims={})
    )
    made = _claim_body("", [{"name": "container-0-request-0", "exactly": {"deviceClassName": DEVICE_CLASS_NAME}}])
    made["metadata"] = {
        "generateName": "extended-extended-resources-",
        "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "extended", "uid": pod.metadata.uid, "controller": True}
        ],
    }
    assert _create_warnings(api_client, namespace, made, dry_run=False) == ""
    # the annotation is what tells it apart: the same claim without it is warned
    made["metadata"]["annotations"] = {}
    assert "request 'container-0-request-0' asks for no capacity.requests.memory, so it takes a whole GPU" in (
        _create_warnings(api_client, namespace, made, dry_run=True)
    )


def test_admission_warns_of_selectors_reading_names_no_gpu_publishes(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """`model` (NVIDIA's `productName`) and HAMi's `gpumem` read nothing on fracgpu's devices: the warning names
    the published name; a published one is not warned; an expression that does not compile is refused by the
    API server itself with the compiler's message."""
    attributes = f'device.attributes["{DRIVER_NAME}"]'
    selectors = [
        {"cel": {"expression": f'{attributes}.model == "NVIDIA A100-SXM4-40GB"'}},
        {"cel": {"expression": f'device.capacity["{DRIVER_NAME}"].gpumem.compareTo(quantity("10Gi")) >= 0'}},
        {"cel": {"expression": f'{attributes}.productName.startsWith("NVIDIA")'}},
        # guarded: false on every GPU, and the scheduler says only "cannot allocate all claims"
        {"cel": {"expression": f'"model" in {attributes} && {attributes}.model == "NVIDIA A100-SXM4-40GB"'}},
    ]
    body = _claim_body("model", [_request("gpu", "1Gi", selectors=selectors)])
    warning = _warnings_text(_create_warnings(api_client, namespace, body, dry_run=True))
    assert (
        f"spec.devices.requests[0].exactly.selectors[0].cel.expression: request 'gpu' reads {attributes}.model, but "
        f"no {DRIVER_NAME} device publishes attribute 'model' in {DRIVER_NAME}" in warning
    ), warning
    assert f"did you mean {attributes}.productName?" in warning, warning
    assert f"selectors[1].cel.expression: request 'gpu' reads device.capacity[\"{DRIVER_NAME}\"].gpumem" in warning
    assert f'did you mean device.capacity["{DRIVER_NAME}"].memory?' in warning, warning
    assert "selectors[2]" not in warning
    assert (
        f"selectors[3].cel.expression: request 'gpu' reads {attributes}.model, but no {DRIVER_NAME} device publishes "
        "attribute 'model' in gpu.fracgpu.dev, so it is absent on every device (a test of it is false" in warning
    ), warning
    broken = _claim_body("broken", [_request("gpu", "1Gi", selectors=[{"cel": {"expression": f"{attributes}.x =="}}])])
    with pytest.raises(ApiException) as refused:
        _claims(dyn).create(namespace=namespace, body=broken)
    assert refused.value.status == 422, refused.value.body
    text = json.loads(refused.value.body)["message"]
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in text and "Syntax error" in text, text


# ----- events and the ledger following slices -----------------------------------------------------------


def test_an_a100_only_claim_larger_than_an_a100_gets_an_event_naming_the_selector(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    a100 = "NVIDIA A100-SXM4-40GB"
    node = kube.create_fake_node(api_client, kube.unique("a100node"))
    kube.publish_gpus(
        dyn, node, DRIVER_NAME, kube.simulated_gpus(node["metadata"]["name"], 2, memory_gib=40, model=a100)
    )
    assert _largest_gpu(dyn) > 50 * kube.GiB, "some GPU of another model is large enough"
    selector = f'device.attributes["{DRIVER_NAME}"].productName == "{a100}"'
    # asking what an A100 has gets no Event (created first: reconciled before the other one's Event is posted)
    fits = _request("gpu", "40Gi", selectors=[{"cel": {"expression": selector}}])
    _claims(dyn).create(namespace=namespace, body=_claim_body("a100-40gi", [fits]))
    only_a100 = _request("gpu", "50Gi", selectors=[{"cel": {"expression": selector}}])
    _claims(dyn).create(namespace=namespace, body=_claim_body("a100-50gi", [only_a100]))
    events = controller.wait_for(
        lambda: _events(api_client, namespace, "a100-50gi", "UnsatisfiableGpuRequest"),
        30,
        "an Unsatisfiable event naming the selector",
    )
    message = events[0].message
    assert "request 'gpu' asks for 50Gi of GPU memory, but only 2 published GPUs of " in message, message
    assert f"`{selector}` (of the request)" in message, message
    assert f'`device.driver == "{DRIVER_NAME}"` (of DeviceClass {DEVICE_CLASS_NAME})' in message, message
    assert message.endswith("and the largest of them has 40Gi"), message
    assert not _events(api_client, namespace, "a100-40gi", "UnsatisfiableGpuRequest")


def test_every_form_of_an_impossible_claim_gets_an_event_saying_what_was_asked_and_why(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    """Whole GPUs, count, All, firstAvailable, and requests that fit alone but not together under matchAttribute
    or distinctAttribute: the controller's UnsatisfiableGpuRequest on each, and none on their possible twins. A node
    with two T4s and one with a T4 and an L4, models no other test publishes."""
    t4, l4 = "NVIDIA T4 (unsatisfiable test)", "NVIDIA L4 (unsatisfiable test)"
    two = kube.create_fake_node(api_client, kube.unique("t4node"))
    kube.publish_gpus(dyn, two, DRIVER_NAME, kube.simulated_gpus(two["metadata"]["name"], 2, memory_gib=16, model=t4))
    mixed = kube.create_fake_node(api_client, kube.unique("mixednode"))
    t4_l4 = kube.simulated_gpus(mixed["metadata"]["name"], 2, memory_gib=16, model=t4)
    t4_l4[1] = t4_l4[1].model_copy(update={"product_name": l4, "memory_total_bytes": 24 * kube.GiB})
    kube.publish_gpus(dyn, mixed, DRIVER_NAME, t4_l4)
    product = f'device.attributes["{DRIVER_NAME}"].productName'
    only_t4, only_l4 = (
        [{"cel": {"expression": f'{product} == "{t4}"'}}],
        [{"cel": {"expression": f'{product} == "{l4}"'}}],
    )
    none = f'{product} == "NVIDIA nonexistent (unsatisfiable test)"'
    uuid, product_name = f"{DRIVER_NAME}/uuid", f"{DRIVER_NAME}/productName"

    def body(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None) -> Any:
        out = _claim_body(name, requests)
        if constraints:
            out["spec"]["devices"]["constraints"] = constraints
        return out

    impossible = {
        "whole": (
            body("whole", [_request("gpu", selectors=[{"cel": {"expression": none}}])]),
            ["request 'gpu' asks for a whole GPU, but no published GPU matches selector", none],
        ),
        "count": (
            body("count", [_request("gpu", "1Gi", count=3, selectors=only_t4)]),
            [
                "request 'gpu' asks for 3 GPUs with 1Gi of GPU memory each, but a claim's GPUs all come from one "
                "node, and no node has 3 GPUs it can use",
                f"the most on one node is 2 (node {two['metadata']['name']}), of 3 published GPUs it can use",
            ],
        ),
        "all": (
            body("all", [_request("gpu", allocationMode="All", selectors=[{"cel": {"expression": none}}])]),
            ["request 'gpu' asks for every GPU of a node it matches (allocationMode All), but no published GPU"],
        ),
        "first": (
            body(
                "first",
                [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "three", "deviceClassName": DEVICE_CLASS_NAME, "count": 3, "selectors": only_t4},
                            {
                                "name": "big",
                                "deviceClassName": DEVICE_CLASS_NAME,
                                "selectors": only_l4,
                                "capacity": {"requests": {"memory": "30Gi"}},
                            },
                        ],
                    }
                ],
            ),
            [
                "request 'gpu/three' asks for 3 whole GPUs, but",
                "; or request 'gpu/big' asks for 30Gi of GPU memory, but only 1 published GPU of ",
                "and the largest of them has 24Gi",
            ],
        ),
        "match": (
            body(
                "match",
                [_request("a", "1Gi", selectors=only_t4), _request("b", "1Gi", selectors=only_l4)],
                [{"requests": ["a", "b"], "matchAttribute": product_name}],
            ),
            [
                "request 'a' asks for 1Gi of GPU memory; request 'b' asks for 1Gi of GPU memory; each fits alone, but",
                f"constraint matchAttribute {product_name} ('a', 'b'): no node has GPUs of one value for all of them "
                f"(the values each can use: 'a': {t4}; 'b': {l4})",
            ],
        ),
        "distinct": (
            body(
                "distinct",
                [_request("a", "1Gi", count=2, selectors=only_t4), _request("b", "1Gi", selectors=only_t4)],
                [{"distinctAttribute": uuid}],
            ),
            [
                f"each fits alone, but constraint distinctAttribute {uuid} (all requests) needs 3 GPUs with "
                f"different {uuid} on one node, and no node has more than 2 such values"
            ],
        ),
        "sum": (
            body(
                "sum",
                [_request("a", "10Gi", selectors=only_t4), _request("b", "10Gi", selectors=only_t4)],
                [{"matchAttribute": uuid}],
            ),
            [
                f"constraint matchAttribute {uuid} (all requests) puts them on one GPU (each {uuid} is one GPU), "
                "and together they ask for 20Gi of GPU memory, where the largest GPU they can all use has 16Gi"
            ],
        ),
        "wholes": (
            body("wholes", [_request(r, selectors=only_t4) for r in ("a", "b", "c")]),
            ["each fits alone, but no node has GPUs for all of them at once"],
        ),
    }
    possible = {  # the twins: one thing changed, and the claim can be allocated
        "count-ok": body("count-ok", [_request("gpu", "1Gi", count=2, selectors=only_t4)]),
        "match-ok": body(
            "match-ok",
            [_request("a", "1Gi", selectors=only_t4), _request("b", "1Gi", selectors=only_t4)],
            [{"matchAttribute": product_name}],
        ),
        "sum-ok": body(
            "sum-ok",
            [_request("a", "8Gi", selectors=only_t4), _request("b", "8Gi", selectors=only_t4)],
            [{"matchAttribute": uuid}],
        ),
        "wholes-ok": body("wholes-ok", [_request(r, selectors=only_t4) for r in ("a", "b")]),
    }
    for claim in possible.values():  # created first: reconciled before the others' Events are posted
        _claims(dyn).create(namespace=namespace, body=claim)
    for claim, _ in impossible.values():
        _claims(dyn).create(namespace=namespace, body=claim)
    for name, (_, expected) in impossible.items():
        events = controller.wait_for(
            functools.partial(_events, api_client, namespace, name, "UnsatisfiableGpuRequest"),
            30,
            f"an UnsatisfiableGpuRequest Event on claim {name!r}",
        )
        message = events[0].message
        assert message.startswith(f"no GPU of {DRIVER_NAME} can ever satisfy this claim: "), message
        for part in expected:
            assert part in message, (name, message)
    for name in possible:
        assert not _events(api_client, namespace, name, "UnsatisfiableGpuRequest"), name

    # the real scheduler agrees: a pod of each impossible claim stays Unschedulable on every node, and each twin is
    # allocated (one at a time, on an otherwise idle cluster of T4s and L4s)
    core = client.CoreV1Api(api_client)

    def pod(claim: str) -> dict[str, Any]:
        body = kube.pod_with_claim(f"p-{claim}", None, "", {"c": claim})
        del body["spec"]["nodeSelector"]  # any node
        return body

    def unschedulable(name: str) -> bool:
        conditions = core.read_namespaced_pod(name, namespace).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    def allocation(claim: str) -> Any:
        return (_claims(dyn).get(namespace=namespace, name=claim).to_dict().get("status") or {}).get("allocation")

    def deallocated(claim: str) -> bool:
        return allocation(claim) is None

    for name in impossible:
        core.create_namespaced_pod(namespace, pod(name))
    for name in impossible:
        controller.wait_for(functools.partial(unschedulable, f"p-{name}"), 30, f"pod of claim {name!r} Unschedulable")
        assert allocation(name) is None, name
    for name in possible:
        core.create_namespaced_pod(namespace, pod(name))
        controller.wait_for(functools.partial(allocation, name), 30, f"claim {name!r} allocated")
        core.delete_namespaced_pod(f"p-{name}", namespace, grace_period_seconds=0)
        controller.wait_for(functools.partial(deallocated, name), 60, f"claim {name!r} deallocated")


def test_a_deallocated_claim_of_another_class_of_our_driver_leaves_the_ledger(
    controller: kube.ControllerProcess, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    other_class = f"other-class.{DRIVER_NAME}"  # our driver's devices, not our DeviceClass
    kube.ensure_device_class(dyn, other_class, DRIVER_NAME)
    node_body = kube.create_fake_node(api_client, kube.unique("gpunode"))
    node = node_body["metadata"]["name"]
    gpus = kube.simulated_gpus(node, 1)
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, gpus)
    claims = _claims(dyn)
    claims.create(namespace=namespace, body=_claim_body("other", [_request("gpu", "10Gi", other_class)]))
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, kube.pod_with_claim("p-other", None, node, {"c": "other"}))

    def allocated_claim() -> dict[str, Any] | None:
        claim: dict[str, Any] = claims.get(namespace=namespace, name="other").to_dict()
        return claim if _our_results(claim) else None

    allocated = controller.wait_for(allocated_claim, 60, "allocation of claim 'other'")
    assert controller.wait_for(
        lambda: _ledger_matches(dyn, node, _expected_ledger([allocated], node, gpus)),
        20,
        "the ledger to show claim 'other'",
    )
    # the pod goes: the claim controller deallocates the claim, which then no longer concerns us at all
    core.delete_namespaced_pod("p-other", namespace, grace_period_seconds=0)
    controller.wait_for(
        lambda: not (claims.get(namespace=namespace, name="other").to_dict().get("status") or {}).get("allocation"),
        60,
        "deallocation of claim 'other'",
    )
    assert controller.wait_for(
        lambda: _ledger_matches(dyn, node, _expected_ledger([], node, gpus)), 20, "its share gone"
    )


def test_events_for_unsatisfiable_requests_and_vanished_devices(
    controller: kube.ControllerProcess, gpu_node: str, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    claims = _claims(dyn)
    claims.create(namespace=namespace, body=_claim_body("too-big", [_request("gpu", "4Ti")]))
    events = controller.wait_for(
        lambda: _events(api_client, namespace, "too-big", "UnsatisfiableGpuRequest"),
        20,
        "Unsatisfiable event",
    )
    assert events[0].type == "Warning"
    assert events[0].metadata.name.startswith("too-big."), "Event names are derived from the claim and reason"
    assert f"largest GPU has {format_bytes(_largest_gpu(dyn))}" in events[0].message, events[0].message
    assert "4Ti" in events[0].message
    assert events[0].involved_object.kind == "ResourceClaim"
    assert events[0].source.component == "fracgpu-controller"

    node_body = kube.create_fake_node(api_client, kube.unique("gpunode"))
    node = node_body["metadata"]["name"]
    gpus = kube.simulated_gpus(node, 2)
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, gpus)
    assert controller.wait_for(lambda: len(_node_ledger(dyn, node)) == 2, 20, "GPU objects of the new node")
    on_gpu1 = _request(
        "gpu", "10Gi", selectors=[{"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].index == 1'}}]
    )
    claims.create(namespace=namespace, body=_claim_body("pinned", [on_gpu1]))
    client.CoreV1Api(api_client).create_namespaced_pod(
        namespace, kube.pod_with_claim("p-pinned", None, node, {"c": "pinned"})
    )
    pinned = controller.wait_for(
        lambda: _written_claim(dyn, namespace, "pinned"),
        60,
        "status of claim 'pinned'",
    )
    assert [d["device"] for d in _our_entries(pinned).values()] == ["gpu-1"]

    # the node plugin stops publishing gpu-1 (new pool generation): its object goes, the claim is told
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, gpus[:1], generation=2)
    gone = controller.wait_for(
        lambda: _events(api_client, namespace, "pinned", "AllocatedDeviceGone"),
        20,
        "AllocatedDeviceGone event",
    )
    assert "gpu-1" in gone[0].message and "no longer exists" in gone[0].message, gone[0].message
    assert controller.wait_for(
        lambda: set(_node_ledger(dyn, node)) == {gpu_object_name(node, "gpu-0")}, 20, "gpu-1 object deleted"
    )
    still = claims.get(namespace=namespace, name="pinned").to_dict()
    assert _our_entries(still) == _our_entries(pinned), "the claim keeps the data of its (vanished) GPU"

    # all slices of the node gone: all its GPU objects gone
    for s in kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice").get().to_dict()["items"]:
        if s["spec"].get("nodeName") == node:
            kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice").delete(name=s["metadata"]["name"])
    assert controller.wait_for(lambda: not _node_ledger(dyn, node), 20, "all GPU objects of the node deleted")


# ----- adminAccess on a busy GPU (issue 30) --------------------------------------------------------------


ADMIN_LABEL = "resource.kubernetes.io/admin-access"


def _unschedulable(api_client: client.ApiClient, namespace: str, pod: str) -> str | None:
    """The scheduler's message once it has found no node for `pod`, else None."""
    conditions = client.CoreV1Api(api_client).read_namespaced_pod(pod, namespace).status.conditions or []
    return next(
        (c.message for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"),
        None,
    )


def test_an_admin_access_claim_of_memory_0_reaches_a_full_gpu_and_one_without_capacity_waits(
    controller: kube.ControllerProcess,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    """The real scheduler (v1.37) fits an adminAccess request's capacity like any other's on a GPU shared by
    memory and leaves it out of the GPU's consumption once allocated. A GPU filled by two 40Gi shares: the
    monitoring claim written as Kubernetes' docs write it (no capacity: the requestPolicy default, all 80Gi) stays
    Pending, and admission said why and what to write; the one with `memory: 0` (the published validRange has
    min 0) is allocated there, and the ledger lists it reserving nothing."""
    core = client.CoreV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    node_body = kube.create_fake_node(api_client, kube.unique("gpunode"))
    node = node_body["metadata"]["name"]
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, kube.simulated_gpus(node, 1))
    claims = _claims(dyn)
    for name in ("busy-a", "busy-b"):
        claims.create(namespace=namespace, body=_claim_body(name, [_request("gpu", "40Gi")]))
        core.create_namespaced_pod(namespace, kube.pod_with_claim(f"p-{name}", None, node, {"c": name}))
    for name in ("busy-a", "busy-b"):
        controller.wait_for(functools.partial(_written_claim, dyn, namespace, name), 60, f"allocation of {name}")

    docs_way = _claim_body("mon-docs", [_request("mon", adminAccess=True)])
    warning = _create_warnings(api_client, namespace, docs_way, dry_run=False)
    assert (
        "request 'mon' has adminAccess and no capacity: to place it, the scheduler charges it the GPU's default "
        "memory request (all of the GPU's memory)" in warning
    ), warning
    assert "write capacity: {requests: {memory: 0}}" in warning, warning
    zero = _claim_body("mon", [_request("mon", "0", adminAccess=True)])
    assert _create_warnings(api_client, namespace, zero, dry_run=False) == ""
    for name in ("mon-docs", "mon"):
        core.create_namespaced_pod(namespace, kube.pod_with_claim(f"p-{name}", None, node, {"c": name}))

    mon = controller.wait_for(
        lambda: _written_claim(dyn, namespace, "mon"), 60, "allocation of the memory-0 admin claim"
    )
    (result,) = _our_results(mon)
    assert (result["device"], result.get("adminAccess"), result["consumedCapacity"]) == (
        "gpu-0",
        True,
        {"memory": "0", "compute": "0"},  # every capacity the GPU publishes; compute's default is none
    )
    assert [(d["memory"], d.get("adminAccess")) for d in _our_entries(mon).values()] == [("0", True)]
    gpu = controller.wait_for(
        lambda: next(
            (g for g in _node_ledger(dyn, node).values() if len((g.get("status") or {}).get("claims") or []) == 3),
            None,
        ),
        20,
        "the ledger listing the admin claim",
    )
    assert (gpu["status"]["allocatedMemory"], gpu["status"]["freeMemory"]) == ("80Gi", "0")
    assert {(c["name"], c["memory"], c.get("adminAccess")) for c in gpu["status"]["claims"]} == {
        ("busy-a", "40Gi", None),
        ("busy-b", "40Gi", None),
        ("mon", "0", True),
    }
    message = controller.wait_for(lambda: _unschedulable(api_client, namespace, "p-mon-docs"), 60, "mon-docs Pending")
    assert "cannot allocate all claims" in message, message
    assert not (claims.get(namespace=namespace, name="mon-docs").to_dict().get("status") or {}).get("allocation")


# ----- burst and restart ------------------------------------------------------------------------------


def test_ledger_matches_allocations_after_a_burst_of_50_claims_and_a_restart_in_the_middle(
    control_plane: ControlPlane,
    controller: kube.ControllerProcess,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    node_body = kube.create_fake_node(api_client, kube.unique("gpunode"))
    node = node_body["metadata"]["name"]
    gpus = kube.simulated_gpus(node, 4)
    kube.publish_gpus(dyn, node_body, DRIVER_NAME, gpus)
    templates = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate")
    for name, memory in (("small", "4Gi"), ("large", "8Gi")):
        templates.create(namespace=namespace, body=kube.claim_template(name, DEVICE_CLASS_NAME, memory))
    core = client.CoreV1Api(api_client)
    claims = _claims(dyn)

    def create(i: int) -> None:
        core.create_namespaced_pod(namespace, kube.pod_with_claim(f"p{i:02d}", "small" if i % 2 else "large", node))

    def delete(i: int) -> None:
        core.delete_namespaced_pod(f"p{i:02d}", namespace, grace_period_seconds=0)

    def items() -> list[dict[str, Any]]:
        return list(claims.get(namespace=namespace).to_dict()["items"])

    for i in range(25):
        create(i)
    controller.wait_for(lambda: sum(_status_written(c) for c in items()) >= 5, 60, "first status writes of the burst")
    controller.kill()  # in the middle of the burst: some claims written, some allocated only, some pending
    for i in range(25, 50):
        create(i)
    for i in range(10):
        delete(i)
    controller.wait_for(
        lambda: sum(bool(_our_results(c)) for c in items()) >= 30,
        60,
        "allocations while the controller is down",
    )
    before_restart = {c["metadata"]["name"]: c["metadata"]["resourceVersion"] for c in items() if _status_written(c)}
    assert 5 <= len(before_restart) < 40, "the restart must find claims both written and still to write"
    controller.start()

    def converged() -> list[dict[str, Any]] | None:
        current = [c for c in items() if not c["metadata"].get("deletionTimestamp")]
        owners = {(c["metadata"].get("ownerReferences") or [{}])[0].get("name") for c in current}
        if owners != {f"p{i:02d}" for i in range(10, 50)} or not all(_status_written(c) for c in current):
            return None
        return current if _ledger_matches(dyn, node, _expected_ledger(current, node, gpus)) else None

    current = controller.wait_for(converged, 90, "40 claims written and the ledger matching after the restart")
    for claim in current:
        assert _our_entries(claim) == _expected_data(claim, {node: gpus}), claim["metadata"]["name"]
    # claims written before the restart were not written again
    for claim in current:
        name = claim["metadata"]["name"]
        if name in before_restart:
            assert claim["metadata"]["resourceVersion"] == before_restart[name], name
    ledger = _node_ledger(dyn, node)
    assert sum(g["status"]["shares"] for g in ledger.values()) == 40
    assert (
        sum(to_bytes(g["status"]["allocatedMemory"]) for g in ledger.values()) == 20 * 4 * kube.GiB + 20 * 8 * kube.GiB
    )
    # `kubectl get gpus` reads like `kubectl inspect gpushare`: one row per GPU with its memory split
    table = _kubectl(control_plane, "get", "gpus", "-l", f"{NODE_LABEL}={node}").splitlines()
    assert table[0].split() == [
        "NAME",  # <node>-<device>: NODE is in -o wide
        "MODEL",
        "TOTAL",
        "ALLOCATED",
        "FREE",
        "SHARES",
        "ENFORCEMENT",
        "REPORTING",
        "AGE",
    ]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert set(rows) == set(ledger)
    wide = {
        row["NAME"]: row
        for row in _columns(_kubectl(control_plane, "get", "gpus", "-l", f"{NODE_LABEL}={node}", "-o", "wide"))
    }
    for name, g in ledger.items():
        st = g["status"]
        assert " ".join(rows[name][1:5]) == "NVIDIA H100 80GB HBM3"
        assert rows[name][5:9] == [st["totalMemory"], st["allocatedMemory"], st["freeMemory"], str(st["shares"])]
        assert rows[name][9] == st["enforcement"] == "none"
        # USED is blank: no node plugin samples these simulated GPUs
        assert (wide[name]["NODE"], wide[name]["USED"], wide[name]["INDEX"]) == (node, "", str(st["index"]))
        assert "conditions" not in st  # REPORTING is blank too: this controller watches no heartbeats

    for i in range(10, 50):
        delete(i)
    controller.wait_for(lambda: not items(), 90, "all claims of the burst deleted")
    assert controller.wait_for(
        lambda: _ledger_matches(dyn, node, _expected_ledger([], node, gpus)), 30, "an empty ledger"
    )
    for g in _node_ledger(dyn, node).values():
        assert (g["status"]["allocatedMemory"], g["status"]["freeMemory"], g["status"]["shares"]) == ("0", "80Gi", 0)


def test_the_ledger_shows_the_slices_taints_and_a_device_taint_rule_until_it_is_deleted(
    controller: kube.ControllerProcess, control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient
) -> None:
    node_body = kube.create_fake_node(api_client, kube.unique("gpunode"))
    node = node_body["metadata"]["name"]
    unhealthy = {"key": "gpu.fracgpu.dev/xid", "value": "48-double-bit-ecc-error", "effect": "NoExecute"}
    published = kube.publish_gpus(
        dyn, node_body, DRIVER_NAME, kube.simulated_gpus(node, 2), taints={"gpu-0": [unhealthy]}
    )
    (slice_name,) = [s["metadata"]["name"] for s in published]
    rules = kube.resource(dyn, "resource.k8s.io/v1", "DeviceTaintRule")
    rule = kube.unique("maint")
    rules.create(
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": rule},
            "spec": {
                "deviceSelector": {"driver": DRIVER_NAME, "pool": node, "device": "gpu-1"},
                "taint": {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"},
            },
        }
    )

    def summaries() -> dict[str, str | None]:
        return {
            n[len(node) + 1 :]: (g.get("status") or {}).get("taintSummary") for n, g in _node_ledger(dyn, node).items()
        }

    controller.wait_for(lambda: summaries() == {"gpu-0": "NoExecute=1", "gpu-1": "NoSchedule=1"} or None, 30, "taints")
    ledger = _node_ledger(dyn, node)
    assert ledger[f"{node}-gpu-0"]["status"]["taints"] == [{**unhealthy, "source": f"ResourceSlice/{slice_name}"}]
    assert ledger[f"{node}-gpu-1"]["status"]["taints"] == [
        {
            "key": "example.com/maintenance",
            "value": "planned",
            "effect": "NoSchedule",
            "source": f"DeviceTaintRule/{rule}",
        }
    ]
    for wide in (False, True):
        table = _kubectl(control_plane, "get", "gpus", "-l", f"{NODE_LABEL}={node}", *(["-o", "wide"] if wide else []))
        shown = {row["NAME"]: row for row in _columns(table)}
        assert {n: (r.get("TAINTS"), r.get("TAINTED-BY")) for n, r in shown.items()} == {
            f"{node}-gpu-0": ("NoExecute=1", "gpu.fracgpu.dev/xid=48-double-bit-ecc-error:NoExecute")
            if wide
            else (None, None),  # the default table leaves taints to -o wide
            f"{node}-gpu-1": ("NoSchedule=1", "example.com/maintenance=planned:NoSchedule") if wide else (None, None),
        }
    described = _kubectl(control_plane, "describe", "gpu", f"{node}-gpu-1")
    assert f"DeviceTaintRule/{rule}" in described, described
    rules.delete(name=rule)
    controller.wait_for(
        lambda: summaries() == {"gpu-0": "NoExecute=1", "gpu-1": None} or None, 30, "the rule's taint gone"
    )
    assert "taints" not in _node_ledger(dyn, node)[f"{node}-gpu-1"]["status"]


# ----- shutdown (last: stops the module's controller) ----------------------------------------------------


def test_sigterm_exits_cleanly_and_unregisters_the_webhooks(
    controller: kube.ControllerProcess, api_client: client.ApiClient
) -> None:
    started = time.monotonic()
    assert controller.terminate() == 0, controller.log_tail()
    assert time.monotonic() - started < 15
    config = client.AdmissionregistrationV1Api(api_client).read_validating_webhook_configuration(DRIVER_NAME)
    assert not config.webhooks, "webhooks left registered after a clean exit"
    assert "Traceback" not in controller.log_tail(400)
