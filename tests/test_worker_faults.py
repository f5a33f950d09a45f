"""The worker under faults: a handler that raises BaseException, a lease
shorter than the heartbeat interval, a server that is gone or does not
answer, a worker paused or removed from its group while deliveries wait in
it; and a bad group name."""

from __future__ import annotations

import ast
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from support.layouts import both_layouts  # noqa: F401  (every test on both layouts)
from support.servers import start_server, wait_for

import rqueue
from rqueue.connection.open import pool_connections
from rqueue.constants import IDLE_POLL_INTERVAL
from rqueue.worker.reconnect import cut_off

HERE = Path(__file__).resolve().parent


def test_handler_raising_base_exception_does_not_kill_the_worker(backend, prefix):
    # given a handler that raises SystemExit on the first delivery of one message
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=0.5)
    q = client.queue("orders")
    q.publish_many([b"boom", b"fine"])
    seen: list[bytes] = []

    def handler(d):
        seen.append(d.data)
        if d.data == b"boom" and d.delivery_count == 1:
            raise SystemExit("handler asked to exit")

    # when a worker runs it
    w = rqueue.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.1, heartbeat_timeout=2)
    w.start()
    wait_for(lambda: q.stats().groups and q.stats().group("g").ack_floor == 2, timeout=20)
    w.stop()
    assert w.join(10)
    # then the worker went on: that message ran again, the other once
    assert seen.count(b"boom") == 2 and seen.count(b"fine") == 1
    client.close()


def test_short_ack_wait_with_default_heartbeat_interval_still_runs_once(backend, prefix):
    # given a lease of 0.8 s, shorter than the default heartbeat interval of 1 s
    # (0.3 s let a loaded machine's cluster run miss an extension), and a
    # handler that outlasts it twice
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=0.8)
    q = client.queue("orders")
    q.publish(b"slow")
    runs = []

    def handler(d):
        runs.append(d.delivery_count)
        time.sleep(2.0)

    # when two workers run
    workers = [rqueue.Worker(q, "g", handler, concurrency=1) for _ in range(2)]
    for w in workers:
        w.start()
    wait_for(lambda: q.stats().groups and q.stats().group("g").ack_floor == 1, timeout=20)
    for w in workers:
        w.stop()
        assert w.join(10)
    # then the handler ran once: the worker kept the lease alive
    assert runs == [1]
    client.close()


def test_join_returns_when_run_fails(prefix):
    # given a worker whose server is gone
    server = start_server("redis")
    client = rqueue.connect(server.url, prefix=prefix)
    q = client.queue("orders")  # looks up whether the queue is partitioned
    server.stop()
    w = rqueue.Worker(q, "g", print, reconnect_timeout=0.5)
    errors = []

    def run() -> None:
        # any error will do: what is tested is that join returns
        errors.append(pytest.raises(Exception, w.run, install_signal_handlers=False))  # noqa: B017

    # when its run fails
    t = threading.Thread(target=run)
    t.start()
    # then join returns
    assert w.join(15)
    t.join(5)


def test_worker_refuses_a_bad_group_name(queue):
    # given a group name with a space, then the worker is refused
    with pytest.raises(rqueue.InvalidName, match="group"):
        rqueue.Worker(queue, "bad group", print)


# -- pauses (docs/guarantees.md, guarantee 13) ------------------------------------


