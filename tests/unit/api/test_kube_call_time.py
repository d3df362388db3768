"""A call's two budgets (api/kube_retry.py `CallTime`, used by api/kube_rest.py): a wait the API server asked for
(429, 503 with Retry-After) is waited out up to the call's hard end; a hung or unreachable server still costs the
call only its own budget; every failure says which of the two happened. On virtual time against the fake API server
(tests/unit/fake_apiserver.py)."""

from collections.abc import Iterator

import pytest

from api.kube_config import KubeConfig
from api.kube_errors import ApiNoConnection, ApiServerError, ApiThrottled, ApiTimeout, ApiUnavailable, api_error
from api.kube_rest import KubeConnection, KubeRest
from api.kube_retry import CallTime, asked_wait
from tests.unit.api.test_kube_rest import CLAIM, VirtualTime
from tests.unit.fake_apiserver import FakeApiServer, refused_url, serve, throttled, unavailable


@pytest.fixture
def api_server() -> Iterator[tuple[FakeApiServer, str]]:
    with serve() as running:
        yield running


def two_budgets(host: str, budget: float, asked_budget: float) -> tuple[KubeRest, VirtualTime]:
    clock = VirtualTime()
    conn = KubeConnection(KubeConfig(server=host))
    rest = KubeRest(
        conn, timeout=budget / 2, budget=budget, asked_budget=asked_budget, clock=clock.now, sleep=clock.sleep
    )
    return rest, clock


def test_only_a_429_or_503_naming_a_wait_is_a_wait_the_server_asked_for() -> None:
    assert asked_wait(api_error(429, "Too Many Requests", "", "8")) == 8.0
    assert asked_wait(api_error(503, "Service Unavailable", "", "3")) == 3.0
    assert asked_wait(api_error(429, "Too Many Requests")) is None, "no wait named: the client's own 1 s"
    assert asked_wait(api_error(500, "Internal Server Error", "", "1")) is None, "a 500 may have been applied"
    assert asked_wait(ApiNoConnection("refused")) is None


def test_call_time_moves_its_own_end_by_the_waits_asked_up_to_the_hard_end() -> None:
    ends = CallTime.start(100.0, budget=10.0, asked_budget=40.0)
    assert (ends.own, ends.hard) == (110.0, 140.0)
    assert not ends.fits(108.0, 3.0, asked=False, least=0.05), "a wait of its own counts against its 10 s"
    assert ends.fits(108.0, 8.0, asked=True, least=0.05), "a wait asked moves the own end on"
    ends.waited(8.0, asked=True)
    assert ends.own == 118.0
    ends.waited(30.0, asked=True)
    assert ends.own == 140.0, "never past the hard end"
    assert not ends.fits(135.0, 8.0, asked=True, least=0.05)
    assert ends.attempt_timeout(139.99, 5.0, least=0.05) == 0.05


def test_a_deadline_replaces_the_asked_budget_and_cuts_the_own_one() -> None:
    ends = CallTime.start(100.0, budget=10.0, asked_budget=10.0, deadline=135.0)
    assert (ends.own, ends.hard) == (110.0, 135.0)
    late = CallTime.start(130.0, budget=10.0, asked_budget=10.0, deadline=135.0)
    assert (late.own, late.hard) == (135.0, 135.0), "a call begun late ends with the caller's deadline"
    assert late.attempt_timeout(130.0, 5.0, least=0.05) == 5.0
    assert late.attempt_timeout(132.0, 5.0, least=0.05) == 3.0


