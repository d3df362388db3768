"""Prometheus counters of a component's API requests that the API server throttled, that were sent again, and
that failed for good with a transient error (`api.kube_rest` counts; each component names them).

An operator sees throttling here before pods stall: `..._api_throttled_total` grows while requests still succeed
after waiting; `..._api_gave_up_total` counts the calls that could not wait (a prepare then fails with the
throttled message and the kubelet retries).
"""

from prometheus_client import REGISTRY, CollectorRegistry, Counter

RESOURCE_PREFIXES = ("api", "apis")


def resource_of(path: str) -> str:
    """The resource (plural) an API path names, e.g. `resourceclaims` for
    `/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status`; "" for a path that names none."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if not parts or parts[0] not in RESOURCE_PREFIXES:
        return ""
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        return rest[2]
    return rest[0] if rest else ""


class ApiMetrics:
    """`fracgpu_<component>_api_*` counters in `registry` (the process's default one unless given)."""

    def __init__(self, component: str, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        prefix = f"fracgpu_{component}_api"
        self.throttled = Counter(
            f"{prefix}_throttled_total",
            "Answers 429 Too Many Requests (API Priority and Fairness rejected the request), by the request's "
            "resource and verb; each was waited out and sent again while the call's budget allowed",
            ["resource", "verb"],
            registry=registry,
        )
        self.retries = Counter(
            f"{prefix}_retries_total",
            "Requests sent again, by the kind of failure before (throttled, unavailable, server_error, "
            "no_connection, connection_lost, timeout) and verb",
            ["kind", "verb"],
            registry=registry,
        )
        self.gave_up = Counter(
            f"{prefix}_gave_up_total",
            "Calls that failed for good with a transient error (retries spent, or the wait asked longer than the "
            "time left), by the kind of the last failure and verb",
            ["kind", "verb"],
            registry=registry,
        )
