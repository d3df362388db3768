"""The node plugin's heartbeat (kubelet_plugin/publishing/heartbeat.py): one Lease apply per interval, errors survived."""

import datetime
import threading
from typing import Any, cast

from api.heartbeat import HEARTBEAT_LABEL, heartbeat_of, lease_name, leases_path, parse_time
from api.kube_errors import ApiError, api_error
from api.kube_rest import KubeRest
from api.names import DRIVER_NAME
from kubelet_plugin.publishing.heartbeat import FIELD_MANAGER, Heartbeat

T0 = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


class FakeRest:
    """Records server-side applies; `fail` makes the next ones raise in turn."""

    def __init__(self, stop: threading.Event, beats: int) -> None:
        self.applied: list[tuple[str, dict[str, Any], str]] = []
        self.fail: list[ApiError] = []
        self._stop, self._beats = stop, beats

    def apply(self, path: str, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        if len(self.applied) + 1 >= self._beats:
            self._stop.set()
        if self.fail:
            self.applied.append((path, {}, "failed"))
            raise self.fail.pop(0)
        self.applied.append((path, body, field_manager))
        return body


def test_the_plugin_renews_its_nodes_lease_every_interval_and_survives_a_failed_renewal() -> None:
    stop = threading.Event()
    rest = FakeRest(stop, beats=3)
    rest.fail = [api_error(503, "Service Unavailable")]
    ticks = iter(T0 + datetime.timedelta(seconds=s) for s in range(100))
    beat = Heartbeat(
        cast(KubeRest, rest), "fracgpu-system", "node-a", DRIVER_NAME, interval_s=0.01, clock=lambda: next(ticks)
    )
    beat.run(stop)
    paths = {p for p, _, _ in rest.applied}
    assert paths == {f"{leases_path('fracgpu-system')}/{lease_name('node-a')}"}
    (failed, first, second) = rest.applied  # the first renewal failed: tried again next interval
    assert failed[2] == "failed" and first[2] == second[2] == FIELD_MANAGER
    body = second[1]
    assert body["metadata"] == {"name": "fracgpu-plugin-node-a", "labels": {HEARTBEAT_LABEL: DRIVER_NAME}}
    assert body["spec"]["holderIdentity"] == "node-a" and body["spec"]["leaseDurationSeconds"] == 1
    assert body["spec"]["acquireTime"] == first[1]["spec"]["acquireTime"]  # held since the plugin started
    renewed = [parse_time(b["spec"]["renewTime"]) for _, b, _ in (first, second)]
    assert renewed[0] is not None and renewed[1] is not None and renewed[1] > renewed[0]
    assert heartbeat_of(body) == ("node-a", body["spec"]["renewTime"])
