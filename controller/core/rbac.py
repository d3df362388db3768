"""The Kubernetes permissions the controller needs (ClusterRole rules), kept next to the code that uses them.

The Helm chart's ClusterRole must grant exactly these; the integration tests run the controller as a
ServiceAccount bound to them, so a missing rule fails a test.
"""

from typing import Any

from api.gpu import GPU_PLURAL
from api.names import API_GROUP, DRIVER_NAME


def cluster_role_rules(
    driver: str = DRIVER_NAME,
    webhook_config: str | None = None,
    *,
    admission: bool = True,
    mps: bool = False,
    namespaces: bool = False,
) -> list[dict[str, Any]]:
    """ClusterRole rules for a controller of `driver` registering its webhooks (unless `admission` is off)
    in the configurations `webhook_config` (default: `driver`), validating and mutating; `mps`: it keeps MPS trust
    domains apart (a DeviceTaintRule per MPS GPU); `namespaces`: it reads namespace labels (MPS trust scope
    namespaceLabel)."""
    rules = [
        # claims: watch; write our status.devices data (server-side apply) -- 1.36+ also checks the
        # per-driver synthetic subresource (DRAResourceClaimGranularStatusAuthorization)
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["patch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "verbs": ["arbitrary-node:patch"],
            "resourceNames": [driver],
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch"]},
        # our DeviceClass: its selectors (Unsatisfiable Events) and configs (admission merges them)
        {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get", "list", "watch"]},
        # the GPU ledger
        {
            "apiGroups": [API_GROUP],
            "resources": [GPU_PLURAL],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        },
        {"apiGroups": [API_GROUP], "resources": [f"{GPU_PLURAL}/status"], "verbs": ["patch"]},
        # Events on claims and on the pods that use them
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # the pods a claim's Event concerns: its owner and those holding it by name, a namespace's unbound pods by a
        # list (no watch: the controller keeps no copy of the cluster's pods)
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        # DeviceTaintRules: the taints they put on our devices (the ledger's status.taints); with mps, each MPS GPU's
        # rule, its trust domain (read back by name as a list: no get)
        {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["list", "watch"]},
        # Nodes: which exist (claims on a deleted one get AllocatedDeviceGone)
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
        # kopf: discovery of CRDs (the GPU CRD may be installed after the controller starts)
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    ]
    if mps:
        # a DeviceTaintRule per MPS GPU that serves a trust domain (controller/mps); a ValidatingAdmissionPolicy of
        # the chart holds these to NoSchedule taints of the driver's own devices and keys
        rules.append(
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["devicetaintrules"],
                "verbs": ["create", "patch", "delete"],
            }
        )
    if namespaces:
        rules.append({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]})
    if admission:
        # the webhooks of the chart-made configurations (controller/admission/webhook_config.py): get and patch of
        # that one name. No create: RBAC cannot scope create to a name, and create of any name would let it
        # intercept every request in the cluster.
        rules.append(
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                "verbs": ["get", "patch"],
                "resourceNames": [webhook_config or driver],
            }
        )
    return rules


def namespace_role_rules(lease: str | None, secret: str | None) -> list[dict[str, Any]]:
    """Role rules in the controller's namespace: the leader Lease `lease` (None: no leader election) and the
    shared webhook certificate's Secret `secret` (None: not shared), by name where RBAC allows it. create
    cannot be scoped to a name: the first replica creates each, AlreadyExists tells the others to read it."""
    rules: list[dict[str, Any]] = []
    for group, resource, name in (("coordination.k8s.io", "leases", lease), ("", "secrets", secret)):
        if name is not None:
            rules.append(
                {"apiGroups": [group], "resources": [resource], "verbs": ["get", "update"], "resourceNames": [name]}
            )
            rules.append({"apiGroups": [group], "resources": [resource], "verbs": ["create"]})
    return rules


def heartbeat_role_rules() -> list[dict[str, Any]]:
    """Role rules in the controller's namespace: read the node plugins' heartbeat Leases (api/heartbeat.py)."""
    return [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}]
