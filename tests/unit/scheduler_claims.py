"""The ResourceClaim the kube-scheduler writes for a pod's DRA extended resource (KEP-5004), shared by tests.

Shaped as kube-scheduler 1.37 makes it (dynamicresources plugin, extendeddynamicresources.go): named
`<pod>-extended-resources-<random>`, annotated `resource.kubernetes.io/extended-resource-claim: "true"`, owned
by the pod (controller reference), one request `container-<i>-request-<j>` per container and resource with
`allocationMode: ExactCount` and the quantity as `count`, no capacity request, no config, no selectors; then
allocated by the scheduler (each result of a GPU shared by capacity carries a shareID and consumes the
capacity's requestPolicy default, all of the GPU's memory).
"""

from typing import Any

EXTENDED_RESOURCE_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def extended_resource_claim(
    pod: str,
    *,
    driver: str,
    device_class: str,
    pool: str,
    devices: dict[str, tuple[str, str]],
    namespace: str = "ns",
    uid: str = "7d0c3b4a-1e2f-4a5b-8c6d-9e0f1a2b3c4d",
    pod_uid: str = "5b6c7d8e-9f0a-4b1c-8d2e-3f4a5b6c7d8e",
    container: int = 0,
    resource_index: int = 0,
) -> dict[str, Any]:
    """The allocated claim for `len(devices)` whole GPUs of one container (index `container`; its extended
    resource is the `resource_index`-th of its sorted requests): `devices` maps device name -> (shareID,
    consumed memory)."""
    request = f"container-{container}-request-{resource_index}"
    results = []
    for device, (share, memory) in devices.items():
        results.append(
            {
                "request": request,
                "driver": driver,
                "pool": pool,
                "device": device,
                "shareID": share,
                "consumedCapacity": {"memory": memory},
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod}-extended-resources-x7k2p",
            "generateName": f"{pod}-extended-resources-",
            "namespace": namespace,
            "uid": uid,
            "annotations": {EXTENDED_RESOURCE_ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid, "controller": True}],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": len(devices),
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
        },
    }
