"""Behaviour the synchronous code and its asyncio twin must share, where
they once differed: each test holds both twins to it.

The worker tests run both workers side by side as tests/test_aio_worker.py
does (``kind`` threaded / async); the client tests run both clients
(``api`` sync / async, tests/support/aio_bridge.py)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from support.aio_bridge import connect as aio_connect
from support.aio_bridge import parametrize_api
from support.servers import start_server, wait_for
from test_aio_worker import Calls, run_worker

import rqueue
import rqueue.aio
import rqueue.aio.worker
from rqueue.errors import CorruptRecord
from rqueue.worker.dispatcher import Dispatcher
from rqueue.worker.stats import Tally, WorkerStats

pytest_generate_tests = parametrize_api  # the client tests run against both clients

BOTH = pytest.mark.parametrize("kind", ["threaded", "async"])
MEMORY = pytest.mark.parametrize("backend", ["memory"], indirect=True)


def server_with_policy(policy: str) -> Iterator:
    """A private redis-server with maxmemory-policy ``policy``."""
    server = start_server("redis", extra_args=["--maxmemory-policy", policy])
    yield server
    server.stop()


@pytest.fixture
def live(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


def dead_letter_count(q) -> int:
    return q.stats().dead_letters


# -- Both workers log what they dead-letter: rejected by the handler, or at max_deliveries


@BOTH
@MEMORY
@pytest.mark.parametrize("why", ["rejected", "max-deliveries"])
def test_a_message_the_worker_dead_letters_is_logged(kind, why, backend, prefix, live, caplog):
    # given a handler that rejects, or fails on a queue that allows one delivery
    live.configure("orders", max_deliveries=1)
    q = live.queue("orders")

    def handler(d):
        if why == "rejected":
            raise rqueue.Reject("bad payload")
        raise ValueError("boom")

    caplog.set_level(logging.WARNING, logger="rqueue.worker")
    w = run_worker(kind, backend, prefix, q, handler)
    try:
        # when a message is published and the worker dead-letters it
        q.publish(b"m")
        wait_for(lambda: dead_letter_count(q) == 1)
        wait_for(lambda: w.stats.dead_lettered == 1)
    finally:
        w.stop()
    assert w.join(10)
    # then the worker's log says so, at WARNING
    said = [r.getMessage() for r in caplog.records if r.name == "rqueue.worker" and r.levelno >= logging.WARNING]
    assert any(m.startswith("dead-lettered ") for m in said), said


# -- An ack refused for a corrupt record is damage, logged at ERROR by both
# (outcome.acks_done); other refusals are late settles, at INFO


@BOTH
def test_an_ack_refused_by_a_corrupt_record_is_logged_at_error(kind, caplog):
    # given the ack bookkeeping of a worker, outside an outage
    worker = SimpleNamespace(_tally=Tally(WorkerStats()), _retry=SimpleNamespace(resync=False))
    record_acks = Dispatcher._record_acks if kind == "threaded" else rqueue.aio.worker.Worker._record_acks
    caplog.set_level(logging.DEBUG, logger="rqueue.worker")
    # when an ack comes back refused by a damaged record
    record_acks(worker, [None, CorruptRecord("rq:{orders}:msgs[7]", "not a record")])
    # then it counts as a late settle and is logged at ERROR
    assert (worker._tally.stats.acked, worker._tally.stats.late_settles) == (1, 1)
    levels = [r.levelno for r in caplog.records if "ack not applied" in r.getMessage()]
    assert levels == [logging.ERROR]


# -- Both workers observe each handler run's time (metrics.handler_seconds)


class FakeMetrics:
    """What a worker calls on its WorkerMetrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.observed: list[float] = []
        self.handler_seconds = SimpleNamespace(observe=self._observe)

    def _observe(self, seconds: float) -> None:
        with self.lock:
            self.observed.append(seconds)

    def count(self, deltas) -> None:
        with self.lock:
            for k, v in deltas.items():
                self.counts[k] = self.counts.get(k, 0) + v


@BOTH
@MEMORY
def test_the_handler_run_time_goes_to_the_metrics(kind, backend, prefix, live):
    # given a worker with metrics
    q = live.queue("orders")
    metrics = FakeMetrics()
    calls = Calls()
    w = run_worker(kind, backend, prefix, q, lambda d: calls.add(d.seq), metrics=metrics)
    try:
        # when three messages are handled
        q.publish_many([b"m"] * 3)
        wait_for(lambda: metrics.counts.get("acked", 0) == 3)
    finally:
        w.stop()
    assert w.join(10)
    # then the counters and the run time of each handler call reached the metrics
    assert metrics.counts.get("handled") == 3
    assert len(metrics.observed) == 3


