"""The asyncio worker, and the calls it shares with the threaded one, on a
bad day: a handler's own CancelledError, plain handlers past their time
limit, a stop at once while a handler swallows its cancellation, a reject
whose reply was lost, another consumer's delivery in an *_available call,
an empty group name on the command line. Every test runs on a private
redis-server of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.servers import start_server

import rqueue
import rqueue.aio


@pytest.fixture
def server():
    s = start_server("redis")
    yield s
    s.stop()


# -- rqueue.aio.Worker ------------------------------------------------------------------


def test_aio_handler_raising_cancelled_error_does_not_wedge_the_worker(server):
    """A coroutine handler that raises CancelledError itself (it awaited a
    future something else cancelled; no one cancelled the worker) fails as
    any handler does: the message is nacked, and the handler task goes on
    with the next one (with concurrency=1, a task lost here would stop the
    worker for good)."""

    async def main() -> tuple[list[bytes], int]:
        client = await rqueue.aio.connect(server.url, prefix="a1", settings_ttl=0)
        q = client.queue("q")
        await q.publish_many([b"bad", b"m2", b"m3", b"m4"])
        runs: list[bytes] = []

        async def handler(d):
            runs.append(d.data)
            if d.data == b"bad" and d.delivery_count == 1:
                fut = asyncio.get_running_loop().create_future()
                fut.cancel()
                await fut  # CancelledError raised inside the handler, not a cancellation of the worker

        w = rqueue.aio.Worker(
            q, "g", handler, concurrency=1, heartbeat_interval=0.2, heartbeat_timeout=2, grace_period=1
        )
        t = asyncio.create_task(w.run(install_signal_handlers=False))
        for _ in range(60):
            await asyncio.sleep(0.1)
            if (await q.stats()).group("g").acked >= 3:
                break
        acked = (await q.stats()).group("g").acked
        w.stop(now=True)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(t, 5)
        await client.close()
        return runs, acked

    runs, acked = asyncio.run(main())
    # the three other messages are handled (the bad one raised: nacked or returned)
    assert acked >= 3, (runs, acked)


def test_aio_a_reject_sent_again_after_its_reply_was_lost_keeps_its_failure(server, monkeypatch):
    """A reject whose reply was lost is sent again and refused as already
    acked: the first attempt dead-lettered the message, so it counts as
    rejected and its failure result is kept, as nacks_done judges a nack."""
    import rqueue.engine.async_commands as acmd

    real = acmd.reject
    dropped: list[int] = []

    async def first_reply_lost(*args, **kwargs):
        if dropped:
            return await real(*args, **kwargs)
        dropped.append(1)
        await real(*args, **kwargs)
        raise rqueue.ConnectionLost("connection dropped after the call was applied")

    monkeypatch.setattr(acmd, "reject", first_reply_lost)

    async def main():
        client = await rqueue.aio.connect(server.url, prefix="rj", settings_ttl=0)
        await client.configure("q", results=True)
        q = client.queue("q")
        seq = (await q.publish(b"x")).seq

        async def handler(d):
            raise rqueue.Reject("no good")

        w = rqueue.aio.Worker(q, "g", handler, concurrency=1)
        t = asyncio.create_task(w.run(install_signal_handlers=False))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if (await q.stats()).dead_letters == 1 and w.stats.rejected + w.stats.late_settles == 1:
                break
        await asyncio.sleep(0.3)
        w.stop()
        await asyncio.wait_for(t, 10)
        try:
            r = await q.result(seq, timeout=0.5)
        except rqueue.ResultTimeout:
            r = None
        await client.close()
        return w.stats, r

    stats, result = asyncio.run(main())
    assert dropped
    assert (stats.rejected, stats.late_settles) == (1, 0), stats
    assert result is not None and result.failure is not None and result.failure.reason == "rejected"


# -- the command line --------------------------------------------------------------------

RQ = str(Path(sys.executable).with_name("rqueue"))


def rq(server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RQ, "--url", server.url, "--prefix", "cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        ["peek", "orders", "--group", ""],
        ["peek", "orders", "--group", "", "--json"],
        ["events", "orders", "--kind", "bogus"],  # inspect.py events: kinds never checked
        ["events", "orders", "--kind", "dead_lettered", "--json"],  # a misspelt kind: an empty list, exit 0
        ["events", "orders", "--kind", "bogus", "--follow", "--seconds", "0"],
    ],
)
def test_cli_bad_input_is_refused_naming_it(server, args):
    """An empty group name is refused by peek as by every other command,
    rather than read as no group."""
    client = rqueue.connect(server.url, prefix="cli", settings_ttl=0)
    try:
        q = client.queue("orders")
        q.publish_many([b"a", b"b"])
        q.consumer("g").close()
        p = rq(server, *args)
        assert p.returncode != 0, (p.stdout, p.stderr)
        assert "error" in p.stderr.lower(), p.stderr
        if args[0] == "events":  # refused as bad input, naming the kind and the kinds there are
            assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
            assert f"unknown event kind {args[3]!r}" in p.stderr and "dead-lettered" in p.stderr, p.stderr
    finally:
        client.close()


# -- settling through another consumer ----------------------------------------------------


def test_ack_available_reports_a_foreign_delivery_per_delivery(server):
    """ack_available (and nack_available, in_progress_available) give a
    status per delivery, so that one stale tag does not fail a batch: a
    delivery another consumer fetched is its own NotHeld, and the rest are
    acked."""
    client = rqueue.connect(server.url, prefix="fa", settings_ttl=0)
    try:
        q = client.queue("q")
        q.publish_many([b"a", b"b"])
        c1 = q.consumer("g", name="c1")
        c2 = q.consumer("g", name="c2")
        [mine] = c1.fetch(1)
        [theirs] = c2.fetch(1)
        statuses = c1.ack_available([mine, theirs])
        assert statuses[0] is None and isinstance(statuses[1], rqueue.NotHeld), statuses
        assert q.stats().group("g").acked == 1
    finally:
        client.close()


def test_aio_stop_now_ends_run_while_a_handler_swallows_its_cancellation(server):
    """A stop at once does not wait for a coroutine handler that swallows
    its cancellation: the worker has left the group, and the handler is
    left to end on its own."""

    async def main() -> float:
        client = await rqueue.aio.connect(server.url, prefix="sn", settings_ttl=0)
        q = client.queue("q")
        await q.publish(b"x")
        started = asyncio.Event()
        released = asyncio.Event()

        async def handler(d):
            started.set()
            while not released.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.1)

        w = rqueue.aio.Worker(q, "g", handler, concurrency=1, grace_period=1)
        t = asyncio.create_task(w.run(install_signal_handlers=False))
        await started.wait()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        w.stop(now=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(t), 8)
        took = loop.time() - t0
        released.set()  # the handler ends by itself now
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(t, 20)
        await client.close()
        return took

    assert asyncio.run(main()) < 5


def test_aio_plain_handlers_cut_off_at_their_limit_do_not_starve_later_messages(server):
    """A plain handler cut off at its time limit keeps its thread until it
    returns: later runs get threads of a new pool, so hung handlers never
    leave the others waiting for a thread (and timed out before they
    start)."""
    import os
    import threading

    pool = min(32, (os.cpu_count() or 1) + 4)

    async def main() -> tuple[list[bytes], int]:
        client = await rqueue.aio.connect(server.url, prefix="tp", settings_ttl=0)
        await client.configure("q", max_deliveries=2)
        q = client.queue("q")
        release = threading.Event()
        ran: list[bytes] = []

        def handler(d):
            ran.append(d.data)
            if d.data == b"hang":
                release.wait(60)  # a plain handler cannot be interrupted

        await q.publish_many([b"hang"] * pool)
        w = rqueue.aio.Worker(q, "g", handler, concurrency=2, time_limit=0.5)
        t = asyncio.create_task(w.run(install_signal_handlers=False))
        try:
            for _ in range(100):
                await asyncio.sleep(0.1)
                if ran.count(b"hang") >= pool:
                    break
            await q.publish_many([b"ok%d" % i for i in range(3)])
            for _ in range(60):
                await asyncio.sleep(0.1)
                if len([r for r in ran if r.startswith(b"ok")]) == 3:
                    break
            dead = [d for d in await q.dead_letters() if d.seq > pool]
        finally:
            release.set()
            w.stop()
            await asyncio.wait_for(t, 20)
            await client.close()
        return [r for r in ran if r.startswith(b"ok")], len(dead)

    oks, dead = asyncio.run(main())
    assert (sorted(oks), dead) == ([b"ok0", b"ok1", b"ok2"], 0)


def test_aio_worker_runs_concurrency_plain_handlers_at_once(server):
    """Plain handlers run on the worker's own pool of ``concurrency``
    threads, not on the loop's default pool, whose min(32, CPUs + 4)
    threads would cap them."""
    import threading
    import time

    async def main():
        client = await rqueue.aio.connect(server.url, prefix="pc", settings_ttl=0)
        q = client.queue("q")
        lock = threading.Lock()
        active = [0, 0]

        def handler(d):
            with lock:
                active[0] += 1
                active[1] = max(active[1], active[0])
            time.sleep(0.4)
            with lock:
                active[0] -= 1

        await q.publish_many([b"m"] * 24)
        w = rqueue.aio.Worker(q, "g", handler, concurrency=12, time_limit=0.7)
        t = asyncio.create_task(w.run(install_signal_handlers=False))
        for _ in range(80):
            await asyncio.sleep(0.1)
            if (await q.stats()).group("g").acked == 24:
                break
        w.stop()
        await asyncio.wait_for(t, 20)
        await client.close()
        return active[1], w.stats.timed_out

    most, timed_out = asyncio.run(main())
    assert (most, timed_out) == (12, 0)


HANGING_HANDLER = textwrap.dedent(
    """
    import asyncio, sys, threading, time
    import rqueue, rqueue.aio

    async def main(url, mode):
        client = await rqueue.aio.connect(url, prefix="p", settings_ttl=0)
        q = client.queue("q")
        await q.publish(b"hangs")
        started = threading.Event()

        def handler(d):  # a plain handler stuck in a call that never returns
            started.set()
            threading.Event().wait()

        w = rqueue.aio.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.2, heartbeat_timeout=2,
                              grace_period=0.2, time_limit=0.3 if mode == "limit" else None)
        task = asyncio.create_task(w.run(install_signal_handlers=False))
        while not started.is_set():
            await asyncio.sleep(0.01)
        if mode == "limit":
            while w.stats.timed_out < 1:
                await asyncio.sleep(0.01)
        w.stop()
        await asyncio.wait_for(task, 10)
        await client.close()
        print("run() returned", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    print("asyncio.run() returned", flush=True)
    """
)


@pytest.mark.parametrize("mode", ["limit", "stop"])
def test_a_process_whose_plain_handler_hangs_still_exits_after_run_returns(server, tmp_path, mode):
    """A plain handler cut off at its time limit keeps its thread until it
    returns, and one still running at the stop is left to end on its own
    (docs/aio.md): its thread is a daemon thread, so the process exits once
    run() returned, as the threaded worker's does."""
    script = tmp_path / "hang.py"
    script.write_text(HANGING_HANDLER)
    proc = subprocess.Popen(
        [sys.executable, str(script), server.url, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the process did not exit within 20 s after stop(); its output: {out!r}")
    assert "asyncio.run() returned" in out, (out, err[-2000:])
    assert proc.returncode == 0, (out, err[-2000:])


@pytest.mark.parametrize(
    ("stop_at_once", "grace_period", "reconnect_timeout"),
    [(True, 1, 5), (False, 0.2, 1)],
    ids=["stopped-at-once-meanwhile", "redis-gone-past-reconnect-timeout"],
)
def test_a_cancelled_run_raises_cancelled_error_while_redis_does_not_answer(
    stoppable_server, stop_at_once, grace_period, reconnect_timeout
):
    """A cancelled run() raises CancelledError after its shutdown (docs/aio.md,
    "Stopping") while Redis does not answer (SIGSTOPped): also when
    stop(now=True) cuts off the shutdown's call, or when the shutdown's leave
    gives up with ConnectionLost past reconnect_timeout (the failure is
    logged). A caller's asyncio.timeout(), TaskGroup or Task.cancel() sees
    the task cancelled."""

    async def main() -> BaseException | str:
        client = await rqueue.aio.connect(stoppable_server.url, prefix="c1", settings_ttl=0)
        q = client.queue("q")
        await q.publish_many([b"m%d" % i for i in range(20)])

        async def handler(d):
            await asyncio.sleep(0.05)

        w = rqueue.aio.Worker(
            q,
            "g",
            handler,
            concurrency=2,
            heartbeat_interval=0.2,
            heartbeat_timeout=2,
            grace_period=grace_period,
            reconnect_timeout=reconnect_timeout,
        )
        task = asyncio.create_task(w.run(install_signal_handlers=False))
        deadline = time.monotonic() + 10
        while w.stats.acked < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        os.kill(stoppable_server.process.pid, signal.SIGSTOP)  # Redis stops answering
        try:
            task.cancel()
            if stop_at_once:
                await asyncio.sleep(0.2)  # the shutdown is waiting on Redis now
                w.stop(now=True)
            try:
                await asyncio.wait_for(asyncio.shield(task), 15)
                outcome: BaseException | str = "returned"
            except asyncio.CancelledError as exc:
                outcome = exc
            except Exception as exc:
                outcome = exc
        finally:
            os.kill(stoppable_server.process.pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            await client.close()
        return outcome

    outcome = asyncio.run(main())
    assert isinstance(outcome, asyncio.CancelledError), f"run() ended with {outcome!r}, not CancelledError"


def test_a_second_cancel_of_run_does_not_drop_the_acks_of_the_round_under_way(stoppable_server, monkeypatch):
    """A cancelled run() lets the dispatcher's round under way end first, its
    acks applied (docs/aio.md, "Stopping"); a second cancel (asyncio.timeout,
    a TaskGroup or a server's lifespan cancelling again) stops as
    stop(now=True) does, which still lets the call under way finish: the
    handled message does not run again."""
    import rqueue.aio.consumer

    real = rqueue.aio.consumer.Consumer.ack_and_fetch
    carrying = asyncio.Event()

    async def slow(self, acks, n, wait=None, may_wait=False):  # a slow network, as test_twins' carrying
        acks = list(acks)
        if acks:
            carrying.set()
            await asyncio.sleep(0.2)
        return await real(self, acks, n, wait, may_wait)

    monkeypatch.setattr(rqueue.aio.consumer.Consumer, "ack_and_fetch", slow)
    runs: list[int] = []

    async def main() -> tuple[int, int]:
        client = await rqueue.aio.connect(stoppable_server.url, prefix="c2", settings_ttl=0)
        q = client.queue("q")

        async def handler(d):
            runs.append(d.seq)

        w = rqueue.aio.Worker(q, "g", handler, heartbeat_interval=0.2, heartbeat_timeout=2, grace_period=1)
        task = asyncio.create_task(w.run(install_signal_handlers=False))
        await q.publish(b"m")
        await asyncio.wait_for(carrying.wait(), 10)
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()  # a second cancel while the acks are on their way
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        # a second worker takes whatever the first handed back
        w2 = rqueue.aio.Worker(q, "g", handler, heartbeat_interval=0.2, heartbeat_timeout=2, grace_period=1)
        t2 = asyncio.create_task(w2.run(install_signal_handlers=False))
        await asyncio.sleep(1.0)
        w2.stop()
        await asyncio.wait_for(t2, 10)
        floor = (await q.stats()).group("g").ack_floor
        await client.close()
        return floor, w.stats.acked

    floor, acked = asyncio.run(main())
    assert runs == [1], f"the message ran {len(runs)} times: {runs} (first worker acked {acked})"


def test_a_second_cancel_during_the_grace_period_still_leaves_the_group(stoppable_server):
    """A second cancel of run() while its shutdown waits out the grace
    period stops at once, and the worker still leaves its group, handing
    back what runs (docs/aio.md, "Stopping"): nothing waits for another
    member's heartbeat to find this one silent."""

    async def main() -> tuple[int, list[str]]:
        client = await rqueue.aio.connect(stoppable_server.url, prefix="c4", settings_ttl=0)
        q = client.queue("q")
        await q.publish(b"slow")
        started = asyncio.Event()

        async def handler(d):
            started.set()
            await asyncio.sleep(5)

        w = rqueue.aio.Worker(
            q, "g", handler, concurrency=1, heartbeat_interval=0.2, heartbeat_timeout=30, grace_period=3
        )
        task = asyncio.create_task(w.run(install_signal_handlers=False))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()  # stop as stop() does: the handler gets its grace period
        await asyncio.sleep(0.3)
        task.cancel()  # a second cancel, during the grace period
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        g = (await q.stats()).group("g")
        await client.close()
        return g.in_flight, [c.name for c in g.consumers]

    in_flight, members = asyncio.run(main())
    assert in_flight == 0 and not members, f"the worker did not leave: members {members}, {in_flight} in flight"


def test_aio_a_heartbeat_finding_a_waiting_deliverys_state_damaged_says_so_loudly(server, caplog):
    """As the threaded worker's heartbeat (test_worker_faults): a waiting
    delivery whose state does not parse is not run, and said at ERROR."""
    import logging

    import redis as sync_redis
    from support.raw import group_key

    async def main() -> list[int]:
        client = await rqueue.aio.connect(server.url, prefix="a9", settings_ttl=0)
        q = client.queue("orders")
        await q.publish_many([b"m"] * 3)
        ran: list[int] = []
        busy, release = asyncio.Event(), asyncio.Event()

        async def handler(d):
            if d.seq == 1:
                busy.set()
                await release.wait()
            ran.append(d.seq)

        # Given one handler busy with message 1 while 2 and 3 wait, and the
        # delivery state of 2 overwritten with garbage
        w = rqueue.aio.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.05, prefetch=3)
        t = asyncio.create_task(w.run(install_signal_handlers=False))
        await asyncio.wait_for(busy.wait(), 10)
        raw = sync_redis.Redis.from_url(server.url)
        raw.hset(group_key(q, "g", "dlv"), 2, b"nonsense")
        raw.close()
        # When a heartbeat extends the waiting deliveries' leases
        deadline = time.monotonic() + 10
        while not any("2.1." in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        release.set()
        while len(ran) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        w.stop()
        await asyncio.wait_for(t, 10)
        await client.close()
        return ran

    caplog.set_level(logging.INFO, logger="rqueue.worker")
    ran = asyncio.run(main())
    # Then 2 is not run, and the log says why at ERROR: damage, not a lease that moved on
    assert ran == [1, 3]
    said = [r for r in caplog.records if "2.1." in r.getMessage()]
    assert said and said[0].levelno == logging.ERROR and "does not parse" in said[0].getMessage()
