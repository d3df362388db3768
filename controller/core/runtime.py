"""Interpreter settings for the controller's mix of one busy event loop and many writer threads.

- GIL hand-over (`SWITCH_INTERVAL`): a thread that waits for the GIL (a status writer whose answer arrived, the
  webhook's thread with a review) gets it once the running thread has held it this long; with CPython's 5 ms
  each of the many small steps of a write or a review may wait that long behind the event loop's work.
- Garbage collection: a full collection scans every tracked object while every thread waits (0.2-0.5 s with
  2000 claims indexed). `tune` makes full collections rarer (`FULL_COLLECTION_EVERY` younger collections
  instead of 10); `compact`, called when the ledger is quiet after a full pass (start, resync), collects
  everything once and freezes what is live then (the indexes, kopf's state), so later full collections skip
  it; the next `compact` unfreezes it first, so garbage among those objects waits at most until then.
"""

import gc
import sys

SWITCH_INTERVAL = 0.001
"""Seconds a thread may hold the GIL while another waits for it."""
FULL_COLLECTION_EVERY = 100
"""Collections of the middle generation between two full collections (CPython's default: 10)."""


def tune() -> None:
    """Set the GIL switch interval and the garbage collector's thresholds (idempotent)."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def compact() -> int:
    """Collect every generation (frozen objects included) and freeze what survives; the objects frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
