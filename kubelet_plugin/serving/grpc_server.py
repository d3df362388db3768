"""The node plugin's kubelet-facing gRPC servers: plugin registration (`registration`), DRA v1/v1beta1, device
health (`health_stream`), on the two Unix sockets of `PluginServer`.

Wire facts (packages, method paths, socket paths, registration handshake) are those of the kubelet's
DRA and plugin-registration APIs, as our protos in ``kubelet_plugin/serving/proto/`` spell them. The actual prepare/unprepare work is delegated to a
:class:`ClaimPreparer`; this module only translates between protobuf messages and the value types of
:mod:`kubelet_plugin.core.model` and guarantees the kubelet's response contract: every claim UID in a
request gets an entry in the response, and a failing preparer never fails the gRPC call.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

import grpc
from typing_extensions import override

from kubelet_plugin.core.model import ClaimRef, PreparedDevice, PrepareResult
from kubelet_plugin.serving import handover
from kubelet_plugin.serving.health_stream import (
    DEFAULT_HEALTH_INTERVAL,
    DRAResourceHealthV1alpha1Servicer,
    DRAResourceHealthV1Servicer,
    HealthStreams,
)
from kubelet_plugin.serving.proto import (
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2_grpc,
)
from kubelet_plugin.serving.registration import RegistrationServicer

if TYPE_CHECKING:
    from kubelet_plugin.health.source import HealthSource

log = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet")
#: Advertised in ``PluginInfo.supported_versions``; the kubelet picks the first DRA service it knows,
#: so v1 must come first. Health services are listed for kubelets that watch device health.
SUPPORTED_VERSIONS: tuple[str, ...] = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
#: sun_path of a Unix socket address holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


class ClaimPreparer(Protocol):
    """Does the node-side work for claims; called from gRPC worker threads, possibly concurrently.

    Implementations serialize themselves where needed. They may raise: an exception fails every
    claim of that call (each gets the error string), it never fails the gRPC call.
    """

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare ``claims``; returns claim UID -> result. A missing UID is reported as an error."""
        ...

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        """Unprepare ``claims``; returns claim UID -> error ("" = ok). A missing UID is an error."""
        ...


# --------------------------------------------------------------------------------------------------
# DRA services