def _spawn(server, prefix, log_path, concurrency=1, hb_timeout=10.0, settings_ttl=60.0):
    """tests/support/worker_proc.py on queue orders, group g, its log in
    ``log_path``; its settings, once read, kept for ``settings_ttl``."""
    with open(log_path, "wb") as err:
        return subprocess.Popen(
            [
                sys.executable,
                str(HERE / "support" / "worker_proc.py"),
                server.url,
                prefix,
                "orders",
                "g",
                "0",
                str(concurrency),
                str(hb_timeout),
                str(settings_ttl),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        )


def _calls(server, prefix) -> list[int]:
    """The seqs the worker process ran its handler on, in order."""
    r = redis.Redis(port=server.port)
    try:
        return [int(x) for x in r.lrange(f"{prefix}:test:calls", 0, -1)]
    finally:
        r.close()


def _joined(q, group="g") -> bool:
    stats = q.stats()
    return group in [g.name for g in stats.groups] and bool(stats.group(group).consumers)


def _paused_with_a_reply_waiting(server, prefix, log_path):
    """One run of the scenario below: the worker's stats line and the seqs
    it ran, or None when the worker's fetch was not waiting in Redis when
    the worker was paused (a loaded machine ran it late), which proves
    nothing either way."""
    worker = None
    client = rqueue.connect(server.url, prefix=prefix, settings_ttl=0)
    try:
        client.configure("orders", ack_wait=1)
        q = client.queue("orders")
        worker = _spawn(server, prefix, log_path)
        wait_for(lambda: _joined(q))
        # (A first stall of Redis, longer than a heartbeat interval and an
        # idle poll, makes the worker's heartbeat and fetch wait at once, so
        # that each has a connection of its own, opened and through its
        # handshake a second later: a connection opened during the stall
        # below would wait there in its handshake, and the fetch would not
        # be sent.)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            stalled = time.monotonic()
            wait_for(lambda: time.monotonic() > stalled + IDLE_POLL_INTERVAL + 0.5)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        resumed = time.monotonic()
        wait_for(lambda: time.monotonic() > resumed + 1.0)
        q.publish_many([b"m"] * 2, delay=1.0)
        due = time.monotonic() + 1.0
        # When Redis stalls until they are due, so that the worker's next
        # fetch waits in Redis; the worker is paused (SIGSTOP) and Redis
        # resumes, so that the fetch's reply, with the two deliveries,
        # waits in the paused worker's socket
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: time.monotonic() > due + IDLE_POLL_INTERVAL + 0.2)
            os.kill(worker.pid, signal.SIGSTOP)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        try:
            # and, once their leases ran out, another consumer handles and acks them
            other = q.consumer("g", name="other")
            got: list[rqueue.Delivery] = []
            wait_for(lambda: got.extend(other.fetch(2)) or len(got) == 2)
            other.ack(got)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        if sorted((d.seq, d.delivery_count) for d in got) != [(1, 2), (2, 2)]:
            return None  # the worker had not sent its fetch: nothing was set up
        # Then, resumed, the worker reads the reply and runs none of them
        try:
            wait_for(lambda: _calls(server, prefix) or log_path.read_text().count("not running") == 2)
        except pytest.fail.Exception:
            pytest.fail(f"the worker neither ran nor gave up both; its log ends:\n{log_path.read_text()[-3000:]}")
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, log_path.read_text()[-2000:]
        return ast.literal_eval(out.decode().strip().splitlines()[-1]), _calls(server, prefix)
    finally:
        client.close()
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_worker_paused_while_its_fetch_reply_waits_runs_nothing_acked_meanwhile(prefix, tmp_path):
    # Given an idle worker process (one thread, so holding up to 2) on a
    # queue with a 1 s lease, and two messages published to fall due in 1 s
    # (the scenario runs again, up to 3 times, when a loaded machine ran the
    # worker's fetch too late for the pause to catch its reply)
    server = start_server("redis")
    try:
        for attempt in range(3):
            outcome = _paused_with_a_reply_waiting(server, f"{prefix}-{attempt}", tmp_path / f"worker-{attempt}.log")
            if outcome is not None:
                break
        else:
            pytest.fail("in 3 runs the worker's fetch was never waiting in Redis when the worker was paused")
        stats, calls = outcome
        assert calls == []
        assert (stats["fetched"], stats["handled"], stats["stale_skipped"]) == (2, 0, 2)
    finally:
        server.stop()


