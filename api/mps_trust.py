"""Who may share a CUDA MPS daemon: the trust domain of a claim, shared by the controller and the node plugin.

Whoever reaches an MPS daemon's pipe directory commands the daemon (NVIDIA documents no access check), and the
clients of one daemon share its server and /dev/shm. So claims of two trust domains never share an MPS GPU's
daemon, pipe directory or /dev/shm. One cluster-wide scope (chart value ``mps.trustDomain.scope``) says what a
domain is:

- ``namespace`` (the default): a claim's namespace;
- ``namespaceLabel``: the namespaces whose label ``mps.trustDomain.label`` has one value; a namespace without
  the label (or with an empty value) is a domain of its own;
- ``cluster``: every claim of the cluster (every namespace trusts every other: the widest opt-in).

A domain is written as an id (``namespace/ns-a``, ``label/team=ml``, ``cluster``: in claim status data, the
checkpoint, the MPS daemons' status files and the ``GPU`` ledger) and, except ``cluster``, as a device taint and
the toleration that matches it, which keep other domains' claims off an MPS GPU at scheduling. `tolerates` matches
a toleration to a taint as Kubernetes does, so that a domain can tell a toleration of its own taint, written in any
form, from one that reaches another domain's (`TrustDomain.tolerates_own`, `TrustDomain.tolerates_others`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from api.names import DRIVER_NAME

TrustScope = Literal["namespace", "namespaceLabel", "cluster"]
DomainKind = Literal["namespace", "label", "cluster"]
NAMESPACE_TAINT_KEY = f"{DRIVER_NAME}/mps-namespace"
"""Taint of an MPS GPU held by a namespace's domain; its value is the namespace."""
LABEL_TAINT_KEY = f"{DRIVER_NAME}/mps-domain"
"""Taint of an MPS GPU held by a labelled domain; its value is the label's value."""
TAINT_KEYS = (NAMESPACE_TAINT_KEY, LABEL_TAINT_KEY)
"""The keys of the trust-domain taints (both may be in use under ``namespaceLabel``: an unlabelled namespace is a
domain of its own)."""
TAINT_EFFECT = "NoSchedule"
"""The effect of every trust-domain taint: it keeps new claims off a GPU, never evicts."""
ADMITTED_CONDITION = "MpsTrustDomainAdmitted"
"""The binding condition of an MPS GPU: True once the controller has found the claim's domain alone there."""
CONFLICT_CONDITION = "MpsTrustDomainConflict"
"""The binding failure condition: True when another domain holds the GPU (the scheduler then tries again)."""
RULE_LABEL = f"{DRIVER_NAME}/mps-trust-domain-rule"
"""Label of the DeviceTaintRules the controller owns, one per MPS GPU that serves a domain (its list selects on it)."""
TAINT_RULES_PATH = "/apis/resource.k8s.io/v1/devicetaintrules"
DATA_KEY = "mpsTrustDomain"
"""The key of a claim's domain id in the controller's ``status.devices[].data`` of an MPS GPU."""


class TrustDomainError(ValueError):
    """A malformed domain id or setting; the message says which and what is allowed."""


