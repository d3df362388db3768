"""Handover between two plugin instances: the marker, replacement detection, and the SIGTERM wait of main."""

import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from harness.kubelet_client import KubeletClient
from kubelet_plugin.__main__ import hand_over
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.serving import handover
from kubelet_plugin.serving.grpc_server import PluginServer
from kubelet_plugin.serving.http_server import HttpEndpoint
from tests.unit.fake_preparer import FakePreparer

DRIVER = "gpu.fracgpu.dev"


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="fg", dir="/tmp"))  # short: socket paths stay under 108 bytes
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _server(kubelet_dir: Path, instance: str) -> PluginServer:
    srv = PluginServer(DRIVER, FakePreparer(), lambda: [], kubelet_dir=kubelet_dir, instance_id=instance)
    srv.start()
    return srv


def _register(srv: PluginServer) -> KubeletClient:
    kubelet = KubeletClient(srv.registration_socket)
    kubelet.register(timeout=5)
    return kubelet


def _settings(kubelet_dir: Path, instance: str, timeout: float) -> Settings:
    return Settings(node_name="n", kubelet_dir=kubelet_dir, instance_id=instance, handover_timeout_seconds=timeout)


def test_only_a_registered_live_other_instance_counts_as_replacement(kubelet_dir: Path) -> None:
    old, new = _server(kubelet_dir, "old"), _server(kubelet_dir, "new")
    try:
        assert handover.registered_replacements(old.dra_socket) == [], "serving but not registered yet"
        kubelet_old = _register(old)
        assert handover.registered_replacements(old.dra_socket) == [], "itself is no replacement"
        kubelet_new = _register(new)
        assert handover.registered_replacements(old.dra_socket) == [new.dra_socket]
        assert old.ready and new.ready
        new.withdraw()  # a terminating instance is no replacement
        assert handover.registered_replacements(old.dra_socket) == [] and not new.ready
        kubelet_old.close()
        kubelet_new.close()
    finally:
        new.stop()
        old.stop()
    assert not handover.marker_path(old.dra_socket).exists(), "stop removes the marker"


def test_a_marker_of_a_dead_instance_is_no_replacement_and_is_removed(kubelet_dir: Path) -> None:
    dra_dir = kubelet_dir / "plugins" / DRIVER
    dra_dir.mkdir(parents=True)
    dead = dra_dir / "dra-crashed.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))  # bound, never listening: what a SIGKILLed instance leaves
    handover.set_marker(dead, True)
    probe = dra_dir / "dra-me.sock"
    assert handover.registered_replacements(probe) == []
    srv = _server(kubelet_dir, "me")  # start() cleans up
    srv.stop()
    assert not handover.marker_path(dead).exists()


def test_sigterm_without_replacement_serves_until_the_bound(kubelet_dir: Path) -> None:
    old = _server(kubelet_dir, "old")
    kubelet = _register(old)
    waited = threading.Thread(target=hand_over, args=(old, None, _settings(kubelet_dir, "old", 3.0)))
    start = time.monotonic()
    waited.start()
    try:
        time.sleep(1.5)
        assert waited.is_alive(), "hand_over returned before its bound without a replacement"
        assert kubelet.prepare([("ns", "uid-1", "claim")]).claims["uid-1"].error == "", "serves during the wait"
        assert not old.ready, "not ready once terminating"
        waited.join(10)
        assert 3.0 <= time.monotonic() - start < 8
    finally:
        kubelet.close()
        old.stop()


def test_sigterm_with_a_registered_replacement_returns_promptly(kubelet_dir: Path) -> None:
    old, new = _server(kubelet_dir, "old"), _server(kubelet_dir, "new")
    kubelets = [_register(old)]
    done = threading.Event()

    def terminate() -> None:
        hand_over(old, None, _settings(kubelet_dir, "old", 30.0))
        done.set()

    waited = threading.Thread(target=terminate, daemon=True)
    try:
        waited.start()
        time.sleep(1)
        assert not done.is_set(), "the replacement is not registered yet"
        kubelets.append(_register(new))
        assert done.wait(5), "hand_over kept waiting although the replacement is registered"
        assert kubelets[0].prepare([("ns", "uid-2", "claim")]).claims["uid-2"].error == "", "old still serves"
    finally:
        for k in kubelets:
            k.close()
        new.stop()
        old.stop()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_readyz_follows_ready_and_a_busy_port_is_retried() -> None:
    with socket.socket() as holder:  # the instance being replaced holds the port (host network)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ready = threading.Event()
        endpoint = HttpEndpoint("127.0.0.1", port, CollectorRegistry(), ready.is_set)
        endpoint.start()
        time.sleep(1.5)
        assert not endpoint.bound.is_set()
    try:
        assert endpoint.bound.wait(5), "the endpoint did not bind once the port was free"
        assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 503
        ready.set()
        assert _get(f"http://127.0.0.1:{port}/readyz") == (200, "ok\n")
        assert _get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    finally:
        endpoint.close()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as an HTTP server binds
        again.bind(("127.0.0.1", port))  # close() freed the port for the replacement
