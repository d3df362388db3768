"""The simulated driver root (harness/mocknvml `make_driver_root`): nodes like the NVIDIA driver's (integration tier: mknod needs root)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness import mocknvml

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates character device nodes with mknod"),
]
PROFILE = mocknvml.PROFILES / "sim80gi-x2.profile"


def test_device_nodes_are_0666_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        mocknvml.make_driver_root(tmp_path, PROFILE)
        (tmp_path / "dev" / "nvidia1").chmod(0o600)  # a node left by an older run is fixed too
        mocknvml.make_driver_root(tmp_path, PROFILE)
    finally:
        os.umask(old)
    names = sorted(p.name for p in (tmp_path / "dev").iterdir())
    assert names == ["nvidia-caps", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl"]
    for name in names[1:]:
        st = (tmp_path / "dev" / name).lstat()
        assert stat.S_ISCHR(st.st_mode), name
        assert stat.S_IMODE(st.st_mode) == 0o666, f"{name}: {oct(st.st_mode)}"
    # GPU 1 is a MIG GPU of the tests (gpu.1.mig_mode): config, monitor and its 15 x 9 instance capabilities
    caps = sorted(int(p.name.removeprefix("nvidia-cap")) for p in (tmp_path / "dev" / "nvidia-caps").iterdir())
    assert caps == [1, 2, *range(mocknvml.cap_minor(1, 0), mocknvml.cap_minor(1, 15))]
    cap = (tmp_path / "dev" / "nvidia-caps" / f"nvidia-cap{mocknvml.cap_minor(1, 9, 0)}").lstat()
    assert stat.S_ISCHR(cap.st_mode) and stat.S_IMODE(cap.st_mode) == 0o444
    assert (os.major(cap.st_rdev), os.minor(cap.st_rdev)) == (mocknvml.NVIDIA_CAPS_MAJOR, 3 + 135 + 81 + 1)
    table = (tmp_path / mocknvml.MIG_MINORS).read_text().splitlines()
    assert "gpu1/gi9/ci0/access 220" in table and table[:2] == ["config 1", "monitor 2"]
