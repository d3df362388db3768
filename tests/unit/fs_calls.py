"""Test helper: record the renames code under test makes (``os.replace``), still performing them."""

import os

import pytest


def record_renames(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """From now on (for the test), every ``os.replace(src, dst)`` appends the two base names and renames."""
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def recording_replace(src: str, dst: str) -> None:
        renames.append((os.path.basename(src), os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    return renames
