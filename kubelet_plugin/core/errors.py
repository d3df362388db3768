"""Why a claim could not be prepared or unprepared: a closed set of kinds (the error metric's ``type`` label).

Code branches on ``PrepareError.kind``, never on message text; the message is for the kubelet and the user.
"""

from enum import StrEnum


class ErrorKind(StrEnum):
    """Kinds of claim errors; the value is the ``type`` label of ``fracgpu_plugin_errors_total``."""

    CLAIM_NOT_FOUND = "claim_not_found"
    UID_MISMATCH = "uid_mismatch"
    NOT_ALLOCATED = "not_allocated"
    UNDECODABLE = "undecodable"
    API_ERROR = "api_error"
    API_TIMEOUT = "api_timeout"
    API_THROTTLED = "api_throttled"
    LOCK_TIMEOUT = "lock_timeout"
    CHECKPOINT_TOO_NEW = "checkpoint_too_new"
    DEVICE_CHANGED = "device_changed"
    DEVICE_NODE_MISSING = "device_node_missing"
    UNKNOWN_DEVICE = "unknown_device"
    INVALID_CONFIG = "invalid_config"
    INVALID_NAME = "invalid_name"
    ENFORCEMENT_UNAVAILABLE = "enforcement_unavailable"
    DRIVER_EDITS = "driver_edits"
    MIG = "mig"
    STATUS_UPDATE = "status_update"
    INTERNAL = "internal"

    @property
    def claim_gone(self) -> bool:
        """The claim the kubelet named no longer exists (deleted, or replaced by one with another UID)."""
        return self in (ErrorKind.CLAIM_NOT_FOUND, ErrorKind.UID_MISMATCH)

    @property
    def api_unavailable(self) -> bool:
        """The API server did not answer, throttled or refused: other reads now would likely fail the same way."""
        return self in (ErrorKind.API_ERROR, ErrorKind.API_TIMEOUT, ErrorKind.API_THROTTLED)


class PrepareError(Exception):
    """A claim cannot be prepared (or unprepared); ``kind`` labels the error metric, the message goes to the
    kubelet."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
