"""The end-to-end fixture: one single-node cluster per session, fracgpu installed by its Helm chart."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster.node import SingleNodeCluster
from e2e.install import Installation, install, remove_dev_char_links


@pytest.fixture(scope="session")
def installation() -> Iterator[Installation]:
    """A Ready node with containerd + kubelet in its own network namespace and fracgpu serving it."""
    if os.geteuid() != 0:
        pytest.skip("the e2e cluster needs root: network namespaces, mounts, mknod and runc")
    state_dir = Path(tempfile.mkdtemp(prefix="fracgpu-e2e-", dir="/tmp"))
    cluster = SingleNodeCluster(state_dir)
    cluster.start()
    installed: Installation | None = None
    try:
        installed = install(cluster, image_out=state_dir / "image")
        yield installed
    finally:
        cluster.stop()
        if installed is not None:
            remove_dev_char_links(installed.driver_root)
        shutil.rmtree(state_dir, ignore_errors=True)