@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
def test_a_fetch_reply_read_late_is_checked_before_its_handler_runs(backend, prefix, monkeypatch, batch):
    # Given a worker whose fetch reply, with two deliveries, is read only
    # after their 0.5 s leases ran out (as when the worker is paused right
    # after the reply reached its socket)
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=0.5)
    q = client.queue("orders")
    calls = []
    late = threading.Event()
    go_on = threading.Event()
    fetch = rqueue.Consumer.ack_and_fetch

    def read_late(self, *args, **kwargs):
        result = fetch(self, *args, **kwargs)
        if result[1] and not late.is_set():
            late.set()
            go_on.wait(20)
        return result

    monkeypatch.setattr(rqueue.Consumer, "ack_and_fetch", read_late)
    if batch:  # a batch handler checks each of its deliveries the same way
        handler = rqueue.BatchHandler(lambda ds: [calls.append(d.seq) or True for d in ds], size=10)
    else:
        handler = lambda d: calls.append(d.seq)  # noqa: E731
    w = rqueue.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.1)
    w.start()
    try:
        wait_for(lambda: _joined(q))
        q.publish_many([b"m"] * 2)
        assert late.wait(10)
        # When another consumer handles and acks both meanwhile
        other = q.consumer("g", name="other")
        got: list[rqueue.Delivery] = []
        wait_for(lambda: got.extend(other.fetch(2)) or len(got) == 2)
        other.ack(got)
    finally:
        go_on.set()
    # Then the worker checks them with Redis and runs neither
    wait_for(lambda: w.stats.stale_skipped + w.stats.handled == 2)
    w.stop()
    assert w.join(10)
    assert calls == [] and w.stats.stale_skipped == 2
    client.close()


@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)  # the worker's logic, not the server's
def test_a_batch_runs_none_of_its_deliveries_whose_check_went_stale_before_it_started(backend, prefix, monkeypatch):
    # Given a batch of two whose fetch reply is read past the stale age (0.5
    # s of a 1 s lease), so that both are checked with Redis before it runs,
    # and whose check answers past the stale age (as a check retried
    # through a blip does); the worker's later fetches wait until it is
    # stopped, so that the two going back to the group below are the other
    # consumer's to take (a worker that joins again fetches them back within
    # half a second, before a test thread held up on a loaded machine: CI)
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=1)
    q = client.queue("orders")
    calls = []
    fetch, check = rqueue.Consumer.ack_and_fetch, rqueue.Consumer.in_progress_available
    checking, go_on = threading.Event(), threading.Event()
    fetched, stopped = threading.Event(), threading.Event()
    checked: list[list[int]] = []

    def read_late(self, *args, **kwargs):
        if fetched.is_set():
            stopped.wait(20)
        result = fetch(self, *args, **kwargs)
        if result[1] and not fetched.is_set():
            fetched.set()
            read = time.monotonic()
            wait_for(lambda: time.monotonic() > read + 0.6)
        return result

    def slow_check(self, deliveries):
        checked.append([d.seq for d in deliveries])
        statuses = check(self, deliveries)
        if not checking.is_set():  # the first check is applied, its answer read late
            checking.set()
            go_on.wait(20)
        return statuses

    monkeypatch.setattr(rqueue.Consumer, "ack_and_fetch", read_late)
    monkeypatch.setattr(rqueue.Consumer, "in_progress_available", slow_check)
    handler = rqueue.BatchHandler(lambda ds: [calls.append(d.seq) or True for d in ds], size=10)
    q.publish_many([b"m"] * 2)  # before the worker starts: its first fetch brings both
    w = rqueue.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.1)
    w.start()
    try:
        try:
            assert checking.wait(10)
            blocked = time.monotonic()
            # When, meanwhile, both go back to the group (a twin of the worker's
            # name leaves), and another consumer takes them and acks message 1
            q.consumer("g", name=w.consumer.name).close()
            other = q.consumer("g", name="other")
            got: list[rqueue.Delivery] = []
            wait_for(lambda: got.extend(other.fetch(2)) or len(got) == 2)
            other.ack([d for d in got if d.seq == 1])
            wait_for(lambda: time.monotonic() > blocked + 0.6)
        finally:
            go_on.set()
        # Then the batch runs neither: both are checked again, in one call, not
        # run on the word of a check that vouched for them past the stale age
        wait_for(lambda: w.stats.stale_skipped + w.stats.handled == 2)
    finally:
        w.stop()
        stopped.set()  # after the stop: what the held fetch brings is handed back, not run
    assert w.join(10)
    assert calls == [] and w.stats.stale_skipped == 2
    assert checked[:2] == [[1, 2], [1, 2]]
    client.close()


