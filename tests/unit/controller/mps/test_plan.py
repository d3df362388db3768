"""Unit tests of the MPS trust-domain plan (controller/mps/plan.py): which share an MPS GPU admits, its taint rule,
and why a pending claim waits (the tolerations admission gives or refuses:
tests/unit/controller/admission/test_mps_tolerations.py)."""

from __future__ import annotations

from typing import Any

from api.mps_trust import NAMESPACE_TAINT_KEY, TrustDomain
from controller.mps.plan import (
    MpsShare,
    ShareState,
    desired_taint_rules,
    plan_device,
    rule_differs,
    rule_name,
)

DRIVER = "gpu.fracgpu.dev"
A, B = TrustDomain("namespace", "team-a"), TrustDomain("namespace", "team-b")


def share(name: str, domain: TrustDomain, state: ShareState, at: str = "") -> MpsShare:
    return MpsShare(
        claim=f"uid-{name}", namespace=domain.value, name=name, pool="node-a", device="gpu-0", share_id=f"s-{name}",
        domain=domain, state=state, allocated_at=at,
    )  # fmt: skip


def test_the_first_allocated_domain_wins_a_free_gpu_and_the_other_is_refused_naming_both() -> None:
    verdict = plan_device("node-a", "gpu-0", [share("b", B, "waiting", "2026-12-05T10:00:02Z"),
                                              share("a", A, "waiting", "2026-12-05T10:00:01Z")])  # fmt: skip
    assert verdict.owner == A and [s.name for s in verdict.admit] == ["a"]
    ((refused, message),) = verdict.refuse
    assert refused.name == "b"
    assert "serves namespace team-a, and this claim belongs to namespace team-b" in message


def test_a_gpu_keeps_the_domain_of_the_claims_it_holds() -> None:
    verdict = plan_device("node-a", "gpu-0", [share("a", A, "admitted", "2026-12-05T10:00:05Z"),
                                              share("b", B, "waiting", "2026-12-05T10:00:01Z"),
                                              share("a2", A, "waiting", "2026-12-05T10:00:09Z")])  # fmt: skip
    assert (
        verdict.owner == A
        and [s.name for s in verdict.admit] == ["a2"]
        and [s.name for s, _ in verdict.refuse] == ["b"]
    )
    holding = plan_device("node-a", "gpu-0", [share("old", B, "holding"), share("a", A, "waiting", "t")])
    assert holding.owner == B and [s.name for s, _ in holding.refuse] == ["a"], "a claim without conditions holds it"
    mixed = plan_device("node-a", "gpu-0", [share("x", A, "admitted", "1"), share("y", B, "holding", "2")])
    assert mixed.owner == A and mixed.mixed == (B,) and mixed.admit == () and mixed.refuse == ()
    assert plan_device("node-a", "gpu-0", [share("r", B, "refused")]).owner is None, "a refused claim holds nothing"


def test_each_gpu_with_a_domain_gets_a_taint_rule_that_its_domain_tolerates() -> None:
    held = plan_device("node-a", "gpu-0", [share("a", A, "admitted")])
    free = plan_device("node-a", "gpu-1", [])
    everyone = plan_device("node-a", "gpu-2", [share("c", TrustDomain("cluster"), "admitted")])
    rules = desired_taint_rules(DRIVER, [held, free, everyone])
    assert list(rules) == [rule_name(DRIVER, "node-a", "gpu-0")] == ["gpu.fracgpu.dev-mps-node-a-gpu-0"]
    rule = rules["gpu.fracgpu.dev-mps-node-a-gpu-0"]
    assert rule["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
        "taint": {"key": NAMESPACE_TAINT_KEY, "value": "team-a", "effect": "NoSchedule"},
    }
    existing: dict[str, Any] = {"spec": {**rule["spec"], "taint": {**rule["spec"]["taint"], "timeAdded": "t"}}}
    assert not rule_differs(rule, existing), "the server's timeAdded is no difference"
    existing["spec"]["taint"]["value"] = "team-b"
    assert rule_differs(rule, existing)


def test_a_pending_claim_is_told_when_only_other_domains_mps_gpus_have_room() -> None:
    from controller.mps.plan import Room, waiting_message

    gib = 1 << 30
    held = Room("node-a", "gpu-0", 60 * gib, mps=True, owner=A)
    message = waiting_message(B, 10 * gib, [held, Room("node-a", "gpu-1", 5 * gib, mps=False)])
    assert message is not None and "serve other trust domains (gpu-0 of node node-a (namespace team-a))" in message
    assert "this claim of namespace team-b waits" in message
    assert waiting_message(A, 10 * gib, [held]) is None, "its own domain's GPU has room"
    assert waiting_message(B, 10 * gib, [held, Room("node-a", "gpu-2", 20 * gib, mps=True)]) is None, "a free MPS GPU"
    assert waiting_message(B, 10 * gib, [held, Room("node-a", "gpu-3", 20 * gib, mps=False)]) is None
    assert waiting_message(B, 90 * gib, [held]) is None, "nothing has room: not a matter of domains"