def test_a_throttled_read_waits_as_told_past_its_own_budget_up_to_the_asked_one(
    api_server: tuple[FakeApiServer, str],
) -> None:
    api, host = api_server
    api.objects[CLAIM] = b'{"metadata": {"name": "c1"}}'
    api.script[CLAIM] = [throttled("8"), unavailable(8), throttled("8"), throttled("8")]
    rest, clock = two_budgets(host, budget=10, asked_budget=40)
    assert rest.get(CLAIM) == {"metadata": {"name": "c1"}}
    assert clock.slept == [8.0] * 4, "32 s of waits asked, past the 10 s budget of its own"

    api.script[CLAIM] = [throttled("8")] * 6
    with pytest.raises(ApiThrottled) as raised:
        rest.get(CLAIM)
    assert clock.slept[4:] == [8.0] * 4, "the fifth wait would pass the 40 s"
    assert str(raised.value) == (
        "throttled by the API server (429 Too Many Requests; it asked to wait 8 s); "
        f"tried 5 times in {raised.value.seconds:.1f} s; the wait did not fit in the call's 40.0 s"
    )


def test_until_gives_the_calls_of_a_copy_a_deadline_for_waits_asked(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    rest, clock = two_budgets(host, budget=10, asked_budget=10)
    bounded = rest.until(clock.now() + 20.0)
    assert bounded.connection is rest.connection and rest.deadline is None
    api.script[CLAIM] = [throttled("8")] * 3
    with pytest.raises(ApiThrottled) as raised:
        bounded.get(CLAIM)
    assert clock.slept == [8.0, 8.0], "16 s fit in the 20 s to the deadline, 24 s do not"
    assert raised.value.out_of_time_after is not None and 19.0 < raised.value.out_of_time_after <= 20.0

    api.script[CLAIM] = [throttled("30")]
    with pytest.raises(ApiThrottled) as once:
        rest.until(clock.now() + 20.0).get(CLAIM)
    assert str(once.value).endswith("it asked to wait 30 s); tried once; the wait did not fit in the call's 20.0 s")


def test_a_hung_server_costs_a_call_its_own_budget_only(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.objects[CLAIM] = b"{}"
    api.hang.add(CLAIM)
    rest, clock = two_budgets(host, budget=1, asked_budget=40)
    with pytest.raises(ApiTimeout) as raised:
        rest.get(CLAIM)
    assert raised.value.tries == 2, "two attempts of 0.5 s fill the 1 s budget; the 40 s are for waits asked only"
    assert clock.slept == [0.0] and raised.value.throttled_tries == 0, "a timed-out read is sent again at once"
    assert str(raised.value).startswith("timed out: ") and "throttled" not in str(raised.value)


def test_a_server_that_hangs_after_throttling_says_both(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.objects[CLAIM] = b"{}"
    api.script[CLAIM] = [throttled("8")]
    rest, clock = two_budgets(host, budget=1, asked_budget=40)
    clock.during_sleep = lambda: api.hang.add(CLAIM)
    with pytest.raises(ApiTimeout) as raised:
        rest.get(CLAIM)
    assert clock.slept == [8.0, 0.0], "after the wait asked, the 1 s of its own: two attempts that time out"
    assert raised.value.tries == 3 and raised.value.throttled_tries == 1
    assert str(raised.value) == (
        f"timed out: the API server at {host.removeprefix('http://')} did not answer within 0.5 s; "
        f"tried {raised.value.tries} times in {raised.value.seconds:.1f} s, 1 of them throttled "
        "(it asked to wait up to 8 s)"
    )


def test_an_unreachable_server_is_not_reported_as_throttled() -> None:
    rest, clock = two_budgets(refused_url(), budget=3, asked_budget=40)
    with pytest.raises(ApiNoConnection) as raised:
        rest.get(CLAIM)
    assert clock.slept == [1.0, 1.0], "client-go's 1 s is the call's own wait: within its 3 s"
    assert str(raised.value).startswith("API server unreachable: cannot connect to ")
    assert "throttled" not in str(raised.value) and "did not fit" not in str(raised.value)


def test_a_503_without_a_wait_counts_against_the_own_budget(api_server: tuple[FakeApiServer, str]) -> None:
    api, host = api_server
    api.script[CLAIM] = [unavailable()] * 5
    rest, clock = two_budgets(host, budget=3, asked_budget=40)
    with pytest.raises(ApiUnavailable) as raised:
        rest.get(CLAIM)
    assert clock.slept == [1.0, 1.0]
    assert isinstance(raised.value, ApiServerError) and raised.value.out_of_time_after is None
