"""The plugin bench's throttled run (``python -m e2e.bench.plugin_bench --throttled``): an API Priority and Fairness
storm against the plugins' own service account, and the report of what their prepares came to.

Both plugins (fracgpu's and the Go reference) talk to the API server as one service account whose every request
a FlowSchema puts in a priority level of one seat that rejects what it cannot seat (`harness.apf`: answered 429 with
`Retry-After`); a flood of LISTs from that same account (`Flood`) keeps the seat taken while the kubelet's calls run,
so each plugin's GETs are throttled as in a real storm, and each plugin waits as its client is told, or gives up.
The report (`throttled_report`) says per plugin how many prepares succeeded, their latency percentiles, and
whether each failure said it was throttled (or unreachable, or timed out) rather than something else.

The pure parts (the report) are unit-tested; the rest needs a control plane.
"""

import threading
import time
from dataclasses import dataclass
from typing import Any

from api.kube_errors import ApiError, ApiThrottled
from api.kube_rest import KubeRest
from e2e.bench.stats import summary_ms

FLOOD_THREADS = 8
"""Threads of the flood: enough that the one seat is never free for long."""
FLOOD_CONFIGMAPS = 200
"""ConfigMaps of 16 KiB the flood LISTs: each LIST holds the seat for a while."""
THROTTLED_WORDS = "throttled by the API server"
"""How every throttled failure of fracgpu's begins its cause (`api.kube_errors.ApiThrottled`); client-go's own
words for a 429 follow in `THROTTLED_GO`."""
THROTTLED_GO = ("Too Many Requests", "the server has received too many requests", "rate limit")
UNREACHABLE_WORDS = ("API server unreachable", "timed out", "DEADLINE_EXCEEDED", "context deadline exceeded")


class Flood:
    """`threads` threads LISTing `path` through `rest` (whose calls never wait: budget 0) until `stop`; counts the
    answers rejected (429) and served."""

    def __init__(self, rest: KubeRest, path: str, threads: int = FLOOD_THREADS) -> None:
        self._rest, self._path = rest, path
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]
        self._lock = threading.Lock()
        self.rejected = 0
        self.served = 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._rest.send("GET", self._path)
                outcome = "served"
            except ApiThrottled:
                outcome = "rejected"
            except ApiError:
                time.sleep(0.05)
                continue
            with self._lock:
                setattr(self, outcome, getattr(self, outcome) + 1)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> dict[str, int]:
        """Stop the threads; the counts."""
        self._stop.set()
        for thread in self._threads:
            thread.join(15)
        return {"rejected": self.rejected, "served": self.served}


@dataclass(frozen=True)
class Outcome:
    """One kubelet call to a plugin during the storm: how long it took, and its error ("" when it succeeded)."""

    seconds: float
    error: str = ""


def failure_kind(error: str) -> str:
    """What a failed prepare's message says happened: ``throttled``, ``unreachable`` (a server that did not answer,
    or the kubelet's own deadline), else ``other``."""
    if THROTTLED_WORDS in error or any(words in error for words in THROTTLED_GO):
        return "throttled"
    if any(words in error for words in UNREACHABLE_WORDS):
        return "unreachable"
    return "other"


def plugin_report(outcomes: list[Outcome]) -> dict[str, Any]:
    """One plugin's figures: prepares, how many succeeded, the latency of those that did and of those that failed
    (when they gave up), and per failure kind how many said so, with an example message of each."""
    ok = [o.seconds for o in outcomes if not o.error]
    failed = [o for o in outcomes if o.error]
    kinds: dict[str, int] = {}
    examples: dict[str, str] = {}
    for outcome in failed:
        kind = failure_kind(outcome.error)
        kinds[kind] = kinds.get(kind, 0) + 1
        examples.setdefault(kind, outcome.error)
    return {
        "prepares": len(outcomes),
        "succeeded": len(ok),
        "latency": summary_ms(ok) if ok else None,
        "gave_up_after": summary_ms([o.seconds for o in failed]) if failed else None,
        "failures": kinds,
        "every_failure_said_why": kinds.get("other", 0) == 0,
        "examples": examples,
    }


def throttled_report(outcomes: dict[str, list[Outcome]], flood: dict[str, int]) -> dict[str, Any]:
    """The throttled run's report: per plugin (`plugin_report`), and the flood's counts (a storm that rejected
    nothing shows nothing)."""
    return {"plugins": {name: plugin_report(calls) for name, calls in outcomes.items()}, "flood": flood}


def describe(report: dict[str, Any]) -> str:
    """The report as text, one block per plugin, side by side in order."""
    flood = report["flood"]
    lines = [f"APF storm: flood {flood['rejected']} rejected (429) / {flood['served']} served"]
    for name, part in report["plugins"].items():
        lines.append(f"{name}: {part['succeeded']}/{part['prepares']} prepares succeeded")
        for label, row in (("  succeeded", part["latency"]), ("  gave up after", part["gave_up_after"])):
            if row is not None:
                lines.append(
                    f"{label}: p50 {row['p50_ms'] / 1000:.1f} s, p90 {row['p90_ms'] / 1000:.1f} s, "
                    f"max {row['max_ms'] / 1000:.1f} s"
                )
        for kind, count in sorted(part["failures"].items()):
            lines.append(f"  failures that said {kind}: {count}, e.g. {part['examples'][kind]}")
    return "\n".join(lines)
