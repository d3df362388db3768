"""A GPU's PCIe root and NUMA node read from a host's sysfs (kubelet_plugin/publishing/pci_topology.py), on fake
sysfs trees laid out as Linux lays them out."""

import logging
from pathlib import Path

import pytest

from kubelet_plugin.publishing.pci_topology import numa_node, pcie_root

BUS_ID = "0000:18:00.0"


def device(sys_root: Path, *path: str, numa: str | None = "0\n", bus_id: str = BUS_ID) -> Path:
    """A PCI device at `sys_root/devices/<path...>/<bus_id>` (with `numa_node` unless `numa` is None), linked from
    `sys_root/bus/pci/devices/<bus_id>` relatively, as sysfs links it."""
    directory = sys_root.joinpath("devices", *path, bus_id)
    directory.mkdir(parents=True)
    if numa is not None:
        (directory / "numa_node").write_text(numa)
    links = sys_root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    (links / bus_id).symlink_to(Path("../../..", "devices", *path, bus_id))
    return directory


def test_the_root_complex_is_the_first_directory_under_devices(tmp_path: Path) -> None:
    """Behind a root port and a switch's two ports, the GPU's root is still the root complex."""
    device(tmp_path, "pci0000:17", "0000:17:01.0", "0000:18:00.0", "0000:19:00.0", bus_id="0000:1a:00.0")
    device(tmp_path, "pci0000:29", "0000:29:01.0")
    assert pcie_root(tmp_path, "0000:1a:00.0") == "pci0000:17"
    assert pcie_root(tmp_path, BUS_ID) == "pci0000:29"


def test_a_device_directly_on_the_root_bus(tmp_path: Path) -> None:
    device(tmp_path, "pci0000:00", bus_id="0000:00:05.0")
    assert pcie_root(tmp_path, "0000:00:05.0") == "pci0000:00"


def test_a_domain_of_more_than_four_digits(tmp_path: Path) -> None:
    """A VMD domain: sysfs prints every digit of the domain, and so does the root."""
    device(tmp_path, "pci10000:e0", "10000:e0:02.0", bus_id="10000:e1:00.0")
    assert pcie_root(tmp_path, "10000:e1:00.0") == "pci10000:e0"


def test_an_absolute_link_inside_the_sysfs_root(tmp_path: Path) -> None:
    directory = tmp_path / "devices" / "pci0000:17" / "0000:17:01.0" / BUS_ID
    directory.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / BUS_ID).symlink_to(directory)
    assert pcie_root(tmp_path, BUS_ID) == "pci0000:17"


@pytest.mark.parametrize(
    ("where", "bus_id"),
    [
        (("platform", "pci0000:17"), BUS_ID),  # not under devices/pci<domain>:<bus>
        (("pci0000:17", "0000:17:01.0"), "0000:18:00.1"),  # the link ends in another device
        (("LNXSYSTM:00", "pci0000:17"), BUS_ID),
        (("pcie-root",), BUS_ID),
    ],
)
def test_a_link_that_leads_anywhere_else_gives_no_root(tmp_path: Path, where: tuple[str, ...], bus_id: str) -> None:
    directory = tmp_path.joinpath("devices", *where, bus_id)
    directory.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / BUS_ID).symlink_to(Path("../../..", "devices", *where, bus_id))
    assert pcie_root(tmp_path, BUS_ID) is None


def test_a_link_leaving_the_sysfs_root_gives_no_root(tmp_path: Path) -> None:
    links = tmp_path / "sys" / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / BUS_ID).symlink_to(Path("../../../../devices/pci0000:17", BUS_ID))
    assert pcie_root(tmp_path / "sys", BUS_ID) is None


def test_a_missing_device_gives_neither_and_says_why_at_debug_level(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="kubelet_plugin.publishing.pci_topology"):
        assert pcie_root(tmp_path, BUS_ID) is None
        assert numa_node(tmp_path, BUS_ID) is None
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.DEBUG]
    assert "no pcieRoot" in caplog.records[0].getMessage()
    assert "no numaNode" in caplog.records[1].getMessage()


def test_a_directory_where_the_link_should_be_gives_no_root(tmp_path: Path) -> None:
    (tmp_path / "bus" / "pci" / "devices" / BUS_ID).mkdir(parents=True)
    assert pcie_root(tmp_path, BUS_ID) is None


@pytest.mark.parametrize("bus_id", ["0000:18:00.0 ", "0000:1A:00.0", "18:00.0", "", "../0000:18:00.0"])
def test_a_bus_id_sysfs_cannot_name_gives_neither(tmp_path: Path, bus_id: str) -> None:
    device(tmp_path, "pci0000:17", "0000:17:01.0")
    assert pcie_root(tmp_path, bus_id) is None
    assert numa_node(tmp_path, bus_id) is None


@pytest.mark.parametrize(("text", "node"), [("0\n", 0), ("1\n", 1), ("7", 7), ("1023\n", 1023)])
def test_the_numa_node(tmp_path: Path, text: str, node: int) -> None:
    device(tmp_path, "pci0000:17", "0000:17:01.0", numa=text)
    assert numa_node(tmp_path, BUS_ID) == node


@pytest.mark.parametrize("text", ["-1\n", "-2", "1024", "", "zero\n", "0x1"])
def test_no_numa_affinity_or_no_number_gives_no_numa_node(tmp_path: Path, text: str) -> None:
    """-1 is the kernel's word for a device without NUMA affinity: Kubernetes says to leave the attribute out."""
    device(tmp_path, "pci0000:17", "0000:17:01.0", numa=text)
    assert numa_node(tmp_path, BUS_ID) is None
    assert pcie_root(tmp_path, BUS_ID) == "pci0000:17"  # the root is still known


def test_a_missing_numa_node_file_gives_no_numa_node(tmp_path: Path) -> None:
    device(tmp_path, "pci0000:17", "0000:17:01.0", numa=None)
    assert numa_node(tmp_path, BUS_ID) is None
    assert pcie_root(tmp_path, BUS_ID) == "pci0000:17"
