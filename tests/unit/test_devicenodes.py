"""Unit tests of the /dev/char links (kubelet_plugin/devicenodes.py `ensure_char_links`); no root needed:
/dev/null and /dev/zero stand in for GPU device nodes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kubelet_plugin.devicenodes import HostDeviceNode, ensure_char_links

NULL = HostDeviceNode("/dev/null", Path("/dev/null"), 1, 3)
ZERO = HostDeviceNode("/dev/zero", Path("/dev/zero"), 1, 5)


@pytest.fixture
def dev_char(tmp_path: Path) -> Path:
    return tmp_path / "dev-char"


def test_missing_links_are_created(dev_char: Path) -> None:
    ensure_char_links(dev_char, [NULL, ZERO])
    assert os.readlink(dev_char / "1:3") == "/dev/null"
    assert os.readlink(dev_char / "1:5") == "/dev/zero"


def test_a_link_that_leads_to_the_device_is_kept(dev_char: Path, tmp_path: Path) -> None:
    dev_char.mkdir()
    (dev_char / "1:3").symlink_to("/dev/./null")  # another path to the same device (udev writes ../null)
    ensure_char_links(dev_char, [NULL])
    assert os.readlink(dev_char / "1:3") == "/dev/./null"


def test_a_dangling_link_is_repaired(dev_char: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dev_char.mkdir()
    (dev_char / "1:3").symlink_to(tmp_path / "old-driver-root" / "dev" / "nvidia0")
    with caplog.at_level(logging.WARNING):
        ensure_char_links(dev_char, [NULL])
    assert os.readlink(dev_char / "1:3") == "/dev/null"
    assert "repairing a stale /dev/char link" in caplog.text
    assert not [p for p in dev_char.iterdir() if p.name.startswith(".")], "no temp link left behind"


@pytest.mark.parametrize("elsewhere", ["other-device", "regular-file"])
def test_a_link_leading_elsewhere_is_repaired(dev_char: Path, tmp_path: Path, elsewhere: str) -> None:
    dev_char.mkdir()
    target = Path("/dev/zero") if elsewhere == "other-device" else tmp_path / "file"
    if elsewhere == "regular-file":
        target.write_text("x")
    (dev_char / "1:3").symlink_to(target)
    ensure_char_links(dev_char, [NULL])
    assert os.readlink(dev_char / "1:3") == "/dev/null"


@pytest.mark.parametrize("what", ["regular file", "directory"])
def test_a_non_link_in_the_way_is_reported_and_left(
    dev_char: Path, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    dev_char.mkdir()
    path = dev_char / "1:3"
    if what == "directory":
        path.mkdir()
    else:
        path.write_text("not a link")
    with caplog.at_level(logging.WARNING):
        ensure_char_links(dev_char, [NULL, ZERO])  # never raises
    assert not path.is_symlink()
    assert os.readlink(dev_char / "1:5") == "/dev/zero", "the other links are still made"
    (record,) = [r for r in caplog.records if "in the way" in r.getMessage()]
    assert record.__dict__["found"] == what
    assert record.__dict__["link"] == str(path)


def test_an_unusable_dev_char_dir_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "dev-char"
    blocker.write_text("a file where the directory should be")
    with caplog.at_level(logging.WARNING):
        ensure_char_links(blocker, [NULL])
    assert "cannot create the /dev/char directory" in caplog.text
