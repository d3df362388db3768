"""Fixtures for tests against a real control plane (etcd, kube-apiserver, controller-manager, scheduler).

One control plane per test session; tests isolate themselves by namespace and by unique object names.
"""

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from harness import kube
from harness.cluster.controlplane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A running control plane; every process it started is stopped at the end, pass or fail."""
    state_dir = Path(tempfile.mkdtemp(prefix="fracgpu-cp-", dir="/tmp"))
    plane = ControlPlane(state_dir)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> client.ApiClient:
    """An admin ApiClient for the control plane."""
    return config.new_client_from_config(config_file=str(control_plane.kubeconfig))


@pytest.fixture(scope="session")
def dyn(api_client: client.ApiClient) -> DynamicClient:
    """A dynamic client: plain dicts in and out, no model class dropping fields."""
    return DynamicClient(api_client)


@pytest.fixture
def namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists; deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name}})
    kube.wait_for(lambda: kube.exists(lambda: core.read_namespaced_service_account("default", name)), 30)
    yield name
    core.delete_namespace(name)
