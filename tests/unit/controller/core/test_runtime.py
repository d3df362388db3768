"""Unit tests of the controller's interpreter settings (controller/core/runtime.py)."""

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from controller.core import metrics, runtime


@pytest.fixture
def interpreter() -> Iterator[None]:
    """Restore the switch interval, the thresholds and an unfrozen heap after the test."""
    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    yield
    sys.setswitchinterval(interval)
    gc.set_threshold(*thresholds)
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_tune_shortens_the_gil_hand_over_and_makes_full_collections_rarer(interpreter: None) -> None:
    young, middle, _ = gc.get_threshold()
    runtime.tune()
    runtime.tune()
    assert sys.getswitchinterval() == pytest.approx(runtime.SWITCH_INTERVAL)
    assert gc.get_threshold() == (young, middle, runtime.FULL_COLLECTION_EVERY)


def test_compact_freezes_what_is_live_and_collects_garbage_among_frozen_objects(interpreter: None) -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    alive = weakref.ref(a)
    frozen = runtime.compact()
    assert frozen == gc.get_freeze_count() > 0 and alive() is a, "live objects are frozen, not freed"
    del a, b
    gc.collect()
    assert alive() is not None, "a frozen cycle is skipped by ordinary collections"
    runtime.compact()
    assert alive() is None, "the next compaction unfreezes and collects it"


def _full_collections_timed() -> float:
    samples = [s for m in metrics.GC_PAUSE_SECONDS.collect() for s in m.samples]
    return next((s.value for s in samples if s.name.endswith("_count") and s.labels == {"generation": "2"}), 0.0)


def test_every_collection_is_timed_once_however_often_timing_is_installed() -> None:
    metrics.time_gc()
    metrics.time_gc()
    before = _full_collections_timed()
    gc.collect()
    assert _full_collections_timed() == before + 1
