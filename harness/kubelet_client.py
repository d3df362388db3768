"""A gRPC client that speaks to a DRA plugin exactly as the kubelet does (the kubelet's method paths).

Used by integration tests and benchmarks in place of a kubelet when no node runs one.
"""

from pathlib import Path
from typing import Any

import grpc

from kubelet_plugin.serving.proto import dra_health_v1_pb2, dra_v1_pb2, pluginregistration_pb2

PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
GET_INFO = "/pluginregistration.Registration/GetInfo"
NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
WATCH_HEALTH = "/v1.DRAResourceHealth/NodeWatchResources"
KUBELET_CALL_TIMEOUT_S = 45.0


class KubeletClient:
    """Registers with a plugin through its registration socket, then calls its DRA v1 service."""

    def __init__(self, registration_socket: Path) -> None:
        self._registration = grpc.insecure_channel(f"unix:{registration_socket}")
        self._dra: grpc.Channel | None = None
        self.info: Any = None

    def register(self, timeout: float = 30) -> Any:
        """GetInfo, connect to the advertised endpoint, report success; return the PluginInfo."""
        get_info = self._registration.unary_unary(
            GET_INFO,
            request_serializer=pluginregistration_pb2.InfoRequest.SerializeToString,
            response_deserializer=pluginregistration_pb2.PluginInfo.FromString,
        )
        # like the kubelet's retries: a socket file may be a stale one until the plugin re-creates it
        self.info = get_info(pluginregistration_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True)
        self._dra = grpc.insecure_channel(f"unix:{self.info.endpoint}")
        notify = self._registration.unary_unary(
            NOTIFY,
            request_serializer=pluginregistration_pb2.RegistrationStatus.SerializeToString,
            response_deserializer=pluginregistration_pb2.RegistrationStatusResponse.FromString,
        )
        notify(pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=10)
        return self.info

    def _dra_call(self, method: str, request_type: Any, response_type: Any) -> Any:
        assert self._dra is not None, "register() first"
        return self._dra.unary_unary(
            method, request_serializer=request_type.SerializeToString, response_deserializer=response_type.FromString
        )

    def prepare(self, claims: list[tuple[str, str, str]]) -> Any:
        """NodePrepareResources for (namespace, uid, name) triples; returns the response message."""
        call = self._dra_call(PREPARE, dra_v1_pb2.NodePrepareResourcesRequest, dra_v1_pb2.NodePrepareResourcesResponse)
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        return call(request, timeout=KUBELET_CALL_TIMEOUT_S)

    def unprepare(self, claims: list[tuple[str, str, str]]) -> Any:
        """NodeUnprepareResources for (namespace, uid, name) triples; returns the response message."""
        call = self._dra_call(
            UNPREPARE, dra_v1_pb2.NodeUnprepareResourcesRequest, dra_v1_pb2.NodeUnprepareResourcesResponse
        )
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        return call(request, timeout=KUBELET_CALL_TIMEOUT_S)

    def health(self, timeout: float = 30) -> dict[str, bool]:
        """The first message of the v1 health stream, as device name -> healthy (the kubelet's view)."""
        return {device: healthy for device, (healthy, _) in self.health_report(timeout).items()}

    def health_report(self, timeout: float = 30) -> dict[str, tuple[bool, str]]:
        """The first message of the v1 health stream, as device name -> (healthy, message)."""
        assert self._dra is not None, "register() first"
        watch = self._dra.unary_stream(
            WATCH_HEALTH,
            request_serializer=dra_health_v1_pb2.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=dra_health_v1_pb2.NodeWatchResourcesResponse.FromString,
        )
        stream = watch(dra_health_v1_pb2.NodeWatchResourcesRequest(), timeout=timeout)
        try:
            first = next(iter(stream))
        finally:
            stream.cancel()
        return {d.device.device_name: (d.health == dra_health_v1_pb2.HEALTHY, d.message) for d in first.devices}

    def close(self) -> None:
        self._registration.close()
        if self._dra is not None:
            self._dra.close()