@dataclass(frozen=True, order=True)
class TrustDomain:
    """One trust domain: ``kind`` and, but for ``cluster``, the namespace or the label's key and value."""

    kind: DomainKind
    value: str = ""
    label: str = ""

    @property
    def id(self) -> str:
        if self.kind == "namespace":
            return f"namespace/{self.value}"
        if self.kind == "label":
            return f"label/{self.label}={self.value}"
        return "cluster"

    def describe(self) -> str:
        """For people: ``namespace ns-a``, ``the namespaces labelled team=ml``, ``the whole cluster``."""
        if self.kind == "namespace":
            return f"namespace {self.value}"
        if self.kind == "label":
            return f"the namespaces labelled {self.label}={self.value}"
        return "the whole cluster"

    def taint(self) -> tuple[str, str] | None:
        """(key, value) of the taint that keeps other domains off a GPU this domain holds; None for ``cluster``."""
        if self.kind == "namespace":
            return NAMESPACE_TAINT_KEY, self.value
        if self.kind == "label":
            return LABEL_TAINT_KEY, self.value
        return None

    def toleration(self) -> dict[str, str] | None:
        """The device toleration a claim of this domain carries (ResourceClaim ``tolerations`` entry)."""
        taint = self.taint()
        if taint is None:
            return None
        return {"key": taint[0], "operator": "Equal", "value": taint[1], "effect": TAINT_EFFECT}

    def tolerates_own(self, toleration: Mapping[str, object]) -> bool:
        """Whether `toleration` tolerates this domain's taint, in any form (False for ``cluster``: it has none)."""
        taint = self.taint()
        return taint is not None and tolerates(toleration, taint[0], taint[1], TAINT_EFFECT)

    def tolerates_others(self, toleration: Mapping[str, object]) -> bool:
        """Whether `toleration` tolerates the taint of some other trust domain than this one: a taint of a key of
        `TAINT_KEYS`, effect NoSchedule, whose key or value differs from this domain's own. Always False for
        ``cluster``, whose claims make no taint. Taint values are never empty (a namespace name, a label value)."""
        own = self.taint()
        if own is None or _field(toleration, "effect") not in ("", TAINT_EFFECT):
            return False
        key = _field(toleration, "key")
        if key and key not in TAINT_KEYS:
            return False
        operator = _field(toleration, "operator") or "Equal"
        if operator == "Exists":
            return True  # every value of its key, or of every key
        value = _field(toleration, "value")
        return operator == "Equal" and bool(value) and any((k, value) != own for k in ((key,) if key else TAINT_KEYS))

    @classmethod
    def parse(cls, text: str) -> TrustDomain:
        """The domain of an id; raises TrustDomainError."""
        kind, _, rest = text.partition("/")
        if text == "cluster":
            return cls("cluster")
        if kind == "namespace" and rest and "/" not in rest:
            return cls("namespace", rest)
        if kind == "label" and "=" in rest:
            label, _, value = rest.rpartition("=")
            if label and value:
                return cls("label", value, label)
        raise TrustDomainError(
            f"{text!r} is not an MPS trust domain: expected namespace/<namespace>, label/<key>=<value> or cluster"
        )


def tolerates(toleration: Mapping[str, object], key: str, value: str, effect: str) -> bool:
    """Whether a device toleration (a ResourceClaim request's ``tolerations`` entry) tolerates the taint
    `key`=`value` with `effect`, as Kubernetes matches them (``DeviceToleration.ToleratesTaint``): an empty effect
    matches every effect, an empty key every key; operator ``Exists`` matches every value, ``Equal`` (the default,
    also when empty) only its own; any other operator nothing. ``tolerationSeconds`` plays no part."""
    if _field(toleration, "effect") not in ("", effect) or _field(toleration, "key") not in ("", key):
        return False
    operator = _field(toleration, "operator") or "Equal"
    return operator == "Exists" or (operator == "Equal" and _field(toleration, "value") == value)


def _field(toleration: Mapping[str, object], name: str) -> str:
    """A toleration's string field; absent, null or not a string counts as empty."""
    value = toleration.get(name)
    return value if isinstance(value, str) else ""


def trust_domain(scope: TrustScope, label: str, namespace: str, labels: Mapping[str, str] | None) -> TrustDomain:
    """The domain of a claim in `namespace` (whose labels are `labels`; needed only for ``namespaceLabel``)."""
    if scope == "cluster":
        return TrustDomain("cluster")
    if scope == "namespaceLabel":
        if not label:
            raise TrustDomainError("the MPS trust scope namespaceLabel needs a label key (mps.trustDomain.label)")
        value = (labels or {}).get(label, "")
        if value:
            return TrustDomain("label", value, label)
    return TrustDomain("namespace", namespace)
