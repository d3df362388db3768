"""Reading the claims of a kubelet call from the API server: each claim, or that claim's PrepareError.

A read checks that the claim is the one the kubelet means (same UID) and that it is allocated. The claims of
one call are read at once on a small pool, each within the API budget (``api_timeout_seconds``, retries
included: a 429 or 503 is waited out as the API server asks while the wait fits in it, `api.kube_retry`): a
read that has not answered by then is that claim's error and delays no other claim.

A failed read's message is the API error's own (one per kind, `api.kube_errors`) after
``cannot read ResourceClaim <namespace>/<name>:``; a transient one adds ``; the kubelet retries``.
"""

import logging
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from api.kube_errors import ApiError, ApiNotFound, ApiThrottled, ApiTimeout, ApiTransient, UndecodableResponse
from api.kube_rest import KubeRest, claim_path
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import ClaimRef

log = logging.getLogger(__name__)

#: Claims of one call read at once; more wait for a free reader (within the same API budget).
FETCH_WORKERS = 16
#: Past the API budget, how long a prepare still waits for a read to report its own error.
FETCH_GRACE_S = 0.5


def show(ref: ClaimRef) -> str:
    """``namespace/name`` of a claim, for messages."""
    return f"{ref.namespace}/{ref.name}"


def no_answer(ref: ClaimRef, budget: float) -> str:
    """The message of a read the API server did not answer within `budget` seconds."""
    return (
        f"cannot read ResourceClaim {show(ref)}: timed out: the API server did not answer within {budget:g} s; "
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

    def read_all(self, claims: list[ClaimRef]) -> dict[str, dict[str, Any] | PrepareError]:
        """By UID, each claim or its error; returns within the API budget (plus a short grace)."""
        if len(claims) == 1:  # no pool hand-off for the common single claim: the read is bounded by itself
            return {claims[0].uid: self._read_one(claims[0])}
        futures = {ref.uid: self._pool.submit(self._read_one, ref) for ref in claims}
        wait(futures.values(), timeout=self._budget + FETCH_GRACE_S)
        fetched: dict[str, dict[str, Any] | PrepareError] = {}
        for ref in claims:
            future = futures[ref.uid]
            if future.done():
                fetched[ref.uid] = future.result()
            else:
                future.cancel()  # still queued behind hung reads, or hung itself: it ends by its own timeout
                fetched[ref.uid] = PrepareError(ErrorKind.API_TIMEOUT, no_answer(ref, self._budget))
        return fetched

    def _read_one(self, ref: ClaimRef) -> dict[str, Any] | PrepareError:
        """`read`, with any error, expected or not, returned as this claim's PrepareError."""
        try:
            return self.read(ref)
        except PrepareError as err:
            return err
        except Exception as err:
            log.error("unexpected error reading a claim", exc_info=err, extra={"claim": show(ref)})
            return PrepareError(
                ErrorKind.INTERNAL, f"cannot read ResourceClaim {show(ref)}: {type(err).__name__}: {err}"
            )

    def read(self, ref: ClaimRef) -> dict[str, Any]:
        """GET the claim; check it is the one the kubelet means and that it is allocated. Raises PrepareError."""
        try:
            claim = self._rest.get(claim_path(ref.namespace, ref.name))
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
