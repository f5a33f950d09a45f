"""The worker runtime: handler outcomes, SPEC guarantees 3 and 7, leases kept
alive, crashes, signals and Redis restarts."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import redis
from support.servers import start_server, wait_for

import rqueue
import rqueue.engine.commands
import rqueue.worker.dispatcher
from rqueue.worker.reconnect import Reconnector
from rqueue.worker.stats import Tally, WorkerStats

HERE = Path(__file__).resolve().parent


@pytest.fixture
def live(backend, prefix):
    """A client on the real clock: workers measure time themselves."""
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def redis_server():
    server = start_server("redis", appendonly=True)
    yield server
    server.stop()


class Calls:
    """Thread-safe record of handler invocations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seqs: list[int] = []

    def add(self, seq: int) -> None:
        with self.lock:
            self.seqs.append(seq)

    def count(self) -> collections.Counter[int]:
        with self.lock:
            return collections.Counter(self.seqs)


def run_worker(q, handler, **options):
    w = rqueue.Worker(q, "g", handler, **options)
    w.start()
    return w


def floor_reaches(q, group, seq):
    def reached():
        stats = q.stats()
        return group in [g.name for g in stats.groups] and stats.group(group).ack_floor >= seq

    return reached


def in_flight(q, group="g"):
    """The group's in-flight count; 0 before any member joined it."""
    stats = q.stats()
    return stats.group(group).in_flight if group in [g.name for g in stats.groups] else 0


def test_return_acks_exception_nacks_reject_dead_letters(live):
    # given three messages with a handler that acks, fails and rejects
    live.configure("orders", max_deliveries=2)
    q = live.queue("orders")
    q.publish_many([b"ok", b"fail", b"reject"])
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        if d.data == b"fail":
            raise ValueError("boom")
        if d.data == b"reject":
            raise rqueue.Reject("not for us")

    # when a worker runs until the group has settled all three
    w = run_worker(q, handler, concurrency=2)
    wait_for(floor_reaches(q, "g", 3))
    w.stop()
    assert w.join(10)
    # then: "ok" ran once, "fail" ran max_deliveries times, "reject" once
    assert calls.count() == {1: 1, 2: 2, 3: 1}
    dead = {m.headers["x-rq-seq"]: m.headers for m in q.dead_letter_queue.peek()}
    assert dead["2"]["x-rq-reason"] == "max-deliveries"
    assert dead["2"]["x-rq-error"] == "ValueError: boom"
    assert (dead["3"]["x-rq-reason"], dead["3"]["x-rq-error"]) == ("rejected", "not for us")
    assert (w.stats.acked, w.stats.nacked, w.stats.rejected, w.stats.dead_lettered) == (1, 2, 1, 2)
    assert q.stats().group("g").consumers == []  # it left the group


def test_seed_scenario_runs_the_handler_exactly_once_per_message(live):
    # SPEC guarantee 3, the NATS Streaming seed scaled down 10x: ack_wait 5 s,
    # a 4 s handler, 10 messages ready, default max_inflight, one consumer.
    live.configure("orders", ack_wait=0.5)
    q = live.queue("orders")
    q.publish_many([b"m"] * 10)
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        time.sleep(0.4)

    w = run_worker(q, handler, concurrency=1, heartbeat_interval=0.1, heartbeat_timeout=2)
    wait_for(floor_reaches(q, "g", 10), timeout=30)
    w.stop()
    assert w.join(10)
    assert calls.count() == {seq: 1 for seq in range(1, 11)}
    assert q.stats().group("g").redelivered == 0


def test_a_late_ack_cannot_settle_a_redelivery_waiting_in_a_worker(live):
    # Given two messages an old consumer held until their 0.5 s leases ran out,
    # and a worker of one thread that took both again: busy with message 1,
    # message 2 waiting behind it (the chaos run's race: a starved worker's
    # late ack landed just before the new holder's handler started)
    live.configure("orders", ack_wait=0.5)
    q = live.queue("orders")
    q.publish_many([b"busy", b"waiting"])
    old = q.consumer("g", name="old")
    first, second = old.fetch(2)
    expired = time.monotonic() + 0.6
    wait_for(lambda: time.monotonic() > expired, timeout=5)
    release, busy = threading.Event(), threading.Event()
    runs: list[int] = []

    def handler(d):
        runs.append(d.seq)
        if d.seq == 1:
            busy.set()
            release.wait(20)

    w = run_worker(q, handler, concurrency=1, prefetch=2, heartbeat_interval=0.1)
    try:
        assert busy.wait(10)
        wait_for(lambda: in_flight(q) == 2)
        # When the old consumer acks message 2 late
        with pytest.raises(rqueue.StaleDelivery):
            old.ack(second)
    finally:
        release.set()
    # Then the worker's delivery is the one that settles it, after its handler ran
    wait_for(floor_reaches(q, "g", 2), timeout=10)
    w.stop()
    assert w.join(10)
    assert runs == [1, 2]


