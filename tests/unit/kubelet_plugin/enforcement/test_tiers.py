"""Unit tests of the enforcement tiers: what a GPU offers, which tier a share gets (kubelet_plugin/enforcement/tiers.py),
and reading the cgroup mount from mountinfo (kubelet_plugin/enforcement/probe.py, pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubelet_plugin.enforcement.probe import cgroup_problem, mount_fs_type
from kubelet_plugin.enforcement.tiers import (
    TIERS,
    EnforcementUnavailableError,
    GpuTiers,
    MpsFacts,
    NodeFacts,
    NvmlLimits,
    applied_tier,
    gpu_tiers,
    weakest,
)

ALL = NodeFacts(cgroup_problem=None, driver_edits_problem=None, hami_core_problem=None)
NVML_OK = NvmlLimits(problem=None)
GPU = "GPU gpu-0 (GPU-1)"
NOT_AN_MPS_GPU = "it is not an MPS GPU (chart value mps.gpus, plugin flag --mps-gpus)"
MPS_UP = MpsFacts(selected=True)

# /proc/self/mountinfo of this kind of machine: hybrid cgroup v1 (tmpfs at /sys/fs/cgroup, cgroup2 at unified)
HYBRID = """\
22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
25 22 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
"""
UNIFIED = "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_every_tier_when_every_fact_holds() -> None:
    tiers = gpu_tiers(ALL, NVML_OK)
    assert tiers.available == ("none", "hami-core", "nvml")
    assert tiers.strongest == "nvml" == tiers.published
    assert tiers.missing == {"mps": NOT_AN_MPS_GPU}


def test_nvml_needs_cgroup_v2_driver_edits_and_the_driver_call() -> None:
    for facts, nvml, why in [
        (ALL.model_copy(update={"cgroup_problem": "no cgroup v2"}), NVML_OK, "no cgroup v2"),
        (ALL.model_copy(update={"driver_edits_problem": "edits off"}), NVML_OK, "edits off"),
        (ALL, NvmlLimits(problem="no symbol"), "no symbol"),
    ]:
        tiers = gpu_tiers(facts, nvml)
        assert tiers.available == ("none", "hami-core"), why
        assert tiers.missing == {"mps": NOT_AN_MPS_GPU, "nvml": why}


def test_without_hami_core_library() -> None:
    tiers = gpu_tiers(ALL.model_copy(update={"hami_core_problem": "no lib"}), NvmlLimits(problem="old driver"))
    assert tiers.available == ("none",)
    assert tiers.strongest == "none"
    assert tiers.missing == {"hami-core": "no lib", "mps": NOT_AN_MPS_GPU, "nvml": "old driver"}


def test_auto_is_the_strongest_the_gpu_offers() -> None:
    assert applied_tier("auto", None, gpu_tiers(ALL, NVML_OK), GPU) == "nvml"
    hami_only = gpu_tiers(ALL, NvmlLimits(problem="x"))
    assert applied_tier("auto", None, hami_only, GPU) == "hami-core"
    assert applied_tier("auto", "none", hami_only, GPU) == "hami-core"  # a claim cannot lower auto


def test_claim_raises_but_never_lowers_the_floor() -> None:
    tiers = gpu_tiers(ALL, NVML_OK)
    assert applied_tier("none", "nvml", tiers, GPU) == "nvml"
    assert applied_tier("none", "hami-core", tiers, GPU) == "hami-core"
    assert applied_tier("hami-core", "none", tiers, GPU) == "hami-core"
    assert applied_tier("nvml", "hami-core", tiers, GPU) == "nvml"
    assert applied_tier("none", None, tiers, GPU) == "none"


def test_claim_asking_for_a_tier_the_gpu_lacks_is_a_clear_error() -> None:
    tiers = gpu_tiers(ALL, NvmlLimits(problem="the driver's libnvidia-ml.so.1 has no nvmlDeviceSetMemoryLimits_v1"))
    with pytest.raises(EnforcementUnavailableError) as err:
        applied_tier("auto", "nvml", tiers, GPU)
    message = str(err.value)
    assert message.startswith("the claim's GpuConfig asks for enforcement 'nvml', but GPU gpu-0 (GPU-1) cannot")
    assert "has no nvmlDeviceSetMemoryLimits_v1" in message
    assert "this GPU offers 'none', 'hami-core'" in message


def test_node_mode_the_gpu_lacks_names_the_node_setting() -> None:
    tiers = GpuTiers(available=("none",), missing={"hami-core": "HAMi-core's library /x is not on this node"})
    with pytest.raises(EnforcementUnavailableError) as err:
        applied_tier("hami-core", None, tiers, GPU)
    assert "this node's enforcement mode is 'hami-core'" in str(err.value)
    assert "/x is not on this node" in str(err.value)


def test_weakest() -> None:
    assert weakest(["nvml", "hami-core"]) == "hami-core"
    assert weakest([]) == "none"


def test_mountinfo_top_mount_wins() -> None:
    assert mount_fs_type(HYBRID, "/sys/fs/cgroup") == "tmpfs"
    assert mount_fs_type(HYBRID, "/sys/fs/cgroup/unified") == "cgroup2"
    assert mount_fs_type(HYBRID + UNIFIED, "/sys/fs/cgroup") == "cgroup2"  # mounted over: the later line
    assert mount_fs_type(HYBRID, "/nowhere") is None
    assert mount_fs_type(r"1 0 0:1 / /a\040b rw - ext4 /dev/x rw", "/a b") == "ext4"


def test_cgroup_problem(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(HYBRID)
    problem = cgroup_problem(Path("/sys/fs/cgroup"), mountinfo)
    assert problem is not None and "it is tmpfs (cgroup v1 or hybrid)" in problem
    mountinfo.write_text(UNIFIED)
    assert cgroup_problem(Path("/sys/fs/cgroup"), mountinfo) is None
    missing = cgroup_problem(Path("/sys/fs/cgroup"), tmp_path / "absent")
    assert missing is not None and "cannot read" in missing


def test_tier_order_puts_mps_between_hami_core_and_nvml() -> None:
    assert TIERS == ("none", "hami-core", "mps", "nvml", "mig")


def test_an_mps_gpu_offers_mps_and_every_share_gets_it_whatever_the_mode() -> None:
    tiers = gpu_tiers(ALL, NVML_OK, MPS_UP)
    assert tiers.available == ("none", "mps")
    assert tiers.required == "mps" == tiers.published
    assert "outside the container's cgroup" in tiers.missing["nvml"]
    for mode in ("auto", "none", "hami-core"):
        for requested in (None, "none", "hami-core", "mps"):
            assert applied_tier(mode, requested, tiers, GPU) == "mps", (mode, requested)


def test_an_mps_gpu_whose_daemon_is_down_refuses_every_share_with_the_reason() -> None:
    tiers = gpu_tiers(ALL, NVML_OK, MpsFacts(selected=True, problem="its MPS control daemon is down: killed"))
    assert tiers.available == ("none",) and tiers.published == "mps"
    with pytest.raises(EnforcementUnavailableError) as err:
        applied_tier("auto", None, tiers, GPU)
    message = str(err.value)
    assert message.startswith(f"{GPU} is an MPS GPU, where every share is an MPS client, but {GPU} cannot give it")
    assert "its MPS control daemon is down: killed" in message and "fracgpu-mps" in message


def test_nvml_on_an_mps_gpu_and_mps_on_another_gpu_are_refused() -> None:
    with pytest.raises(EnforcementUnavailableError, match="outside the container's cgroup"):
        applied_tier("auto", "nvml", gpu_tiers(ALL, NVML_OK, MPS_UP), GPU)
    assert applied_tier("auto", "mps", gpu_tiers(ALL, NVML_OK), GPU) == "nvml"  # a stronger tier satisfies it
    with pytest.raises(EnforcementUnavailableError) as err:
        applied_tier("auto", "mps", gpu_tiers(ALL, NvmlLimits(problem="old driver")), GPU)
    assert "the claim's GpuConfig asks for enforcement 'mps'" in str(err.value)
    assert NOT_AN_MPS_GPU in str(err.value)
