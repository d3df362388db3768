"""The errors of an API request, one type per kind of failure, parsed once from the API server's answer.

`api_error` reads the HTTP status, the API server's `Status` body (its `reason` and `details.causes`, never its
message) and the `Retry-After` header. Callers decide by type, never by the text of a message:

- `ApiNotFound` (404); `ApiConflict` (409), with `ApiAlreadyExists` (a create of a name that exists);
  `ApiGone` (410: a resourceVersion too old to watch or list from);
  `ApiUidMismatch` (an apply whose `metadata.uid` names an object that was replaced or deleted);
  `ApiForbidden` (403), with `ApiNamespaceTerminating` (a create in a namespace being deleted);
  `ApiAllocationImmutable` (422 on a ResourceClaim's `status.allocation`: see `UNWRITABLE_STATUS`);
- `ApiTransient`, the answers that say "not now" (`retry_after`: the wait the server asked, if any):
  `ApiThrottled` (429), `ApiServerError` (5xx) with `ApiUnavailable` (503), and `ApiUnreachable` (no answer:
  the connection was lost or TLS failed; status 0) with `ApiNoConnection` (no connection could be made, so
  nothing was sent) and `ApiTimeout` (no answer in time);
- `UndecodableResponse`: an answer whose body this client cannot decode.
  kube-apiserver stores, and serves byte for byte, opaque parameters (10 KiB at most) that Python's `json`
  cannot decode: arrays nested 5117 levels deep (objects 1706), past the decoder's recursion limit of about
  1000 levels, and strings that are not valid UTF-8;
- anything else (400, 401, 422, ...) is a plain `ApiError`.

Each kind has one message (`str(err)`), the one a user reads (in a prepare's error, an Event, a log line): what
happened, in words, with the API server's own message where it sent one, never a status of 0 or a transport
library's text. `api.kube_rest` adds how long it kept trying (`tries`, `seconds`) when it gave up, how many of those
tries the server throttled before a last failure of another kind (`throttled_tries`, with the longest wait it
asked), and, when the wait asked did not fit in the call's time, that it ran out (`out_of_time_after`), so a message
always tells a throttled call from an unreachable or hung server.

Imports nothing of the project: both components' API code and their tests use these types.
"""

import json
from typing import Any, NamedTuple


class ApiError(Exception):
    """A request failed: the API server answered with HTTP `status` (`reason`, and the answer's `body`), or
    (status 0, in `ApiUnreachable`) it did not answer. `message` is what the API server's `Status` says (else
    `reason`); `status_reason` and `causes` are its machine-readable `reason` and `details.causes`. `tries` and
    `seconds`: how many times the request was sent and how long the call took, when it was retried;
    `throttled_tries` and `longest_asked`: how many earlier tries were answered with a wait asked (429, 503 with
    `Retry-After`), and the longest; `out_of_time_after`: set when the call ended because the wait the server
    asked did not fit in its time, to the seconds after its start by which it had to end."""

    def __init__(
        self,
        status: int = 0,
        reason: str = "",
        body: str = "",
        *,
        status_reason: str = "",
        message: str = "",
        causes: tuple["Cause", ...] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, reason, body)
        self.status = status
        self.reason = reason
        self.body = body
        self.status_reason = status_reason
        self.message = message or reason
        self.causes = causes
        self.retry_after = retry_after
        self.tries = 1
        self.seconds = 0.0
        self.throttled_tries = 0
        self.longest_asked = 0.0
        self.out_of_time_after: float | None = None

    def __str__(self) -> str:
        return self.summary() + self.retried()

    def summary(self) -> str:
        """What happened, in one line: the kind's own message (subclasses), else the HTTP status and what the
        API server said."""
        if not self.status:
            return self.reason
        return f"the API server answered {self.status} {self.reason}{self.said()}"

    def retried(self) -> str:
        """How the call went, when it was retried or ran out of time, else nothing: `; tried N times in S s`, how
        many of those tries were throttled (when the last failure is of another kind), and that the wait asked
        did not fit in the call's time."""
        text = f"; tried {self.tries} times in {self.seconds:.1f} s" if self.tries > 1 else ""
        if self.throttled_tries:
            text += f", {self.throttled_tries} of them throttled (it asked to wait up to {self.longest_asked:g} s)"
        if self.out_of_time_after is not None:
            text = f"{text or '; tried once'}; the wait did not fit in the call's {self.out_of_time_after:.1f} s"
        return text

    def said(self) -> str:
        """`: <the API server's message>` when it sent one (not only the reason phrase), else nothing."""
        return f": {self.message}" if self.message and self.message != self.reason else ""