def test_long_handler_is_kept_alive_past_ack_wait_and_runs_once(live):
    # (a lease of 0.8 s: eight heartbeat intervals, so that a loaded machine
    # that holds a worker's threads back for a few of them does not let it run out)
    live.configure("orders", ack_wait=0.8)
    q = live.queue("orders")
    q.publish(b"slow")
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        time.sleep(2.4)  # three times ack_wait

    a = run_worker(q, handler, concurrency=1, heartbeat_interval=0.1, heartbeat_timeout=2)
    b = run_worker(q, handler, concurrency=1, heartbeat_interval=0.1, heartbeat_timeout=2)
    wait_for(floor_reaches(q, "g", 1), timeout=20)
    for w in (a, b):
        w.stop()
        assert w.join(10)
    assert calls.count() == {1: 1}


def test_async_handler(live):
    q = live.queue("orders")
    q.publish_many([b"a", b"b", b"c"])
    seen = []

    async def handler(d):
        await asyncio.sleep(0.01)
        seen.append(d.data)
        if d.data == b"b" and d.delivery_count == 1:
            raise RuntimeError("once")

    w = run_worker(q, handler, concurrency=2)
    wait_for(floor_reaches(q, "g", 3))
    w.stop()
    assert w.join(10)
    assert sorted(seen) == [b"a", b"b", b"b", b"c"]


def test_an_idle_worker_waits_in_redis_for_a_publish_and_stops_at_once(live, monkeypatch):
    # given an idle worker (nothing running) whose fetch waits in Redis, with
    # polling made too slow to matter and the channel out of use
    monkeypatch.setattr(rqueue.worker.dispatcher, "IDLE_POLL_INTERVAL", 60.0)
    live.configure("orders", wait_in_redis=True)
    q = live.queue("orders")
    calls = Calls()
    w = rqueue.Worker(q, "g", lambda d: calls.add(d.seq), reconnect_timeout=120)
    in_redis = not isinstance(live.redis, redis.RedisCluster)  # (a cluster's consumers wait on the channel)
    if in_redis:
        deaf(live, monkeypatch)
    w.start()
    try:
        wait_for(lambda: live.redis.hget(q.keys.meta, "wake") is not None or not in_redis)
        # when a message is published, then it runs long before a poll
        q.publish(b"m")
        wait_for(lambda: calls.count() == {1: 1})
        wait_for(floor_reaches(q, "g", 1))
        # and when the idle worker is stopped, it ends long before its 30 s
        # wait would (the stop adds a wake-up entry)
        wait_for(lambda: live.redis.hget(q.keys.meta, "wake") is not None or not in_redis)
        started = time.monotonic()
    finally:
        w.stop()
    assert w.join(10)
    assert time.monotonic() - started < 10


def deaf(client, monkeypatch):
    """Cuts off the channel's wake-ups: a wait on it lasts until its
    timeout or its own condition."""
    real = client.notifier.wait_any
    monkeypatch.setattr(client.notifier, "wait_any", lambda since, timeout, until=None: real({}, timeout, until))


def test_a_paused_group_resumed_wakes_a_consumer_waiting_in_redis(live, monkeypatch):
    # given a consumer waiting in fetch on a paused group (a paused group's
    # fetch marks nothing), with polling made too slow to matter
    monkeypatch.setattr(rqueue.consumer, "IDLE_POLL_INTERVAL", 60.0)
    q = live.queue("orders")
    c = q.consumer("g", wait_in_redis=True)
    q.pause("g")
    q.publish(b"m")
    waiting = threading.Event()
    real = rqueue.engine.commands.wait_then_fetch

    def wait_then_fetch(*args):
        waiting.set()
        return real(*args)

    monkeypatch.setattr(rqueue.engine.commands, "wait_then_fetch", wait_then_fetch)
    if isinstance(live.redis, redis.RedisCluster):  # (a cluster's consumers wait on the channel)
        real_wait = live.notifier.wait
        monkeypatch.setattr(live.notifier, "wait", lambda *a: waiting.set() or real_wait(*a))
    got: list[rqueue.Delivery] = []
    t = threading.Thread(target=lambda: got.extend(c.fetch(1, timeout=30)))
    t.start()
    wait_for(waiting.is_set)
    # when the group is resumed, then the waiting fetch returns the message at once
    q.resume("g")
    wait_for(lambda: not t.is_alive())
    assert [d.data for d in got] == [b"m"]


def test_stop_returns_messages_not_started(live):
    q = live.queue("orders")
    q.publish_many([b"m"] * 5)
    started = threading.Event()
    release = threading.Event()

    def handler(d):
        started.set()
        release.wait(5)

    w = run_worker(q, handler, concurrency=1, grace_period=5)
    wait_for(started.is_set)
    w.stop()
    release.set()
    assert w.join(10)
    g = q.stats().group("g")
    assert (g.ack_floor, g.in_flight, g.consumers) == (1, 0, [])


def test_worker_holds_prefetch_deliveries_twice_its_threads_by_default(live):
    # Given 10 messages and a worker of 2 threads whose handlers block
    q = live.queue("orders")
    q.publish_many([b"m"] * 10)
    running = threading.Semaphore(0)
    release = threading.Event()

    def handler(d):
        running.release()
        release.wait(10)

    w = run_worker(q, handler, concurrency=2)
    try:
        # When both threads are busy
        for _ in range(2):
            assert running.acquire(timeout=10)
        # Then the worker holds 4 (2 running, 2 waiting for a thread), no more
        wait_for(lambda: in_flight(q) == 4)
        # (what it may hold once quick handlers wait for fetches: docs/worker.md, "Prefetch")
        assert w.prefetch == rqueue.constants.ADAPTIVE_PREFETCH_CAP
        assert q.stats().group("g").consumers[0].held == 4
    finally:
        release.set()
        wait_for(floor_reaches(q, "g", 10))
        w.stop()
        assert w.join(10)
    assert (w.stats.handled, w.stats.acked, w.stats.redelivered) == (10, 10, 0)


