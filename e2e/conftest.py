"""The end-to-end fixture: one single-node cluster per session, fracgpu installed by its Helm chart."""

import os
from collections.abc import Iterator

import pytest

from e2e import workloads as w
from e2e.install import Installation, install, state_dir, tear_down
from harness.cluster.node import SingleNodeCluster


@pytest.fixture(scope="session")
def installation() -> Iterator[Installation]:
    """A Ready node with containerd + kubelet in its own network namespace and fracgpu serving it; containerd's
    default runtime is NVIDIA's (cdi mode, a node-level nvidia.com/gpu spec), RuntimeClass `runc` is plain runc."""
    if os.geteuid() != 0:
        pytest.skip("the e2e cluster needs root: network namespaces, mounts, mknod and runc")
    with state_dir("fracgpu-e2e-") as files:
        cluster = SingleNodeCluster(files, nvidia_runtime=True)
        cluster.start()
        installed: Installation | None = None
        try:
            installed = install(cluster, image_out=files / "image")
            yield installed
        finally:
            tear_down(cluster, installed)


@pytest.fixture
def ns(installation: Installation) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount), deleted with everything in it afterwards."""
    with w.fresh_namespace(installation.cluster) as name:
        yield name
