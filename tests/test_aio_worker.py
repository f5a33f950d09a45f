"""The asyncio worker (rqueue.aio.Worker) beside the threaded one: a core set
of the worker tests runs against both, so that a difference in behaviour
fails here; then what only the asyncio worker has (its task cancelled,
SIGTERM on its loop, a Redis restart under it)."""

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
from pathlib import Path

import pytest
from support.counting import count_calls
from support.servers import start_server, wait_for

import rqueue
import rqueue.aio
from rqueue.worker.ledger import Ledger

HERE = Path(__file__).resolve().parent
BOTH = pytest.mark.parametrize("kind", ["threaded", "async"])
# Each test runs on a real server and on memory://: the worker's code is the
# same whatever the backend, which tests/test_worker.py covers.
BACKENDS = pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)


@pytest.fixture
def live(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


class Calls:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seqs: list[int] = []

    def add(self, seq: int) -> None:
        with self.lock:
            self.seqs.append(seq)

    def count(self) -> collections.Counter[int]:
        with self.lock:
            return collections.Counter(self.seqs)


class AsyncWorkerThread:
    """An rqueue.aio.Worker on its own event loop in a thread, with its own
    asyncio client, driven as a threaded worker is (start, stop, join)."""

    def __init__(self, url: str, prefix: str, queue: str, group: str, handler, **options) -> None:
        self.url, self.prefix, self.queue_name, self.group = url, prefix, queue, group
        self.handler, self.options = handler, options
        self.worker: rqueue.aio.Worker | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True).start()
        assert self._ready.wait(10)
        if self.error is not None:
            raise self.error

    async def _main(self) -> None:
        try:
            client = await rqueue.aio.connect(self.url, prefix=self.prefix, settings_ttl=0)
        except BaseException as exc:
            self.error = exc
            self._ready.set()
            self._done.set()
            return
        try:
            self.worker = rqueue.aio.Worker(client.queue(self.queue_name), self.group, self.handler, **self.options)
        except BaseException as exc:
            self.error = exc
            self._ready.set()
        try:
            if self.worker is not None:
                self._ready.set()
                await self.worker.run(install_signal_handlers=False)
        except BaseException as exc:
            self.error = exc
        finally:
            await client.close()
            self._done.set()

    def stop(self, now: bool = False) -> None:
        assert self.worker is not None
        self.worker.stop(now)

    def join(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def stats(self) -> rqueue.WorkerStats:
        assert self.worker is not None
        return self.worker.stats

    @property
    def prefetch(self) -> int:
        assert self.worker is not None
        return self.worker.prefetch

    @property
    def consumer(self):
        assert self.worker is not None
        return self.worker.consumer


def run_worker(kind: str, backend: str, prefix: str, q, handler, **options):
    if kind == "threaded":
        w = rqueue.Worker(q, "g", handler, **options)
    else:
        w = AsyncWorkerThread(backend, prefix, q.name, "g", handler, **options)
    w.start()
    return w


def floor_reaches(q, group, seq):
    def reached():
        stats = q.stats()
        return group in [g.name for g in stats.groups] and stats.group(group).ack_floor >= seq

    return reached


def in_flight(q, group="g"):
    stats = q.stats()
    return stats.group(group).in_flight if group in [g.name for g in stats.groups] else 0


# -- both workers ------------------------------------------------------------------


def slow_polls(monkeypatch):
    """Both workers' idle polls a minute apart: what a test waits for comes
    some other way, or not within its deadline."""
    import rqueue.aio.worker
    import rqueue.worker.dispatcher

    monkeypatch.setattr(rqueue.worker.dispatcher, "IDLE_POLL_INTERVAL", 60.0)
    monkeypatch.setattr(rqueue.aio.worker, "IDLE_POLL_INTERVAL", 60.0)


def deaf_channels(monkeypatch):
    """Cuts off the channel's wake-ups for both workers' clients: a wait on
    it lasts until its timeout or its own condition."""
    import rqueue.aio.notify
    import rqueue.engine.notify

    sync_wait = rqueue.engine.notify.Notifier.wait_any
    async_wait = rqueue.aio.notify.AsyncNotifier.wait_any
    monkeypatch.setattr(
        rqueue.engine.notify.Notifier,
        "wait_any",
        lambda self, since, timeout, until=None: sync_wait(self, {}, timeout, until),
    )
    monkeypatch.setattr(
        rqueue.aio.notify.AsyncNotifier,
        "wait_any",
        lambda self, since, timeout, until=None: async_wait(self, {}, timeout, until),
    )


@BOTH
@BACKENDS
def test_an_idle_worker_waits_in_redis_for_a_publish_and_stops_at_once(kind, backend, prefix, live, monkeypatch):
    # given an idle worker whose fetch waits in Redis, with polling made too
    # slow to matter and the channel's wake-ups cut off
    slow_polls(monkeypatch)
    deaf_channels(monkeypatch)
    live.configure("orders", wait_in_redis=True)
    q = live.queue("orders")
    calls = Calls()
    w = run_worker(kind, backend, prefix, q, lambda d: calls.add(d.seq), reconnect_timeout=120)
    try:
        wait_for(lambda: live.redis.hget(q.keys.meta, "wake") is not None)
        # when a message is published, then it runs long before a poll
        q.publish(b"m")
        wait_for(lambda: calls.count() == {1: 1})
        wait_for(floor_reaches(q, "g", 1))
        # and when the idle worker is stopped, it ends long before its 30 s wait
        wait_for(lambda: live.redis.hget(q.keys.meta, "wake") is not None)
    finally:
        w.stop()
    assert w.join(10)


@BOTH
@BACKENDS
def test_a_fetch_whose_reply_is_lost_hands_its_message_back_and_runs_it_at_once(
    kind, backend, prefix, live, monkeypatch
):
    # given a message, and a worker whose first fetch that brings one loses
    # its reply (the script ran: the message is leased to the worker, which
    # does not know it), with polling made too slow to matter and the
    # channel's wake-ups cut off
    import rqueue.aio.consumer
    import rqueue.consumer

    slow_polls(monkeypatch)
    deaf_channels(monkeypatch)
    lost = threading.Event()
    sync_fetch = rqueue.consumer.Consumer.ack_and_fetch
    async_fetch = rqueue.aio.consumer.Consumer.ack_and_fetch

    def lose_once(reply):
        if reply[1] and not lost.is_set():
            lost.set()
            raise rqueue.ConnectionLost("the reply was lost")
        return reply

    async def async_lose_once(self, *args, **kwargs):
        return lose_once(await async_fetch(self, *args, **kwargs))

    monkeypatch.setattr(rqueue.consumer.Consumer, "ack_and_fetch", lambda *a, **k: lose_once(sync_fetch(*a, **k)))
    monkeypatch.setattr(rqueue.aio.consumer.Consumer, "ack_and_fetch", async_lose_once)
    q = live.queue("orders")
    q.publish(b"m")
    counts: list[int] = []
    # when the worker runs
    w = run_worker(kind, backend, prefix, q, lambda d: counts.append(d.delivery_count), reconnect_timeout=120)
    try:
        # then it hands the message back and fetches it again at once (the
        # hand-back announces nothing, and the next poll is a minute away),
        # and the handler runs it once, as its first delivery (one that
        # reached no handler does not count)
        wait_for(floor_reaches(q, "g", 1))
        assert lost.is_set() and counts == [1]
    finally:
        w.stop()
    assert w.join(10)


@BOTH
@BACKENDS
def test_an_idle_worker_whose_wake_stream_is_overwritten_warns_and_goes_on(
    kind, backend, prefix, live, monkeypatch, caplog
):
    # given an idle worker waiting in Redis, with polling made too slow to matter
    slow_polls(monkeypatch)
    live.configure("orders", wait_in_redis=True)
    q = live.queue("orders")
    calls = Calls()
    w = run_worker(kind, backend, prefix, q, lambda d: calls.add(d.seq), reconnect_timeout=120)
    try:
        wait_for(lambda: live.redis.hget(q.keys.meta, "wake") is not None)
        # when its wake stream is replaced by a string (WRONGTYPE for XREAD;
        # memory:// fails it with a Python error) and messages are published
        live.redis.delete(q.keys.wakes)
        live.redis.set(q.keys.wakes, "not a stream")
        q.publish(b"a")
        wait_for(lambda: calls.count() == {1: 1})
        q.publish(b"b")
        # then every message runs (the worker lives on), and it says why it waits on the channel
        wait_for(lambda: calls.count() == {1: 1, 2: 1})
    finally:
        w.stop()
    assert w.join(10)
    assert "waits on the wake-up channel instead" in caplog.text


@BACKENDS
@BOTH
def test_return_acks_exception_nacks_reject_dead_letters(kind, live, backend, prefix):
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
    w = run_worker(kind, backend, prefix, q, handler, concurrency=2)
    wait_for(floor_reaches(q, "g", 3))
    w.stop()
    assert w.join(10)
    # then "ok" ran once, "fail" max_deliveries times, "reject" once
    assert calls.count() == {1: 1, 2: 2, 3: 1}
    dead = {m.headers["x-rq-seq"]: m.headers for m in q.dead_letter_queue.peek()}
    assert (dead["2"]["x-rq-reason"], dead["2"]["x-rq-error"]) == ("max-deliveries", "ValueError: boom")
    assert (dead["3"]["x-rq-reason"], dead["3"]["x-rq-error"]) == ("rejected", "not for us")
    assert (w.stats.acked, w.stats.nacked, w.stats.rejected, w.stats.dead_lettered) == (1, 2, 1, 2)
    assert q.stats().group("g").consumers == []  # it left the group


@BACKENDS
@BOTH
def test_a_partitioned_queue_has_every_message_handled_once(kind, live, backend, prefix):
    # given a queue of three partitions with messages in each, one failing once
    pq = live.queue("orders", partitions=3)
    pq.publish_many([b"%d" % i for i in range(30)], keys=[f"k{i}" for i in range(30)])
    calls = Calls()
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def handler(d):
        with lock:
            first = (d.consumer.queue.partition, d.seq) not in seen
            seen.add((d.consumer.queue.partition, d.seq))
        calls.add(int(d.data))
        if d.data == b"7" and first:
            raise ValueError("once")

    # when a worker runs until every partition's group has settled its messages
    w = run_worker(kind, backend, prefix, pq, handler, concurrency=3)
    wait_for(lambda: pq.stats().groups and pq.stats().group("g").acked == 30)
    w.stop()
    assert w.join(10)
    # then each message ran once, the failed one twice, and nothing is left in flight
    assert calls.count() == {i: 2 if i == 7 else 1 for i in range(30)}
    g = pq.stats().group("g")
    assert (g.acked, g.in_flight, g.pending) == (30, 0, 0)


@BACKENDS
@BOTH
def test_a_handler_runs_exactly_once_per_message_past_ack_wait(kind, live, backend, prefix):
    # SPEC guarantee 3: handlers longer than ack_wait, kept alive by the heartbeat
    # (a 0.8 s lease, sixteen heartbeat intervals: a loaded machine that holds
    # the worker back for a few of them does not let it run out)
    live.configure("orders", ack_wait=0.8)
    q = live.queue("orders")
    q.publish_many([b"m"] * 3)
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        time.sleep(1.2)

    w = run_worker(kind, backend, prefix, q, handler, concurrency=1, heartbeat_interval=0.05, heartbeat_timeout=2)
    wait_for(floor_reaches(q, "g", 3), timeout=30)
    w.stop()
    assert w.join(10)
    assert calls.count() == {1: 1, 2: 1, 3: 1}
    assert q.stats().group("g").redelivered == 0
    assert w.stats.stale_skipped == 0


@BACKENDS
@BOTH
def test_coroutine_handler_nacks_and_acks(kind, live, backend, prefix):
    q = live.queue("orders")
    q.publish_many([b"a", b"b", b"c"])
    seen = []

    async def handler(d):
        await asyncio.sleep(0.01)
        seen.append(d.data)
        if d.data == b"b" and d.delivery_count == 1:
            raise RuntimeError("once")

    w = run_worker(kind, backend, prefix, q, handler, concurrency=2)
    wait_for(floor_reaches(q, "g", 3))
    w.stop()
    assert w.join(10)
    assert sorted(seen) == [b"a", b"b", b"b", b"c"]
    assert (w.stats.handled, w.stats.acked, w.stats.nacked) == (4, 3, 1)


@BACKENDS
@BOTH
def test_holds_prefetch_and_hands_back_waiting_deliveries_at_once_on_stop(kind, live, backend, prefix):
    # given a worker of 2 handlers, both blocked, holding twice that
    q = live.queue("orders")
    q.publish_many([b"m"] * 10)
    running = threading.Semaphore(0)
    release = threading.Event()

    def handler(d):
        running.release()
        release.wait(10)

    w = run_worker(kind, backend, prefix, q, handler, concurrency=2, grace_period=10)
    try:
        for _ in range(2):
            assert running.acquire(timeout=10)
        wait_for(lambda: in_flight(q) == 4)
        # (what it may hold once quick handlers wait for fetches: docs/worker.md, "Prefetch")
        assert w.prefetch == rqueue.constants.ADAPTIVE_PREFETCH_CAP
        # when it is stopped while both handlers still run
        w.stop()
        # then the two waiting are offered again at once, the running two stay held
        wait_for(lambda: in_flight(q) == 2)
    finally:
        release.set()
    assert w.join(10)
    g = q.stats().group("g")
    assert (g.ack_floor, g.in_flight, g.consumers) == (2, 0, [])
    assert w.stats.handled == 2
    # and they were never attempts: their next delivery is a first one
    with q.consumer("g", name="next") as c:
        ds = c.fetch(10)
        assert [(d.seq, d.delivery_count) for d in ds] == [(s, 1) for s in range(3, 11)]
        c.ack(ds)


@BACKENDS
@BOTH
def test_waiting_deliveries_keep_their_lease_and_run_once(kind, live, backend, prefix):
    # given 3 deliveries waiting behind a handler 2x ack_wait long, and a
    # second worker ready to take any lease that runs out (a 0.8 s lease, as above)
    live.configure("orders", ack_wait=0.8)
    q = live.queue("orders")
    q.publish_many([b"m"] * 4)
    calls = Calls()

    def handler(d):
        calls.add(d.seq)
        time.sleep(1.6)

    opts = dict(concurrency=1, prefetch=4, heartbeat_interval=0.05, heartbeat_timeout=2)
    a = run_worker(kind, backend, prefix, q, handler, **opts)
    wait_for(lambda: in_flight(q) == 4)
    b = run_worker(kind, backend, prefix, q, handler, **opts)
    wait_for(floor_reaches(q, "g", 4), timeout=30)
    for w in (a, b):
        w.stop()
        assert w.join(10)
    # then each ran once: the heartbeat kept the waiting leases alive
    assert calls.count() == {seq: 1 for seq in range(1, 5)}
    assert q.stats().group("g").redelivered == 0


@pytest.mark.parametrize("acked_meanwhile", [True, False], ids=["acked-meanwhile", "still-held"])
@BOTH
def test_a_worker_stalled_between_the_take_and_the_handler_runs_nothing_acked_meanwhile(
    kind, acked_meanwhile, live, backend, prefix, monkeypatch
):
    # given a worker whose handler stalls right after it takes message 1, past the stale
    # age (half of min(ack_wait, heartbeat_timeout): 0.5 s), as a SIGSTOP or a long GC
    # pause there would; and message 1 acked meanwhile under the worker's name (as the
    # group's ack after a redelivery would settle it), or not
    q = live.queue("orders")
    q.publish(b"m")
    begin = Ledger.begin
    stalled = []

    def stalling(self, d, *args, **kwargs):
        taken = begin(self, d, *args, **kwargs)
        if not stalled:
            stalled.append(d.seq)
            if acked_meanwhile:
                q.consumer("g", name=d.consumer.name).ack(d.tag)  # a twin: not closed, not left
            time.sleep(0.8)
        return taken

    monkeypatch.setattr(Ledger, "begin", stalling)
    calls = Calls()
    w = run_worker(kind, backend, prefix, q, lambda d: calls.add(d.seq), heartbeat_interval=0.2, heartbeat_timeout=1.0)
    wait_for(floor_reaches(q, "g", 1))
    wait_for(lambda: w.stats.handled + w.stats.stale_skipped >= 1)
    w.stop()
    assert w.join(10)
    # then the handler ran only if the worker still held it (checked with Redis after the stall)
    assert stalled == [1]
    if acked_meanwhile:
        assert (calls.count(), w.stats.stale_skipped, w.stats.handled) == ({}, 1, 0)
    else:
        assert (calls.count(), w.stats.stale_skipped, w.stats.handled) == ({1: 1}, 0, 1)
    assert q.stats().group("g").redelivered == 0


def stall_the_first_batch_after_its_start(q, monkeypatch, acked_meanwhile):
    """Makes the first batch a worker starts stall right after its start (its take
    done, its handler not yet called), past the stale age (0.5 s), as a SIGSTOP or a
    long GC pause there would, with the messages ``acked_meanwhile`` acked under the
    worker's name (as the group's ack after a redelivery would settle them); returns
    the seqs of the stalled batch."""
    start_batch = Ledger.start_batch
    stalled: list[list[int]] = []

    def stalling(self, deliveries, *args, **kwargs):
        start_batch(self, deliveries, *args, **kwargs)
        if not stalled:
            stalled.append([d.seq for d in deliveries])
            acked = [d.tag for d in deliveries if d.seq in acked_meanwhile]
            q.consumer("g", name=deliveries[0].consumer.name).ack(acked)  # a twin: not closed, not left
            time.sleep(0.8)

    monkeypatch.setattr(Ledger, "start_batch", stalling)
    return stalled


@BOTH
def test_a_batch_stalled_between_the_take_and_the_handler_runs_only_what_is_still_held(
    kind, live, backend, prefix, monkeypatch
):
    # given a worker whose batch of messages 1 and 2 stalls between its take and the
    # batch handler's call, past the stale age, and message 1 acked meanwhile under
    # the worker's name while 2 is still held
    q = live.queue("orders")
    q.publish_many([b"1", b"2"])
    stalled = stall_the_first_batch_after_its_start(q, monkeypatch, acked_meanwhile={1})
    batches: list[list[int]] = []

    @rqueue.batch_handler(size=10)
    def handler(ds):
        batches.append([d.seq for d in ds])
        return [True] * len(ds)

    # when the worker runs until the group has settled both
    w = run_worker(kind, backend, prefix, q, handler, concurrency=1, heartbeat_interval=0.2, heartbeat_timeout=1.0)
    wait_for(floor_reaches(q, "g", 2))
    wait_for(lambda: w.stats.handled + w.stats.stale_skipped >= 2)
    w.stop()
    assert w.join(10)
    # then the batch handler got only message 2, the one Redis still held (checked
    # with Redis after the stall), and message 1 was not run
    assert stalled == [[1, 2]]
    assert batches == [[2]]
    assert (w.stats.stale_skipped, w.stats.handled, w.stats.acked) == (1, 1, 1)
    assert q.stats().group("g").redelivered == 0


@BOTH
def test_a_batch_stalled_between_the_take_and_the_handler_whose_every_message_was_handed_on_is_not_run(
    kind, live, backend, prefix, monkeypatch
):
    # given a worker whose batch of messages 1 and 2 stalls between its take and the
    # batch handler's call, past the stale age, and both acked meanwhile under the
    # worker's name
    q = live.queue("orders")
    q.publish_many([b"1", b"2"])
    stalled = stall_the_first_batch_after_its_start(q, monkeypatch, acked_meanwhile={1, 2})
    calls = Calls()
    handler = rqueue.BatchHandler(lambda ds: [calls.add(d.seq) or True for d in ds], size=10)

    # when the worker runs until it has dealt with both
    w = run_worker(kind, backend, prefix, q, handler, concurrency=1, heartbeat_interval=0.2, heartbeat_timeout=1.0)
    wait_for(floor_reaches(q, "g", 2))
    wait_for(lambda: w.stats.handled + w.stats.stale_skipped >= 2)
    w.stop()
    assert w.join(10)
    # then the batch handler was never called
    assert stalled == [[1, 2]]
    assert calls.count() == {}
    assert (w.stats.stale_skipped, w.stats.handled, w.stats.acked) == (2, 0, 0)
    assert q.stats().group("g").redelivered == 0


@BACKENDS
@BOTH
def test_a_removed_worker_runs_none_of_its_waiting_deliveries(kind, live, backend, prefix):
    # given a worker whose only handler is busy with message 1 while message 2 waits
    q = live.queue("orders")
    q.publish_many([b"1", b"2"])
    calls = Calls()
    started = threading.Event()
    release = threading.Event()

    def handler(d):
        calls.add(d.seq)
        started.set()
        release.wait(10)

    w = run_worker(kind, backend, prefix, q, handler, concurrency=1, prefetch=2, heartbeat_interval=0.1)
    try:
        assert started.wait(10)
        wait_for(lambda: in_flight(q) == 2)
        # when it is removed (a twin of its name leaves), another consumer
        # takes and acks both, and the worker joins again
        q.consumer("g", name=w.consumer.name).close()
        with q.consumer("g", name="other") as other:
            got = other.fetch(2)
            assert [d.seq for d in got] == [1, 2]
            other.ack(got)
        wait_for(lambda: w.consumer.name in [c.name for c in q.stats().group("g").consumers])
    finally:
        release.set()
    # then message 2 is not run from the worker, and message 1's ack is late
    wait_for(lambda: w.stats.stale_skipped == 1 and w.stats.late_settles == 1)
    w.stop()
    assert w.join(10)
    assert calls.count() == {1: 1}


@BACKENDS
@BOTH
def test_bad_worker_arguments(kind, live, backend, prefix):
    if kind == "threaded":
        q, make = live.queue("orders"), rqueue.Worker
    else:
        q, make = asyncio.run(rqueue.aio.connect(backend, prefix=prefix)).queue("orders"), rqueue.aio.Worker
    with pytest.raises(rqueue.InvalidInput, match="concurrency"):
        make(q, "g", print, concurrency=0)
    with pytest.raises(rqueue.InvalidInput, match="not callable"):
        make(q, "g", "print")
    with pytest.raises(rqueue.InvalidInput, match="heartbeat_timeout"):
        make(q, "g", print, heartbeat_interval=2, heartbeat_timeout=1)
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(rqueue.InvalidInput, match="prefetch"):
            make(q, "g", print, prefetch=bad)
    with pytest.raises(rqueue.InvalidName):
        make(q, "bad group", print)


# -- batch handlers (both workers) --------------------------------------------------


@BACKENDS
@BOTH
def test_a_batch_handler_settles_each_delivery_by_its_outcome(kind, live, backend, prefix):
    # given five messages and a batch handler that answers by payload, with
    # the outcome enum, True, an exception instance and rqueue.Reject
    live.configure("orders", max_deliveries=2, redelivery_delay=0)
    q = live.queue("orders")
    q.publish_many([b"ok", b"nack", b"reject", b"err", b"yes"])
    calls = Calls()
    answers = {
        b"ok": rqueue.worker.Outcome.ACK,
        b"nack": rqueue.worker.Outcome.NACK,
        b"reject": rqueue.Reject("not for us"),
        b"err": ValueError("boom"),
        b"yes": True,
    }

    @rqueue.batch_handler(size=10)
    def handler(ds):
        for d in ds:
            calls.add(d.seq)
        return [answers[d.data] for d in ds]

    # when a worker runs until the group has settled all five
    w = run_worker(kind, backend, prefix, q, handler, concurrency=1)
    wait_for(floor_reaches(q, "g", 5))
    w.stop()
    assert w.join(10)
    # then the acks ran once, the nacks max_deliveries times, the reject once
    assert calls.count() == {1: 1, 2: 2, 3: 1, 4: 2, 5: 1}
    dead = {m.headers["x-rq-seq"]: m.headers for m in q.dead_letter_queue.peek()}
    assert dead["2"]["x-rq-error"] == "nacked by the batch handler"
    assert (dead["3"]["x-rq-reason"], dead["3"]["x-rq-error"]) == ("rejected", "not for us")
    assert (dead["4"]["x-rq-reason"], dead["4"]["x-rq-error"]) == ("max-deliveries", "ValueError: boom")
    assert (w.stats.acked, w.stats.nacked, w.stats.rejected, w.stats.handled) == (2, 4, 1, 7)


@BACKENDS
@BOTH
def test_a_batch_handler_that_raises_or_leaves_one_out_acks_none_of_it(kind, live, backend, prefix):
    # given three messages and a batch handler whose first call leaves one
    # out of its mapping, second raises, third returns too many outcomes
    live.configure("orders", max_deliveries=4, redelivery_delay=0)
    q = live.queue("orders")
    q.publish_many([b"a", b"b", b"c"])
    batches: list[list[int]] = []

    def answer(ds):
        batches.append([d.seq for d in ds])
        if len(batches) == 1:
            return {d.tag: True for d in ds if d.seq != 2}
        if len(batches) == 2:
            raise ValueError("all of it")
        if len(batches) == 3:
            return [True] * (len(ds) + 1)
        return [True] * len(ds)

    # when a worker runs until the group has settled all three
    w = run_worker(kind, backend, prefix, q, rqueue.BatchHandler(answer, size=10), concurrency=1)
    wait_for(floor_reaches(q, "g", 3))
    w.stop()
    assert w.join(10)
    # then 1 and 3 were acked by the first call, 2 only by the fourth: the
    # missing outcome, the exception and the wrong length each nacked it
    assert batches == [[1, 2, 3], [2], [2], [2]]
    assert (w.stats.acked, w.stats.nacked) == (3, 3)
    assert q.dead_letter_queue.peek() == []


@pytest.mark.parametrize("backend", ["memory"], indirect=True)  # the outcomes are read the same everywhere
def test_a_mapping_that_names_a_delivery_twice_or_another_batchs_acks_none_of_it(live, backend, prefix):
    # given three messages and a batch handler whose first mapping acks every
    # tag and rejects the first delivery by the delivery itself, whose second
    # also names a delivery of the first batch, and whose third is right
    live.configure("orders", max_deliveries=4, redelivery_delay=0)
    q = live.queue("orders")
    q.publish_many([b"a", b"b", b"c"])
    batches: list[list[rqueue.Delivery]] = []

    def answer(ds):
        batches.append(ds)
        out: dict[object, object] = {d.tag: True for d in ds}
        if len(batches) == 1:
            out[ds[0]] = rqueue.Reject("not this one")
        elif len(batches) == 2:
            out[batches[0][1]] = True
        return out

    # when a worker runs until the group has settled all three
    w = run_worker("threaded", backend, prefix, q, rqueue.BatchHandler(answer, size=10), concurrency=1)
    wait_for(floor_reaches(q, "g", 3))
    w.stop()
    assert w.join(10)
    # then 2 and 3 were acked by the first call; 1, named twice there and
    # beside another batch's delivery in the second, only by the third
    assert [[d.seq for d in ds] for ds in batches] == [[1, 2, 3], [1], [1]]
    assert (w.stats.acked, w.stats.nacked) == (3, 2)
    assert q.dead_letter_queue.peek() == []


@BACKENDS
@BOTH
def test_batches_whose_leases_were_lost_are_neither_run_nor_acked(kind, live, backend, prefix):
    # given a worker running a batch of two while the next two wait
    q = live.queue("orders")
    q.publish_many([b"1", b"2", b"3", b"4"])
    calls = Calls()
    started = threading.Event()
    release = threading.Event()

    @rqueue.batch_handler(size=2)
    def handler(ds):
        for d in ds:
            calls.add(d.seq)
        started.set()
        release.wait(10)
        return [True] * len(ds)

    w = run_worker(kind, backend, prefix, q, handler, concurrency=1, heartbeat_interval=0.1)
    try:
        assert started.wait(10)
        wait_for(lambda: in_flight(q) == 4)
        # when it is removed from its group mid-run (a twin of its name
        # leaves), and another member takes all four and acks them
        q.consumer("g", name=w.consumer.name).close()
        with q.consumer("g", name="other") as other:
            got = other.fetch(4)
            assert [d.seq for d in got] == [1, 2, 3, 4]
            other.ack(got)
        wait_for(lambda: w.consumer.name in [c.name for c in q.stats().group("g").consumers])
    finally:
        release.set()
    # then the waiting batch never runs, and the running one's acks are late
    wait_for(lambda: w.stats.stale_skipped == 2 and w.stats.late_settles == 2)
    w.stop()
    assert w.join(10)
    assert calls.count() == {1: 1, 2: 1}
    assert w.stats.acked == 0


@BACKENDS
@BOTH
def test_a_batch_past_its_time_limit_is_nacked_whole(kind, live, backend, prefix):
    # given a batch handler whose first batch of two outlives the time limit
    live.configure("orders", redelivery_delay=0)
    q = live.queue("orders")
    q.publish_many([b"1", b"2"])
    calls = Calls()

    @rqueue.batch_handler(size=2)
    async def handler(ds):
        for d in ds:
            calls.add(d.seq)
        if ds[0].delivery_count == 1:
            await asyncio.sleep(10)
        return [True] * len(ds)

    # when a worker with a 0.2 s limit runs until both are settled
    w = run_worker(kind, backend, prefix, q, handler, concurrency=1, time_limit=0.2)
    wait_for(floor_reaches(q, "g", 2))
    w.stop()
    assert w.join(10)
    # then the batch timed out whole, and both ran again and were acked
    assert calls.count() == {1: 2, 2: 2}
    assert (w.stats.timed_out, w.stats.nacked, w.stats.acked) == (2, 2, 2)


def test_bad_batch_handlers_are_refused():
    with pytest.raises(rqueue.InvalidInput, match="size"):
        rqueue.BatchHandler(list, size=0)
    with pytest.raises(rqueue.InvalidInput, match="not callable"):
        rqueue.BatchHandler("list")
    with pytest.raises(rqueue.InvalidInput, match="InProcess"):
        rqueue.BatchHandler(rqueue.worker.InProcess("json:dumps"))


# -- the asyncio worker alone --------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory"], indirect=True)  # tests/test_worker_faults.py has the threaded one
def test_a_batch_runs_none_of_its_deliveries_whose_check_went_stale_before_it_started(
    live, backend, prefix, monkeypatch
):
    # given a batch of two whose fetch reply is read past the stale age (0.5
    # s of a 1 s lease), and whose check is applied but its answer read past
    # the stale age; the worker's later fetches wait until it is stopped, so
    # that the two going back to the group below are the other consumer's to
    # take (a worker that joins again fetches them back within half a
    # second, before a test thread held up on a loaded machine)
    from rqueue.aio.consumer import Consumer

    live.configure("orders", ack_wait=1)
    q = live.queue("orders")
    calls = Calls()
    fetch, check = Consumer.ack_and_fetch, Consumer.in_progress_available
    checking, go_on = threading.Event(), threading.Event()
    fetched, stopped = threading.Event(), threading.Event()
    checked: list[list[int]] = []

    async def read_late(self, *args, **kwargs):
        if fetched.is_set():
            await asyncio.to_thread(stopped.wait, 20)
        result = await fetch(self, *args, **kwargs)
        if result[1] and not fetched.is_set():
            fetched.set()
            await asyncio.sleep(0.6)  # the reply read late is the premise, not a condition
        return result

    async def slow_check(self, deliveries):
        checked.append([d.seq for d in deliveries])
        statuses = await check(self, deliveries)
        if not checking.is_set():
            checking.set()
            await asyncio.to_thread(go_on.wait, 20)
        return statuses

    monkeypatch.setattr(Consumer, "ack_and_fetch", read_late)
    monkeypatch.setattr(Consumer, "in_progress_available", slow_check)
    handler = rqueue.BatchHandler(lambda ds: [calls.add(d.seq) or True for d in ds], size=10)
    q.publish_many([b"m"] * 2)
    w = run_worker("async", backend, prefix, q, handler, concurrency=1, heartbeat_interval=0.1)
    try:
        try:
            assert checking.wait(10)
            blocked = time.monotonic()
            # when both go back to the group meanwhile and another consumer acks message 1
            q.consumer("g", name=w.consumer.name).close()
            other = q.consumer("g", name="other")
            got: list[rqueue.Delivery] = []
            wait_for(lambda: got.extend(other.fetch(2)) or len(got) == 2)
            other.ack([d for d in got if d.seq == 1])
            wait_for(lambda: time.monotonic() > blocked + 0.6)
        finally:
            go_on.set()
        # then the batch runs neither: both are checked again, in one call
        wait_for(lambda: w.stats.stale_skipped + w.stats.handled == 2)
    finally:
        w.stop()
        stopped.set()  # after the stop: what the held fetch brings is handed back, not run
    assert w.join(10)
    assert calls.count() == {} and w.stats.stale_skipped == 2
    assert checked[:2] == [[1, 2], [1, 2]]


@pytest.mark.parametrize("backend", ["memory"], indirect=True)  # tests/test_worker_faults.py has the threaded one
def test_a_batch_checked_late_runs_the_deliveries_held_beside_one_whose_state_is_damaged(
    live, backend, prefix, monkeypatch, caplog
):
    # given a batch of three whose fetch reply is read past the stale age (0.5
    # s of a 1 s lease), and the delivery state of the second overwritten with garbage meanwhile
    from support.raw import group_key

    from rqueue.aio.consumer import Consumer

    live.configure("orders", ack_wait=1)
    q = live.queue("orders")
    ran: list[tuple[int, int]] = []  # (seq, delivery count) of each delivery run
    fetch = Consumer.ack_and_fetch

    async def read_late(self, *args, **kwargs):
        result = await fetch(self, *args, **kwargs)
        if result[1]:
            live.redis.hset(group_key(q, "g", "dlv"), 2, b"nonsense")
            await asyncio.sleep(0.6)  # the reply read late is the premise, not a condition
        return result

    monkeypatch.setattr(Consumer, "ack_and_fetch", read_late)
    caplog.set_level(logging.INFO, logger="rqueue.worker")
    handler = rqueue.BatchHandler(lambda ds: [ran.append((d.seq, d.delivery_count)) or True for d in ds], size=10)
    q.publish_many([b"m"] * 3)
    w = run_worker("async", backend, prefix, q, handler, concurrency=1, heartbeat_interval=0.1, prefetch=3)
    # when the batch is checked
    try:
        wait_for(lambda: w.stats.stale_skipped + w.stats.handled >= 2)
    finally:
        w.stop()
        w.join(10)
    # then the two held ones run at their first delivery, and the damaged one is not run and is said loudly
    assert sorted(ran) == [(1, 1), (3, 1)]
    damaged = [r for r in caplog.records if r.levelno >= logging.ERROR and "2.1." in r.getMessage()]
    assert damaged and "does not parse" in damaged[0].getMessage()


@BACKENDS
@BOTH
def test_a_failed_batch_is_nacked_in_one_call(kind, live, backend, prefix, monkeypatch):
    # given 100 messages dead-lettered at their first failure, and a batch handler of 20 that fails
    import rqueue.engine.async_commands as acmd
    import rqueue.engine.commands as commands

    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish_many([b"m"] * 100)
    calls = count_calls(monkeypatch, commands if kind == "threaded" else acmd, "nack", "nack_many", "fetch")

    def fail(ds):
        raise ValueError("database down")

    async def afail(ds):
        fail(ds)

    handler = rqueue.BatchHandler(fail if kind == "threaded" else afail, size=20)
    # when a worker runs them
    w = run_worker(kind, backend, prefix, q, handler)
    try:
        wait_for(lambda: q.stats().dead_letters == 100, timeout=20)
    finally:
        w.stop()
        assert w.join(10)
    # then each was dead-lettered with the batch's error, the failed deliveries of a
    # round in one call (not one per message)
    assert {(m.reason, m.error) for m in q.dead_letters(limit=100)} == {("max-deliveries", "ValueError: database down")}
    assert w.stats.dead_lettered == 100
    assert 1 <= calls["nack"] + calls["nack_many"] <= calls["fetch"] < 100


@BACKENDS
@BOTH
def test_a_nack_sent_again_after_its_reply_was_lost_counts_as_applied(kind, live, backend, prefix, monkeypatch, caplog):
    # given 3 messages dead-lettered at their first failure, a batch handler that fails,
    # and a connection that drops after the first nack call was applied, before its reply
    import rqueue.engine.async_commands as acmd
    import rqueue.engine.commands as commands

    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")
    q.publish_many([b"m"] * 3)
    engine = commands if kind == "threaded" else acmd
    dropped = []

    def reply_lost(name):
        real = getattr(engine, name)

        def first_reply_lost(*args, **kwargs):
            if dropped:
                return real(*args, **kwargs)
            dropped.append(name)
            real(*args, **kwargs)
            raise rqueue.ConnectionLost("connection dropped after the call was applied")

        async def afirst_reply_lost(*args, **kwargs):
            if dropped:
                return await real(*args, **kwargs)
            dropped.append(name)
            await real(*args, **kwargs)
            raise rqueue.ConnectionLost("connection dropped after the call was applied")

        return first_reply_lost if kind == "threaded" else afirst_reply_lost

    for name in ("nack", "nack_many"):
        monkeypatch.setattr(engine, name, reply_lost(name))

    def fail(ds):
        raise ValueError("database down")

    async def afail(ds):
        fail(ds)

    caplog.set_level(logging.INFO, logger="rqueue.worker")
    # when a worker runs them, its first nack sent again once the connection is back
    w = run_worker(kind, backend, prefix, q, rqueue.BatchHandler(fail if kind == "threaded" else afail, size=3))
    try:
        wait_for(lambda: q.stats().dead_letters == 3, timeout=20)
        wait_for(lambda: w.stats.nacked + w.stats.late_settles == 3, timeout=5)
    finally:
        w.stop()
        assert w.join(10)
    # then each is dead-lettered once, and the nack that was applied counts as nacked, not as a late settle
    assert dropped and w.stats.reconnects >= 1
    assert len(q.dead_letters(limit=10)) == 3
    assert (w.stats.nacked, w.stats.late_settles) == (3, 0)
    assert "not applied" not in caplog.text


@BACKENDS
def test_cancelling_the_run_task_stops_gracefully(live, backend, prefix):
    # given an asyncio worker whose handler is running and a message waiting
    q = live.queue("orders")
    q.publish_many([b"1", b"2", b"3"])
    done: list[int] = []

    async def main() -> rqueue.aio.Worker:
        client = await rqueue.aio.connect(backend, prefix=prefix, settings_ttl=0)
        started = asyncio.Event()

        async def handler(d):
            started.set()
            await asyncio.sleep(0.3)
            done.append(d.seq)

        w = rqueue.aio.Worker(client.queue("orders"), "g", handler, concurrency=1, prefetch=2, grace_period=5)
        task = asyncio.create_task(w.run(install_signal_handlers=False))
        await asyncio.wait_for(started.wait(), 10)
        # when the task that runs it is cancelled
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()
        return w

    w = asyncio.run(main())
    # then the running handler finished within the grace period and was
    # acked, the waiting delivery went back unattempted, and it left
    assert done == [1]
    g = q.stats().group("g")
    assert (g.ack_floor, g.in_flight, g.consumers) == (1, 0, [])
    assert w.stats.acked == 1
    with q.consumer("g", name="next") as c:
        assert [(d.seq, d.delivery_count) for d in c.fetch(5)] == [(2, 1), (3, 1)]


def test_sigterm_drains_the_running_handler_and_leaves(prefix, tmp_path):
    server = start_server("redis")
    try:
        q = rqueue.connect(server.url, prefix=prefix).queue("orders")
        q.publish_many([b"m"] * 3)
        marks = tmp_path / "marks"
        script = f"""
import asyncio, sys
import rqueue.aio

async def main():
    client = await rqueue.aio.connect({server.url!r}, prefix={prefix!r})
    async def handler(d):
        open({str(marks)!r}, "a").write(f"start {{d.seq}}\\n")
        await asyncio.sleep(1.0)
        open({str(marks)!r}, "a").write(f"end {{d.seq}}\\n")
    w = rqueue.aio.Worker(client.queue("orders"), "g", handler, concurrency=1, prefetch=1, grace_period=10)
    stats = await w.run()
    print("acked", stats.acked, flush=True)
    await client.close()

asyncio.run(main())
"""
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        wait_for(lambda: marks.exists() and "start 1" in marks.read_text(), timeout=20)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        # the running handler finished, nothing else started, and it left
        assert marks.read_text().split("\n")[:2] == ["start 1", "end 1"]
        assert "start 2" not in marks.read_text()
        assert "acked 1" in out
        g = q.stats().group("g")
        assert (g.ack_floor, g.in_flight, g.consumers) == (1, 0, [])
    finally:
        server.stop()


def test_redis_restart_under_the_async_worker_loses_nothing(prefix, tmp_path):
    server = start_server("redis", appendonly=True, data_dir=tmp_path / "data")
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        q = client.queue("orders")
        total = 1000
        q.publish_many([b"m"] * total)
        calls = Calls()

        async def handler(d):
            calls.add(d.seq)
            await asyncio.sleep(0.001)

        w = run_worker("async", server.url, prefix, q, handler, concurrency=4, heartbeat_interval=0.2)
        wait_for(lambda: len(calls.count()) > 200)
        server.kill()
        wait_for(lambda: w.stats.reconnects >= 1, timeout=20)
        server.start()
        wait_for(floor_reaches(q, "g", total), timeout=60)
        w.stop()
        assert w.join(20)
        counts = calls.count()
        assert set(counts) == set(range(1, total + 1))
        assert sum(counts.values()) - total <= 4 * 2 + 8  # at most what was in hand when Redis died
        client.close()
    finally:
        server.stop()


@BOTH
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # its leave fails: raised
def test_a_stop_at_once_ends_the_worker_while_redis_is_paused(kind, prefix):
    # given a worker whose Redis stops answering (SIGSTOP: connections stay open)
    server = start_server("redis")
    try:
        q = rqueue.connect(server.url, prefix=prefix).queue("orders")
        q.publish(b"1")
        w = run_worker(kind, server.url, prefix, q, lambda d: None, concurrency=1, reconnect_timeout=60)
        wait_for(lambda: w.stats.acked == 1)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            time.sleep(0.6)  # the dispatcher's next fetch (it polls every 0.5 s) is now unanswered
            # when it is stopped at once
            started = time.monotonic()
            w.stop(now=True)
            # then it ends within about a second, not after reconnect_timeout
            assert w.join(5)
            assert time.monotonic() - started < 3
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    finally:
        server.stop()


def test_a_second_sigterm_stops_the_async_worker_at_once(prefix, tmp_path):
    server = start_server("redis")
    try:
        q = rqueue.connect(server.url, prefix=prefix).queue("orders")
        q.publish(b"m")
        marks = tmp_path / "marks"
        script = f"""
import asyncio
import rqueue.aio

async def main():
    client = await rqueue.aio.connect({server.url!r}, prefix={prefix!r})
    async def handler(d):
        open({str(marks)!r}, "a").write("start\\n")
        await asyncio.sleep(30)
    w = rqueue.aio.Worker(client.queue("orders"), "g", handler, concurrency=1, grace_period=30)
    await w.run()
    print("returned", flush=True)

asyncio.run(main())
"""
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        wait_for(lambda: marks.exists() and "start" in marks.read_text(), timeout=20)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # in its grace period, the handler still running
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        # the second signal ended it within about a second, not after the grace period
        assert time.monotonic() - started < 5
        assert "returned" in out
        assert q.stats().group("g").consumers == []  # it still left the group
    finally:
        server.stop()


@BACKENDS
@BOTH
@pytest.mark.parametrize("prefetch", [None, 4])
def test_a_worker_left_its_prefetch_fetches_more_while_quick_handlers_wait(
    kind, live, backend, prefix, monkeypatch, prefetch
):
    # given a backlog of 2,000 messages and a worker of 2 handlers that return at once
    q = live.queue("orders")
    q.publish_many([b"m"] * 2000)
    asked: list[int] = []
    for cls in (rqueue.Consumer, rqueue.aio.Consumer):
        real = cls.ack_and_fetch

        def counted(self, acks, n, *args, _real=real, **kwargs):
            asked.append(n)
            return _real(self, acks, n, *args, **kwargs)

        monkeypatch.setattr(cls, "ack_and_fetch", counted)
    seen = Calls()
    # when it drains the queue, its prefetch left to it, or set to 4
    w = run_worker(kind, backend, prefix, q, lambda d: seen.add(d.seq), concurrency=2, prefetch=prefetch)
    try:
        wait_for(floor_reaches(q, "g", 2000), timeout=60)
    finally:
        w.stop()
    assert w.join(10)
    # then each message ran once; left to it, the worker asked for more than its 4 at first, never
    # above the cap; set, never more than it
    assert sorted(seen.seqs) == list(range(1, 2001))
    cap = rqueue.constants.ADAPTIVE_PREFETCH_CAP if prefetch is None else prefetch
    assert max(asked) <= cap
    if prefetch is None:
        assert max(asked) > 4


@BACKENDS
@BOTH
def test_a_loss_in_one_partition_drops_only_its_own_waiting_deliveries(kind, live, backend, prefix):
    # given a worker on two partitions whose one handler is busy while the
    # other deliveries wait, with a lease far longer than the test
    live.configure("orders", ack_wait=120)
    pq = live.queue("orders", partitions=2)
    pq.parts[0].publish_many([b"a0", b"a1"])
    pq.parts[1].publish(b"b0")
    ran: list[tuple[int, bytes, int]] = []
    started = threading.Event()
    release = threading.Event()

    def handler(d):
        ran.append((d.consumer.queue.partition, d.data, d.delivery_count))
        started.set()
        release.wait(10)

    w = run_worker(kind, backend, prefix, pq, handler, concurrency=1, prefetch=3, heartbeat_interval=0.1)
    try:
        assert started.wait(10)
        wait_for(lambda: pq.stats().group("g").in_flight == 3)
        # when partition 1 reports a new incarnation (Redis restarted it
        # without its data) and the worker sees that loss
        live.redis.hset(pq.parts[1].keys.meta, "inc", "ianewincarnation")
        wait_for(lambda: w.consumer.consumers[1].state_epoch == 1)
        release.set()
        # then partition 0's messages run at once, each at its first delivery,
        # not after their lease runs out: only partition 1's are dropped
        wait_for(lambda: {(p, data) for p, data, _ in ran} >= {(0, b"a0"), (0, b"a1")}, timeout=15)
    finally:
        release.set()
        w.stop()
        assert w.join(10)
    assert sorted((p, data, n) for p, data, n in ran if p == 0) == [(0, b"a0", 1), (0, b"a1", 1)]
