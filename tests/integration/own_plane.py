"""Module-scoped replacements for the session's control plane fixtures, for a test module that must not
share its API server: one that stops it, or that stores objects other components choke on.

Use: `control_plane, api_client, dyn = own_plane.control_plane, own_plane.api_client, own_plane.dyn`.
"""

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from harness.cluster.controlplane import ControlPlane


@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    """A control plane for one test module; every process stopped at the end, a SIGSTOPped one too."""
    state_dir = Path(tempfile.mkdtemp(prefix="fracgpu-cp-own-", dir="/tmp"))
    plane = ControlPlane(state_dir)
    plane.start()
    try:
        yield plane
    finally:
        with contextlib.suppress(KeyError, ProcessLookupError):  # a stopped process would not stop on SIGTERM
            os.kill(plane.procs.procs["kube-apiserver"].pid, signal.SIGCONT)
        plane.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def api_client(control_plane: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(control_plane.kubeconfig))


@pytest.fixture(scope="module")
def dyn(api_client: client.ApiClient) -> DynamicClient:
    return DynamicClient(api_client)
