"""Pod and container of a process from /proc/<pid>/cgroup: the line formats the kubelet and runtimes produce."""

import os
from pathlib import Path

import pytest

from kubelet_plugin.usage.cgroups import (
    CgroupUnreadableError,
    PodContainer,
    pod_of_cgroup_file,
    pod_of_path,
    pod_of_pid,
)

UID = "3f2c8a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"
CID = "9a8b7c6d5e4f30211203a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, cgroupfs driver, burstable pod
        (f"0::/kubepods/burstable/pod{UID}/{CID}\n", PodContainer(pod_uid=UID, container_id=CID)),
        # cgroup v2, cgroupfs driver, guaranteed pod (no QoS level)
        (f"0::/kubepods/pod{UID}/{CID}\n", PodContainer(pod_uid=UID, container_id=CID)),
        # cgroup v2, systemd driver, containerd
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n",
            PodContainer(pod_uid=UID, container_id=CID),
        ),
        # cgroup v2, systemd driver, CRI-O, guaranteed
        (
            f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
            PodContainer(pod_uid=UID, container_id=CID),
        ),
        # cgroup v1 (every controller its own line), cgroupfs driver
        (
            f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n"
            f"11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
            f"4:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n"
            "1:name=systemd:/\n",
            PodContainer(pod_uid=UID, container_id=CID),
        ),
        # hybrid: the v2 hierarchy holds no pods (this machine's layout), a v1 line does
        (
            f"13:memory:/kubepods/burstable/pod{UID}/{CID}\n0::/\n",
            PodContainer(pod_uid=UID, container_id=CID),
        ),
        # v1, systemd driver, docker
        (
            f"7:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
            f"docker-{CID}.scope\n",
            PodContainer(pod_uid=UID, container_id=CID),
        ),
        # a node inside a container (kind): the kubelet's tree below a prefix
        (
            f"0::/system.slice/docker-0123456789ab.scope/kubelet.slice/kubelet-kubepods.slice/"
            f"kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n",
            PodContainer(pod_uid=UID, container_id=CID),
        ),
        # a static pod (UID is the config hash) and the pod's own cgroup (no container)
        (
            "0::/kubepods/besteffort/pod0123456789abcdef0123456789abcdef\n",
            PodContainer(pod_uid="0123456789abcdef0123456789abcdef"),
        ),
        # host processes
        ("0::/user.slice/user-0.slice/session-3.scope\n", None),
        ("0::/system.slice/containerd.service\n12:memory:/\n", None),
        # junk lines are ignored, not fatal
        ("garbage\n\n0:\n", None),
        ("", None),
    ],
)
def test_pod_of_cgroup_file(text: str, expected: PodContainer | None) -> None:
    assert pod_of_cgroup_file(text) == expected


def test_v2_line_is_preferred_over_v1() -> None:
    other = "11111111-2222-3333-4444-555555555555"
    text = f"11:memory:/kubepods/pod{other}/{CID}\n0::/kubepods/pod{UID}/{CID}\n"
    assert pod_of_cgroup_file(text) == PodContainer(pod_uid=UID, container_id=CID)


def test_a_segment_that_only_looks_like_a_pod_is_not_one() -> None:
    assert pod_of_path(f"/kubepods/xpod{UID}/{CID}") is None
    assert pod_of_path(f"/kubepods/pod{UID}x/{CID}") is None
    assert pod_of_path(f"/kubepods/pod{UID}/not-a-container") == PodContainer(pod_uid=UID, container_id=None)


def test_pod_of_pid_reads_the_host_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    assert pod_of_pid(tmp_path, 42) == PodContainer(pod_uid=UID, container_id=CID)
    assert pod_of_pid(Path("/proc"), os.getpid()) is None  # the test itself runs in no pod


def test_unreadable_cgroup_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CgroupUnreadableError, match=r"cannot read .*/43/cgroup: No such file or directory"):
        pod_of_pid(tmp_path, 43)
