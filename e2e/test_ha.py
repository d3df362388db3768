"""Controller high availability: two replicas, the leader killed (SIGKILL) during a burst of 100 claims.

Every claim gets its status and the ledger converges (a new process takes the Lease once the dead holder's ran
out — the follower, or the killed pod's restarted container — and resyncs everything), and
admission keeps answering (both replicas serve it with one certificate; the survivor alone while the
killed one restarts): the only admission calls the API server lets through unanswered are those that met the
killed process at the kill itself (in flight to it, or on its connection before the API server read the reset:
`ha.CRASH_WINDOW_S`), checked for every call in the API server's log, not only the probe's. Takeover times over
repeated kills: e2e/bench/ha_bench.py.
"""

import threading
import time

from e2e import ha
from e2e.install import NAMESPACE, Installation
from harness import kube

CLAIMS = 100


def test_killing_the_leader_during_a_burst_loses_no_claim_and_admission_keeps_answering(
    installation: Installation, ns: str
) -> None:
    api = ha.api_client(installation.cluster.kubeconfig)
    began = time.time()
    old, pods = ha.wait_for_two_replicas_and_a_leader(api)
    burst: list[str] = []
    with ha.fake_gpu_node(api) as node, ha.AdmissionProbe(api, ns) as probe:
        try:
            creator = threading.Thread(target=lambda: burst.extend(ha.create_burst(api, ns, node, CLAIMS, "ha")))
            creator.start()
            kube.wait_for(
                lambda: sum(map(ha.our_status, ha.claims_of(api, ns))) >= 10 or None,
                120,
                what="the first status writes of the burst",
            )
            killed_holder, transitions = ha.holder(api)
            kill_sent = time.time()
            ha.kill_controller(pods[old])
            killed = time.monotonic()
            crash = (kill_sent, time.time() + ha.CRASH_WINDOW_S)
            creator.join(120)
            assert len(burst) == CLAIMS

            def converged() -> list[dict[str, object]] | None:
                claims = ha.claims_of(api, ns)
                written = [c for c in claims if ha.our_status(c)]
                return claims if len(written) == CLAIMS and ha.ledger_matches(api, node, claims) else None

            kube.wait_for(converged, 150, interval=1, what=f"status of all {CLAIMS} claims and the ledger")
            took = time.monotonic() - killed
            # another process leads: the other replica, or the killed pod's restarted container if it asked first
            # once the dead holder's lease ran out (a new identity either way)
            new, now_transitions = ha.holder(api)
            assert new is not None and new != killed_holder, (
                f"the leader after the kill: {new} (killed: {killed_holder})"
            )
            assert now_transitions > transitions, f"leaseTransitions {transitions} -> {now_transitions}"
            events = installation.cluster.kubectl(
                "get", "events", "-n", NAMESPACE, "--field-selector", "reason=LeaderElected", "-o", "name"
            )
            assert events.stdout.strip(), "no LeaderElected Event on the Lease"
            # the survivor answered admission while the killed replica was down (and restarting)
            assert probe.answers >= took / probe.interval / 4, f"{probe.answers} admission answers in {took:.0f}s"
            outside = probe.outside(*crash)
            assert outside == [], [str(p) for p in outside]
            log = installation.cluster.procs.logs / "kube-apiserver.log"
            unanswered = ha.failed_open_calls(log, began)
            late = [line for when, line in unanswered if not crash[0] <= when <= crash[1]]
            assert late == [], f"admission calls let through outside the kill's {ha.CRASH_WINDOW_S} s: {late}"
        finally:
            ha.delete_burst(api, ns, burst)
