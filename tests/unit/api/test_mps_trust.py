"""Unit tests of the MPS trust domains (api/mps_trust.py): ids, taints and tolerations that match, scopes."""

from __future__ import annotations

import pytest

from api.mps_trust import (
    LABEL_TAINT_KEY,
    NAMESPACE_TAINT_KEY,
    TrustDomain,
    TrustDomainError,
    tolerates,
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


A = TrustDomain("namespace", "team-a")
NS, LABEL = NAMESPACE_TAINT_KEY, LABEL_TAINT_KEY
OWN_FORMS = [
    {"key": NS, "operator": "Equal", "value": "team-a", "effect": "NoSchedule"},
    {"key": NS, "value": "team-a"},  # operator Equal by default, every effect
    {"key": NS, "operator": "Equal", "value": "team-a"},
    {"key": NS, "operator": "", "value": "team-a", "effect": ""},
    {"key": NS, "value": "team-a", "effect": "NoSchedule", "tolerationSeconds": 30},
]
NEITHER = [
    {"key": NS, "value": "team-a", "effect": "NoExecute"},  # not the NoSchedule taint
    {"key": NS, "value": "team-b", "effect": "NoExecute"},
    {"operator": "Exists", "effect": "NoExecute"},
    {"key": "example.com/maintenance", "operator": "Exists"},
    {"key": NS, "operator": "Equal", "value": ""},  # no domain's taint has an empty value
    {"key": NS, "operator": "Lt", "value": "team-a"},  # no such operator: matches nothing
    {"key": NS, "value": "team-a", "effect": "None"},
]
OTHERS_ONLY = [
    {"key": NS, "value": "team-b"},
    {"key": NS, "operator": "Equal", "value": "team-b", "effect": "NoSchedule"},
    {"key": LABEL, "value": "team-a"},  # the same value under the other key: a labelled domain's taint
    {"key": LABEL, "operator": "Exists", "effect": "NoSchedule"},
]
BOTH = [
    {"operator": "Exists"},
    {"operator": "Exists", "effect": "NoSchedule"},
    {"key": NS, "operator": "Exists"},
    {"value": "team-a"},  # no key with Equal (the API refuses it): the value under every key
]


@pytest.mark.parametrize(
    ("toleration", "own", "others"),
    [(t, True, False) for t in OWN_FORMS]
    + [(t, False, False) for t in NEITHER]
    + [(t, False, True) for t in OTHERS_ONLY]
    + [(t, True, True) for t in BOTH],
)
def test_a_toleration_reaches_the_own_domains_taint_or_another_domains_as_kubernetes_matches_it(
    toleration: dict[str, object], own: bool, others: bool
) -> None:
    assert A.tolerates_own(toleration) is own
    assert A.tolerates_others(toleration) is others
    everyone = TrustDomain("cluster")
    assert not everyone.tolerates_own(toleration) and not everyone.tolerates_others(toleration), "cluster: no taint"


def test_a_labelled_domain_tells_its_own_taint_from_a_namespaces_of_the_same_value() -> None:
    labelled = TrustDomain("label", "ml", "team")
    assert labelled.tolerates_own({"key": LABEL, "value": "ml"})
    assert not labelled.tolerates_others({"key": LABEL, "value": "ml", "effect": "NoSchedule"})
    assert labelled.tolerates_others({"key": NS, "value": "ml"}) and not labelled.tolerates_own(
        {"key": NS, "value": "ml"}
    )


def test_tolerates_matches_key_value_and_effect_as_kubernetes_does() -> None:
    assert tolerates({"key": "k", "value": "v"}, "k", "v", "NoExecute"), "no effect: every effect"
    assert not tolerates({"key": "k", "value": "v", "effect": "NoSchedule"}, "k", "v", "NoExecute")
    assert tolerates({"operator": "Exists"}, "any", "thing", "NoSchedule")
    assert not tolerates({"key": "k", "operator": "Exists"}, "other", "v", "NoSchedule")
    assert not tolerates({"key": "k", "value": 7}, "k", "7", "NoSchedule"), "not a string: empty"
