"""MPS trust domains at scheduling, on the real control plane (issue #27): the controller (`--mps`, its RBAC only)
gives claims their namespace's toleration at admission, decides the MPS binding conditions the real scheduler waits
on, keeps a DeviceTaintRule per MPS GPU, and tells a pending claim why it waits. The MPS GPUs are published by the
node plugin's own `build_slices` on fake Nodes (no kubelet: pods are bound, never started).

Shown: pods of two namespaces created at once land on two MPS GPUs, each admitted, each GPU tainted for its domain
and its ledger object naming it; a pod of a namespace already on a GPU joins it; a pod of a third namespace waits
(Pending, `MpsTrustDomainWaiting` naming the domains) until a GPU frees, then lands; a claim of our class that
tolerates every taint, or another domain's taint, is refused at admission; one of another class that selects our
devices and tolerates every taint, placed on another domain's GPU, is refused there (`MpsTrustDomainConflict`) and
never bound; three namespaces racing for two free MPS GPUs settle, and the namespaces left out are told why.
"""

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.crds import CRD_DIR
from api.gpu import GPU_API_VERSION, GPU_CRD_NAME, gpu_object_name
from api.mps_trust import ADMITTED_CONDITION, NAMESPACE_TAINT_KEY, RULE_LABEL
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.core.rbac import cluster_role_rules
from harness import kube
from harness.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration
SA_NAMESPACE = "fracgpu-system"


@pytest.fixture(scope="module")
def controller(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[kube.ControllerProcess]:
    kube.apply_crd(api_client, yaml.safe_load((CRD_DIR / f"{GPU_CRD_NAME}.yaml").read_text()))
    kube.ensure_device_class(dyn, DEVICE_CLASS_NAME, DRIVER_NAME)
    workdir = tmp_path_factory.mktemp("mps-controller")
    kubeconfig = kube.service_account_kubeconfig(
        api_client, server=control_plane.server, ca_cert=control_plane.ca_cert, namespace=SA_NAMESPACE,
        name="fracgpu-controller-mps-it", rules=cluster_role_rules(mps=True), path=workdir / "controller.kubeconfig",
    )  # fmt: skip
    with kube.chart_made_webhook_configuration(api_client, DRIVER_NAME):
        proc = kube.ControllerProcess(workdir, kubeconfig, "--mps", "--ledger-delay=0.2")
        proc.start()
        probe = kube.claim_template("probe", DEVICE_CLASS_NAME, "1Gi")["spec"]
        claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim")

        def mutated() -> bool:
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "probe"}, **probe}
            made = claims.create(namespace="default", body=body, query_params=[("dryRun", "All")]).to_dict()
            return bool(made["spec"]["devices"]["requests"][0]["exactly"].get("tolerations"))

        wait(proc, mutated, 30, "the mutating webhook to give a claim its toleration")
        yield proc
        proc.terminate()
        print(f"controller log:\n{proc.log_tail(40)}")


@pytest.fixture
def namespaces(api_client: client.ApiClient) -> Iterator[list[str]]:
    core = client.CoreV1Api(api_client)
    names = [kube.unique(f"team-{x}") for x in "abc"]
    for name in names:
        core.create_namespace({"metadata": {"name": name}})

        def account(namespace: str = name) -> bool:
            return kube.exists(lambda: core.read_namespaced_service_account("default", namespace))

        kube.wait_for(account, 30)
    yield names
    for name in names:
        core.delete_namespace(name)


def wait(proc: kube.ControllerProcess, probe: Any, timeout: float, what: str) -> Any:
    try:
        return kube.wait_for(probe, timeout, what=what)
    except AssertionError as err:
        raise AssertionError(f"{err}\n--- controller log:\n{proc.log_tail()}") from None


def mps_node(api_client: client.ApiClient, dyn: DynamicClient, count: int) -> str:
    # the only GPUs of the driver: earlier tests' leftover slices would be room elsewhere, and a claim that has
    # room elsewhere is not told that it waits for a trust domain
    client.ResourceV1Api(api_client).delete_collection_resource_slice(field_selector=f"spec.driver={DRIVER_NAME}")
    node = kube.create_fake_node(api_client, kube.unique("mpsnode"))
    name: str = node["metadata"]["name"]
    kube.publish_gpus(dyn, node, DRIVER_NAME, kube.simulated_gpus(name, count), enforcement="mps", mps_binding=True)
    return name


