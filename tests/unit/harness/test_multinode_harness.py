"""The multi-node harness's pure parts: node profiles, paths inside a node, refusals of bad input."""

from pathlib import Path

import pytest

from harness.cluster.__main__ import main
from harness.cluster.mountns import NODE_ROOT, MountNamespace
from harness.cluster.multinode import A100X1, H100X2, MultiNodeCluster, NodeProfile, default_profiles
from harness.mocknvml import gpu_minors, read_profile


def test_default_profiles_alternate_h100_and_a100_nodes() -> None:
    assert default_profiles(3) == [
        NodeProfile("fracgpu-node-0", H100X2),
        NodeProfile("fracgpu-node-1", A100X1),
        NodeProfile("fracgpu-node-2", H100X2),
    ]
    with pytest.raises(ValueError, match="at least one node, not 0"):
        default_profiles(0)


def test_the_a100_profile_has_one_40gi_a100() -> None:
    values = read_profile(A100X1)
    assert gpu_minors(A100X1) == [0]
    assert (values["gpu.0.name"], values["gpu.0.memory_mib"]) == ("NVIDIA A100-SXM4-40GB", "40960")
    assert len(gpu_minors(H100X2)) == 2


def test_a_path_inside_a_node_is_below_its_own_directory_on_the_host() -> None:
    ns = MountNamespace("fg3", Path("/run/fg3"))
    assert ns.host_path(NODE_ROOT / "kubelet" / "pods") == Path("/run/fg3/kubelet/pods")
    with pytest.raises(ValueError):
        ns.host_path(Path("/var/lib/kubelet"))


def test_node_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        MultiNodeCluster(Path("/nonexistent"), [NodeProfile("a", H100X2), NodeProfile("a", A100X1)])


def test_the_command_line_refuses_fewer_than_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["up", "--nodes", "0", "--state-dir", "/nonexistent"])
    assert exited.value.code == 2
    assert "--nodes must be at least 1, not 0" in capsys.readouterr().err
