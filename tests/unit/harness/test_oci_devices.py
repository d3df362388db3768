"""The daemon-reload check on small OCI specs: what it accepts and each way a device node can be unaccounted for."""

import json
from pathlib import Path
from typing import Any

import pytest

from harness.oci_devices import DeviceNode, DeviceRule, access_of, bundle_config, mismatches, parse_listing

GPU0 = DeviceNode(path="/dev/nvidia0", major=195, minor=0)
CTL = DeviceNode(path="/dev/nvidiactl", major=195, minor=255)
NULL = DeviceNode(path="/dev/null", major=1, minor=3)


def spec(devices: list[tuple[str, int, int]], rules: list[dict[str, Any]]) -> dict[str, Any]:
    """A config.json as containerd writes it for a container with CDI devices (fields the check ignores too)."""
    return {
        "ociVersion": "1.2.1",
        "process": {"args": ["sh"]},
        "linux": {
            "devices": [
                {"path": p, "type": "c", "major": ma, "minor": mi, "fileMode": 438, "uid": 0, "gid": 0}
                for p, ma, mi in devices
            ],
            "resources": {"devices": [{"allow": False, "access": "rwm"}, *rules]},
        },
    }


def allow(major: int, minor: int, access: str = "rwm") -> dict[str, Any]:
    return {"allow": True, "type": "c", "major": major, "minor": minor, "access": access}


GOOD = spec([("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255)], [allow(195, 0), allow(195, 255)])


def test_a_container_whose_nodes_are_all_in_its_spec_has_no_mismatch() -> None:
    assert mismatches([GPU0, CTL, NULL], GOOD) == []


def test_a_node_the_spec_does_not_list_is_a_mismatch() -> None:
    """What NVIDIA's legacy hook did: a GPU node made outside the spec, hence not in the cgroup rules either."""
    hooked = DeviceNode(path="/dev/nvidia1", major=195, minor=1)
    assert mismatches([GPU0, CTL, hooked], GOOD) == [
        "/dev/nvidia1 (195:1) is not in linux.devices",
        "/dev/nvidia1 (195:1) lacks rw in linux.resources.devices",
    ]


def test_a_listed_node_without_read_write_access_is_a_mismatch() -> None:
    read_only = spec([("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255)], [allow(195, 0, "rm"), allow(195, 255)])
    assert mismatches([GPU0, CTL], read_only) == ["/dev/nvidia0 (195:0) lacks w in linux.resources.devices"]
    unlisted_rule = spec([("/dev/nvidia0", 195, 0)], [])
    assert mismatches([GPU0], unlisted_rule) == ["/dev/nvidia0 (195:0) lacks rw in linux.resources.devices"]


def test_a_later_deny_rule_wins() -> None:
    revoked = spec(
        [("/dev/nvidia0", 195, 0)], [allow(195, 0), {"allow": False, "type": "c", "major": 195, "access": "w"}]
    )
    assert mismatches([GPU0], revoked) == ["/dev/nvidia0 (195:0) lacks w in linux.resources.devices"]


def test_a_node_listed_with_other_numbers_is_a_mismatch() -> None:
    wrong = spec([("/dev/nvidia0", 195, 1)], [allow(195, 0), allow(195, 1)])
    assert mismatches([GPU0], wrong) == ["/dev/nvidia0 is 195:0 in the container but c 195:1 in linux.devices"]


def test_only_default_devices_with_their_standard_numbers_are_exempt() -> None:
    assert mismatches([NULL, DeviceNode(path="/dev/tty", major=5, minor=0)], spec([], [])) == []
    fake_null = DeviceNode(path="/dev/null", major=195, minor=0)
    assert mismatches([fake_null], spec([], [])) == [
        "/dev/null (195:0) is not in linux.devices",
        "/dev/null (195:0) lacks rw in linux.resources.devices",
    ]


def test_wildcard_rules_cover_any_number() -> None:
    rules = [DeviceRule(allow=True, access="rwm"), DeviceRule(allow=False, type="b", access="rwm")]
    assert access_of(rules, 195, 7) == {"r", "w", "m"}
    assert access_of([DeviceRule(allow=True, type="c", major=195, minor=-1, access="rw")], 195, 7) == {"r", "w"}
    assert access_of([DeviceRule(allow=True, type="b", major=195, minor=7)], 195, 7) == set()


def test_the_listing_is_parsed_from_hex_numbers() -> None:
    lines = ["ENV X=1", "DEV /dev/nvidiactl c3 ff", "DEV /dev/nvidia-uvm 1fe 1", "END"]
    assert parse_listing(lines) == [CTL, DeviceNode(path="/dev/nvidia-uvm", major=510, minor=1)]
    with pytest.raises(ValueError, match="'DEV /dev/x zz'"):
        parse_listing(["DEV /dev/x zz"])


def test_the_bundle_config_is_below_containerds_state_dir() -> None:
    state = Path("/run/ctd/state")
    assert bundle_config(state, "containerd://abc") == state / "io.containerd.runtime.v2.task/k8s.io/abc/config.json"


CAPTURED = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "oci-devices-two-requests.json").read_text())


@pytest.mark.parametrize("container", ["all", "only-a"])
def test_the_containers_captured_from_the_e2e_cluster_have_no_mismatch(container: str) -> None:
    captured = CAPTURED[container]
    nodes = parse_listing(captured["listing"])
    assert {"/dev/nvidiactl", "/dev/null"} <= {n.path for n in nodes}
    assert mismatches(nodes, captured["config"]) == []


def test_a_container_with_another_requests_gpu_node_is_a_mismatch() -> None:
    """`only-a` was granted request a's GPU only: had it request b's node too (as `all` has), the check says so."""
    nodes = parse_listing(CAPTURED["all"]["listing"])
    assert mismatches(nodes, CAPTURED["only-a"]["config"]) == [
        "/dev/nvidia0 (195:0) is not in linux.devices",
        "/dev/nvidia0 (195:0) lacks rw in linux.resources.devices",
    ]
