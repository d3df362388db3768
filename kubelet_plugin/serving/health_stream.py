"""The kubelet's device health stream (DRA ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth``): each
stream sends the complete device list at once and then every interval, from a `HealthSource`."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc
from typing_extensions import override

from kubelet_plugin.serving.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
)

if TYPE_CHECKING:
    from kubelet_plugin.health.source import HealthSource

log = logging.getLogger(__name__)

DEFAULT_HEALTH_INTERVAL = 10.0
#: Kubelet's own default health timeout; a device not reported for this long turns Unknown.
KUBELET_DEFAULT_HEALTH_TIMEOUT_S = 30
#: The kubelet truncates a health message past this many characters (to 1021 and "...").
MAX_HEALTH_MESSAGE = 1024


class HealthStreams:
    """Produces the health stream shared by the v1 and v1alpha1 health services.

    Each stream sends the complete device list at once and then every ``interval`` seconds, until
    the client cancels or :meth:`close` is called. A failing health source skips that round (logged).
    """

    def __init__(self, source: HealthSource, interval: float = DEFAULT_HEALTH_INTERVAL) -> None:
        if interval <= 0:
            raise ValueError(f"health interval must be positive, got {interval}")
        self._source = source
        self._interval = interval
        self._timeout_s = max(KUBELET_DEFAULT_HEALTH_TIMEOUT_S, math.ceil(3 * interval))
        self._lock = threading.Lock()
        self._wakeups: set[threading.Event] = set()
        self._closed = False

    def close(self) -> None:
        """End all current streams promptly; new streams end right after their first message."""
        with self._lock:
            self._closed = True
            for ev in self._wakeups:
                ev.set()

    def _snapshot(self) -> dra_health_v1_pb2.NodeWatchResourcesResponse | None:
        try:
            devices = self._source()
        except Exception:
            log.exception("health source failed; skipping this health update")
            return None
        now = int(time.time())
        resp = dra_health_v1_pb2.NodeWatchResourcesResponse()
        for pool, device, healthy, message in devices:
            resp.devices.add(
                device=dra_health_v1_pb2.DeviceIdentifier(pool_name=pool, device_name=device),
                health=dra_health_v1_pb2.HEALTHY if healthy else dra_health_v1_pb2.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=self._timeout_s,
                message=message if len(message) <= MAX_HEALTH_MESSAGE else message[: MAX_HEALTH_MESSAGE - 3] + "...",
            )
        return resp

    def stream(self, context: grpc.ServicerContext) -> Iterator[dra_health_v1_pb2.NodeWatchResourcesResponse]:
        """Yield v1 responses for one RPC until it is cancelled or the streams are closed."""
        wakeup = threading.Event()
        if not context.add_callback(wakeup.set):
            return  # RPC already terminated
        with self._lock:
            if self._closed:
                wakeup.set()
            self._wakeups.add(wakeup)
        try:
            while True:
                snap = self._snapshot()
                if snap is not None:
                    yield snap
                if wakeup.wait(self._interval) or not context.is_active():
                    return
        finally:
            with self._lock:
                self._wakeups.discard(wakeup)


class DRAResourceHealthV1Servicer(dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth``."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    @override
    def NodeWatchResources(
        self, request: dra_health_v1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[dra_health_v1_pb2.NodeWatchResourcesResponse]:
        """Server stream of complete device health lists."""
        return self._streams.stream(context)


class DRAResourceHealthV1alpha1Servicer(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``: same messages as v1 (wire-identical), other package."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    @override
    def NodeWatchResources(
        self, request: dra_health_v1alpha1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[dra_health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        """Server stream of complete device health lists."""
        for resp in self._streams.stream(context):
            yield dra_health_v1alpha1_pb2.NodeWatchResourcesResponse.FromString(resp.SerializeToString())