# -- A partitioned queue's stats() name where each partition lives, in both
# clients (partitions.partitioned_stats)


@MEMORY
def test_a_partitioned_queues_stats_name_each_partitions_placement(client):
    # given a queue of three partitions
    pq = client.queue("orders", partitions=3)
    pq.publish_many([b"m"] * 3)
    # when its stats are read
    stats = pq.stats()
    # then they say where each partition lives, as placement() does
    assert stats.last_seq == 3
    assert [p.partition for p in stats.placement] == [0, 1, 2]
    assert stats.placement == pq.placement().placement


# -- A publish refused at maxmemory raises OutOfMemory naming used and max
# memory, in both clients (commands.memory_figured)


@pytest.fixture
def full_server() -> Iterator:
    yield from server_with_policy("noeviction")


@pytest.mark.parametrize("api_kind", ["sync", "async"])
def test_a_publish_refused_at_maxmemory_names_the_memory(api_kind, full_server, prefix):
    # given a server over its maxmemory
    plain = rqueue.connect(full_server.url, prefix=prefix)
    client = plain if api_kind == "sync" else aio_connect(full_server.url, prefix=prefix)
    try:
        q = client.queue("orders")
        q.publish(b"first")
        plain.redis.set(f"{prefix}:filler", b"x" * 5_000_000)
        plain.redis.config_set("maxmemory", 4 * 1024 * 1024)
        # when a message is published
        with pytest.raises(rqueue.OutOfMemory) as caught:
            q.publish(b"m")
        # then the error names used and max memory
        err = caught.value
        assert err.limit == 4 * 1024 * 1024 and err.used is not None and err.used > err.limit
    finally:
        plain.redis.config_set("maxmemory", 0)
        if client is not plain:
            client.close()
        plain.close()


# -- run() puts back the SIGTERM / SIGINT handlers it replaced, so that the
# process can be interrupted again once its worker has returned


@BOTH
@MEMORY
def test_run_puts_back_the_signal_handlers_it_replaced(kind, backend, prefix):
    assert threading.current_thread() is threading.main_thread()

    def mine(signum, frame):  # the process's own handler
        pass

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, mine)
    signal.signal(signal.SIGINT, mine)
    try:
        if kind == "threaded":
            client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
            w = rqueue.Worker(client.queue("orders"), "g", lambda d: None, scheduler=False)
            threading.Timer(0.3, w.stop).start()
            w.run()  # in the main thread: it installs its signal handlers
            client.close()
        else:

            async def main() -> None:
                client = await rqueue.aio.connect(backend, prefix=prefix, settings_ttl=0)
                w = rqueue.aio.Worker(client.queue("orders"), "g", lambda d: None)
                asyncio.get_running_loop().call_later(0.3, w.stop)
                await w.run()
                await client.close()

            asyncio.run(main())
        # then, the worker ended, the process's handlers are its own again
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# -- Both clients refuse a server whose maxmemory-policy may evict keys
# (connection.open.check_policy), unless allow_eviction=True


@pytest.fixture
def lru_server() -> Iterator:
    yield from server_with_policy("allkeys-lru")


@pytest.mark.parametrize("api_kind", ["sync", "async"])
def test_a_server_that_may_evict_is_refused_at_connect(api_kind, lru_server, prefix):
    # when a client connects to a server whose maxmemory-policy may evict keys
    # then it is refused, naming the policy

    async def aio_connect_and_close() -> None:
        client = await rqueue.aio.connect(lru_server.url, prefix=prefix)
        await client.close()

    with pytest.raises(rqueue.EvictionPolicy) as caught:
        if api_kind == "sync":
            rqueue.connect(lru_server.url, prefix=prefix).close()
        else:
            asyncio.run(aio_connect_and_close())
    assert caught.value.policy == "allkeys-lru"