@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)  # the worker's logic, not the server's
def test_a_batch_checked_late_runs_the_deliveries_held_beside_one_whose_state_is_damaged(
    backend, prefix, monkeypatch, caplog
):
    # Given a batch of three whose fetch reply is read past the stale age (0.5
    # s of a 1 s lease), so that all are checked with Redis before it runs,
    # and the delivery state of the second overwritten with garbage meanwhile
    from support.raw import group_key

    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=1)
    q = client.queue("orders")
    ran: list[tuple[int, int]] = []  # (seq, delivery count) of each delivery run
    fetch = rqueue.Consumer.ack_and_fetch

    def read_late(self, *args, **kwargs):
        result = fetch(self, *args, **kwargs)
        if result[1]:
            client.redis.hset(group_key(q, "g", "dlv"), 2, b"nonsense")
            read = time.monotonic()
            wait_for(lambda: time.monotonic() > read + 0.6)
        return result

    monkeypatch.setattr(rqueue.Consumer, "ack_and_fetch", read_late)
    caplog.set_level(logging.INFO, logger="rqueue.worker")
    handler = rqueue.BatchHandler(lambda ds: [ran.append((d.seq, d.delivery_count)) or True for d in ds], size=10)
    q.publish_many([b"m"] * 3)  # before the worker starts: its first fetch brings all three
    w = rqueue.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.1, prefetch=3)
    w.start()
    # When the batch is checked
    try:
        wait_for(lambda: w.stats.stale_skipped + w.stats.handled >= 2)
    finally:
        w.stop()
        w.join(10)
    # Then the two held ones run at their first delivery, and the damaged one
    # is not run and is said loudly (by the batch's check, or by a heartbeat
    # that finds it first)
    assert sorted(ran) == [(1, 1), (3, 1)]
    damaged = [r for r in caplog.records if r.levelno >= logging.ERROR and "2.1." in r.getMessage()]
    assert damaged and "does not parse" in damaged[0].getMessage()
    client.close()


@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)
def test_a_heartbeat_finding_a_waiting_deliverys_state_damaged_says_so_loudly(backend, prefix, caplog):
    # Given a worker whose one handler thread is busy with message 1 while
    # messages 2 and 3 wait, and the delivery state of 2 overwritten with garbage
    from support.raw import group_key

    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    q = client.queue("orders")
    ran: list[int] = []
    busy, release = threading.Event(), threading.Event()

    def handler(d):
        if d.seq == 1:
            busy.set()
            release.wait(20)
        ran.append(d.seq)

    caplog.set_level(logging.INFO, logger="rqueue.worker")
    q.publish_many([b"m"] * 3)
    w = rqueue.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.05, prefetch=3)
    w.start()
    try:
        assert busy.wait(10)
        client.redis.hset(group_key(q, "g", "dlv"), 2, b"nonsense")
        # When a heartbeat extends the waiting deliveries' leases
        wait_for(lambda: any("2.1." in r.getMessage() for r in caplog.records))
    finally:
        release.set()
        wait_for(lambda: len(ran) == 2)
        w.stop()
        w.join(10)
    # Then 2 is not run, and the log says why at ERROR: damage, not a lease that moved on
    assert ran == [1, 3]
    said = [r for r in caplog.records if "2.1." in r.getMessage()]
    assert said[0].levelno == logging.ERROR and "does not parse" in said[0].getMessage()
    client.close()


