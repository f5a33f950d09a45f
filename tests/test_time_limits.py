"""Handler time limits, in both workers: past its limit a run is nacked with
the reason timeout, its lease is no longer extended, its cancellation is
set, and whatever the handler does later never acks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time

import pytest
from support.servers import wait_for
from test_aio_worker import BACKENDS, BOTH, floor_reaches, in_flight, run_worker

import rqueue
import rqueue.aio
from rqueue.timelimits import TIME_LIMIT_HEADER, time_limit_for
from rqueue.worker import InProcess


@pytest.fixture
def live(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


def dead_headers(q: rqueue.Queue) -> dict[str, dict[str, str]]:
    return {m.headers["x-rq-seq"]: m.headers for m in q.dead_letter_queue.peek()}


@BACKENDS
@BOTH
def test_a_handler_past_its_limit_is_nacked_with_reason_timeout_and_never_acked(kind, live, backend, prefix):
    # given a slow message and a quick one, one delivery each, a 0.3 s limit
    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish_many([b"slow", b"quick"])
    release = threading.Event()
    saw_cancel = threading.Event()
    returned = threading.Event()

    def slow(d):
        # cooperative: waits on its cancellation, then lingers past it
        if rqueue.cancellation().wait(5):
            saw_cancel.set()
        release.wait(5)
        returned.set()

    async def handler(d):
        if d.data == b"slow":
            await asyncio.to_thread(slow, d)

    def sync_handler(d):
        if d.data == b"slow":
            slow(d)

    w = run_worker(kind, backend, prefix, q, sync_handler if kind == "threaded" else handler, time_limit=0.3)
    try:
        # when the slow one runs past its limit
        wait_for(lambda: dead_headers(q).get("1") is not None, timeout=10)
        # then it is dead-lettered (its one delivery failed) with the timeout
        # as its error, while its handler still runs: its lease is gone
        headers = dead_headers(q)["1"]
        assert headers["x-rq-error"] == "timeout: the handler ran past its time limit of 0.3 s"
        assert headers["x-rq-reason"] == "max-deliveries"
        assert saw_cancel.wait(5)
        assert not returned.is_set()
        wait_for(floor_reaches(q, "g", 2))
        assert in_flight(q) == 0
        # and when the handler returns at last, nothing is acked after the nack
        release.set()
        assert returned.wait(5)
        time.sleep(0.3)  # give a (wrong) late ack the time to go out
        assert q.stats().group("g").acked == 1
        assert w.stats.timed_out == 1 and w.stats.acked == 1 and w.stats.nacked == 1
    finally:
        release.set()
        w.stop()
        assert w.join(10)


@BACKENDS
@BOTH
def test_the_header_sets_one_messages_limit(kind, live, backend, prefix):
    # given no worker limit, a message with a 0.2 s header and one without
    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish(b"limited", headers={TIME_LIMIT_HEADER: "0.2"})
    q.publish(b"free")

    def handler(d):
        rqueue.cancellation().wait(0.6)  # past the header's limit, no other

    w = run_worker(kind, backend, prefix, q, handler)
    try:
        wait_for(floor_reaches(q, "g", 2), timeout=10)
        # then only the limited one timed out
        assert set(dead_headers(q)) == {"1"}
        assert dead_headers(q)["1"]["x-rq-error"].startswith("timeout:")
        assert q.stats().group("g").acked == 1
    finally:
        w.stop()
        assert w.join(10)


@BACKENDS
def test_a_thread_stuck_past_its_limit_is_replaced(live):
    # given one handler thread and a handler that ignores its cancellation
    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish_many([b"stuck", b"next"])
    release = threading.Event()
    ran = []

    def handler(d):
        ran.append(d.data)
        if d.data == b"stuck":
            release.wait(10)  # not the cancellation: only the limit frees the slot

    w = rqueue.Worker(q, "g", handler, concurrency=1, time_limit=0.2)
    w.start()
    try:
        # then the next message runs while the stuck one still blocks its thread
        wait_for(floor_reaches(q, "g", 2), timeout=10)
        assert ran == [b"stuck", b"next"]
        assert q.stats().group("g").acked == 1
    finally:
        release.set()
        w.stop()
        assert w.join(10)
    assert q.stats().group("g").acked == 1  # the stuck one's return acked nothing


@BACKENDS
def test_interrupt_raises_time_limit_exceeded_in_the_handler(live):
    # given a handler in a pure-Python loop and a worker that interrupts
    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish(b"spin")
    seen: list[BaseException] = []

    def handler(d):
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                pass
        except BaseException as exc:
            seen.append(exc)
            raise

    w = rqueue.Worker(q, "g", handler, time_limit=0.2, interrupt=True)
    w.start()
    try:
        wait_for(lambda: bool(seen), timeout=5)
        assert isinstance(seen[0], rqueue.TimeLimitExceeded)
        wait_for(floor_reaches(q, "g", 1))
        assert dead_headers(q)["1"]["x-rq-error"].startswith("timeout:")
    finally:
        w.stop()
        assert w.join(10)


@BACKENDS
def test_a_coroutine_that_swallows_its_cancellation_is_still_nacked(live, backend, prefix):
    # given an asyncio worker whose coroutine catches its cancellation and returns
    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish(b"stubborn")
    caught = threading.Event()

    async def handler(d):
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            caught.set()

    w = run_worker("async", backend, prefix, q, handler, time_limit=0.2)
    try:
        wait_for(floor_reaches(q, "g", 1), timeout=10)
        assert caught.wait(5)
        # then the timeout stands: dead-lettered, never acked
        assert dead_headers(q)["1"]["x-rq-error"].startswith("timeout:")
        assert q.stats().group("g").acked == 0
    finally:
        w.stop()
        assert w.join(10)


@BACKENDS
def test_a_coroutine_handler_of_the_threaded_worker_is_cancelled(live):
    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish(b"slow")
    cancelled = threading.Event()

    async def handler(d):
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    w = rqueue.Worker(q, "g", handler, time_limit=0.2)
    w.start()
    try:
        assert cancelled.wait(5)
        wait_for(floor_reaches(q, "g", 1))
        assert dead_headers(q)["1"]["x-rq-error"].startswith("timeout:")
        assert w.stats.timed_out == 1
    finally:
        w.stop()
        assert w.join(10)


@BACKENDS
@BOTH
def test_bad_time_limits(kind, live, backend, prefix):
    if kind == "threaded":
        q, make = live.queue("orders"), rqueue.Worker
    else:
        q, make = asyncio.run(rqueue.aio.connect(backend, prefix=prefix)).queue("orders"), rqueue.aio.Worker
    for bad in (0, -1, float("inf"), "3", True):
        with pytest.raises(rqueue.InvalidInput, match="time_limit"):
            make(q, "g", print, time_limit=bad)


def test_a_header_that_does_not_parse_falls_back_to_the_workers_limit(caplog):
    with caplog.at_level(logging.WARNING, logger="rqueue.worker"):
        assert time_limit_for({TIME_LIMIT_HEADER: "soon"}, 2.0) == 2.0
        assert time_limit_for({TIME_LIMIT_HEADER: "-1"}, None) is None
        assert time_limit_for({TIME_LIMIT_HEADER: "nan"}, None) is None
    assert "x-rq-time-limit" in caplog.text
    assert time_limit_for({TIME_LIMIT_HEADER: "1.5"}, 9.0) == 1.5
    assert time_limit_for({}, 9.0) == 9.0


def test_outside_a_handler_the_cancellation_is_never_set():
    c = rqueue.cancellation()
    assert not c.cancelled and c.limit is None
    c.check()  # does not raise


def test_the_worker_command_takes_a_time_limit():
    from click.testing import CliRunner

    from rqueue.cli import cli

    out = CliRunner().invoke(cli, ["worker", "--help"])
    assert "--time-limit" in out.output and "--interrupt" in out.output
    bad = CliRunner().invoke(cli, ["--url", "memory://", "worker", "m:f", "-q", "q", "-g", "g", "--time-limit", "0"])
    assert bad.exit_code == 2 and "--time-limit" in bad.output


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_in_process_handlers_are_killed_at_their_limit(live, tmp_path):
    # given a handler run in child processes, one message that blocks in C
    live.configure("orders", max_deliveries=1, results=True)
    q = live.queue("orders")
    pid_file = tmp_path / "pid"
    q.publish(b"hang", headers={"pid-file": str(pid_file)})
    q.publish_many([b"quick", b"fail", b"reject", b"print"])
    handler = InProcess("process_handlers:work")
    # (3 s: a child started on a loaded machine writes its pid file well within it)
    w = rqueue.Worker(q, "g", handler, concurrency=1, time_limit=3.0)
    w.start()
    try:
        wait_for(floor_reaches(q, "g", 5), timeout=20)
        # then the blocked one was nacked for its limit and its process killed
        assert q.result(1, timeout=5).failure == rqueue.Failure(
            "max-deliveries", "timeout: the handler ran past its time limit of 3 s"
        )
        pid = int(pid_file.read_text())
        wait_for(lambda: not alive(pid), timeout=5)
        # and the others ran in a new child, with their outcomes
        assert q.result(2, timeout=5).value == {"seq": 2, "count": 1}
        assert q.result(3, timeout=5).failure == rqueue.Failure("max-deliveries", "ChildFailed: ValueError: boom")
        assert q.result(4, timeout=5).failure == rqueue.Failure("rejected", "nope")
        assert q.result(5, timeout=5).value == b"printed"
    finally:
        w.stop()
        assert w.join(10)
    assert handler._children == []  # the worker's stop ended its children


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_an_in_process_childs_start_never_counts_against_a_limit(live):
    # given a handler whose module takes 2 s to import, run in a child process with a limit of 1.5 s,
    # and a message that hangs ahead of two quick ones
    live.configure("orders", max_deliveries=1, results=True)
    q = live.queue("orders")
    q.publish_many([b"hang", b"quick", b"quick"])
    handler = InProcess("slow_import_handlers:work")
    w = rqueue.Worker(q, "g", handler, concurrency=1, time_limit=1.5)
    w.start()
    try:
        wait_for(floor_reaches(q, "g", 3), timeout=30)
        # then the hanging one was killed at its limit
        assert q.result(1, timeout=5).failure == rqueue.Failure(
            "max-deliveries", "timeout: the handler ran past its time limit of 1.5 s"
        )
        # and the others ran within theirs: the first child started before the worker fetched, the
        # second before the thread took the next delivery
        assert [q.result(s, timeout=5).value for s in (2, 3)] == [{"seq": 2}, {"seq": 3}]
        # and one child runs per thread, with one spare (the replaced thread kills the hanging child
        # when it next looks at its cancellation, after the new thread may have run both quick ones)
        wait_for(lambda: sum(c.poll() is None for c in handler._children) <= 2, timeout=5)
    finally:
        w.stop()
        assert w.join(10)
    assert handler._children == [] and handler._spares == []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"  # a zombie is dead
    return True


def test_in_process_refuses_a_bad_handler_name():
    with pytest.raises(rqueue.InvalidInput, match="module.path:function"):
        InProcess("nothing")
    with pytest.raises(rqueue.InvalidInput, match="cannot import"):
        InProcess("no_such_module_here:f")


def test_the_cancellation_of_a_run_without_a_limit_cannot_be_set():
    # given the cancellation every run without a time limit shares
    shared = rqueue.cancellation()
    # when something cancels it, then it stays not cancelled, for this run and every later one
    shared.cancel()
    assert not shared.cancelled and not rqueue.cancellation().cancelled
    assert shared.wait(0) is False