@pytest.fixture
def carrying(monkeypatch) -> threading.Event:
    """Makes both workers' round trips that carry acks take 0.2 s (a slow
    network, well under STOP_PATIENCE); set once such a trip is on its way."""
    import rqueue.aio.consumer
    import rqueue.consumer

    on_its_way = threading.Event()
    sync_call = rqueue.consumer.Consumer.ack_and_fetch
    async_call = rqueue.aio.consumer.Consumer.ack_and_fetch

    def slow_sync(self, acks, n, wait=None, may_wait=False):
        acks = list(acks)
        if acks:
            on_its_way.set()
            time.sleep(0.2)
        return sync_call(self, acks, n, wait, may_wait)

    async def slow_async(self, acks, n, wait=None, may_wait=False):
        acks = list(acks)
        if acks:
            on_its_way.set()
            await asyncio.sleep(0.2)
        return await async_call(self, acks, n, wait, may_wait)

    monkeypatch.setattr(rqueue.consumer.Consumer, "ack_and_fetch", slow_sync)
    monkeypatch.setattr(rqueue.aio.consumer.Consumer, "ack_and_fetch", slow_async)
    return on_its_way


# -- A stop at once lets the dispatcher's Redis call under way finish within
# STOP_PATIENCE, so the acks it carries apply and their messages do not run
# again (docs/worker.md, Stopping)


@BOTH
@MEMORY
def test_a_stop_at_once_still_applies_the_acks_of_the_call_under_way(kind, backend, prefix, live, carrying):
    # given a dispatcher whose round trip that carries acks takes 0.2 s (carrying)
    q = live.queue("orders")
    calls = Calls()
    w = run_worker(kind, backend, prefix, q, lambda d: calls.add(d.seq))
    try:
        # when a message is handled, and the worker is stopped at once while
        # its ack is on the way to Redis
        q.publish(b"m")
        assert carrying.wait(10)
    finally:
        w.stop(now=True)
    assert w.join(10)
    # then the ack was applied: the message is settled, not handed back to run again
    assert calls.count() == {1: 1}
    assert q.stats().group("g").ack_floor == 1
    assert w.stats.acked == 1


# -- A cancel of the asyncio run() stops as stop() does: the dispatcher's
# round under way ends first, its acks applied


