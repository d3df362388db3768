"""The end-to-end fixture: one single-node cluster per session, fracgpu installed by its Helm chart."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import workloads as w
from e2e.cluster.node import SingleNodeCluster
from e2e.install import Installation, install, remove_dev_char_links

KEEP_STATE = "FRACGPU_E2E_KEEP_STATE"  # set (non-empty): the session's state dir (logs/*.log) is kept for a look


@pytest.fixture(scope="session")
def installation() -> Iterator[Installation]:
    """A Ready node with containerd + kubelet in its own network namespace and fracgpu serving it; containerd's
    default runtime is NVIDIA's (cdi mode, a node-level nvidia.com/gpu spec), RuntimeClass `runc` is plain runc."""
    if os.geteuid() != 0:
        pytest.skip("the e2e cluster needs root: network namespaces, mounts, mknod and runc")
    state_dir = Path(tempfile.mkdtemp(prefix="fracgpu-e2e-", dir="/tmp"))
    cluster = SingleNodeCluster(state_dir, nvidia_runtime=True)
    cluster.start()
    installed: Installation | None = None
    try:
        installed = install(cluster, image_out=state_dir / "image")
        yield installed
    finally:
        cluster.stop()
        if installed is not None:
            remove_dev_char_links(installed.driver_root)
        if os.environ.get(KEEP_STATE):
            print(f"\n{KEEP_STATE}: the e2e cluster's files and logs stay in {state_dir}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def ns(installation: Installation) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount), deleted with everything in it afterwards."""
    with w.fresh_namespace(installation.cluster) as name:
        yield name
