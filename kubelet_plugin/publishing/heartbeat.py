"""Renews this node's heartbeat Lease (`api/heartbeat.py`) while the plugin runs.

Only liveness: the Lease says nothing about GPUs, and stopping it (SIGTERM, a crash, an API server out of
reach) never touches the node's ResourceSlices. The controller marks the node's GPU objects not reporting
once the Lease has not been renewed for its `--plugin-heartbeat-timeout`.
"""

import datetime
import logging
import threading
from collections.abc import Callable

from api.heartbeat import lease_body, lease_name, leases_path
from api.kube_errors import ApiError
from api.kube_rest import KubeRest

log = logging.getLogger(__name__)
FIELD_MANAGER = "fracgpu-kubelet-plugin"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Heartbeat:
    """Server-side applies `node`'s Lease in `namespace` every `interval_s` (one request per beat)."""

    def __init__(
        self,
        rest: KubeRest,
        namespace: str,
        node: str,
        driver: str,
        *,
        interval_s: float,
        clock: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self._rest = rest
        self._path = f"{leases_path(namespace)}/{lease_name(node)}"
        self._node = node
        self._driver = driver
        self._interval = interval_s
        self._clock = clock
        self._started = clock()
        self._failing = False

    def beat(self) -> None:
        """Renew the Lease now (creating it when missing). Raises ApiError."""
        body = lease_body(
            self._node,
            self._driver,
            renewed=self._clock(),
            acquired=self._started,
            duration_seconds=max(1, round(3 * self._interval)),
        )
        self._rest.apply(self._path, body, FIELD_MANAGER)

    def renew(self) -> bool:
        """One beat; a failure is logged (once until one succeeds again). Whether it succeeded."""
        try:
            self.beat()
        except ApiError as err:
            if not self._failing:
                log.warning("cannot renew the heartbeat Lease", extra={"lease": self._path, "error": str(err)})
            self._failing = True
            return False
        if self._failing:
            log.info("heartbeat renewed again", extra={"lease": self._path})
        self._failing = False
        return True

    def keep(self, stop: threading.Event) -> None:
        """Beat every interval until `stop`, the first one an interval from now; a failed beat is retried at the
        next interval."""
        while not stop.wait(self._interval):
            self.renew()

    def run(self, stop: threading.Event) -> None:
        """Beat now, then every interval until `stop` (`renew`, `keep`)."""
        self.renew()
        self.keep(stop)
