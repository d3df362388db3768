"""How many of the claim flow's modules a one-claim prepare passes through, from the gRPC handler to the written files.

The flow's modules are those of ``serving``, ``prepare`` and ``kinds``; the libraries they call (``state``, ``core``,
``enforcement``, ``api``) are not counted. docs/architecture.md ("Flow of one claim") names the nine. The first
claim on a GPU since the plugin started also enters ``kinds/gpu/publish`` once, for the attributes the GPU publishes
(cached per GPU); the claim traced here is the second on its GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from kubelet_plugin.serving.grpc_server import DRAPluginV1Servicer
from kubelet_plugin.serving.proto import dra_v1_pb2
from tests.unit.plugin_host import NS, SHARE_B, UID_A, UID_B, make_claim, make_env

FLOW_PACKAGES = ("kubelet_plugin.serving.", "kubelet_plugin.prepare.", "kubelet_plugin.kinds.")


def _modules_entered(call: Any) -> set[str]:
    """The flow modules whose code runs in this thread while `call()` runs."""
    entered: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith(FLOW_PACKAGES):
                entered.add(name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


def test_a_one_claim_prepare_passes_through_at_most_nine_flow_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path, monkeypatch)
    env.api.add(make_claim(UID_A, "claim-a"))
    env.api.add(make_claim(UID_B, "claim-b", share=SHARE_B))
    servicer = DRAPluginV1Servicer(env.preparer)
    request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(namespace=NS, name="claim-a", uid=UID_A)])
    answers: list[Any] = []
    first = dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(namespace=NS, name="claim-b", uid=UID_B)])
    assert not servicer.NodePrepareResources(first, None).claims[UID_B].error

    entered = _modules_entered(lambda: answers.append(servicer.NodePrepareResources(request, None)))

    assert not answers[0].claims[UID_A].error
    assert env.spec_file(UID_A).is_file()
    assert {"kubelet_plugin.serving.grpc_server", "kubelet_plugin.prepare.preparer"} <= entered
    assert len(entered) <= 9, sorted(entered)