def test_waiting_deliveries_keep_their_lease_and_run_once(live):
    # Given a lease much shorter than the wait for a thread (3 deliveries
    # wait behind a 2 s handler with ack_wait 1.5 s; a heartbeat late by
    # 1.45 s on a loaded machine still renews it) and a second worker ready
    # to take any lease that runs out
    live.configure("orders", ack_wait=1.5)
    q = live.queue("orders")
    q.publish_many([b"m"] * 4)
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        time.sleep(2)

    opts = dict(concurrency=1, prefetch=4, heartbeat_interval=0.05, heartbeat_timeout=2)
    a = run_worker(q, handler, **opts)
    wait_for(lambda: in_flight(q) == 4)  # a holds all four
    b = run_worker(q, handler, **opts)
    # When every message has been handled
    wait_for(floor_reaches(q, "g", 4), timeout=30)
    for w in (a, b):
        w.stop()
        assert w.join(10)
    # Then each ran once: the heartbeat kept the waiting leases alive
    assert calls.count() == {seq: 1 for seq in range(1, 5)}
    assert q.stats().group("g").redelivered == 0
    assert a.stats.stale_skipped == b.stats.stale_skipped == 0


def test_stop_hands_back_waiting_deliveries_at_once(live):
    # Given a worker holding 3 deliveries: one running a blocked handler,
    # two waiting for its only thread
    q = live.queue("orders")
    q.publish_many([b"m"] * 5)
    started = threading.Event()
    release = threading.Event()

    def handler(d):
        started.set()
        release.wait(10)

    w = run_worker(q, handler, concurrency=1, prefetch=3, grace_period=10)
    wait_for(started.is_set)
    wait_for(lambda: in_flight(q) == 3)
    # When it is stopped while the handler still runs
    w.stop()
    # Then the waiting two are offered again at once, not after the grace
    # period, and the running one stays held until it finishes
    wait_for(lambda: in_flight(q) == 1)
    release.set()
    assert w.join(10)
    g = q.stats().group("g")
    assert (g.ack_floor, g.in_flight, g.consumers) == (1, 0, [])
    assert w.stats.handled == 1
    # and they were never attempts: their next delivery is a first one
    with q.consumer("g", name="next") as c:
        ds = c.fetch(10)
        assert [(d.seq, d.delivery_count, d.redelivered) for d in ds] == [(s, 1, False) for s in range(2, 6)]
        c.ack(ds)


def test_stop_during_a_fetch_hands_back_what_it_brought_though_threads_are_idle(live, monkeypatch):
    # Given a worker of 2 threads, one running a blocked handler, the other
    # idle, whose stop arrives while a fetch is on its way back with 3 more
    q = live.queue("orders")
    q.publish(b"first")
    started = threading.Event()
    release = threading.Event()
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        started.set()
        release.wait(10)

    stop_in_fetch = threading.Event()
    fetch = rqueue.Consumer.ack_and_fetch

    def fetch_then_stop(self, *args, **kwargs):
        result = fetch(self, *args, **kwargs)
        if stop_in_fetch.is_set() and result[1]:
            w.stop()
        return result

    monkeypatch.setattr(rqueue.Consumer, "ack_and_fetch", fetch_then_stop)
    w = run_worker(q, handler, concurrency=2, prefetch=4)
    try:
        assert started.wait(10)
        stop_in_fetch.set()
        # When the fetch brings 3 deliveries just as the stop arrives
        q.publish_many([b"m"] * 3)
        # Then the idle thread runs none of them and all 3 are offered again
        # at once, while the running handler still holds its own
        wait_for(lambda: in_flight(q) == 1)
    finally:
        release.set()
    assert w.join(10)
    assert calls.count() == {1: 1}
    with q.consumer("g", name="next") as c:
        ds = c.fetch(10)
        assert [(d.seq, d.delivery_count) for d in ds] == [(2, 1), (3, 1), (4, 1)]
        c.ack(ds)


def test_waiting_deliveries_are_kept_alive_no_longer_than_max_run_time(live):
    # Given a worker whose only thread hangs on message 1 while message 2
    # waits behind it, with max_run_time 0.5 s and a 0.3 s lease
    live.configure("orders", ack_wait=0.3)
    q = live.queue("orders")
    q.publish_many([b"m"] * 2)
    release = threading.Event()
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        release.wait(20)

    w = run_worker(
        q, handler, concurrency=1, prefetch=2, max_run_time=0.5, heartbeat_interval=0.05, heartbeat_timeout=5
    )
    try:
        wait_for(lambda: in_flight(q) == 2)
        # When another consumer of the group keeps asking
        other = q.consumer("g", name="other")
        got: list[rqueue.Delivery] = []
        # Then both leases run out, the waiting one's too, and it gets both
        wait_for(lambda: got.extend(other.fetch(2)) or sorted(d.seq for d in got) == [1, 2], timeout=15)
        other.ack(got)
        other.close()
    finally:
        release.set()
    wait_for(lambda: w.stats.stale_skipped == 1)  # message 2, when its turn came, was not run
    w.stop()
    assert w.join(10)
    assert calls.count() == {1: 1}


