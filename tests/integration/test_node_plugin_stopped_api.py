"""The node plugin while its API server is stopped (SIGSTOP): answers in time, with a per-claim error (issue 9).

A stopped kube-apiserver still accepts TCP connections (the kernel queues them) but never answers, the
worst case for a client. This module stops an API server, so it runs a control plane of its own.
"""

import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from harness import kube
from harness.cluster.controlplane import ControlPlane
from harness.kubelet_client import KUBELET_CALL_TIMEOUT_S
from harness.nodeplugin import DRIVER
from tests.integration import own_plane
from tests.integration import test_node_plugin as node_plugin

pytestmark = pytest.mark.integration
control_plane, api_client, dyn = own_plane.control_plane, own_plane.api_client, own_plane.dyn  # it gets stopped
plugin = node_plugin.plugin  # on this module's control plane
Plugin = node_plugin.Plugin


@contextmanager
def stopped(control_plane: ControlPlane) -> Iterator[None]:
    """kube-apiserver stopped with SIGSTOP for the block, continued afterwards whatever happens."""
    pid = control_plane.procs.procs["kube-apiserver"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_prepare_answers_in_time_while_the_api_server_is_stopped(
    plugin: Plugin, control_plane: ControlPlane, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    claims = kube.allocate_claims(api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["1Gi"] * 2)
    refs = [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]
    with stopped(control_plane):
        start = time.monotonic()
        try:
            response = plugin.kubelet.prepare(refs)  # the kubelet's own 45 s deadline
        except grpc.RpcError as err:
            pytest.fail(f"no answer within the kubelet's {KUBELET_CALL_TIMEOUT_S:g} s: {err}")
        elapsed = time.monotonic() - start
    print(f"NodePrepareResources of {len(refs)} claims with the API server stopped answered in {elapsed:.1f} s")
    for namespace_, uid, name in refs:
        # a read that timed out is tried again while the prepare's 10 s last (client-go retries timed-out reads)
        error = response.claims[uid].error
        assert error.startswith(f"cannot read ResourceClaim {namespace_}/{name}: timed out: the API server at "), error
        assert re.search(r"did not answer within \d+ s; tried \d+ times in \d+\.\d s; the kubelet retries$", error), (
            error
        )
        assert not response.claims[uid].devices
    assert not list(plugin.process.cdi_dir.glob("*.json"))

    def prepared() -> Any:
        answer = plugin.kubelet.prepare(refs)
        return answer if all(c.error == "" for c in answer.claims.values()) else None

    again = kube.wait_for(prepared, 60, what="prepare after the API server continued (the kubelet retries)")
    assert all(len(c.devices) == 1 for c in again.claims.values())
    plugin.kubelet.unprepare(refs)