def test_a_fetch_that_finds_the_worker_removed_drops_its_waiting_deliveries(backend, prefix, monkeypatch):
    # Given a worker of one thread busy with message 1 while message 2 waits
    # behind it, whose heartbeat does not come during the test (so that only
    # its fetch can find it removed)
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=120)
    q = client.queue("orders")
    calls = []
    running = threading.Event()
    release = threading.Event()

    def handler(d):
        calls.append(d.seq)
        if d.seq == 1:
            running.set()
            release.wait(20)

    hold = threading.Event()  # the dispatcher's next fetch waits until resume
    parked = threading.Event()
    resume = threading.Event()
    fetched_after_removal = threading.Event()
    fetch = rqueue.Consumer.ack_and_fetch

    def gated(self, *args, **kwargs):
        if hold.is_set():
            hold.clear()
            parked.set()
            resume.wait(20)
            result = fetch(self, *args, **kwargs)
            fetched_after_removal.set()
            return result
        if fetched_after_removal.is_set():
            # The dispatcher is past what the fetch that found it removed
            # returned: message 1's handler may end now.
            release.set()
        return fetch(self, *args, **kwargs)

    monkeypatch.setattr(rqueue.Consumer, "ack_and_fetch", gated)
    w = rqueue.Worker(q, "g", handler, concurrency=1, prefetch=3, heartbeat_interval=30, heartbeat_timeout=60)
    w.start()
    try:
        wait_for(lambda: _joined(q))
        q.publish_many([b"m"] * 2)
        assert running.wait(10)
        wait_for(lambda: q.stats().group("g").in_flight == 2)
        hold.set()
        assert parked.wait(10)
        # When it is removed from the group (a twin of its name leaves it)
        # and another consumer takes and acks both messages
        q.consumer("g", name=w.consumer.name).close()
        with q.consumer("g", name="other") as other:
            got = other.fetch(2)
            assert [d.seq for d in got] == [1, 2]
            other.ack(got)
        resume.set()
        # Then its fetch finds it removed, it joins again, and message 2 is
        # dropped, never run
        wait_for(lambda: w.stats.stale_skipped == 1)
    finally:
        resume.set()
        release.set()
    w.stop()
    assert w.join(10)
    assert calls == [1]
    client.close()


# -- Redis gone or silent: reconnect_timeout and stopping at once -------------------


class _Run:
    """A worker run in a thread of the test's, keeping what ``run`` raised."""

    def __init__(self, worker: rqueue.Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run(install_signal_handlers=False)
        except BaseException as exc:
            self.error = exc


def _redis_gone(server, how: str) -> None:
    """Takes ``server`` away: "down" kills it (calls are refused), "silent"
    pauses it (SIGSTOP: connections are accepted and never answered)."""
    if how == "down":
        server.kill()
    else:
        os.kill(server.process.pid, signal.SIGSTOP)


def _redis_back(server, how: str) -> None:
    if how == "silent" and server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)


def test_a_cut_off_wakes_calls_blocked_on_a_silent_redis(stoppable_server, prefix):
    # Given calls blocked on a paused Redis: one through the client's pool,
    # one a queue's publish (its script calls' connections)
    client = rqueue.connect(stoppable_server.url, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"x")
    errors: list[BaseException] = []

    def blocked(call) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    os.kill(stoppable_server.process.pid, signal.SIGSTOP)
    threads = [
        threading.Thread(target=blocked, args=(lambda: client.redis.get(f"{prefix}:x"),), daemon=True),
        threading.Thread(target=blocked, args=(lambda: q.publish(b"y"),), daemon=True),
    ]
    for t in threads:
        t.start()
    wait_for(lambda: _in_use(client) == 2)
    # When the worker's watchdog cuts them off, every 0.2 s while they are
    # under way (a connection still being made has no socket to shut yet)
    deadline = time.monotonic() + 2
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        cut_off(client)
        for t in threads:
            t.join(0.2)
    # Then both calls fail at once
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 2 and all(isinstance(e, (redis.ConnectionError, rqueue.ConnectionLost)) for e in errors)


def test_a_cut_off_shuts_sockets_down_and_leaves_closing_them_to_their_next_user(stoppable_server, prefix):
    # Given a client whose pool and script calls hold idle connections
    client = rqueue.connect(stoppable_server.url, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"x")
    client.redis.ping()
    sockets = [c._sock for c in _connections(client) if c._sock is not None]
    assert len(sockets) >= 2
    # When the worker's watchdog cuts them off
    cut_off(client)
    # Then their sockets are shut down, not closed: a descriptor closed
    # under a thread about to wait on it may be another socket's by the
    # time it waits, where no later cut-off reaches it
    assert all(s.fileno() >= 0 for s in sockets)
    with pytest.raises(OSError):
        sockets[0].send(b"PING\r\n")
    # and the next use of one finds it shut, closes it and connects again
    reused = client.redis.connection_pool._available_connections[-1]  # the next one handed out
    shut_socket = reused._sock
    assert client.redis.ping() and q.stats().depth == 1
    assert shut_socket.fileno() == -1 and reused._sock is not None and reused._sock is not shut_socket
    client.close()