def busy_with_message_1(q: rqueue.Queue) -> tuple[rqueue.Worker, Calls, threading.Event]:
    """A worker of one thread whose handler holds message 1 until released,
    with message 2 fetched and waiting behind it: (worker, calls, release)."""
    q.publish_many([b"m"] * 2)
    started = threading.Event()
    release = threading.Event()
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        started.set()
        release.wait(10)

    w = run_worker(q, handler, concurrency=1, prefetch=2, heartbeat_interval=0.05)
    assert started.wait(10)
    wait_for(lambda: in_flight(q) == 2)
    return w, calls, release


def test_a_waiting_delivery_whose_lease_is_lost_never_runs(live, monkeypatch):
    # Given a worker whose only thread is busy with message 1 while message
    # 2 waits behind it
    q = live.queue("orders")
    fetched: list[rqueue.Delivery] = []
    fetch = rqueue.Consumer.ack_and_fetch

    def recording(self, *args, **kwargs):
        result = fetch(self, *args, **kwargs)
        fetched.extend(result[1])
        return result

    monkeypatch.setattr(rqueue.Consumer, "ack_and_fetch", recording)
    w, calls, release = busy_with_message_1(q)
    try:
        # When message 2 is acked under the worker's name before its turn (by
        # tag: this twin is not closed, which would leave the group as it)
        twin = q.consumer("g", name=w.consumer.name)
        [tag] = [d.tag for d in fetched if d.seq == 2]
        twin.ack(tag)
        wait_for(lambda: w.stats.leases_lost >= 1)  # the next heartbeat finds it gone
    finally:
        release.set()
    wait_for(floor_reaches(q, "g", 2))
    w.stop()
    assert w.join(10)
    # Then it was never run, though it waited less than the stale check's age
    assert calls.count() == {1: 1}
    assert w.stats.handled == 1


def test_a_removed_worker_runs_none_of_its_waiting_deliveries(live):
    # Given a worker whose only thread is busy with message 1 while message
    # 2 waits behind it
    q = live.queue("orders")
    w, calls, release = busy_with_message_1(q)
    try:
        # When it is removed from the group (a twin of its name leaves it),
        # another consumer takes and acks both, and the worker joins again
        q.consumer("g", name=w.consumer.name).close()
        with q.consumer("g", name="other") as other:
            got = other.fetch(2)
            assert [d.seq for d in got] == [1, 2]
            other.ack(got)
        wait_for(lambda: w.consumer.name in [c.name for c in q.stats().group("g").consumers])
    finally:
        release.set()
    # Then message 2 is not run from the worker, and message 1's ack is late
    wait_for(lambda: w.stats.stale_skipped == 1 and w.stats.late_settles == 1)
    w.stop()
    assert w.join(10)
    assert calls.count() == {1: 1}


def test_bad_worker_arguments(live):
    q = live.queue("orders")
    with pytest.raises(rqueue.InvalidInput, match="concurrency"):
        rqueue.Worker(q, "g", print, concurrency=0)
    with pytest.raises(rqueue.InvalidInput, match="not callable"):
        rqueue.Worker(q, "g", "print")
    with pytest.raises(rqueue.InvalidInput, match="heartbeat_timeout"):
        rqueue.Worker(q, "g", print, heartbeat_interval=2, heartbeat_timeout=1)
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(rqueue.InvalidInput, match="prefetch"):
            rqueue.Worker(q, "g", print, prefetch=bad)
    for bad in (float("nan"), float("inf"), 1e300):
        with pytest.raises(rqueue.InvalidInput, match="heartbeat_timeout must be a positive number of seconds"):
            rqueue.Worker(q, "g", print, heartbeat_timeout=bad)


# -- processes: real servers only -------------------------------------------------


def spawn(server, prefix, sleep_s, concurrency, hb_timeout=5.0):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "support" / "worker_proc.py"),
            server.url,
            prefix,
            "orders",
            "g",
            str(sleep_s),
            str(concurrency),
            str(hb_timeout),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def calls_of(server, prefix):
    r = redis.Redis(port=server.port)
    return collections.Counter(int(x) for x in r.lrange(f"{prefix}:test:calls", 0, -1))


def test_seed_scenario_with_three_worker_processes(redis_server, prefix):
    client = rqueue.connect(redis_server.url, prefix=prefix)
    client.configure("orders", ack_wait=0.5)
    q = client.queue("orders")
    q.consumer("g").close()  # the group exists before anything is published
    procs = [spawn(redis_server, prefix, 0.4, 1) for _ in range(3)]
    try:
        wait_for(lambda: len(q.stats().group("g").consumers) == 3, timeout=20)
        q.publish_many([b"m"] * 10)
        wait_for(floor_reaches(q, "g", 10), timeout=30)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(20)
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert calls_of(redis_server, prefix) == {seq: 1 for seq in range(1, 11)}
    client.close()


