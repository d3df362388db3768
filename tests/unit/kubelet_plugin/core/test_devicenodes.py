"""Unit tests of the /dev/char links (kubelet_plugin/core/devicenodes.py `ensure_char_links`); no root needed:
/dev/null and /dev/zero stand in for GPU device nodes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kubelet_plugin.core.devicenodes import (
    DeviceNodeError,
    DeviceNodeSnapshot,
    HostDeviceNode,
    ensure_char_links,
    snapshot,
)

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


# --- the snapshot planning reads instead of the host -------------------------------------------------


def test_snapshot_stats_each_node_once_and_tells_what_is_unusable(tmp_path: Path) -> None:
    """A driver root whose nodes are links to /dev/null and /dev/zero (character devices any user can stat)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name, target in (("nvidia0", "/dev/null"), ("nvidiactl", "/dev/zero"), ("nvidia-uvm", "/dev/null")):
        (dev / name).symlink_to(target)
    (dev / "nvidia-uvm-tools").write_text("not a device")
    seen = snapshot(tmp_path, [0, 1])
    assert seen.found["nvidia0"] == HostDeviceNode("/dev/nvidia0", dev / "nvidia0", 1, 3)
    assert seen.found["nvidiactl"] == HostDeviceNode("/dev/nvidiactl", dev / "nvidiactl", 1, 5)
    assert (
        seen.found["nvidia-uvm-tools"]
        == f"{dev / 'nvidia-uvm-tools'} exists but is not a character device; check the driver root"
    )
    assert "nvidia1" not in seen.found and "nvidia-modeset" not in seen.found
    assert seen.present("nvidia0") and not seen.present("nvidia1") and not seen.present("nvidia-uvm-tools")
    with pytest.raises(DeviceNodeError, match="nvidia-uvm-tools exists but is not a character device"):
        seen.gpu_nodes(0)
    with pytest.raises(DeviceNodeError, match=f"device node {dev / 'nvidia1'} does not exist"):
        seen.gpu_nodes(1)


def test_gpu_nodes_are_its_own_the_control_nodes_and_modeset_when_present(tmp_path: Path) -> None:
    table = {"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidiactl": (195, 255), "nvidia-uvm": (510, 0)}
    table["nvidia-uvm-tools"] = (510, 1)
    nodes = DeviceNodeSnapshot.of(tmp_path, table).gpu_nodes(1)
    assert [(n.container_path, n.major, n.minor) for n in nodes] == [
        ("/dev/nvidia1", 195, 1),
        ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia-uvm", 510, 0),
        ("/dev/nvidia-uvm-tools", 510, 1),
    ]
    with_modeset = DeviceNodeSnapshot.of(tmp_path, {**table, "nvidia-modeset": (195, 254)}).gpu_nodes(1)
    assert with_modeset[-1] == HostDeviceNode("/dev/nvidia-modeset", tmp_path / "dev" / "nvidia-modeset", 195, 254)


def test_a_link_this_module_made_is_kept_without_following_it(dev_char: Path, tmp_path: Path) -> None:
    """The link to a node's host path stays as it is, even while the node itself is away."""
    node = HostDeviceNode("/dev/nvidia0", tmp_path / "driver" / "dev" / "nvidia0", 195, 0)
    ensure_char_links(dev_char, [node])
    first = (dev_char / "195:0").lstat()
    ensure_char_links(dev_char, [node])
    assert os.readlink(dev_char / "195:0") == str(node.host_path)
    assert (dev_char / "195:0").lstat().st_ino == first.st_ino, "not replaced"
