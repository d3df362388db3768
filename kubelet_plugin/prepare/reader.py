"""Reading the claims of a kubelet call from the API server: each claim, or that claim's PrepareError.

A read checks that the claim is the one the kubelet means (same UID) and that it is allocated. The claims of
one call are read at once on a small pool, each within the API budget (``api_timeout_seconds``, retries
included, `api.kube_retry`): a server that hangs or cannot be reached costs a read no more. A 429 or 503 naming a
wait (API Priority and Fairness, a server that asks to come back later: the request was not applied) is waited out
as asked past that budget, up to the call's read deadline (`read_all`'s `deadline`: the prepare's, see the
preparer's Deadlines), as client-go waits what it is told within the kubelet's deadline. A read that has not
answered by its end is that claim's error and delays no other claim.

A failed read's message is the API error's own (one per kind, `api.kube_errors`: throttled with the wait asked
and the tries, or unreachable, or timed out, with the tries throttled before) after
``cannot read ResourceClaim <namespace>/<name>:``; a transient one adds ``; the kubelet retries``.
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from api.kube_errors import ApiError, ApiNotFound, ApiThrottled, ApiTimeout, ApiTransient, UndecodableResponse
from api.kube_rest import KubeRest, claim_path
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import ClaimRef

log = logging.getLogger(__name__)

#: Claims of one call read at once; more wait for a free reader (within the same API budget).
FETCH_WORKERS = 16
#: Past a read's end, how long a prepare still waits for it to report its own error.
FETCH_GRACE_S = 0.5


def show(ref: ClaimRef) -> str:
    """``namespace/name`` of a claim, for messages."""
    return f"{ref.namespace}/{ref.name}"


def no_answer(ref: ClaimRef, budget: float) -> str:
    """The message of a read the API server did not answer within `budget` seconds."""
    return (
        f"cannot read ResourceClaim {show(ref)}: timed out: the API server did not answer within "
        f"{round(budget, 1):g} s; "
        "the kubelet retries"
    )


def _kind(err: ApiError) -> ErrorKind:
    if isinstance(err, ApiThrottled):
        return ErrorKind.API_THROTTLED
    if isinstance(err, ApiTimeout):
        return ErrorKind.API_TIMEOUT
    return ErrorKind.API_ERROR


class ClaimReader:
    """GETs ResourceClaims through a bounded client; see the module docstring."""

    def __init__(self, rest: KubeRest, budget_s: float) -> None:
        self._rest = rest
        self._budget = budget_s
        self._pool = ThreadPoolExecutor(max_workers=FETCH_WORKERS, thread_name_prefix="fracgpu-fetch")

    def read_all(
        self, claims: list[ClaimRef], deadline: float | None = None
    ) -> dict[str, dict[str, Any] | PrepareError]:
        """By UID, each claim or its error. `deadline` (``time.monotonic``): until when a read may wait what the
        API server asks (and by when every read ends); None: within the API budget only. Returns by the reads'
        end plus a short grace."""
        rest = self._rest if deadline is None else self._rest.until(deadline)
        if len(claims) == 1:  # no pool hand-off for the common single claim: the read is bounded by itself
            return {claims[0].uid: self._read_one(claims[0], rest)}
        limit = self._budget if deadline is None else max(0.0, deadline - time.monotonic())
        futures = {ref.uid: self._pool.submit(self._read_one, ref, rest) for ref in claims}
        wait(futures.values(), timeout=limit + FETCH_GRACE_S)
        fetched: dict[str, dict[str, Any] | PrepareError] = {}
        for ref in claims:
            future = futures[ref.uid]
            if future.done():
                fetched[ref.uid] = future.result()
            else:
                future.cancel()  # still queued behind hung reads, or hung itself: it ends by its own timeout
                fetched[ref.uid] = PrepareError(ErrorKind.API_TIMEOUT, no_answer(ref, limit))
        return fetched

    def _read_one(self, ref: ClaimRef, rest: KubeRest) -> dict[str, Any] | PrepareError:
        """`read`, with any error, expected or not, returned as this claim's PrepareError."""
        try:
            return self.read(ref, rest)
        except PrepareError as err:
            return err
        except Exception as err:
            log.error("unexpected error reading a claim", exc_info=err, extra={"claim": show(ref)})
            return PrepareError(
                ErrorKind.INTERNAL, f"cannot read ResourceClaim {show(ref)}: {type(err).__name__}: {err}"
            )

    def read(self, ref: ClaimRef, rest: KubeRest | None = None) -> dict[str, Any]:
        """GET the claim (through `rest`, default: the reader's, within the API budget); check it is the one the
        kubelet means and that it is allocated. Raises PrepareError."""
        try:
            claim = (rest or self._rest).get(claim_path(ref.namespace, ref.name))
        except UndecodableResponse as err:
            raise PrepareError(
                ErrorKind.UNDECODABLE,
                f"ResourceClaim {show(ref)} cannot be read: {err.reason}; delete the claim and create it "
                "again (or fix its ResourceClaimTemplate) with valid parameters",
            ) from None
        except ApiNotFound:
            raise PrepareError(ErrorKind.CLAIM_NOT_FOUND, f"ResourceClaim {show(ref)} not found") from None
        except ApiError as err:
            retries = "; the kubelet retries" if isinstance(err, ApiTransient) else ""
            raise PrepareError(_kind(err), f"cannot read ResourceClaim {show(ref)}: {err}{retries}") from None
        if claim["metadata"]["uid"] != ref.uid:
            raise PrepareError(
                ErrorKind.UID_MISMATCH,
                f"ResourceClaim {show(ref)} has UID {claim['metadata']['uid']}, not {ref.uid}: it was replaced",
            )
        if not (claim.get("status") or {}).get("allocation"):
            raise PrepareError(ErrorKind.NOT_ALLOCATED, f"ResourceClaim {show(ref)} is not allocated")
        return claim
