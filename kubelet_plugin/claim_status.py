"""The node plugin's part of a claim's `status.devices`: the `Ready` condition, by server-side apply.

Field manager `fracgpu-kubelet-plugin` owns only the conditions of this driver's entries; the controller
(`fracgpu-controller`) owns their `data`. Other drivers' entries are never sent, so never touched.
"""

import datetime
from typing import Any

from api.kube_rest import KubeRest, claim_path

FIELD_MANAGER = "fracgpu-kubelet-plugin"


def is_ready(claim: dict[str, Any], driver: str) -> bool:
    """True when every entry of `driver` in status.devices already has Ready=True and covers the results."""
    results = [r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == driver]
    ready = {
        (d["pool"], d["device"], d.get("shareID"))
        for d in claim["status"].get("devices") or []
        if d["driver"] == driver
        and any(c["type"] == "Ready" and c["status"] == "True" for c in d.get("conditions") or [])
    }
    return all((r["pool"], r["device"], r.get("shareID")) in ready for r in results)


def apply_ready(rest: KubeRest, claim: dict[str, Any], driver: str, node: str) -> None:
    """Set Ready=True on each of `driver`'s status.devices entries of `claim` (server-side apply)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries = []
    for result in claim["status"]["allocation"]["devices"]["results"]:
        if result["driver"] != driver:
            continue
        entry: dict[str, Any] = {"driver": driver, "pool": result["pool"], "device": result["device"]}
        if result.get("shareID"):
            entry["shareID"] = result["shareID"]
        entry["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": f"CDI device prepared on node {node}",
                "lastTransitionTime": now,
                "observedGeneration": claim["metadata"].get("generation", 0),
            }
        ]
        entries.append(entry)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim["metadata"]["name"], "namespace": claim["metadata"]["namespace"]},
        "status": {"devices": entries},
    }
    path = claim_path(claim["metadata"]["namespace"], claim["metadata"]["name"]) + "/status"
    rest.apply(path, body, FIELD_MANAGER)
