"""API Priority and Fairness objects that throttle one service account: a priority level of one seat that rejects
what it cannot seat (answered 429 with ``Retry-After``) and a FlowSchema putting every request of the account in it.
Shared by the integration tier (``tests/integration/test_api_pressure.py``) and the throttled plugin bench
(``e2e/bench/throttle.py``)."""

from typing import Any

from api.kube_rest import KubeRest

FLOW = "/apis/flowcontrol.apiserver.k8s.io/v1"


def apf_reject(name: str, namespace: str, account: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A PriorityLevelConfiguration of one nominal share that rejects what it cannot seat, and a FlowSchema putting
    every request of service account `namespace/account` in it (before every schema but the exempt and system
    ones): the objects to create under `FLOW`'s `prioritylevelconfigurations` and `flowschemas`."""
    level = {
        "metadata": {"name": name},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 1,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"},
            },
        },
    }
    everything = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
    schema = {
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": name},
            "matchingPrecedence": 300,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {"kind": "ServiceAccount", "serviceAccount": {"name": account, "namespace": namespace}}
                    ],
                    "resourceRules": [everything],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }
    return level, schema


def create_apf_reject(admin: KubeRest, name: str, namespace: str, account: str) -> None:
    """Create `apf_reject`'s objects with `admin` (not in the trap)."""
    level, schema = apf_reject(name, namespace, account)
    admin.create(f"{FLOW}/prioritylevelconfigurations", level)
    admin.create(f"{FLOW}/flowschemas", schema)