class ApiNotFound(ApiError):  # noqa: N818  # names the condition, as the API's own reasons do
    """404: the object (or its namespace, or the resource) does not exist."""

    def summary(self) -> str:
        return f"not found (404){self.said()}"


class ApiConflict(ApiError):  # noqa: N818
    """409: the write lost against the object's current state (a stale resourceVersion, a name that exists)."""

    def summary(self) -> str:
        return f"conflict (409){self.said()}"


class ApiAlreadyExists(ApiConflict):
    """409 `AlreadyExists`: a create of a name that is taken."""


class ApiUidMismatch(ApiError):  # noqa: N818
    """A server-side apply whose `metadata.uid` is a precondition found another object: one of the same name
    replaced the one it names (422, the cause on `metadata.uid`: a uid is immutable), or none is left to apply to
    (409 `uid mismatch`; a status subresource answers 404 instead: `ApiNotFound`). A forced apply has no field
    conflicts and the API server retries a stale resourceVersion itself, so that precondition is all a 409 to one
    can mean."""

    def summary(self) -> str:
        return f"the object was replaced or deleted ({self.status}: its uid is not the one applied){self.said()}"


class ApiAllocationImmutable(ApiError):  # noqa: N818
    """422 with a cause on `status.allocation`: the write would change a ResourceClaim's allocation, which no write
    may change once set. To a write that leaves the allocation alone (the driver's applies of `status.devices` and
    its conditions), it means what `UNWRITABLE_STATUS` says: no status write to that claim can succeed."""


UNWRITABLE_STATUS = (
    "the API server refuses every status write to this claim (422: status.allocation cannot be modified once set): "
    "its allocation copies the opaque parameters of spec.devices.config, stored byte for byte as sent, and each "
    "status write encodes them again as the API server writes JSON (compact, keys sorted), so they differ. The "
    "driver's mutating webhook rewrites them so at admission but did not for this claim (it was off or unreachable, "
    "the config is another driver's, or the claim predates it). Delete and create the claim again with its "
    "parameters sent as compact JSON with sorted keys, as kubectl apply and helm send them (one made from a "
    "ResourceClaimTemplate: fix the template, then recreate the pod)"
)
"""What `ApiAllocationImmutable` means to a write of a claim's status that leaves its allocation alone, and what to
do (one line, for an Event or a log line)."""


class Cause(NamedTuple):
    """One of a `Status`'s `details.causes`: its machine-readable reason and the field it is about."""

    reason: str
    field: str = ""


class ApiGone(ApiError):  # noqa: N818
    """410: the resourceVersion a watch or list asked for is too old (compacted): list again from now."""

    def summary(self) -> str:
        return f"gone (410: the resourceVersion is too old){self.said()}"


class ApiForbidden(ApiError):  # noqa: N818
    """403: the credentials may not do this (RBAC, an admission plugin)."""

    def summary(self) -> str:
        return f"forbidden (403){self.said()}"


class ApiNamespaceTerminating(ApiForbidden):
    """403 with the cause `NamespaceTerminating`: nothing new may be created in a namespace being deleted."""


class ApiTransient(ApiError):  # noqa: N818
    """The API server could not take the request now; the same request may succeed later, after `retry_after`
    seconds when the server said how long."""

    def wait_asked(self) -> str:
        return f"it asked to wait {self.retry_after:g} s" if self.retry_after is not None else "it named no wait"


class ApiThrottled(ApiTransient):
    """429: API Priority and Fairness (or a rate limit) rejected the request before processing it."""

    def summary(self) -> str:
        return f"throttled by the API server (429 Too Many Requests; {self.wait_asked()})"


class ApiServerError(ApiTransient):
    """5xx: the API server failed (an internal error, a timeout on its side, a storage problem)."""

    def summary(self) -> str:
        return f"API server error ({self.status} {self.reason}){self.said()}"


