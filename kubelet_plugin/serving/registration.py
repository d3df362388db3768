"""The plugin-registration service (``pluginregistration.Registration``) the kubelet calls on the registry socket:
what the plugin is, where its DRA socket is, and the kubelet's verdict."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
from typing_extensions import override

from kubelet_plugin.serving.proto import pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)
PLUGIN_TYPE = "DRAPlugin"


class RegistrationServicer(pluginregistration_pb2_grpc.RegistrationServicer):
    """``pluginregistration.Registration`` on the registry socket.

    ``registered`` is set when the kubelet reports success and cleared when it reports failure;
    ``on_status(registered)`` is called after each report.
    """

    def __init__(
        self,
        driver_name: str,
        endpoint: Path,
        supported_versions: Sequence[str],
        on_status: Callable[[bool], None] = lambda _: None,
    ) -> None:
        self._info = pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver_name,
            endpoint=str(endpoint),
            supported_versions=list(supported_versions),
        )
        self.registered = threading.Event()
        self._lock = threading.Lock()
        self._last_status: tuple[bool, str] | None = None
        self._on_status = on_status

    @property
    def last_status(self) -> tuple[bool, str] | None:
        """``(plugin_registered, error)`` of the kubelet's latest notification, None before any."""
        with self._lock:
            return self._last_status

    @override
    def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.PluginInfo:
        """Type "DRAPlugin", driver name, absolute DRA socket path, supported services (v1 first)."""
        resp = pluginregistration_pb2.PluginInfo()
        resp.CopyFrom(self._info)
        return resp

    @override
    def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        """Record the kubelet's verdict; a refusal is logged with the kubelet's error."""
        with self._lock:
            self._last_status = (request.plugin_registered, request.error)
            if request.plugin_registered:
                self.registered.set()
            else:
                self.registered.clear()
            self._on_status(request.plugin_registered)
        if request.plugin_registered:
            log.info("registered with the kubelet as %s", self._info.name)
        else:
            log.error("kubelet refused plugin registration of %s: %s", self._info.name, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()
