"""Unit tests of the MPS trust-domain plan (controller/mps/plan.py): which share an MPS GPU admits, its taint rule,
and the tolerations admission adds or refuses."""

from __future__ import annotations

from typing import Any

from api.mps_trust import NAMESPACE_TAINT_KEY, TrustDomain
from controller.core.slices import TaintRuleView, taint_rule_view
from controller.mps.plan import (
    MpsShare,
    ShareState,
    deleted_message,
    edited_message,
    plan_device,
    recorded_domain,
    rewritten_message,
    rule_findings,
    rule_name,
    taint_rule,
)

DRIVER = "gpu.fracgpu.dev"
A, B = TrustDomain("namespace", "team-a"), TrustDomain("namespace", "team-b")
CLUSTER = TrustDomain("cluster")


def share(name: str, domain: TrustDomain, state: ShareState, at: str = "") -> MpsShare:
    return MpsShare(
        claim=f"uid-{name}", namespace=domain.value, name=name, pool="node-a", device="gpu-0", share_id=f"s-{name}",
        domain=domain, state=state, allocated_at=at,
    )  # fmt: skip


def view(domain: TrustDomain, **edits: Any) -> TaintRuleView:
    """The GPU's rule as the controller writes it for `domain`, with `edits` to its body (a path -> value)."""
    body = taint_rule(DRIVER, "node-a", "gpu-0", domain)
    assert body is not None
    body["metadata"]["uid"] = "uid-rule"
    for path, value in edits.items():
        *parents, leaf = path.split("__")
        target = body
        for part in parents:
            target = target[part]
        if value is None:
            del target[leaf]
        else:
            target[leaf] = value
    rule = taint_rule_view(body, DRIVER, any_selector=True)
    assert rule is not None
    return rule


def test_a_free_gpu_decides_nothing_until_its_rule_records_the_first_allocated_domain() -> None:
    both = [share("b", B, "waiting", "2026-12-05T10:00:02Z"), share("a", A, "waiting", "2026-12-05T10:00:01Z")]
    unruled = plan_device("node-a", "gpu-0", both)
    assert unruled.owner == A and not unruled.settled, "the rule must record team-a first"
    assert unruled.admit == () and unruled.refuse == () and unruled.serves is None
    verdict = plan_device("node-a", "gpu-0", both, recorded=A)
    assert verdict.settled and verdict.serves == A and [s.name for s in verdict.admit] == ["a"]
    ((refused, message),) = verdict.refuse
    assert refused.name == "b" and verdict.decision(refused.key) == "refused"
    assert "serves namespace team-a, and this claim belongs to namespace team-b" in message
    other = plan_device("node-a", "gpu-0", both, recorded=B)
    assert other.owner == B and [s.name for s in other.admit] == ["b"], "the rule, not the order, decides"


def test_a_gpu_keeps_the_domain_of_the_claims_it_holds() -> None:
    held = [share("a", A, "admitted", "2026-12-05T10:00:05Z"), share("b", B, "waiting", "2026-12-05T10:00:01Z"),
            share("a2", A, "waiting", "2026-12-05T10:00:09Z")]  # fmt: skip
    verdict = plan_device("node-a", "gpu-0", held, recorded=A)
    assert [s.name for s in verdict.admit] == ["a2"] and [s.name for s, _ in verdict.refuse] == ["b"]
    lost = plan_device("node-a", "gpu-0", held)
    assert lost.owner == A and not lost.settled, "a rule deleted under admitted claims is created again for them"
    edited = plan_device("node-a", "gpu-0", held, recorded=B)
    assert edited.owner == A and not edited.settled and edited.admit == (), "a rule no holder belongs to is rewritten"
    holding = plan_device("node-a", "gpu-0", [share("old", B, "holding"), share("a", A, "waiting", "t")], recorded=B)
    assert holding.owner == B and [s.name for s, _ in holding.refuse] == ["a"], "a claim without conditions holds it"
    mixed = plan_device("node-a", "gpu-0", [share("x", A, "admitted", "1"), share("y", B, "holding", "2")], A)
    assert mixed.owner == A and mixed.mixed == (B,) and mixed.admit == () and mixed.refuse == ()
    refused_only = plan_device("node-a", "gpu-0", [share("r", B, "refused")], recorded=A)
    assert refused_only.owner is None and refused_only.serves == A, "a refused claim holds nothing: the rule is stale"
    assert refused_only.stale and not plan_device("node-a", "gpu-0", [share("a", A, "waiting")], A).stale
    other_waits = plan_device("node-a", "gpu-0", [share("b", B, "waiting", "1")], recorded=A)
    assert other_waits.stale and other_waits.owner == B, "no claim of team-a is there: its rule is stale"
    assert other_waits.refuse == () and other_waits.admit == (), "b waits for its own rule, not refused by a stale one"
    both = plan_device("node-a", "gpu-0", [share("b", B, "waiting", "1"), share("a", A, "waiting", "2")], A)
    assert not both.stale and [s.name for s, _ in both.refuse] == ["b"], "the rule stands while a claim of it waits"