class ApiUnavailable(ApiServerError):  # noqa: N818
    """503: the API server (or an aggregated API behind it) is not serving now."""

    def summary(self) -> str:
        return f"API server unavailable (503 Service Unavailable; {self.wait_asked()}){self.said()}"


class ApiUnreachable(ApiTransient):
    """No answer from the API server: the connection was lost before an answer came, or TLS failed (status 0).
    `reason` says what happened to the connection, in words."""

    def __init__(self, reason: str) -> None:
        super().__init__(status=0, reason=reason)

    def summary(self) -> str:
        return f"API server unreachable: {self.reason}"


class ApiNoConnection(ApiUnreachable):
    """No connection to the API server could be made (refused, no route, no answer to connect): nothing was sent."""


class ApiTimeout(ApiUnreachable):
    """The API server did not answer within the request's time budget (status 0); a write may have been applied."""

    def summary(self) -> str:
        return f"timed out: {self.reason}"


class UndecodableResponse(ApiError):  # noqa: N818  # names the condition
    """The API server answered (`status` is its HTTP status) with a body this client cannot decode."""

    def summary(self) -> str:
        return self.reason


STATUS_REASON_ALREADY_EXISTS = "AlreadyExists"
CAUSE_NAMESPACE_TERMINATING = "NamespaceTerminating"
CAUSE_FIELD_MANAGER_CONFLICT = "FieldManagerConflict"
UID_FIELD = "metadata.uid"
ALLOCATION_FIELD = "status.allocation"
_BY_STATUS: dict[int, type[ApiError]] = {
    403: ApiForbidden,
    404: ApiNotFound,
    409: ApiConflict,
    410: ApiGone,
    429: ApiThrottled,
    503: ApiUnavailable,
}


def _seconds(value: object) -> float | None:
    try:
        seconds = float(str(value))
    except ValueError:
        return None  # an HTTP date, or garbage: no wait we can use
    return seconds if seconds >= 0 else None


def api_error(
    status: int,
    reason: str = "",
    body: str = "",
    retry_after: str | None = None,
    *,
    uid_precondition: bool = False,
) -> ApiError:
    """The error for an answer with HTTP `status` (reason phrase `reason`, body `body`, `Retry-After` header
    `retry_after`): its `Status` parsed once into the subclass that names it. `uid_precondition`: the request
    was a server-side apply naming `metadata.uid` (see `ApiUidMismatch`)."""
    try:
        decoded = json.loads(body) if body else None
    except (ValueError, RecursionError):
        decoded = None
    parsed: dict[str, Any] = decoded if isinstance(decoded, dict) and decoded.get("kind") == "Status" else {}
    details = parsed.get("details")
    if not isinstance(details, dict):
        details = {}
    causes = tuple(
        Cause(str(c.get("reason") or c.get("type") or ""), str(c.get("field") or ""))
        for c in details.get("causes") or []
        if isinstance(c, dict)
    )
    reasons = {c.reason for c in causes}
    status_reason = str(parsed.get("reason") or "")
    kind = _BY_STATUS.get(status, ApiServerError if status >= 500 else ApiError)
    if kind is ApiConflict and status_reason == STATUS_REASON_ALREADY_EXISTS:
        kind = ApiAlreadyExists
    elif uid_precondition and (
        (kind is ApiConflict and CAUSE_FIELD_MANAGER_CONFLICT not in reasons)
        or (status == 422 and any(c.field == UID_FIELD for c in causes))
    ):
        kind = ApiUidMismatch
    elif status == 422 and any(c.field == ALLOCATION_FIELD for c in causes):
        kind = ApiAllocationImmutable
    elif kind is ApiForbidden and CAUSE_NAMESPACE_TERMINATING in reasons:
        kind = ApiNamespaceTerminating
    wait = _seconds(retry_after) if retry_after is not None else _seconds(details.get("retryAfterSeconds"))
    return kind(
        status=status,
        reason=reason,
        body=body,
        status_reason=status_reason,
        message=str(parsed.get("message") or ""),
        causes=causes,
        retry_after=wait if issubclass(kind, ApiTransient) else None,
    )