class CancellableAsyncWorker:
    """An rqueue.aio.Worker whose run() task is cancelled to stop it."""

    def __init__(self, url: str, prefix: str, queue: str, handler) -> None:
        self.url, self.prefix, self.queue_name, self.handler = url, prefix, queue, handler
        self.worker = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()
        self._done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True).start()
        assert self._ready.wait(10)

    async def _main(self) -> None:
        client = await rqueue.aio.connect(self.url, prefix=self.prefix, settings_ttl=0)
        try:
            self.worker = rqueue.aio.Worker(client.queue(self.queue_name), "g", self.handler)
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self.worker.run(install_signal_handlers=False))
            self._ready.set()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except BaseException as exc:
                self.error = exc
        finally:
            await client.close()
            self._done.set()

    def stop(self) -> None:
        assert self._loop is not None and self._task is not None
        self._loop.call_soon_threadsafe(self._task.cancel)

    def join(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    @property
    def stats(self):
        return self.worker.stats


@BOTH
@MEMORY
def test_a_graceful_stop_applies_the_acks_of_the_call_under_way(kind, backend, prefix, live, carrying):
    # given a dispatcher whose round trip that carries acks takes 0.2 s (carrying)
    q = live.queue("orders")
    calls = Calls()
    if kind == "threaded":
        w = rqueue.Worker(q, "g", lambda d: calls.add(d.seq), scheduler=False)
        w.start()
    else:
        w = CancellableAsyncWorker(backend, prefix, "orders", lambda d: calls.add(d.seq))
        w.start()
    try:
        # when a message is handled, and the worker is stopped gracefully
        # (stop(); for the asyncio worker its run() task cancelled) while its
        # ack is on the way to Redis
        q.publish(b"m")
        assert carrying.wait(10)
    finally:
        w.stop()
    assert w.join(10)
    # then the ack was applied: the message is settled, not handed back to run again
    assert calls.count() == {1: 1}
    assert q.stats().group("g").ack_floor == 1
    assert w.stats.acked == 1


# -- A worker whose dispatcher failed hands back what waits without counting
# it as stale_skipped: the stop is set first, in both


@BOTH
@MEMORY
def test_deliveries_handed_back_after_the_dispatcher_failed_are_not_counted_as_skipped(
    kind, backend, prefix, live, monkeypatch
):
    import rqueue.aio.consumer
    import rqueue.consumer

    class Broken(rqueue.RQueueError):
        pass

    fetched = threading.Event()
    release = threading.Event()
    started = threading.Event()
    sync_call = rqueue.consumer.Consumer.ack_and_fetch
    async_call = rqueue.aio.consumer.Consumer.ack_and_fetch

    # given a dispatcher whose calls fail for good once it has fetched and a handler runs
    def failing_sync(self, acks, n, wait=None, may_wait=False):
        if fetched.is_set() and started.is_set():
            raise Broken("no more")
        reply = sync_call(self, acks, n, wait, may_wait)
        if reply[1]:
            fetched.set()
        return reply

    async def failing_async(self, acks, n, wait=None, may_wait=False):
        if fetched.is_set() and started.is_set():
            raise Broken("no more")
        reply = await async_call(self, acks, n, wait, may_wait)
        if reply[1]:
            fetched.set()
        return reply

    monkeypatch.setattr(rqueue.consumer.Consumer, "ack_and_fetch", failing_sync)
    monkeypatch.setattr(rqueue.aio.consumer.Consumer, "ack_and_fetch", failing_async)
    q = live.queue("orders")
    q.publish_many([b"m"] * 3)

    def handler(d):
        started.set()
        release.wait(10)

    # and one handler, busy with the first message while two wait
    options = {"concurrency": 1, "prefetch": 5, "grace_period": 0.2}
    if kind == "threaded":
        w = rqueue.Worker(q, "g", handler, scheduler=False, **options)
        failed: list[BaseException] = []

        def run():
            try:
                w.run(install_signal_handlers=False)
            except BaseException as exc:
                failed.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        join = runner.join
    else:
        from test_aio_worker import AsyncWorkerThread

        w = AsyncWorkerThread(backend, prefix, "orders", "g", handler, **options)
        w.start()
        join = w.join
    try:
        assert started.wait(10)
        # when the dispatcher fails, and the worker ends
        join(10)
    finally:
        release.set()
    time.sleep(0.5)  # the handler, released, goes on to what was queued for it
    error = failed[0] if kind == "threaded" and failed else getattr(w, "error", None)
    assert isinstance(error, Broken)
    # then the two it handed back are not counted as skipped for being settled elsewhere
    assert w.stats.handled == 1
    assert w.stats.stale_skipped == 0


# -- A stop at once ends a join's pause between retries through an outage
# (docs/worker.md: with Redis down it ends within about a second)


@BOTH
@MEMORY
def test_a_stop_at_once_ends_a_join_retrying_through_an_outage_at_once(kind, backend, prefix, live, monkeypatch):
    import rqueue.aio.consumer
    import rqueue.aio.reconnect
    import rqueue.queue
    import rqueue.worker.reconnect

    # given Redis unreachable when the worker joins, and retries 5 s apart
    def unreachable(*args, **kwargs):
        raise rqueue.ConnectionLost("refused", applied=False)

    async def unreachable_async(*args, **kwargs):
        raise rqueue.ConnectionLost("refused", applied=False)

    monkeypatch.setattr(rqueue.queue.Queue, "consumer", unreachable)
    monkeypatch.setattr(rqueue.aio.consumer.Consumer, "join", unreachable_async)
    monkeypatch.setattr(rqueue.worker.reconnect, "FIRST_PAUSE", 5.0)
    monkeypatch.setattr(rqueue.aio.reconnect, "FIRST_PAUSE", 5.0)
    q = live.queue("orders")
    if kind == "threaded":
        w = rqueue.Worker(q, "g", lambda d: None, scheduler=False, reconnect_timeout=60)
        failed: list[BaseException] = []

        def run():
            try:
                w.run(install_signal_handlers=False)
            except BaseException as exc:
                failed.append(exc)

        threading.Thread(target=run, daemon=True).start()
        ended = w.join
    else:
        from test_aio_worker import AsyncWorkerThread

        w = AsyncWorkerThread(backend, prefix, "orders", "g", lambda d: None, reconnect_timeout=60)
        w.start()
        ended = w.join
    time.sleep(0.5)  # in the pause after the first failed join
    # when it is stopped at once
    began = time.monotonic()
    w.stop(now=True)
    # then it ends within about a second, raising the connection error
    assert ended(10)
    assert time.monotonic() - began < 1.5
    error = failed[0] if kind == "threaded" else w.error
    assert isinstance(error, rqueue.ConnectionLost)


# -- A partitioned dead-letter queue is placed by the hash tags its keys
# carry ({orders/i}), in both clients (placement.queue_placements)


@MEMORY
def test_a_partitioned_dead_letter_queue_is_placed_where_its_keys_are(client):
    # given a partitioned queue and its dead-letter queue
    pq = client.queue("orders", partitions=2)
    dlq = pq.dead_letter_queue
    dlq = dlq() if callable(dlq) else dlq  # a property of the sync queue, a method of the asyncio one
    # when the dead-letter queue's placement is read
    report = dlq.placement()
    placed = report.placement
    # then each partition's hash tag is the one its keys carry, and the report names the dead-letter queue
    assert [p.hash_tag for p in placed] == ["{orders/0}", "{orders/1}"]
    assert all(p.hash_tag in part.keys.base for p, part in zip(placed, dlq.parts, strict=True))
    assert report.queue == dlq.name


# -- A plain handle on a queue another process partitioned since this one
# read it: a publish goes to the partitions, a join is refused by name


@pytest.mark.parametrize("api_kind", ["sync", "async"])
@MEMORY
def test_a_stale_plain_handle_publishes_to_the_partitions(api_kind, backend, prefix, live):
    async def main():
        stale = await rqueue.aio.connect(backend, prefix=prefix, settings_ttl=60)
        try:
            # given a process that read "orders" as a plain queue
            plain = stale.queue("orders")
            assert isinstance(plain, rqueue.aio.Queue)
            # when another process partitions it, and the first publishes through its plain handle
            await asyncio.to_thread(live.queue, "orders", 3)
            return await plain.publish_many([b"a", b"b"])
        finally:
            await stale.close()

    if api_kind == "sync":
        stale = rqueue.connect(backend, prefix=prefix, settings_ttl=60)
        try:
            plain = stale.queue("orders")
            assert isinstance(plain, rqueue.Queue)
            live.queue("orders", partitions=3)
            results = plain.publish_many([b"a", b"b"])
        finally:
            stale.close()
    else:
        results = asyncio.run(main())
    # then the messages went to the partitions
    assert all(r.partition is not None for r in results)
    assert live.queue("orders").stats().last_seq == 2


@pytest.mark.parametrize("operation", ["join", "create", "reset", "delete"])
@pytest.mark.parametrize("api_kind", ["sync", "async"])
@MEMORY
def test_a_stale_plain_handles_group_operations_are_refused_as_partitioned(api_kind, operation, backend, prefix, live):
    calls = {
        "join": lambda q: q.consumer("g") if api_kind == "sync" else q.consumer("g").join(),
        "create": lambda q: q.create_group("g"),
        "reset": lambda q: q.reset_group("g", "first"),
        "delete": lambda q: q.delete_group("g"),
    }
    base = rqueue.Queue(live, "orders").keys.base

    def plain_state():
        """The plain queue's keys and its meta (which holds the partitioning marker)."""
        return sorted(live.redis.scan_iter(match=base + "*")), live.redis.hgetall(base + ":meta")

    async def main():
        stale = await rqueue.aio.connect(backend, prefix=prefix, settings_ttl=60)
        try:
            plain = stale.queue("orders")
            await asyncio.to_thread(live.queue, "orders", 2)
            before = plain_state()
            # when the stale process joins, makes, resets or deletes a group through its plain
            # handle, then it is refused by name
            with pytest.raises(rqueue.QueuePartitioned, match="2 partitions"):
                await calls[operation](plain)
            # and the client has learned the partitioning
            assert isinstance(stale.queue("orders"), rqueue.aio.PartitionedQueue)
            return before
        finally:
            await stale.close()

    if api_kind == "sync":
        stale = rqueue.connect(backend, prefix=prefix, settings_ttl=60)
        try:
            plain = stale.queue("orders")
            assert isinstance(plain, rqueue.Queue)
            live.queue("orders", partitions=2)
            before = plain_state()
            with pytest.raises(rqueue.QueuePartitioned, match="2 partitions"):
                calls[operation](plain)
            assert isinstance(stale.queue("orders"), rqueue.PartitionedQueue)
        finally:
            stale.close()
    else:
        before = asyncio.run(main())
    # and nothing was written to the plain queue
    assert plain_state() == before
    assert live.queue("orders").groups() == []


# -- Both workers take every option by keyword (docs/aio.md: "It takes the
# same keyword arguments"): Worker(q, "g", h, 4) is refused by both


@BOTH
def test_concurrency_is_taken_by_keyword_only(kind):
    async def main():
        client = await rqueue.aio.connect("memory://kw-only", prefix="kw")
        try:
            rqueue.aio.Worker(client.queue("orders"), "g", lambda d: None, 4)  # type: ignore[misc]
        finally:
            await client.close()

    with pytest.raises(TypeError):
        if kind == "threaded":
            client = rqueue.connect("memory://kw-only", prefix="kw")
            try:
                rqueue.Worker(client.queue("orders"), "g", lambda d: None, 4)  # type: ignore[misc]
            finally:
                client.close()
        else:
            asyncio.run(main())
