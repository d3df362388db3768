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
- **at most** `MAX_RETRIES` (10) times, and only within the caller's time (`CallTime`): a wait that does not fit
  in the time left is not waited (the caller gets the error, whose message names the wait asked).

**Two budgets** (`CallTime`). A call's own time (its attempts, and the waits it chooses itself: client-go's 1 s, the
resend of a lost read) is bounded by its `budget`, so a hung or unreachable server costs it no more than that. A
wait the server asked for a request it did not apply (`asked_wait`: 429, or 503, with `Retry-After`) is not the
call's own time: it moves the own budget's end on by the wait, up to the call's `hard` end (a budget of its own,
or a deadline such as the one the kubelet gives a prepare), as client-go waits what it is told within the
caller's context deadline.

A loop that keeps something in sync (a watch, a ledger pass) backs off after a failed round as client-go's
reflector does (`reflector_backoff`: 0.8 s doubling to 30 s, with jitter, never less than the wait asked).

Pure: imports only the error types.
"""

from dataclasses import dataclass

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


def asked_wait(err: ApiError) -> float | None:
    """The wait the API server asked for a request it did not apply (429 or 503 with `Retry-After` or
    `retryAfterSeconds`), else None: the waits that count against a call's hard end, not its own budget."""
    if isinstance(err, ApiThrottled | ApiUnavailable) and err.retry_after is not None:
        return err.retry_after
    return None


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


@dataclass
class CallTime:
    """When one call must end, on the caller's monotonic clock (see the module doc's two budgets).

    `own`: the end of the call's own time, moved on by each wait the server asked for (`waited`); `hard`: the end
    of the whole call, waits asked included. `own` never passes `hard`."""

    began: float
    own: float
    hard: float

    @classmethod
    def start(cls, now: float, budget: float, asked_budget: float, deadline: float | None = None) -> "CallTime":
        """A call beginning at `now`: its own time `budget`; the whole call at most `asked_budget` (at least
        `budget`), or until `deadline` when given (the caller's deadline, which also cuts `budget`)."""
        hard = deadline if deadline is not None else now + max(budget, asked_budget)
        return cls(began=now, own=min(now + budget, hard), hard=hard)

    def attempt_timeout(self, now: float, timeout: float, least: float) -> float:
        """An attempt's timeout at `now`: `timeout`, cut to the call's time left (at least `least`)."""
        return max(least, min(timeout, self.own - now, self.hard - now))

    def end_after(self, wait: float, asked: bool) -> float:
        """When the call must end if it waits `wait` s (`asked`: the server asked for it): the earlier end."""
        return min(self.own + wait if asked else self.own, self.hard)

    def fits(self, now: float, wait: float, asked: bool, least: float) -> bool:
        """Whether waiting `wait` s at `now` (`asked`: the server asked for it) still leaves an attempt of at least
        `least` s before the call must end."""
        return now + wait + least <= self.end_after(wait, asked)

    def waited(self, wait: float, asked: bool) -> None:
        """Record a wait made: one the server asked for moves the own end on (never past `hard`)."""
        if asked:
            self.own = min(self.own + wait, self.hard)


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
