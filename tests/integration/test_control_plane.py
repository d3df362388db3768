"""The upstream control plane serves the resource model fracgpu relies on (issue #2).

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler; fake Nodes without a kubelet.
"""

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from harness import kube
from harness.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration


def test_resource_v1_is_served(api_client: client.ApiClient) -> None:
    groups = client.ApisApi(api_client).get_api_versions().groups
    resource = next(g for g in groups if g.name == "resource.k8s.io")
    assert "v1" in [v.version for v in resource.versions]
    assert resource.preferred_version.version == "v1"
    kinds = {r.kind for r in client.ResourceV1Api(api_client).get_api_resources().resources}
    assert {"ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass"} <= kinds


def test_slice_with_shareable_memory_device_is_accepted(api_client: client.ApiClient, dyn: DynamicClient) -> None:
    node = kube.create_fake_node(api_client, kube.unique("node"))
    driver = f"{kube.unique('gpu')}.fracgpu.dev"
    body = kube.gpu_slice(driver, node, [kube.shared_gpu("gpu-0", "80Gi", "GPU-11111111-2222-3333-4444-555555555555")])
    slices = kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice")
    created = slices.create(body=body).to_dict()
    stored = slices.get(name=created["metadata"]["name"]).to_dict()
    device = stored["spec"]["devices"][0]
    # Fields behind DRAConsumableCapacity survive: the apiserver silently drops gated fields when the gate is off.
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["value"] == "80Gi"
    assert device["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "256Mi", "step": "256Mi"}
    assert stored["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]

    invalid = kube.gpu_slice(driver, node, [kube.shared_gpu("gpu-0", "80Gi", "GPU-x", step="0")])
    invalid["metadata"]["name"] += "-bad"
    with pytest.raises(ApiException) as refused:
        slices.create(body=invalid)
    assert refused.value.status == 422


def test_scheduler_packs_two_memory_shares_onto_one_device(
    api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    node = kube.create_fake_node(api_client, kube.unique("node"))
    node_name = node["metadata"]["name"]
    driver = f"{kube.unique('gpu')}.fracgpu.dev"
    uuid_ = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    kube.resource(dyn, "resource.k8s.io/v1", "ResourceSlice").create(
        body=kube.gpu_slice(driver, node, [kube.shared_gpu("gpu-0", "80Gi", uuid_)])
    )
    kube.resource(dyn, "resource.k8s.io/v1", "DeviceClass").create(
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    )
    kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaimTemplate").create(
        namespace=namespace,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "share-30gi"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {"deviceClassName": driver, "capacity": {"requests": {"memory": "30Gi"}}},
                            }
                        ]
                    }
                }
            },
        },
    )
    core = client.CoreV1Api(api_client)
    for name in ("a", "b", "c"):
        core.create_namespaced_pod(namespace, kube.pod_with_claim(name, "share-30gi", node_name))

    def placement() -> tuple[list[str], list[Any]] | None:
        pods = core.list_namespaced_pod(namespace).items
        bound = [p.metadata.name for p in pods if p.spec.node_name]
        unschedulable = [
            p
            for p in pods
            if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])
        ]
        return (bound, unschedulable) if len(bound) == 2 and len(unschedulable) == 1 else None

    _, unschedulable = kube.wait_for(placement, 90, what="two pods bound, one unschedulable")
    claims = kube.resource(dyn, "resource.k8s.io/v1", "ResourceClaim").get(namespace=namespace).to_dict()["items"]
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    assert len(allocated) == 2, claims
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in allocated]
    for result in results:
        assert (result["driver"], result["pool"], result["device"]) == (driver, node_name, "gpu-0")
        assert result["consumedCapacity"] == {"memory": "30Gi"}
        assert result["shareID"]
    assert results[0]["shareID"] != results[1]["shareID"]
    for claim in allocated:
        term = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
        assert term["matchFields"][0]["values"] == [node_name]

    pending = unschedulable[0]
    assert pending.spec.node_name is None
    condition = next(c for c in pending.status.conditions if c.type == "PodScheduled")
    assert condition.status == "False"
    assert "claim" in condition.message.lower(), condition.message
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pending.metadata.name},reason=FailedScheduling"
    ).items
    assert events, "the scheduler records why the third pod does not fit"


def test_rbac_refuses_a_service_account_without_rights(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    configuration = client.Configuration()
    configuration.host = control_plane.server
    configuration.ssl_ca_cert = str(control_plane.ca_cert)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    as_nobody = client.ApiClient(configuration)

    with pytest.raises(ApiException) as refused:
        client.ResourceV1Api(as_nobody).list_resource_slice()
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in str(refused.value.body)

    rbac = client.RbacAuthorizationV1Api(api_client)
    role = kube.unique("slice-reader")
    rbac.create_cluster_role(
        {
            "metadata": {"name": role},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": namespace}],
        }
    )
    kube.wait_for(
        lambda: kube.exists(lambda: client.ResourceV1Api(as_nobody).list_resource_slice()), 10, what="RBAC grant"
    )
    with pytest.raises(ApiException) as still_refused:
        client.ResourceV1Api(as_nobody).delete_collection_resource_slice()
    assert still_refused.value.status == 403
