"""rqueue.aio.cutoff.within: a Redis call awaited for at most some seconds,
also when the call misses its cancellation (redis-py's connection setup
can, until its socket timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

import rqueue
from rqueue.aio.cutoff import within
from rqueue.aio.reconnect import AsyncReconnector
from rqueue.worker.stats import Tally, WorkerStats


async def stubborn(ended: list[str], runs_on: float = 2.0) -> str:
    """A call that misses its first cancellation and goes on for ``runs_on`` s."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(30)
    await asyncio.sleep(runs_on)
    ended.append("ended")
    return "late reply"


def test_a_call_answering_in_time_gives_its_reply():
    async def main() -> str:
        async def answer() -> str:
            await asyncio.sleep(0.01)
            return "reply"

        return await within(1, answer())

    assert asyncio.run(main()) == "reply"


def test_a_call_raising_in_time_raises_its_error():
    async def main() -> None:
        async def fail() -> None:
            raise rqueue.ConnectionLost("refused", applied=False)

        await within(1, fail())

    with pytest.raises(rqueue.ConnectionLost, match="refused"):
        asyncio.run(main())


def test_a_call_that_misses_its_cancellation_is_left_running_and_the_caller_goes_on():
    async def main() -> tuple[float, bool, list[str]]:
        ended: list[str] = []
        # given a call that goes on 2 s after it is cancelled
        began = time.monotonic()
        # when it is awaited for 0.05 s
        with pytest.raises(TimeoutError):
            await within(0.05, stubborn(ended))
        waited = time.monotonic() - began
        # then it ends on its own later, its reply dropped
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        deadline = time.monotonic() + 5
        while not ended and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return waited, bool(left), ended

    waited, left_running, ended = asyncio.run(main())
    assert waited < 1, f"the caller waited {waited:.2f} s"
    assert left_running
    assert ended == ["ended"]


def test_cancelling_the_caller_cancels_the_call_and_raises_cancelled_error_at_once():
    async def main() -> tuple[float, bool]:
        ended: list[str] = []
        cancelled = asyncio.Event()

        async def cancellable() -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        # given a caller awaiting a call that honours its cancellation, and one that misses it
        polite = asyncio.create_task(within(10, cancellable()))
        rude = asyncio.create_task(within(10, stubborn(ended)))
        await asyncio.sleep(0.05)
        began = time.monotonic()
        # when both callers are cancelled
        polite.cancel()
        rude.cancel()
        results = await asyncio.gather(polite, rude, return_exceptions=True)
        # then both raise CancelledError within the grace, and the polite call was cancelled
        assert all(isinstance(r, asyncio.CancelledError) for r in results), results
        return time.monotonic() - began, cancelled.is_set()

    took, call_cancelled = asyncio.run(main())
    assert took < 1
    assert call_cancelled


def test_the_workers_reconnector_cuts_off_a_call_that_misses_its_cancellation():
    async def main() -> tuple[float, BaseException | None]:
        ended: list[str] = []
        retry = AsyncReconnector(0.2, Tally(WorkerStats()))
        began = time.monotonic()
        try:
            await retry.call_once(stubborn, ended)
        except BaseException as exc:  # the outcome is what the test checks
            return time.monotonic() - began, exc
        return time.monotonic() - began, None

    took, error = asyncio.run(main())
    assert isinstance(error, rqueue.ConnectionLost), error
    assert took < 1.2, f"cut off after {took:.2f} s"


def test_calls_cut_off_while_redis_does_not_answer_end_in_time(stoppable_server):
    """Each call is cut off 1 ms in, mostly while redis-py sets up a new
    connection (its HELLO unanswered), where redis-py can miss the cancel."""

    async def main() -> list[float]:
        client = await rqueue.aio.connect(stoppable_server.url, prefix="cut")
        redis = client.redis
        await redis.ping()
        os.kill(stoppable_server.process.pid, signal.SIGSTOP)
        slowest: list[float] = []

        async def calls() -> None:
            for _ in range(150):
                began = time.monotonic()
                with contextlib.suppress(Exception):
                    await within(0.001, redis.hgetall("cut:x"))
                slowest.append(time.monotonic() - began)

        try:
            await asyncio.gather(*(calls() for _ in range(3)))
        finally:
            os.kill(stoppable_server.process.pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            await client.close()
        return slowest

    took = asyncio.run(main())
    # a call missing its cancel would hold its caller for the 30 s socket timeout
    assert max(took) < 3, f"a call held its caller {max(took):.2f} s"