def _connections(client) -> list:
    made = client.scripts.connections._made if client.scripts.connections is not None else []
    return [*made, *pool_connections(client.redis.connection_pool)]


def _in_use(client) -> int:
    connections = client.scripts.connections
    scripts = len(connections._made) - len(connections._free) if connections is not None else 0
    return len(client.redis.connection_pool._in_use_connections) + scripts


@pytest.mark.parametrize("how", ["down", "silent"])
def test_reconnect_timeout_is_honoured_within_a_second(prefix, how, caplog):
    # Given a working worker with reconnect_timeout 2 s
    caplog.set_level(logging.INFO, logger="rqueue.worker")
    server = start_server("redis")
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        q = client.queue("orders")
        w = rqueue.Worker(q, "g", print, heartbeat_interval=0.2, heartbeat_timeout=2, reconnect_timeout=2)
        run = _Run(w)
        wait_for(lambda: _joined(q))
        # When Redis goes away (down, or silent), for good
        gone = time.monotonic()
        _redis_gone(server, how)
        # Then the worker gives up 2 s after Redis stopped answering (its call
        # under way then was sent up to an idle poll later), within a second
        run.thread.join(15)
        took = time.monotonic() - gone
        assert not run.thread.is_alive()
        assert isinstance(run.error, rqueue.ConnectionLost), run.error
        # (a heartbeat sent just before Redis went away may open the outage;
        # on two loaded cores the threads' wake-ups add up to 1.3 s more, seen in CI)
        assert 1.5 <= took < 2.0 + IDLE_POLL_INTERVAL + 1.5, took
        # and the log said when reconnecting started and when it gave up
        messages = [r.getMessage() for r in caplog.records]
        assert any("retrying the worker's calls for up to 2 s" in m for m in messages)
        assert sum(m.startswith("giving up: Redis has not answered for") for m in messages) == 1
        print(f"Redis {how}: worker gave up {took:.2f} s after it went away (reconnect_timeout 2 s)")
        _redis_back(server, how)
        client.close()
    finally:
        _redis_back(server, how)
        server.stop()


@pytest.mark.parametrize("how", ["down", "silent"])
def test_a_stop_at_once_ends_a_reconnecting_worker_at_once(prefix, how, caplog):
    # Given a worker with the default reconnect_timeout (60 s) whose Redis
    # went away: down (its calls are refused, and it retries them) or silent
    # (its call waits for a reply), and a graceful stop that it cannot
    # complete meanwhile
    caplog.set_level(logging.INFO, logger="rqueue.worker")
    server = start_server("redis")
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        q = client.queue("orders")
        w = rqueue.Worker(q, "g", print, heartbeat_interval=0.2, heartbeat_timeout=2, grace_period=2)
        run = _Run(w)
        wait_for(lambda: _joined(q))
        gone = time.monotonic()
        _redis_gone(server, how)
        if how == "down":
            wait_for(lambda: w.stats.reconnects >= 1)
        else:  # its next idle poll is under way
            wait_for(lambda: time.monotonic() > gone + IDLE_POLL_INTERVAL + 0.3)
        w.stop()
        assert not w.join(1.0)  # still trying to finish its work
        # When it is told to stop at once
        told = time.monotonic()
        w.stop(now=True)
        # Then it ends within about a second, raising what kept it from leaving
        assert w.join(5)
        took = time.monotonic() - told
        run.thread.join(5)
        assert isinstance(run.error, rqueue.ConnectionLost), run.error
        assert took < 1.5, took
        print(f"Redis {how}: a stop at once ended the reconnecting worker in {took:.2f} s")
        client.close()
    finally:
        _redis_back(server, how)
        server.stop()
