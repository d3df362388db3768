"""Unit tests of the controller's work queue (controller/core/workqueue.py)."""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from controller.core.workqueue import QueueShutDownError, WorkQueue


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_a_queued_key_is_queued_once_and_order_is_kept() -> None:
    async def test() -> None:
        depths: list[int] = []
        queue: WorkQueue[str] = WorkQueue(on_depth=depths.append)
        for key in ("a", "b", "a", "c", "b"):
            queue.add(key)
        assert len(queue) == 3 and queue.queued() == {"a", "b", "c"}
        assert [await queue.get() for _ in range(3)] == ["a", "b", "c"]
        assert len(queue) == 0 and queue.processing() == {"a", "b", "c"}
        assert depths == [1, 2, 3, 2, 1, 0]

    run(test)


def test_on_wait_reports_the_time_from_first_queued_to_taken() -> None:
    async def test() -> None:
        now = [100.0]
        waits: list[float] = []
        queue: WorkQueue[str] = WorkQueue(on_wait=waits.append, clock=lambda: now[0])
        queue.add("a")
        now[0] = 101.0
        queue.add("b")
        queue.add("a")  # already queued: its wait still counts from its first add
        now[0] = 103.5
        assert [await queue.get(), await queue.get()] == ["a", "b"]
        assert waits == [3.5, 2.5]
        queue.add("a")  # held by a worker: queued again at done, and its wait counts from then
        now[0] = 104.0
        queue.done("a")
        now[0] = 104.25
        assert await queue.get() == "a"
        assert waits[-1] == 0.25

    run(test)


def test_a_key_added_while_processing_is_queued_again_at_done_not_before() -> None:
    async def test() -> None:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")
        key = await queue.get()
        queue.add("a")
        queue.add("a")
        assert len(queue) == 0, "never handed to a second worker while the first holds it"
        queue.done(key)
        assert queue.queued() == {"a"} and not queue.processing()
        assert await queue.get() == "a"
        queue.done("a")
        assert len(queue) == 0, "done without a new add does not queue it again"

    run(test)


def test_waiting_workers_are_woken_by_add_one_key_each() -> None:
    async def test() -> None:
        queue: WorkQueue[int] = WorkQueue()
        got: list[int] = []

        async def worker() -> None:
            got.append(await queue.get())

        workers = [asyncio.create_task(worker()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not got
        for key in (1, 2, 3):
            queue.add(key)
        await asyncio.wait_for(asyncio.gather(*workers), 1)
        assert sorted(got) == [1, 2, 3]

    run(test)


def test_retry_backs_off_exponentially_up_to_the_limit_and_forget_resets() -> None:
    async def test() -> None:
        queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.03, max_attempts=3)
        assert [queue.retry("a") for _ in range(3)] == [0.02, 0.03, 0.03]
        assert queue.attempts("a") == 3
        assert queue.retry("a") is None, "given up after max_attempts failures in a row"
        assert queue.attempts("a") == 0
        queue.retry("b")
        queue.forget("b")
        assert queue.attempts("b") == 0
        assert queue.retry("b") == 0.02, "after forget the backoff starts afresh"

    run(test)


def test_an_unlimited_retry_never_gives_up_and_waits_at_least_what_is_asked() -> None:
    async def test() -> None:
        queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.03, max_attempts=2)
        delays = [queue.retry("a", limited=False) for _ in range(50)]
        assert delays[:2] == [0.02, 0.03] and set(delays[2:]) == {0.03}, "no None: never given up"
        assert queue.retry("a", at_least=5.0, limited=False) == 5.0, "the wait the server asked wins"
        assert queue.retry("b", at_least=0.001) == 0.02, "the backoff wins when longer"
        queue.shutdown()

    run(test)


def test_a_retried_key_is_queued_after_its_delay() -> None:
    async def test() -> None:
        queue: WorkQueue[str] = WorkQueue(base_delay=0.05)
        queue.retry("a")  # 0.1 s
        await asyncio.sleep(0.03)
        assert len(queue) == 0
        assert await asyncio.wait_for(queue.get(), 1) == "a"

    run(test)


def test_shutdown_wakes_waiting_workers_and_drops_delayed_adds() -> None:
    async def test() -> None:
        queue: WorkQueue[str] = WorkQueue(base_delay=0.01)
        waiting = asyncio.create_task(queue.get())
        await asyncio.sleep(0.01)
        queue.add_after("late", 0.02)
        queue.shutdown()
        with pytest.raises(QueueShutDownError):
            await asyncio.wait_for(waiting, 1)
        await asyncio.sleep(0.05)
        queue.add("a")
        assert len(queue) == 0 and queue.is_shut_down
        with pytest.raises(QueueShutDownError):
            await queue.get()

    run(test)
