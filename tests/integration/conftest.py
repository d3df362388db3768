"""Fixtures for tests against a real control plane (etcd, kube-apiserver, controller-manager, scheduler).

One control plane per test session; tests isolate themselves by namespace and by unique object names.
"""

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from api.names import DRIVER_NAME
from controller.core.rbac import cluster_role_rules
from harness import kube
from harness.cluster.controlplane import ControlPlane

CHART_NAMESPACE = "fracgpu-system"
"""Where the chart runs the controller (its ServiceAccount's namespace)."""


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


@pytest.fixture(scope="module")
def chart_controller(
    control_plane: ControlPlane, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], AbstractContextManager[kube.ControllerProcess]]:
    """`start(name)`: the controller as the chart runs it (ServiceAccount `fracgpu-controller-<name>-it` bound to the
    chart's ClusterRole rules, the chart's webhook configurations), its ledger writes delayed 0.2 s."""

    def start(name: str) -> AbstractContextManager[kube.ControllerProcess]:
        return kube.controller_with_rbac(
            api_client, server=control_plane.server, ca_cert=control_plane.ca_cert,
            workdir=tmp_path_factory.mktemp(f"{name}-controller"),
            account=(CHART_NAMESPACE, f"fracgpu-controller-{name}-it"), rules=cluster_role_rules(),
            webhook_config=DRIVER_NAME, args=("--ledger-delay=0.2",),
        )  # fmt: skip

    return start
