"""Start-up gate: a plugin that cannot read this node's state does not serve the kubelet until it can.

The node's state is the checkpoint; its schema version covers every file the plugin reads back (see
docs/architecture.md, "Files on the node"). A checkpoint of a newer schema (a rollback past a format change)
cannot be used safely: prepare and unprepare would refuse every claim (``Preparer``). Registering anyway would
hand the node over from an instance that can serve, since a rolling update (maxSurge 1, maxUnavailable 0) removes
the old pod once the new one is Ready, to one that refuses everything. So the plugin waits here, before it
registers: its pod stays not Ready (the chart's readiness probe is the registration marker), the rollout stops on
the first node with the newer instance still serving, and the ``CheckpointTooNew`` Node Event (posted by the
recovery that ran before) says what to do. No crash loop: the file is re-checked every ``interval`` seconds, and
once it is readable (the plugin was upgraded back, or the operator started the node's claims over) the plugin
recovers and serves.
"""

import logging
import threading
from collections.abc import Callable
from typing import Literal

from kubelet_plugin.state.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

RECHECK_SECONDS = 5.0
Outcome = Literal["readable", "waited", "stopped"]


def newer_state(store: CheckpointStore) -> str | None:
    """What makes the node's state unreadable to this plugin (a checkpoint of a newer schema); None if readable.

    Reads only: a newer file is never moved or rewritten."""
    too_new = store.load().too_new
    if too_new is None:
        return None
    return (
        f"{too_new}. This plugin does not register with the kubelet until then (its pod stays not Ready, so a "
        "rolling update keeps the newer instance serving)"
    )


def wait_until_readable(check: Callable[[], str | None], stop: threading.Event, interval: float) -> Outcome:
    """Block while ``check()`` names a problem, re-checking every ``interval`` seconds.

    ``"readable"``: no problem at the first check; ``"waited"``: the problem went away (recover again before
    serving); ``"stopped"``: ``stop`` was set first."""
    problem = check()
    if problem is None:
        return "readable"
    log.error("not serving the kubelet: this node's state is of a newer schema", extra={"problem": problem})
    while problem is not None:
        if stop.wait(interval):
            return "stopped"
        problem = check()
    log.info("this node's state is readable again; recovering and serving the kubelet")
    return "waited"
