"""Protocol tests of the node plugin's gRPC servers.

A real gRPC client talks to the plugin over its Unix sockets in a temporary kubelet directory, using
the exact method paths the kubelet uses (those of the kubelet's DRA client).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubelet_plugin.core.model import ClaimRef
from kubelet_plugin.health.source import ReportedHealth
from kubelet_plugin.serving.grpc_server import SUPPORTED_VERSIONS, PluginServer
from kubelet_plugin.serving.proto import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_pb2,
)
from tests.unit.fake_preparer import FakePreparer

DRIVER = "gpu.fracgpu.dev"
REPO_ROOT = Path(__file__).resolve().parents[4]

GET_INFO = "/pluginregistration.Registration/GetInfo"
NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
V1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
V1_UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
V1BETA1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
V1BETA1_UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
HEALTH_V1ALPHA1 = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
HEALTH_V1 = "/v1.DRAResourceHealth/NodeWatchResources"

TIMEOUT = 5.0
HEALTH = [ReportedHealth("node-a", "gpu-0", True), ReportedHealth("node-a", "gpu-1", False, "X" * 2000)]


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    # Short path: a Unix socket path must stay under 108 bytes.
    d = Path(tempfile.mkdtemp(prefix="fg", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def preparer() -> FakePreparer:
    return FakePreparer()


@pytest.fixture
def server(kubelet_dir: Path, preparer: FakePreparer) -> Iterator[PluginServer]:
    srv = PluginServer(DRIVER, preparer, lambda: list(HEALTH), kubelet_dir=kubelet_dir, health_interval=0.2)
    with srv:
        yield srv


def _channel(path: Path) -> Any:
    """A channel the way the kubelet opens it: ``unix:<absolute path>``, insecure."""
    return grpc.insecure_channel("unix:" + str(path))


def _unary(path: Path, method: str, request: Any, response_cls: Any) -> Any:
    with _channel(path) as ch:
        call = ch.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        return call(request, timeout=TIMEOUT)


def _claims(module: Any, *names: str) -> list[Any]:
    return [module.Claim(namespace="ns", uid=f"uid-{n}", name=n) for n in names]


def _prepare(server: PluginServer, module: Any, method: str, *names: str) -> Any:
    req = module.NodePrepareResourcesRequest(claims=_claims(module, *names))
    return _unary(server.dra_socket, method, req, module.NodePrepareResourcesResponse)


def _unprepare(server: PluginServer, module: Any, method: str, *names: str) -> Any:
    req = module.NodeUnprepareResourcesRequest(claims=_claims(module, *names))
    return _unary(server.dra_socket, method, req, module.NodeUnprepareResourcesResponse)


def _is_socket(path: Path) -> bool:
    return stat.S_ISSOCK(path.lstat().st_mode)


# ---------------------------------------------------------------------------------------------------
# registration


def test_get_info(server: PluginServer, kubelet_dir: Path) -> None:
    info = _unary(
        server.registration_socket,
        GET_INFO,
        pluginregistration_pb2.InfoRequest(),
        pluginregistration_pb2.PluginInfo,
    )
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert list(SUPPORTED_VERSIONS) == list(info.supported_versions)
    endpoint = Path(info.endpoint)
    assert endpoint.is_absolute()
    assert endpoint == kubelet_dir / "plugins" / DRIVER / "dra.sock"
    assert _is_socket(endpoint)
    assert server.registration_socket == kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"
    assert _is_socket(server.registration_socket)


def test_notify_registration_status(server: PluginServer, caplog: pytest.LogCaptureFixture) -> None:
    assert not server.registered.is_set()
    assert server.registration_status is None

    def notify(ok: bool, error: str) -> None:
        req = pluginregistration_pb2.RegistrationStatus(plugin_registered=ok, error=error)
        resp = _unary(server.registration_socket, NOTIFY, req, pluginregistration_pb2.RegistrationStatusResponse)
        assert isinstance(resp, pluginregistration_pb2.RegistrationStatusResponse)

    notify(True, "")
    assert server.registered.is_set()
    assert server.registration_status == (True, "")

    with caplog.at_level(logging.ERROR, logger="kubelet_plugin.serving.grpc_server"):
        notify(False, "endpoint already registered")
    assert not server.registered.is_set()
    assert server.registration_status == (False, "endpoint already registered")
    assert "endpoint already registered" in caplog.text


# ---------------------------------------------------------------------------------------------------
# DRA v1 / v1beta1


def test_prepare_v1_returns_devices_with_share_id(server: PluginServer, preparer: FakePreparer) -> None:
    resp = _prepare(server, dra_v1_pb2, V1_PREPARE, "a", "b")
    assert set(resp.claims) == {"uid-a", "uid-b"}
    entry = resp.claims["uid-a"]
    assert entry.error == ""
    first, second = entry.devices
    assert list(first.request_names) == ["gpu"]
    assert (first.pool_name, first.device_name) == ("node-a", "gpu-0")
    assert list(first.cdi_device_ids) == ["k8s.gpu.fracgpu.dev/claim=uid-a-gpu-0-share"]
    assert first.HasField("share_id")
    assert first.share_id == "share-uid-a"
    assert not second.HasField("share_id")
    assert list(second.request_names) == []
    assert list(second.cdi_device_ids) == []
    assert preparer.prepared == [
        [ClaimRef(namespace="ns", uid="uid-a", name="a"), ClaimRef(namespace="ns", uid="uid-b", name="b")]
    ]


def test_prepare_v1beta1_has_no_share_id(server: PluginServer) -> None:
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    resp = _prepare(server, dra_v1beta1_pb2, V1BETA1_PREPARE, "a")
    (entry,) = resp.claims.values()
    assert entry.error == ""
    assert [d.device_name for d in entry.devices] == ["gpu-0", "gpu-1"]
    assert list(entry.devices[0].cdi_device_ids) == ["k8s.gpu.fracgpu.dev/claim=uid-a-gpu-0-share"]
    # Unknown fields would mean the server sent v1 bytes (with field 5) on the v1beta1 service.
    assert (
        entry.devices[0].SerializeToString()
        == dra_v1beta1_pb2.Device(
            request_names=["gpu"],
            pool_name="node-a",
            device_name="gpu-0",
            cdi_device_ids=["k8s.gpu.fracgpu.dev/claim=uid-a-gpu-0-share"],
        ).SerializeToString()
    )


@pytest.mark.parametrize(("module", "method"), [(dra_v1_pb2, V1_PREPARE), (dra_v1beta1_pb2, V1BETA1_PREPARE)])
def test_prepare_per_claim_error(server: PluginServer, module: Any, method: str) -> None:
    resp = _prepare(server, module, method, "a", "bad", "c")
    assert set(resp.claims) == {"uid-a", "uid-bad", "uid-c"}
    assert resp.claims["uid-bad"].error == "claim bad is not allocated"
    assert len(resp.claims["uid-bad"].devices) == 0
    for uid in ("uid-a", "uid-c"):
        assert resp.claims[uid].error == ""
        assert len(resp.claims[uid].devices) == 2


@pytest.mark.parametrize(("module", "method"), [(dra_v1_pb2, V1_PREPARE), (dra_v1beta1_pb2, V1BETA1_PREPARE)])
def test_prepare_exception_becomes_per_claim_errors(
    server: PluginServer, preparer: FakePreparer, module: Any, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    preparer.raise_exc = RuntimeError("api server unreachable")
    with caplog.at_level(logging.ERROR, logger="kubelet_plugin.serving.grpc_server"):
        resp = _prepare(server, module, method, "a", "b")  # no grpc.RpcError
    assert set(resp.claims) == {"uid-a", "uid-b"}
    for entry in resp.claims.values():
        assert "api server unreachable" in entry.error
        assert len(entry.devices) == 0
    assert "api server unreachable" in caplog.text


def test_prepare_missing_result_becomes_error(server: PluginServer) -> None:
    resp = _prepare(server, dra_v1_pb2, V1_PREPARE, "a", "lost")
    assert set(resp.claims) == {"uid-a", "uid-lost"}
    assert resp.claims["uid-a"].error == ""
    assert "uid-lost" in resp.claims["uid-lost"].error


def test_prepare_empty_request(server: PluginServer) -> None:
    resp = _prepare(server, dra_v1_pb2, V1_PREPARE)
    assert len(resp.claims) == 0


@pytest.mark.parametrize(("module", "method"), [(dra_v1_pb2, V1_UNPREPARE), (dra_v1beta1_pb2, V1BETA1_UNPREPARE)])
def test_unprepare_answers_every_uid(server: PluginServer, preparer: FakePreparer, module: Any, method: str) -> None:
    resp = _unprepare(server, module, method, "a", "bad", "lost")
    assert set(resp.claims) == {"uid-a", "uid-bad", "uid-lost"}
    assert resp.claims["uid-a"].error == ""
    assert resp.claims["uid-bad"].error == "busy"
    assert resp.claims["uid-lost"].error != ""
    assert [c.uid for c in preparer.unprepared[0]] == ["uid-a", "uid-bad", "uid-lost"]

    preparer.raise_exc = OSError("disk full")
    resp = _unprepare(server, module, method, "x", "y")
    assert set(resp.claims) == {"uid-x", "uid-y"}
    assert all("disk full" in e.error for e in resp.claims.values())


# ---------------------------------------------------------------------------------------------------
# health


@pytest.mark.parametrize(
    ("module", "method"), [(dra_health_v1_pb2, HEALTH_V1), (dra_health_v1alpha1_pb2, HEALTH_V1ALPHA1)]
)
def test_health_stream_delivers_device_list(server: PluginServer, module: Any, method: str) -> None:
    with _channel(server.dra_socket) as ch:
        watch = ch.unary_stream(
            method,
            request_serializer=module.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=module.NodeWatchResourcesResponse.FromString,
        )
        stream = watch(module.NodeWatchResourcesRequest(), timeout=TIMEOUT)
        t0 = time.monotonic()
        first = next(stream)
        second = next(stream)  # repeated after health_interval (0.2 s)
        elapsed = time.monotonic() - t0
        stream.cancel()
    assert elapsed < 2.0
    for resp in (first, second):
        got = [(d.device.pool_name, d.device.device_name, d.health) for d in resp.devices]
        assert got == [("node-a", "gpu-0", module.HEALTHY), ("node-a", "gpu-1", module.UNHEALTHY)]
        # the message says why; past the kubelet's 1024 characters it is cut as the kubelet would cut it
        assert [d.message for d in resp.devices] == ["", "X" * 1021 + "..."]
        for d in resp.devices:
            assert abs(d.last_updated_time - time.time()) < 60
            assert d.health_check_timeout_seconds >= 1


def test_health_stream_ends_when_server_stops(kubelet_dir: Path, preparer: FakePreparer) -> None:
    srv = PluginServer(DRIVER, preparer, lambda: list(HEALTH), kubelet_dir=kubelet_dir, health_interval=30)
    srv.start()
    received: list[Any] = []
    done = threading.Event()
    with _channel(srv.dra_socket) as ch:
        watch = ch.unary_stream(
            HEALTH_V1,
            request_serializer=dra_health_v1_pb2.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=dra_health_v1_pb2.NodeWatchResourcesResponse.FromString,
        )
        stream = watch(dra_health_v1_pb2.NodeWatchResourcesRequest(), timeout=TIMEOUT)
        received.append(next(stream))

        def drain() -> None:
            with contextlib.suppress(grpc.RpcError):
                received.extend(stream)
            done.set()

        threading.Thread(target=drain, daemon=True).start()
        t0 = time.monotonic()
        srv.stop(grace=2.0)
        assert done.wait(TIMEOUT)
        assert time.monotonic() - t0 < 3.0  # not the 30 s interval
    assert len(received[0].devices) == 2


# ---------------------------------------------------------------------------------------------------
# sockets


def test_stale_sockets_replaced_and_removed_on_stop(kubelet_dir: Path, preparer: FakePreparer) -> None:
    reg_dir = kubelet_dir / "plugins_registry"
    dra_dir = kubelet_dir / "plugins" / DRIVER
    reg_dir.mkdir(parents=True)
    dra_dir.mkdir(parents=True)
    stale_reg = reg_dir / f"{DRIVER}-reg.sock"
    stale_dra = dra_dir / "dra.sock"
    # A dead socket file left behind by a crashed instance, and a plain file.
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale_reg))
    stale_dra.write_text("stale")
    # Other plugins' sockets must survive start and stop.
    other_reg = reg_dir / "other.example.com-reg.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(other_reg))
    other_dra = dra_dir / "dra-someone-else.sock"
    other_dra.write_text("not ours")

    srv = PluginServer(DRIVER, preparer, lambda: [], kubelet_dir=kubelet_dir)
    srv.start()
    try:
        assert _is_socket(srv.registration_socket)
        assert _is_socket(srv.dra_socket)
        info = _unary(stale_reg, GET_INFO, pluginregistration_pb2.InfoRequest(), pluginregistration_pb2.PluginInfo)
        assert info.endpoint == str(stale_dra)
        assert _prepare(srv, dra_v1_pb2, V1_PREPARE, "a").claims["uid-a"].error == ""
    finally:
        srv.stop()
    assert not stale_reg.exists()
    assert not stale_dra.exists()
    assert _is_socket(other_reg)
    assert other_dra.read_text() == "not ours"
    srv.stop()  # idempotent


def test_dead_sockets_of_other_instances_are_removed_live_ones_kept(kubelet_dir: Path, preparer: FakePreparer) -> None:
    reg_dir = kubelet_dir / "plugins_registry"
    dra_dir = kubelet_dir / "plugins" / DRIVER
    reg_dir.mkdir(parents=True)
    dra_dir.mkdir(parents=True)
    dead = [reg_dir / f"{DRIVER}-old-pod-reg.sock", dra_dir / "dra-old-pod.sock"]  # a crashed rolling-update pod
    for path in dead:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    live = PluginServer(DRIVER, preparer, lambda: [], kubelet_dir=kubelet_dir, instance_id="live-pod")
    live.start()
    srv = PluginServer(DRIVER, preparer, lambda: [], kubelet_dir=kubelet_dir, instance_id="new-pod")
    srv.start()
    try:
        assert not any(p.exists() for p in dead)
        assert _is_socket(live.registration_socket) and _is_socket(live.dra_socket)
    finally:
        srv.stop()
        live.stop()


def test_stop_leaves_a_replaced_socket_alone(kubelet_dir: Path, preparer: FakePreparer) -> None:
    srv = PluginServer(DRIVER, preparer, lambda: [], kubelet_dir=kubelet_dir)
    srv.start()
    # Someone else (e.g. a newer instance with the same name) took over the path.
    os.unlink(srv.registration_socket)
    srv.registration_socket.write_text("newer")
    srv.stop()
    assert srv.registration_socket.read_text() == "newer"
    assert not srv.dra_socket.exists()


def test_instance_id_gives_distinct_sockets(kubelet_dir: Path, preparer: FakePreparer) -> None:
    uid1, uid2 = "0f6a2c1e-1111-4d2b-9c7e-a1b2c3d4e5f6", "0f6a2c1e-2222-4d2b-9c7e-a1b2c3d4e5f6"
    a = PluginServer(DRIVER, preparer, lambda: [], kubelet_dir=kubelet_dir, instance_id=uid1)
    b = PluginServer(DRIVER, preparer, lambda: [], kubelet_dir=kubelet_dir, instance_id=uid2)
    with a, b:
        assert a.registration_socket == kubelet_dir / "plugins_registry" / f"{DRIVER}-{uid1}-reg.sock"
        assert a.dra_socket == kubelet_dir / "plugins" / DRIVER / f"dra-{uid1}.sock"
        assert b.registration_socket == kubelet_dir / "plugins_registry" / f"{DRIVER}-{uid2}-reg.sock"
        assert b.dra_socket == kubelet_dir / "plugins" / DRIVER / f"dra-{uid2}.sock"
        for srv in (a, b):
            assert _is_socket(srv.registration_socket)
            assert _is_socket(srv.dra_socket)
            info = _unary(
                srv.registration_socket,
                GET_INFO,
                pluginregistration_pb2.InfoRequest(),
                pluginregistration_pb2.PluginInfo,
            )
            assert info.name == DRIVER
            assert info.endpoint == str(srv.dra_socket)
    for srv in (a, b):
        assert not srv.registration_socket.exists()
        assert not srv.dra_socket.exists()


def test_socket_path_too_long_is_rejected(preparer: FakePreparer) -> None:
    with pytest.raises(ValueError, match="longer than"):
        PluginServer(DRIVER, preparer, lambda: [], kubelet_dir=Path("/tmp") / ("x" * 100))


# ---------------------------------------------------------------------------------------------------
# generated code


def test_proto_packages_and_file_names() -> None:
    descriptors = [
        dra_v1_pb2.DESCRIPTOR,
        dra_v1beta1_pb2.DESCRIPTOR,
        dra_health_v1alpha1_pb2.DESCRIPTOR,
        dra_health_v1_pb2.DESCRIPTOR,
        pluginregistration_pb2.DESCRIPTOR,
    ]
    assert [d.package for d in descriptors] == [
        "k8s.io.kubelet.pkg.apis.dra.v1",
        "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        "v1alpha1",
        "v1",
        "pluginregistration",
    ]
    assert len({d.name for d in descriptors}) == len(descriptors)
    share_id = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert share_id.number == 5
    assert share_id.has_presence


def test_generated_code_is_not_stale() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kubelet_plugin.serving.proto.generate", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
