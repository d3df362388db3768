"""Fixtures every node plugin unit test gets."""

from collections.abc import Iterator

import pytest

from tests.unit.plugin_host import settle_ready_writes


@pytest.fixture(autouse=True)
def _no_ready_write_outlives_its_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A Preparer's Ready writes run on threads of their own; the test's FakeApi (kept by `monkeypatch`, which
    this fixture outlives) takes them all before the next test patches in its own."""
    yield
    settle_ready_writes()
