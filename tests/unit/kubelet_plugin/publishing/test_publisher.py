"""The slice publisher's list-and-watch loop under API pressure (kubelet_plugin/publishing/publisher.py), against
a fake API server on 127.0.0.1 (tests/unit/fake_apiserver.py): it lists and watches as client-go's reflector does."""

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.kube_rest import SLICES, node_path
from kubelet_plugin.publishing.publisher import SlicePublisher
from tests.unit.fake_apiserver import FakeApiServer, connection, serve, throttled
from tests.unit.plugin_host import GPUS, NODE, host_root, host_settings


@pytest.fixture
def api_server() -> Iterator[tuple[FakeApiServer, str]]:
    with serve() as running:
        yield running


def requests_of(api: FakeApiServer) -> list[str]:
    """Each request as `list`, `watch` (of the slices), `node` or a write's method, in order."""
    with api.lock:
        queries = list(api.queries)
    out = []
    for method, path, query in queries:
        if path == SLICES and method == "GET":
            out.append("watch" if "watch=true" in query else "list")
        elif path == node_path(NODE):
            out.append("node")
        else:
            out.append(method)
    return out


def test_a_throttled_watch_starts_again_from_its_resource_version_and_a_410_lists_again(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    api, host = api_server
    api.objects[node_path(NODE)] = json.dumps({"metadata": {"uid": "node-uid"}}).encode()
    api.objects[SLICES] = json.dumps({"metadata": {"resourceVersion": "7"}, "items": []}).encode()
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    api.streams[SLICES] = json.dumps(gone).encode() + b"\n"
    # the list and the create succeed; the watch is throttled past the client's 1 s budget (the server asks for 2 s)
    api.script[SLICES] = [(200, api.objects[SLICES], {}), (200, b"{}", {}), throttled("2")]
    settings = host_settings(tmp_path, host_root(tmp_path), api_timeout_seconds=1, resync_seconds=60)
    publisher = SlicePublisher(connection(host), settings, GPUS)
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(stop,), daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while requests_of(api).count("list") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
    took = time.monotonic() - started
    seen = requests_of(api)
    assert seen[:6] == ["node", "list", "POST", "watch", "watch", "node"], seen
    assert seen[6] == "list", "the 410 event lists again, as the reflector does"
    with api.lock:
        watches = [q for m, p, q in api.queries if p == SLICES and "watch=true" in q]
    assert all("resourceVersion=7" in q for q in watches[:2]), "the throttled watch resumes where the list left off"
    assert took >= 2, "it waited at least the 2 s the API server asked"
    thread.join(5)