def test_scope_cluster_needs_no_rule() -> None:
    verdict = plan_device("node-a", "gpu-0", [share("c", CLUSTER, "waiting", "1")])
    assert verdict.settled and verdict.serves == CLUSTER and [s.name for s in verdict.admit] == ["c"]
    assert taint_rule(DRIVER, "node-a", "gpu-0", CLUSTER) is None


def test_the_rule_records_its_domain_and_keeps_the_others_off() -> None:
    rule = taint_rule(DRIVER, "node-a", "gpu-0", A)
    assert rule is not None and rule["metadata"]["name"] == rule_name(DRIVER, "node-a", "gpu-0")
    assert rule["metadata"]["name"] == "gpu.fracgpu.dev-mps-node-a-gpu-0"
    assert rule["metadata"]["annotations"] == {"gpu.fracgpu.dev/mps-trust-domain": "namespace/team-a"}
    assert rule["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
        "taint": {"key": NAMESPACE_TAINT_KEY, "value": "team-a", "effect": "NoSchedule"},
    }
    assert recorded_domain(view(A), DRIVER, "node-a", "gpu-0") == A
    assert recorded_domain(view(A, spec__taint__timeAdded="t"), DRIVER, "node-a", "gpu-0") == A, "timeAdded"
    assert recorded_domain(None, DRIVER, "node-a", "gpu-0") is None
    assert recorded_domain(view(A), DRIVER, "node-a", "gpu-1") is None, "another GPU's rule"


def test_every_edit_of_a_rule_is_found_and_named() -> None:
    rule = taint_rule(DRIVER, "node-a", "gpu-0", A)
    assert rule is not None
    assert rule_findings(rule, view(A)) == []
    cases = {
        "its taint is gpu.fracgpu.dev/mps-namespace=team-b:NoSchedule": view(A, spec__taint__value="team-b"),
        "its taint is gpu.fracgpu.dev/mps-namespace=team-a:NoExecute": view(A, spec__taint__effect="NoExecute"),
    }
    for finding, edited in cases.items():
        assert rule_findings(rule, edited) == [finding]
        assert recorded_domain(edited, DRIVER, "node-a", "gpu-0") is None, finding
    relabelled = view(A, metadata__labels={"app.kubernetes.io/managed-by": "someone"})
    assert rule_findings(rule, relabelled) == [
        "its label gpu.fracgpu.dev/mps-trust-domain-rule is missing",
        "its label app.kubernetes.io/managed-by is 'someone'",
    ]
    annotated = view(A, metadata__annotations={"gpu.fracgpu.dev/mps-trust-domain": "namespace/team-c"})
    assert rule_findings(rule, annotated) == ["its annotation gpu.fracgpu.dev/mps-trust-domain is 'namespace/team-c'"]
    assert recorded_domain(annotated, DRIVER, "node-a", "gpu-0") is None, "its taint is team-a's: not intact"
    unannotated = view(A, metadata__annotations={})
    assert rule_findings(rule, unannotated) == ["its annotation gpu.fracgpu.dev/mps-trust-domain is missing"]
    moved = view(A, spec__deviceSelector={"driver": "nic.example.com", "device": "nic-0"})
    assert rule_findings(rule, moved) == ["its deviceSelector selects driver=nic.example.com, pool=<any>, device=nic-0"]
    assert rule_findings(rule, view(A, spec__deviceSelector=None)) == ["it has no deviceSelector"]
    assert recorded_domain(view(B), DRIVER, "node-a", "gpu-0") == B, "a coherent rule of team-b records team-b"


def test_the_restore_events_say_what_was_found_and_what_was_written() -> None:
    name = rule_name(DRIVER, "node-a", "gpu-0")
    written = "taint gpu.fracgpu.dev/mps-namespace=team-a:NoSchedule and annotation gpu.fracgpu.dev/mps-trust-domain="
    assert deleted_message(name, "node-a", "gpu-0", A) == (
        f"DeviceTaintRule {name} of MPS GPU gpu-0 of node node-a was deleted while it recorded namespace team-a. It "
        f"keeps other domains' claims off the GPU, so the controller created it again ({written}namespace/team-a)"
    )
    edited = edited_message(name, "node-a", "gpu-0", A, ["its taint is x=y:NoSchedule", "its label l is missing"])
    assert edited.startswith(
        f"DeviceTaintRule {name} of MPS GPU gpu-0 of node node-a was edited: its taint is x=y:NoSchedule; its label "
        "l is missing. "
    ) and edited.endswith(f"so the controller rewrote it for namespace team-a ({written}namespace/team-a)")
    rewritten = rewritten_message(name, "node-a", "gpu-0", B, A)
    assert "recorded namespace team-b, a domain none of the claims that hold the GPU belongs to" in rewritten
    assert rewritten.endswith(
        f"rewrote it for namespace team-a, the domain of the earliest allocated of them ({written}namespace/team-a)"
    )


def claim_spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


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
    busy = Room("node-a", "gpu-0", 60 * gib, mps=True, owner=A, compute=40)
    assert waiting_message(B, 10 * gib, [busy], 40) is not None, "40 of compute free: room for 40"
    assert waiting_message(B, 10 * gib, [busy], 50) is None, "no compute for 50: not a matter of domains"
    assert waiting_message(B, 10 * gib, [held, Room("node-a", "gpu-3", 20 * gib, mps=False, compute=0)], 50)
