"""When a failed API request is sent again, and after how long: client-go's rules, as one pure function.

client-go (`k8s.io/client-go/rest`, which the upstream DRA helper library and every Go driver use) sends a
request again up to 10 times when the API server answers 429 or 5xx with `Retry-After`, waiting what it asks,
and a GET again, after 1 s, when its connection was reset. `retry_wait` keeps those rules, with these choices:

- **the server did not process it** (`ApiThrottled` 429: API Priority and Fairness rejects before the handler;
  `ApiUnavailable` 503; `ApiNoConnection`: no connection, nothing sent): any method is sent again. A write is
  retried only then, since only then did the server say it did not apply it;
- **an idempotent read** (GET) is also sent again after any other transient failure (`ApiServerError`, a lost
  connection, `ApiTimeout`); a write is not, as the server may have applied it (stricter than client-go, which
  also resends a write answered 5xx with `Retry-After`: a 500 or 504 timeout may have been applied);
- **the wait**: the server's `Retry-After` (or `retryAfterSeconds`), else `DEFAULT_WAIT_S` (client-go's
  1 s); a read that timed out is sent again at once (the time is spent already);
- **at most** `MAX_RETRIES` (10) times, and only within the caller's budget: a wait that does not fit in the
  time left is not waited (the caller gets the error, whose message names the wait asked).

A loop that keeps something in sync (a watch, a ledger pass) backs off after a failed round as client-go's
reflector does (`reflector_backoff`: 0.8 s doubling to 30 s, with jitter, never less than the wait asked).

Pure: imports only the error types.
"""

from api.kube_errors import (
    ApiError,
    ApiNoConnection,
    ApiServerError,
    ApiThrottled,
    ApiTimeout,
    ApiTransient,
    ApiUnavailable,
)

MAX_RETRIES = 10
"""client-go's `maxRetries` of a request."""
DEFAULT_WAIT_S = 1.0
"""The wait when the server named none (client-go's artificial `Retry-After: 1`)."""
READS = frozenset({"GET"})
"""The methods sent again after a failure that may have reached the handler (client-go: GET only)."""
REFLECTOR_FIRST_S = 0.8
REFLECTOR_MAX_S = 30.0
"""client-go's reflector backs off a failed list or watch from 800 ms, doubling, up to 30 s."""


def not_processed(err: ApiError) -> bool:
    """Whether the API server said it did not process the request (429, 503), or never got it."""
    return isinstance(err, ApiThrottled | ApiUnavailable | ApiNoConnection)


def retry_wait(method: str, err: ApiError, retries_done: int) -> float | None:
    """Seconds to wait before sending `method`'s request again after it failed with `err`, having been sent
    again `retries_done` times already; None: `err` is final (see the module doc). The caller checks the wait
    against its budget."""
    if retries_done >= MAX_RETRIES or not isinstance(err, ApiTransient):
        return None
    if not not_processed(err) and method.upper() not in READS:
        return None  # the server may have applied the write
    if isinstance(err, ApiTimeout):
        return 0.0
    return err.retry_after if err.retry_after is not None else DEFAULT_WAIT_S


def failure_kind(err: ApiError) -> str:
    """The `kind` label of a transient failure in the API metrics (`api.kube_metrics`)."""
    for kind, name in (
        (ApiThrottled, "throttled"),
        (ApiUnavailable, "unavailable"),
        (ApiServerError, "server_error"),
        (ApiNoConnection, "no_connection"),
        (ApiTimeout, "timeout"),
    ):
        if isinstance(err, kind):
            return name
    return "connection_lost"


def reflector_backoff(failures: int, err: ApiError | None = None, jitter: float = 0.0) -> float:
    """Seconds to wait after the `failures`-th failed round in a row of a sync loop: `REFLECTOR_FIRST_S`
    doubling per failure up to `REFLECTOR_MAX_S`, stretched by `jitter` (0 to 1: the caller's random draw, so
    the plugins of many nodes do not come back at once), and at least the wait `err` asked for."""
    delay = min(REFLECTOR_MAX_S, REFLECTOR_FIRST_S * 2.0 ** max(0, failures - 1)) * (1.0 + jitter)
    asked = err.retry_after if isinstance(err, ApiTransient) and err.retry_after is not None else 0.0
    return max(delay, asked)