def start_pod(
    api_client: client.ApiClient,
    namespace: str,
    name: str,
    node: str,
    device_class: str = DEVICE_CLASS_NAME,
    **exactly: Any,
) -> None:
    template = kube.claim_template(name, device_class, "10Gi")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(exactly)
    client.ResourceV1Api(api_client).create_namespaced_resource_claim_template(namespace, template)
    client.CoreV1Api(api_client).create_namespaced_pod(namespace, kube.pod_with_claim(name, name, node))


def bound(api_client: client.ApiClient, namespace: str, pod: str) -> bool:
    return bool(client.CoreV1Api(api_client).read_namespaced_pod(pod, namespace).spec.node_name)


def claim_of(dyn: DynamicClient, namespace: str, pod: str) -> dict[str, Any]:
    claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim").get(namespace=namespace).to_dict()["items"]
    found: dict[str, Any] = next(c for c in claims if c["metadata"]["name"].startswith(f"{pod}-gpu"))
    return found


def our_entry(claim: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [d for d in (claim.get("status") or {}).get("devices") or [] if d["driver"] == DRIVER_NAME]
    return dict(entry)


def device_of(claim: dict[str, Any]) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def events(api_client: client.ApiClient, namespace: str, reason: str, kind: str = "ResourceClaim") -> list[str]:
    """The messages of the Events `reason` about objects of `kind` (claims; the pods hear each one too)."""
    selector = f"reason={reason},involvedObject.kind={kind}"
    listed = client.CoreV1Api(api_client).list_namespaced_event(namespace, field_selector=selector)
    return [e.message for e in listed.items]


def taint_rules(dyn: DynamicClient, node: str) -> dict[str, str]:
    """device -> the namespace its rule keeps the GPU for."""
    rules = kube.resource(dyn, "resource.k8s.io/v1", "DeviceTaintRule").get(label_selector=f"{RULE_LABEL}=true")
    return {
        r["spec"]["deviceSelector"]["device"]: r["spec"]["taint"]["value"]
        for r in rules.to_dict()["items"]
        if r["spec"]["deviceSelector"]["pool"] == node and r["spec"]["taint"]["key"] == NAMESPACE_TAINT_KEY
    }


def test_namespaces_are_kept_apart_on_mps_gpus_and_a_third_waits_until_one_frees(
    controller: kube.ControllerProcess, api_client: client.ApiClient, dyn: DynamicClient, namespaces: list[str]
) -> None:
    a, b, c = namespaces
    node = mps_node(api_client, dyn, 2)
    start_pod(api_client, a, "p-a", node)
    start_pod(api_client, b, "p-b", node)  # at once: both may be allocated to one free GPU, one is refused there
    wait(controller, lambda: bound(api_client, a, "p-a") and bound(api_client, b, "p-b"), 90, "p-a and p-b bound")
    claim_a, claim_b = claim_of(dyn, a, "p-a"), claim_of(dyn, b, "p-b")
    assert device_of(claim_a) != device_of(claim_b), "two namespaces on one MPS GPU"
    for claim, ns in ((claim_a, a), (claim_b, b)):
        tolerations = claim["spec"]["devices"]["requests"][0]["exactly"]["tolerations"]
        assert tolerations == [{"key": NAMESPACE_TAINT_KEY, "operator": "Equal", "value": ns, "effect": "NoSchedule"}]
        entry = our_entry(claim)
        assert entry["data"]["mpsTrustDomain"] == f"namespace/{ns}"
        assert [(x["type"], x["status"]) for x in entry["conditions"] if x["type"] == ADMITTED_CONDITION] == [
            (ADMITTED_CONDITION, "True")
        ]
    expected = {device_of(claim_a): a, device_of(claim_b): b}
    wait(controller, lambda: taint_rules(dyn, node) == expected, 30, f"the taint rules {expected}")
    gpus = kube.resource(dyn, GPU_API_VERSION, "GPU")

    def ledger() -> dict[str, str | None]:
        objects = {d: gpus.get(name=gpu_object_name(node, d)).to_dict() for d in expected}
        return {d: (o.get("status") or {}).get("mpsTrustDomain") for d, o in objects.items()}

    wait(controller, lambda: ledger() == {d: f"namespace/{ns}" for d, ns in expected.items()}, 30, "the ledger")

    start_pod(api_client, b, "p-b2", node)  # b's GPU has room: b joins it
    wait(controller, lambda: bound(api_client, b, "p-b2"), 60, "p-b2 bound")
    assert device_of(claim_of(dyn, b, "p-b2")) == device_of(claim_b)

    start_pod(api_client, c, "p-c", node)  # both GPUs serve other namespaces: c waits, and is told why
    told = wait(controller, lambda: events(api_client, c, "MpsTrustDomainWaiting"), 60, "MpsTrustDomainWaiting")
    assert (
        f"this claim of namespace {c} waits" in told[0] and f"namespace {a}" in told[0] and f"namespace {b}" in told[0]
    )
    on_pod = wait(controller, lambda: events(api_client, c, "MpsTrustDomainWaiting", "Pod"), 30, "it on the pod")
    claim_c = claim_of(dyn, c, "p-c")["metadata"]["name"]
    on_claim = events(api_client, c, "MpsTrustDomainWaiting")
    assert {f"claim 'gpu' (ResourceClaim {claim_c}): {m}" for m in on_claim} >= set(on_pod), on_pod
    assert not bound(api_client, c, "p-c")

    core = client.CoreV1Api(api_client)
    core.delete_namespaced_pod("p-a", a, grace_period_seconds=0)  # a's GPU frees (its claim goes with the pod)
    wait(controller, lambda: bound(api_client, c, "p-c"), 120, "p-c bound on the freed GPU")
    assert device_of(claim_of(dyn, c, "p-c")) == device_of(claim_a)
    wait(controller, lambda: taint_rules(dyn, node).get(device_of(claim_a)) == c, 30, "the freed GPU tainted for c")


def test_a_claim_placed_on_another_domains_gpu_is_refused_there_and_one_tolerating_it_at_admission(
    controller: kube.ControllerProcess, api_client: client.ApiClient, dyn: DynamicClient, namespaces: list[str]
) -> None:
    a, b, _ = namespaces
    node = mps_node(api_client, dyn, 1)
    start_pod(api_client, a, "holder", node)
    wait(controller, lambda: bound(api_client, a, "holder"), 60, "the holder bound")
    # every taint tolerated: refused at admission on our classes (else the scheduler could place it on a's GPU
    # again and again)
    everything = kube.claim_template("everything", DEVICE_CLASS_NAME, "1Gi")
    everything["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [{"operator": "Exists"}]
    with pytest.raises(ApiException) as denied:
        client.ResourceV1Api(api_client).create_namespaced_resource_claim_template(b, everything)
    assert denied.value.status == 422 and "tolerates every taint" in str(denied.value.body), denied.value.body
    # a class of someone else's that selects our devices escapes admission: the binding condition still refuses it
    kube.ensure_device_class(dyn, "intruders.example.com", DRIVER_NAME)
    start_pod(api_client, b, "intruder", node, "intruders.example.com", tolerations=[{"operator": "Exists"}])
    refused = wait(controller, lambda: events(api_client, b, "MpsTrustDomainConflict"), 60, "MpsTrustDomainConflict")
    assert f"serves namespace {a}, and this claim belongs to namespace {b}" in refused[0]
    assert not bound(api_client, b, "intruder"), "bound onto another trust domain's MPS GPU"
    ledger = kube.resource(dyn, GPU_API_VERSION, "GPU").get(name=gpu_object_name(node, "gpu-0")).to_dict()
    assert {c["namespace"] for c in ledger["status"]["claims"]} <= {a}

    sneaky = kube.claim_template("sneaky", DEVICE_CLASS_NAME, "1Gi")
    sneaky["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": NAMESPACE_TAINT_KEY, "operator": "Equal", "value": a, "effect": "NoSchedule"}
    ]
    with pytest.raises(ApiException) as denied:
        client.ResourceV1Api(api_client).create_namespaced_resource_claim_template(b, sneaky)
    assert denied.value.status == 422 and f"{NAMESPACE_TAINT_KEY}={a}" in str(denied.value.body)


def test_three_namespaces_racing_for_two_free_mps_gpus_settle_promptly_and_the_rest_are_told_why(
    controller: kube.ControllerProcess, api_client: client.ApiClient, dyn: DynamicClient, namespaces: list[str]
) -> None:
    """6 + 6 + 2 pods of 10Gi from three namespaces created at once on two free MPS GPUs of 80Gi (8 shares each): the
    pods of the namespaces that end up holding a GPU all run on it (there is room for each), the others wait and
    are told which domains hold the GPUs, and no GPU ever has bound pods of two namespaces."""
    node = mps_node(api_client, dyn, 2)
    pods = [(ns, f"r{i}") for ns, count in zip(namespaces, (6, 6, 2), strict=True) for i in range(count)]
    start = time.monotonic()
    for ns, pod in pods:
        start_pod(api_client, ns, pod, node)
    mixed: list[str] = []

    def bound_namespaces_by_gpu() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for ns, pod in pods:
            if bound(api_client, ns, pod):
                out.setdefault(device_of(claim_of(dyn, ns, pod)), set()).add(ns)
        mixed.extend(f"{d}: {sorted(n)}" for d, n in out.items() if len(n) > 1)
        return out

    def settled() -> bool:
        holders = bound_namespaces_by_gpu()
        held = {ns for names in holders.values() for ns in names}
        return len(holders) == 2 and all(bound(api_client, ns, pod) for ns, pod in pods if ns in held)

    wait(controller, settled, 60, "every pod of a namespace that holds a GPU bound")
    settled_after = time.monotonic() - start
    holders = bound_namespaces_by_gpu()
    held = {ns for names in holders.values() for ns in names}
    waiting = sorted(set(namespaces) - held)
    assert waiting, f"three namespaces bound on two MPS GPUs: {holders}"
    for ns in waiting:
        told = wait(controller, lambda ns=ns: events(api_client, ns, "MpsTrustDomainWaiting"), 30, f"{ns} told")
        assert all(f"namespace {holder}" in told[0] for holder in held), told[0]
    told_after = time.monotonic() - start
    assert not any(bound(api_client, ns, pod) for ns, pod in pods if ns in waiting)
    assert not mixed, f"GPUs with bound pods of two namespaces: {mixed}"
    conflicts = sum(len(events(api_client, ns, "MpsTrustDomainConflict")) for ns in namespaces)
    print(
        f"race: settled after {settled_after:.1f} s, the waiting namespaces told after {told_after:.1f} s, "
        f"{conflicts} conflicts decided, GPUs held by {holders}"
    )


def test_a_deleted_or_edited_rule_of_an_mps_gpu_is_restored_within_seconds_with_an_event(
    controller: kube.ControllerProcess, api_client: client.ApiClient, dyn: DynamicClient, namespaces: list[str]
) -> None:
    a, b, _ = namespaces
    node = mps_node(api_client, dyn, 1)
    start_pod(api_client, a, "holder", node)
    wait(controller, lambda: bound(api_client, a, "holder"), 60, "the holder bound")
    wait(controller, lambda: taint_rules(dyn, node) == {"gpu-0": a}, 30, "the rule of a's GPU")
    rules = kube.resource(dyn, "resource.k8s.io/v1", "DeviceTaintRule")
    (name,) = [
        r["metadata"]["name"]
        for r in rules.get(label_selector=f"{RULE_LABEL}=true").to_dict()["items"]
        if r["spec"]["deviceSelector"]["pool"] == node
    ]
    core = client.CoreV1Api(api_client)

    def restored_events() -> list[str]:
        listed = core.list_namespaced_event(
            "default", field_selector=f"reason=MpsTaintRuleRestored,involvedObject.name={name}"
        )
        return [e.message for e in listed.items]

    rules.delete(name=name)
    start = time.monotonic()
    wait(controller, lambda: taint_rules(dyn, node) == {"gpu-0": a}, 10, "the deleted rule back")
    deleted_after = time.monotonic() - start
    told = wait(controller, restored_events, 10, "an Event about the deleted rule")
    assert any("deleted" in m for m in told), told

    patch = {"spec": {"taint": {"key": NAMESPACE_TAINT_KEY, "value": b, "effect": "NoSchedule"}}}
    rules.patch(name=name, body=patch, content_type="application/merge-patch+json")
    start = time.monotonic()
    wait(controller, lambda: taint_rules(dyn, node) == {"gpu-0": a}, 10, "the edited rule back")
    edited_after = time.monotonic() - start
    told = wait(controller, lambda: [m for m in restored_events() if "deleted" not in m], 10, "an Event about the edit")
    assert any(b in m for m in told), told
    print(f"rule restored {deleted_after:.1f} s after its deletion, {edited_after:.1f} s after its edit")
