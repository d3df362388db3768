"""Unit tests of the MPS trust domains (api/mps_trust.py): ids, taints and tolerations that match, scopes."""

from __future__ import annotations

import pytest

from api.mps_trust import (
    LABEL_TAINT_KEY,
    NAMESPACE_TAINT_KEY,
    TrustDomain,
    TrustDomainError,
    trust_domain,
)


@pytest.mark.parametrize(
    ("domain", "text", "described"),
    [
        (TrustDomain("namespace", "ns-a"), "namespace/ns-a", "namespace ns-a"),
        (
            TrustDomain("label", "ml", "example.com/team"),
            "label/example.com/team=ml",
            "the namespaces labelled example.com/team=ml",
        ),
        (TrustDomain("cluster"), "cluster", "the whole cluster"),
    ],
)
def test_a_domain_round_trips_through_its_id(domain: TrustDomain, text: str, described: str) -> None:
    assert domain.id == text and TrustDomain.parse(text) == domain and domain.describe() == described


@pytest.mark.parametrize("text", ["", "namespace/", "namespace/a/b", "label/team", "label/=x", "label/team=", "team"])
def test_a_malformed_id_is_refused_saying_what_is_allowed(text: str) -> None:
    with pytest.raises(TrustDomainError, match="expected namespace/<namespace>, label/<key>=<value> or cluster"):
        TrustDomain.parse(text)


def test_scopes() -> None:
    assert trust_domain("namespace", "", "ns-a", {"team": "ml"}) == TrustDomain("namespace", "ns-a")
    assert trust_domain("cluster", "", "ns-a", None) == TrustDomain("cluster")
    assert trust_domain("namespaceLabel", "team", "ns-a", {"team": "ml"}) == TrustDomain("label", "ml", "team")
    assert trust_domain("namespaceLabel", "team", "ns-b", {}) == TrustDomain("namespace", "ns-b"), "unlabelled: alone"
    assert trust_domain("namespaceLabel", "team", "ns-c", {"team": ""}) == TrustDomain("namespace", "ns-c")
    with pytest.raises(TrustDomainError, match="needs a label key"):
        trust_domain("namespaceLabel", "", "ns-a", {})


def test_a_domain_tolerates_its_own_taint_only() -> None:
    def tolerated(claim: TrustDomain, holder: TrustDomain) -> bool:
        taint, toleration = holder.taint(), claim.toleration()
        assert taint is not None and toleration is not None
        return (toleration["key"], toleration["value"]) == taint

    a, b = TrustDomain("namespace", "ml"), TrustDomain("namespace", "web")
    labelled = TrustDomain("label", "ml", "team")  # the same value as namespace ml: another key
    assert a.taint() == (NAMESPACE_TAINT_KEY, "ml") and labelled.taint() == (LABEL_TAINT_KEY, "ml")
    assert tolerated(a, a) and not tolerated(b, a) and not tolerated(labelled, a) and not tolerated(a, labelled)
    assert TrustDomain("cluster").taint() is None and TrustDomain("cluster").toleration() is None