def _claim_refs(claims: Iterable[dra_v1_pb2.Claim | dra_v1beta1_pb2.Claim]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def _call_prepare(preparer: ClaimPreparer, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
    """Run ``preparer.prepare`` and return exactly one result per requested UID."""
    try:
        results = preparer.prepare(claims)
    except Exception as exc:
        log.exception("NodePrepareResources failed for claims %s", [c.uid for c in claims])
        msg = f"prepare failed: {type(exc).__name__}: {exc}"
        return {c.uid: PrepareResult(error=msg) for c in claims}
    out: dict[str, PrepareResult] = {}
    for c in claims:
        res = results.get(c.uid)
        if res is None:
            log.error("preparer returned no result for claim %s/%s (%s)", c.namespace, c.name, c.uid)
            res = PrepareResult(error=f"driver returned no result for claim {c.uid}")
        out[c.uid] = res
    return out


def _call_unprepare(preparer: ClaimPreparer, claims: list[ClaimRef]) -> dict[str, str]:
    """Run ``preparer.unprepare`` and return exactly one error string per requested UID."""
    try:
        results = preparer.unprepare(claims)
    except Exception as exc:
        log.exception("NodeUnprepareResources failed for claims %s", [c.uid for c in claims])
        msg = f"unprepare failed: {type(exc).__name__}: {exc}"
        return {c.uid: msg for c in claims}
    out: dict[str, str] = {}
    for c in claims:
        err = results.get(c.uid)
        if err is None:
            log.error("preparer returned no result for claim %s/%s (%s)", c.namespace, c.name, c.uid)
            err = f"driver returned no result for claim {c.uid}"
        out[c.uid] = err
    return out


def _v1_device(d: PreparedDevice) -> dra_v1_pb2.Device:
    dev = dra_v1_pb2.Device(
        request_names=list(d.request_names),
        pool_name=d.pool_name,
        device_name=d.device_name,
        cdi_device_ids=list(d.cdi_device_ids),
    )
    if d.share_id is not None:
        dev.share_id = d.share_id
    return dev


def _v1beta1_device(d: PreparedDevice) -> dra_v1beta1_pb2.Device:
    return dra_v1beta1_pb2.Device(
        request_names=list(d.request_names),
        pool_name=d.pool_name,
        device_name=d.device_name,
        cdi_device_ids=list(d.cdi_device_ids),
    )


class DRAPluginV1Servicer(dra_v1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``: the preferred DRA service (carries share_id)."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    @override
    def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        """One entry per requested UID; devices are sent only for claims without error."""
        resp = dra_v1_pb2.NodePrepareResourcesResponse()
        for uid, res in _call_prepare(self._preparer, _claim_refs(request.claims)).items():
            entry = resp.claims[uid]
            if res.error:
                entry.error = res.error
            else:
                entry.devices.extend(_v1_device(d) for d in res.devices)
        return resp

    @override
    def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        """One entry per requested UID; ``error`` empty on success."""
        resp = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for uid, err in _call_unprepare(self._preparer, _claim_refs(request.claims)).items():
            resp.claims[uid].error = err
        return resp


class DRAPluginV1beta1Servicer(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin``: like v1, but without share_id."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    @override
    def NodePrepareResources(
        self, request: dra_v1beta1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        """One entry per requested UID; devices are sent only for claims without error."""
        resp = dra_v1beta1_pb2.NodePrepareResourcesResponse()
        for uid, res in _call_prepare(self._preparer, _claim_refs(request.claims)).items():
            entry = resp.claims[uid]
            if res.error:
                entry.error = res.error
            else:
                entry.devices.extend(_v1beta1_device(d) for d in res.devices)
        return resp

    @override
    def NodeUnprepareResources(
        self, request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        """One entry per requested UID; ``error`` empty on success."""
        resp = dra_v1beta1_pb2.NodeUnprepareResourcesResponse()
        for uid, err in _call_unprepare(self._preparer, _claim_refs(request.claims)).items():
            resp.claims[uid].error = err
        return resp


# --------------------------------------------------------------------------------------------------
# Server


def _unlink_if_dead(path: Path) -> None:
    """Remove a socket file of this driver that no process serves any more (an instance that died without
    cleaning up, e.g. during a rolling update); a live instance's socket is left alone."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return
    except FileNotFoundError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("removing stale socket file %s", path)
            path.unlink(missing_ok=True)
        except OSError:
            pass  # not a socket, or busy: not ours to judge


def _unlink_own(path: Path) -> None:
    """Remove a leftover file at one of our own socket paths; refuses to touch a directory."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"socket path {path} is a directory")
    log.info("removing stale socket file %s", path)
    path.unlink(missing_ok=True)


class PluginServer:
    """Serves the kubelet-facing gRPC APIs of one plugin instance on two Unix sockets.

    * DRA socket ``<kubelet_dir>/plugins/<driver>/dra.sock`` (``dra-<instance_id>.sock`` with an
      instance id): DRA v1 + v1beta1 and health v1 + v1alpha1.
    * Registration socket ``<kubelet_dir>/plugins_registry/<driver>-reg.sock``
      (``<driver>-<instance_id>-reg.sock``): ``pluginregistration.Registration``.

    ``instance_id`` (the pod UID) gives each instance its own sockets, so that during a rolling update
    two instances can be registered at once. :meth:`start` starts the DRA server before the
    registration server (the kubelet connects to the endpoint right after registration);
    :meth:`stop` stops both and removes only this instance's socket files. While the kubelet reports it
    registered (and until :meth:`withdraw`) the instance keeps a handover marker next to its DRA socket
    (:mod:`kubelet_plugin.serving.handover`), by which a terminating instance knows its replacement took over.
    """

    def __init__(
        self,
        driver_name: str,
        preparer: ClaimPreparer,
        health_source: HealthSource,
        *,
        kubelet_dir: Path = DEFAULT_KUBELET_DIR,
        instance_id: str | None = None,
        health_interval: float = DEFAULT_HEALTH_INTERVAL,
        max_workers: int = 8,
    ) -> None:
        if not driver_name or "/" in driver_name or driver_name.startswith("."):
            raise ValueError(f"invalid driver name {driver_name!r}")
        if instance_id is not None and (not instance_id or "/" in instance_id):
            raise ValueError(f"invalid instance id {instance_id!r}")
        self.driver_name = driver_name
        kubelet_dir = Path(os.path.abspath(kubelet_dir))
        suffix = f"-{instance_id}" if instance_id else ""
        self.registration_socket = kubelet_dir / "plugins_registry" / f"{driver_name}{suffix}-reg.sock"
        self.dra_socket = kubelet_dir / "plugins" / driver_name / f"dra{suffix}.sock"
        for p in (self.registration_socket, self.dra_socket):
            if len(os.fsencode(p)) > MAX_SOCKET_PATH_BYTES:
                raise ValueError(f"socket path longer than {MAX_SOCKET_PATH_BYTES} bytes: {p}")
        self._preparer = preparer
        self._health_source = health_source
        self._health_interval = health_interval
        self._health = HealthStreams(health_source, health_interval)  # validates the interval
        self._max_workers = max_workers
        self._withdrawn = False
        self._registration = RegistrationServicer(
            driver_name, self.dra_socket, SUPPORTED_VERSIONS, on_status=self._mark_registered
        )
        self._dra_server: Any = None
        self._reg_server: Any = None
        self._socket_ids: dict[Path, tuple[int, int]] = {}

    @property
    def registered(self) -> threading.Event:
        """Set while the kubelet's latest NotifyRegistrationStatus reported success."""
        return self._registration.registered

    @property
    def registration_status(self) -> tuple[bool, str] | None:
        """``(plugin_registered, error)`` last reported by the kubelet, None before any report."""
        return self._registration.last_status

    def _mark_registered(self, registered: bool) -> None:
        """Keep the handover marker in step with the kubelet's verdict (never again once withdrawn)."""
        handover.set_marker(self.dra_socket, registered and not self._withdrawn)

    def withdraw(self) -> None:
        """Stop counting as a replacement for other instances (SIGTERM); keeps serving the kubelet."""
        self._withdrawn = True
        handover.set_marker(self.dra_socket, False)

    @property
    def ready(self) -> bool:
        """Registered with the kubelet, serving, and not withdrawn: what the pod's readiness reports."""
        return self._dra_server is not None and self.registered.is_set() and not self._withdrawn

    def _serve(self, socket_path: Path, add: Callable[[Any], None], workers: int) -> Any:
        _unlink_own(socket_path)
        server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fracgpu-grpc"))
        add(server)
        if server.add_insecure_port("unix://" + str(socket_path)) == 0:
            raise RuntimeError(f"cannot listen on {socket_path}")
        server.start()
        st = socket_path.stat()
        self._socket_ids[socket_path] = (st.st_dev, st.st_ino)
        log.info("serving on %s", socket_path)
        return server

    def start(self) -> None:
        """Bind both sockets (replacing stale files of our own names) and start serving.

        Raises on failure, after stopping whatever had been started.
        """
        if self._dra_server is not None:
            raise RuntimeError("PluginServer already started")
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        for pattern, directory in (
            (f"{self.driver_name}-*reg.sock", self.registration_socket.parent),
            ("dra*.sock", self.dra_socket.parent),
        ):
            for path in directory.glob(pattern):
                _unlink_if_dead(path)
        handover.remove_dead_markers(self.dra_socket)
        self._withdrawn = False
        self._health = HealthStreams(self._health_source, self._health_interval)

        def add_dra(server: Any) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1Servicer(self._preparer), server)
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1Servicer(self._preparer), server)
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                DRAResourceHealthV1Servicer(self._health), server
            )
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                DRAResourceHealthV1alpha1Servicer(self._health), server
            )

        def add_reg(server: Any) -> None:
            pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self._registration, server)

        try:
            self._dra_server = self._serve(self.dra_socket, add_dra, self._max_workers)
            self._reg_server = self._serve(self.registration_socket, add_reg, 2)
        except BaseException:
            self.stop(grace=None)
            raise

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving (registration first, so the kubelet deregisters) and remove our socket files.

        ``grace``: seconds in-flight calls may still finish; health streams end at once. A socket
        path that now holds another file (e.g. a newer instance's socket) is left alone. Idempotent.
        """
        self._health.close()
        self.withdraw()
        for attr in ("_reg_server", "_dra_server"):
            server = getattr(self, attr)
            if server is not None:
                server.stop(grace).wait()
                setattr(self, attr, None)
        for path, ident in list(self._socket_ids.items()):
            try:
                st = path.lstat()
            except FileNotFoundError:
                pass
            else:
                if (st.st_dev, st.st_ino) == ident:
                    path.unlink(missing_ok=True)
            del self._socket_ids[path]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