def test_killed_worker_messages_are_finished_within_heartbeat_timeout(redis_server, prefix):
    # given a worker process holding messages with a very long ack_wait
    client = rqueue.connect(redis_server.url, prefix=prefix)
    client.configure("orders", ack_wait=600)
    q = client.queue("orders")
    q.publish_many([b"m"] * 6)
    victim = spawn(redis_server, prefix, 30, 3, hb_timeout=1.0)
    wait_for(lambda: len(calls_of(redis_server, prefix)) == 3, timeout=20)
    # when it is killed with SIGKILL mid-batch
    victim.kill()
    victim.wait()
    # then a surviving member finishes everything long before ack_wait
    survivor = run_worker(q, lambda d: None, concurrency=2, heartbeat_interval=0.2, heartbeat_timeout=1.0)
    wait_for(floor_reaches(q, "g", 6), timeout=30)
    survivor.stop()
    assert survivor.join(10)
    assert survivor.stats.members_removed == 1
    g = q.stats().group("g")
    assert (g.in_flight, g.dead_lettered, [c.name for c in g.consumers]) == (0, 0, [])
    client.close()


def test_sigterm_drains_running_handlers_and_leaves(redis_server, prefix):
    client = rqueue.connect(redis_server.url, prefix=prefix)
    q = client.queue("orders")
    q.publish_many([b"m"] * 10)
    proc = spawn(redis_server, prefix, 1.0, 2)
    wait_for(lambda: len(calls_of(redis_server, prefix)) >= 2, timeout=20)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    ran = calls_of(redis_server, prefix)
    g = q.stats().group("g")
    # every message it started was finished and acked; the rest is untouched
    assert g.acked == sum(ran.values()) and g.in_flight == 0 and g.consumers == []
    assert g.pending == 10 - g.acked
    client.close()


IDLE_WORKER_IN_REDIS = """
import sys
import rqueue
import rqueue.worker.dispatcher

rqueue.worker.dispatcher.IDLE_POLL_INTERVAL = 60.0  # a wait in Redis ends at a wake-up, or after a minute
client = rqueue.connect(sys.argv[1], prefix=sys.argv[2], settings_ttl=0)
worker = rqueue.Worker(client.queue("orders"), "g", lambda d: None, heartbeat_timeout=600, reconnect_timeout=600)
worker.run()
print("stopped", flush=True)
"""


def test_sigterm_ends_an_idle_workers_wait_in_redis_at_once(redis_server, prefix):
    # given an idle worker process waiting in Redis for its queue's wake-up,
    # a wait that would last a minute
    client = rqueue.connect(redis_server.url, prefix=prefix)
    client.configure("orders", wait_in_redis=True, ack_wait=600)
    admin = redis.Redis(port=redis_server.port)
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.Popen(
        [sys.executable, "-c", IDLE_WORKER_IN_REDIS, redis_server.url, prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        wait_for(lambda: admin.info("clients")["blocked_clients"] == 1, timeout=20)
        # when it gets SIGTERM
        proc.send_signal(signal.SIGTERM)
        # then it ends long before its wait would (the signal handler starts
        # the thread that adds the wake-up)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0 and out.decode().strip() == "stopped", err.decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        admin.close()
        client.close()


def test_redis_restart_mid_run_loses_nothing(prefix, tmp_path):
    server = start_server("redis", appendonly=True, data_dir=tmp_path / "data")
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        q = client.queue("orders")
        total = 2000
        q.publish_many([b"m"] * total)
        calls = Calls()

        def handler(d):
            calls.add(d.seq)
            time.sleep(0.001)

        w = run_worker(q, handler, concurrency=4, heartbeat_interval=0.2, heartbeat_timeout=2)
        wait_for(lambda: len(calls.count()) > 300)
        server.kill()  # SIGKILL: AOF with fsync always is all that survives
        # Down until the worker has met the outage: restarted at once, the
        # server can be back before the worker's next call, which redis-py's
        # check of a pooled connection then reconnects without an error.
        wait_for(lambda: w.stats.reconnects >= 1, timeout=20)
        server.start()
        wait_for(floor_reaches(q, "g", total), timeout=60)
        w.stop()
        assert w.join(20)
        counts = calls.count()
        assert set(counts) == set(range(1, total + 1))
        duplicates = sum(counts.values()) - total
        print(f"redis restart: {total} messages, {duplicates} handled twice, {w.stats.reconnects} retried calls")
        assert duplicates <= 4 * 2 + 8  # at most what was in hand when Redis died
        assert w.stats.reconnects >= 1
        client.close()
    finally:
        server.stop()


def test_metrics_count_what_the_worker_did(live):
    from prometheus_client import generate_latest

    from rqueue.worker.metrics import WorkerMetrics

    q = live.queue("orders")
    q.publish_many([b"ok", b"reject"])
    metrics = WorkerMetrics(q, "g")

    def handler(d):
        if d.data == b"reject":
            raise rqueue.Reject("no")

    w = run_worker(q, handler, concurrency=1, metrics=metrics)
    wait_for(floor_reaches(q, "g", 2))
    w.stop()
    assert w.join(10)
    text = generate_latest(metrics.registry).decode()
    labels = 'group="g",queue="orders"'
    assert f"rqueue_delivered_total{{{labels}}} 2.0" in text
    assert f"rqueue_acked_total{{{labels}}} 1.0" in text
    assert f"rqueue_dead_lettered_total{{{labels}}} 1.0" in text
    assert f"rqueue_handler_seconds_count{{{labels}}} 2.0" in text
    assert f"rqueue_queue_dead_letters{{{labels}}} 1.0" in text
    assert f"rqueue_group_ack_floor{{{labels}}} 2.0" in text


def test_a_call_that_fails_once_is_retried_and_counted():
    # The first attempt runs outside the retry loop; a transient failure
    # (as the engine raises it: every driver error is translated) must still
    # be retried, counted and mark the worker for a resync, and anything
    # else must still be raised at once.
    stats = WorkerStats()
    retry = Reconnector(5, Tally(stats))
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise rqueue.ConnectionLost("gone")
        return "done"

    assert retry(flaky) == "done" and len(calls) == 2
    assert stats.reconnects == 1 and retry.resync

    def broken():
        calls.append(1)
        raise ValueError("not transient")

    calls.clear()
    with pytest.raises(ValueError):
        retry(broken)
    assert len(calls) == 1 and stats.reconnects == 1

    # and a driver error that reached the worker untranslated is not taken
    # for a lost connection: nothing unwrapped should reach it
    def untranslated():
        calls.append(1)
        raise redis.ConnectionError("gone")

    calls.clear()
    with pytest.raises(redis.ConnectionError):
        retry(untranslated)
    assert len(calls) == 1


def test_a_call_failing_oddly_after_the_watchdog_closed_its_connection_is_a_lost_connection():
    # given a watchdog that closes the connections of a call unanswered past
    # reconnect_timeout, and a call that then fails as redis-py can when its
    # socket is closed from another thread (poll() on a socket set to None)
    stats = WorkerStats()
    closed = threading.Event()
    retry = Reconnector(0.3, Tally(stats), cut_off=closed.set)
    calls = []

    def unanswered():
        calls.append(1)
        assert closed.wait(5), "the watchdog never cut the call off"
        raise TypeError("argument must be an int, or have a fileno() method.")

    retry.watch()
    try:
        # when the call is sent: then it ends as a lost connection (the
        # outage has lasted reconnect_timeout: no retry)
        with pytest.raises(rqueue.ConnectionLost, match=r"cut off under way \(TypeError"):
            retry(unanswered)
        assert len(calls) == 1

        # and the same error of a call sent once is a lost connection too
        closed.clear()
        with pytest.raises(rqueue.ConnectionLost, match=r"cut off under way \(TypeError"):
            retry.once(unanswered)
    finally:
        retry.unwatch()

    # and without a cut-off the error is the call's own, raised at once
    def broken():
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        retry(broken)


@pytest.mark.parametrize("send", ["retried", "once"])
def test_a_call_that_handled_its_cut_off_step_itself_does_not_end_the_outage(send, caplog):
    # Given a watchdog with reconnect_timeout 0.3 s, and a call whose step
    # Redis leaves unanswered until the watchdog cuts it off, and which goes
    # on without that step (as a join does with its best-effort steps)
    stats = WorkerStats()
    closed = threading.Event()
    retry = Reconnector(0.3, Tally(stats), cut_off=closed.set)
    sender = retry if send == "retried" else retry.once

    def handles_its_lost_step():
        assert closed.wait(5), "the watchdog never cut the call off"
        return "went on"

    def down():
        raise rqueue.ConnectionLost("gone")

    caplog.set_level(logging.WARNING, logger="rqueue.worker")
    retry.watch()
    try:
        # When the call returns, and the next call finds Redis still gone
        began = time.monotonic()
        assert sender(handles_its_lost_step) == "went on"
        with pytest.raises(rqueue.ConnectionLost):
            retry(down)
        # Then the worker gives up at once: Redis has not answered since the
        # first call was sent, more than reconnect_timeout ago
        assert stats.reconnects == 0
        assert time.monotonic() - began < 0.3 + 0.2 + 1.0
        messages = [r.getMessage() for r in caplog.records]
        assert sum(m.startswith("giving up: Redis has not answered for") for m in messages) == 1
        # and a call answered without a cut-off ends the outage (the watchdog,
        # the outage's deadline past, would cut off any call under way)
        retry.unwatch()
        assert retry(lambda: "answered") == "answered"
        assert "Redis answers again" in caplog.records[-1].getMessage()
    finally:
        retry.unwatch()


def test_a_call_that_keeps_failing_gives_up_after_reconnect_timeout(caplog):
    stats = WorkerStats()
    retry = Reconnector(0.3, Tally(stats))
    calls = []

    def down():
        calls.append(1)
        raise rqueue.ConnectionLost("gone")

    caplog.set_level(logging.WARNING, logger="rqueue.worker")
    with pytest.raises(rqueue.ConnectionLost):
        retry(down)
    assert len(calls) >= 2 and stats.reconnects == len(calls) - 1
    # and the log says when reconnecting started and when it gave up, once each
    messages = [r.getMessage() for r in caplog.records]
    assert sum("retrying the worker's calls for up to 0.3 s" in m for m in messages) == 1
    assert sum(m.startswith("giving up: Redis has not answered for") for m in messages) == 1


def test_a_delivery_acked_while_a_heartbeat_is_under_way_is_not_counted_as_a_lost_lease():
    # given a heartbeat that lists two running deliveries, one of which the
    # dispatcher settles before Redis answers (both come back "not held")
    from rqueue.worker.heartbeat import Heartbeat
    from rqueue.worker.ledger import Ledger
    from rqueue.worker.outcome import Outcome

    client = rqueue.connect("memory://heartbeat-race", prefix="hb")
    q = client.queue("orders")
    q.publish_many([b"a", b"b"])
    consumer = q.consumer("g")
    kept, settled = consumer.fetch(2)
    ledger = Ledger()
    ledger.fetched([kept, settled])
    ledger.start(kept, client.clock.monotonic())
    ledger.start(settled, client.clock.monotonic())
    called = threading.Event()

    class Racing:
        name, group = consumer.name, consumer.group
        state_epoch = 0  # no loss of Redis state seen

        def heartbeat(self, deliveries, timeout):
            if called.is_set():  # later beats fail (not counted), so one beat is measured
                raise rqueue.ConnectionLost("a later beat")
            ledger.stop(settled)
            ledger.result(settled, Outcome.ACK, "")
            ledger.drain()  # the dispatcher took its ack meanwhile
            called.set()
            refused = [rqueue.NotHeld(d.tag) for d in deliveries]
            return rqueue.HeartbeatResult(refused, 0, 0, 0, 0)

    stats = WorkerStats()
    tally = Tally(stats)
    beat = Heartbeat(
        consumer=Racing(),
        queue_name="orders",
        ledger=ledger,
        tally=tally,
        retry=Reconnector(1.0, tally),
        clock=client.clock,
        ack_wait=lambda: 30.0,
        interval=0.01,
        timeout=5.0,
        max_run_time=60.0,
    )
    # when one heartbeat runs
    beat.start()
    try:
        assert called.wait(5)
        wait_for(lambda: stats.leases_lost > 0, timeout=5)
    finally:
        beat.stop()
    # then only the delivery still held counts as a lost lease
    assert stats.leases_lost == 1
    assert ledger.is_known(kept) and not ledger.is_known(settled)
    client.close()


def test_after_a_loss_of_redis_state_only_deliveries_from_before_it_are_dropped():
    # given a ledger with one delivery waiting from before a loss (epoch 0) and one fetched after it (epoch 1)
    from rqueue.worker.ledger import Ledger

    client = rqueue.connect("memory://ledger-epochs", prefix="le")
    q = client.queue("orders")
    q.publish_many([b"old", b"new"])
    old, new = q.consumer("g").fetch(2)
    new.epoch = 1
    ledger = Ledger()
    ledger.fetched([old, new])
    ledger.wait([old, new], 0.0)
    # when the heartbeat or the dispatcher drops what is from before epoch 1
    dropped = ledger.forget_waiting(epoch_for=lambda d: 1)
    # then only the old one is dropped: the new one still runs
    assert dropped == 1
    stopping = threading.Event()
    assert ledger.take(old, stopping) is rqueue.worker.outcome.Outcome.SKIPPED
    assert ledger.take(new, stopping) == 0.0
    client.close()


def test_begin_starts_a_fresh_delivery_and_leaves_a_stale_one_taken_but_not_running():
    # given a ledger with two deliveries waiting, one fetched 1 s ago and one 10 s ago
    from rqueue.worker.ledger import Ledger
    from rqueue.worker.outcome import Outcome

    client = rqueue.connect("memory://ledger-begin", prefix="lb")
    q = client.queue("orders")
    q.publish_many([b"fresh", b"stale", b"gone"])
    fresh, stale, gone = q.consumer("g").fetch(3)
    ledger = Ledger()
    ledger.fetched([fresh, stale, gone])
    ledger.wait([fresh], 99.0)
    ledger.wait([stale], 90.0)
    stopping = threading.Event()
    # when handler threads begin them at 100 s with a stale age of 5 s
    began_fresh = ledger.begin(fresh, stopping, 100.0, 5.0)
    began_stale = ledger.begin(stale, stopping, 100.0, 5.0)
    # then the fresh one runs since 100 s, in the same step
    assert began_fresh is None
    running, waiting = ledger.leases(100.0, 60.0)
    assert running == [fresh] and waiting == []
    # and the stale one is taken (its fetch's time returned for a check with
    # Redis) but runs only once the caller starts it
    assert began_stale == 90.0
    assert not ledger.stop(stale)
    # and one no longer waiting is skipped; with the worker stopping, one is returned
    assert ledger.begin(gone, stopping, 100.0, 5.0) is Outcome.SKIPPED
    ledger.wait([gone], 99.0)
    stopping.set()
    assert ledger.begin(gone, stopping, 100.0, 5.0) is Outcome.RETURNED
    client.close()


def test_a_delivery_from_before_a_loss_of_redis_state_is_not_run_nor_left_running(caplog):
    # given a handler thread's turn at a delivery made before a loss of Redis
    # state its consumer has seen since (its epoch is older than the consumer's)
    from rqueue.worker.handlers import Handlers
    from rqueue.worker.ledger import Ledger
    from rqueue.worker.outcome import Outcome

    client = rqueue.connect("memory://handle-epoch", prefix="he")
    q = client.queue("orders")
    q.publish(b"old")
    consumer = q.consumer("g")
    (d,) = consumer.fetch(1)
    d.epoch = consumer.state_epoch - 1
    ledger = Ledger()
    ledger.fetched([d])
    ledger.wait([d], client.clock.monotonic())
    ran = []
    stats = WorkerStats()
    tally = Tally(stats)
    handlers = Handlers(
        ran.append,
        1,
        consumer=consumer,
        ledger=ledger,
        tally=tally,
        retry=Reconnector(1.0, tally),
        clock=client.clock,
        notifier=types.SimpleNamespace(poke=lambda: None),
        stopping=threading.Event(),
        ack_wait=lambda: 30.0,
        heartbeat_timeout=5.0,
    )
    # when the thread handles it
    with caplog.at_level(logging.INFO, logger="rqueue.worker"):
        done = handlers._handle(d)
    # then it is skipped, unrun, and says why; and the heartbeat no longer keeps it alive
    assert done == (Outcome.SKIPPED, "")
    assert ran == [] and stats.stale_skipped == 1
    assert f"not running {d.tag}: fetched before Redis lost the queue's state" in caplog.messages
    assert ledger.leases(client.clock.monotonic(), 60.0) == ([], [])
    client.close()


def test_a_waiting_delivery_withdrawn_by_a_heartbeat_is_logged_as_not_run(caplog):
    # given a ledger with two deliveries waiting, one of them already taken by a handler thread
    from rqueue.worker.ledger import Ledger

    client = rqueue.connect("memory://ledger-lost", prefix="ll")
    q = client.queue("orders")
    q.publish_many([b"a", b"b"])
    waiting, taken = q.consumer("g").fetch(2)
    ledger = Ledger()
    ledger.fetched([waiting, taken])
    ledger.wait([waiting, taken], 0.0)
    assert ledger.take(taken, threading.Event()) == 0.0
    # when a heartbeat finds both no longer held
    with caplog.at_level(logging.INFO, logger="rqueue.worker"):
        ledger.lost([(waiting, rqueue.NotHeld(waiting.tag)), (taken, rqueue.NotHeld(taken.tag))])
    # then the one withdrawn says why it is not run; the one its handler took is left to that thread
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not running")]
    assert lines == [f"not running {waiting.tag}: its lease was lost while it waited (a heartbeat found it)"]
    assert ledger.take(waiting, threading.Event()) is rqueue.worker.outcome.Outcome.SKIPPED
    client.close()


def test_a_result_handed_in_while_the_dispatcher_drains_is_drained_or_wakes_it():
    # given a ledger holding one result, and a handler thread handing in a
    # second one whose check for results already waiting is answered just
    # before the dispatcher drains them all (as a thread switch there does)
    from rqueue.engine.notify import Notifier
    from rqueue.worker.ledger import Ledger
    from rqueue.worker.outcome import Outcome

    ledger, notifier = Ledger(), Notifier(None)  # type: ignore[arg-type]  # wait_any on no channel: no Redis
    first, second = types.SimpleNamespace(tag="1"), types.SimpleNamespace(tag="2")
    checked, drained = threading.Event(), threading.Event()
    handler_thread: list[threading.Thread] = []

    class Racing(collections.deque):
        def __len__(self) -> int:
            n = super().__len__()
            if handler_thread and threading.current_thread() is handler_thread[0] and not checked.is_set():
                checked.set()
                # the dispatcher drains now, unless the ledger keeps it out until the append
                drained.wait(0.3)
            return n

    ledger._results = Racing([(first, Outcome.ACK, "")])
    settled: dict[str, float] = {}

    def dispatch() -> None:  # as Dispatcher.run: drain, then sleep until woken for results
        assert checked.wait(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "2" not in settled:
            acks, _ = ledger.drain()
            settled.update((d.tag, time.monotonic()) for d in acks)
            drained.set()
            if "2" not in settled:
                notifier.wait_any({}, 5, until=ledger.has_results)

    def hand_in() -> None:  # as Handlers._work
        if ledger.result(second, Outcome.ACK, ""):
            notifier.poke()

    dispatcher = threading.Thread(target=dispatch)
    dispatcher.start()
    handler_thread.append(threading.Thread(target=hand_in))
    handed = time.monotonic()
    handler_thread[0].start()
    handler_thread[0].join(5)
    dispatcher.join(10)
    # then the second result is settled at once, not after the dispatcher's idle poll
    assert "2" in settled and settled["2"] - handed < 1.0


def test_an_idle_workers_wait_in_redis_stays_inside_half_the_stale_age_and_the_reconnect_timeout():
    from rqueue.worker.dispatcher import redis_wait

    # the poll interval, by default
    assert redis_wait(0.5, reconnect_timeout=60, ack_wait=30, heartbeat_timeout=10) == 0.5
    # half the stale age, for a short lease: what it brings is not judged stale for the wait
    assert redis_wait(0.5, reconnect_timeout=60, ack_wait=0.4, heartbeat_timeout=10) == pytest.approx(0.1)
    # half the reconnect timeout: the watchdog does not cut the wait off
    assert redis_wait(0.5, reconnect_timeout=0.4, ack_wait=30, heartbeat_timeout=10) == pytest.approx(0.2)
