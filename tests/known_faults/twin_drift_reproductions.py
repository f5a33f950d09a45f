"""Behaviour that drifted between the synchronous code and its asyncio twin:
each test passes on the twin that is right (the threaded worker and the
docs, unless a test says otherwise) and fails on the other one.

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


@pytest.fixture
def live(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


def dead_letter_count(q) -> int:
    return q.stats().dead_letters


# -- LOG: a dead-lettering by the worker is logged ----------------------------------
#
# rqueue/worker/dispatcher.py logs a WARNING for every message its worker
# dead-letters: "dead-lettered <tag>: rejected by the handler: <reason>"
# (Dispatcher._settle_others) and "dead-lettered <tag>: <n> deliveries
# reached max_deliveries; last error: <error>" (Dispatcher._nack_all).
# rqueue/aio/worker.py's _settle_others and _nack_all count and trace the
# same dead letters but log nothing: an operator reading an asyncio
# worker's log never learns that a message went to the dead-letter queue.


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


# -- LOG: a corrupt record refusing an ack is logged at ERROR -------------------------
#
# Dispatcher._record_acks (rqueue/worker/dispatcher.py) logs an ack refused
# with CorruptRecord at ERROR ("damage, not a late ack: said loudly"), the
# others at INFO; rqueue.aio.Worker._record_acks logs every refusal at INFO,
# the damage included.


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


# -- LOG (metrics): the handler's run time is observed -------------------------------
#
# WorkerMetrics serves "the worker's counters and handler run times"
# (docs/worker.md, Metrics); rqueue.aio.Worker takes ``metrics`` too
# (docs/aio.md). The threaded worker observes
# ``metrics.handler_seconds`` after every run (Handlers._handle and
# _handle_batch, rqueue/worker/handlers.py); the asyncio worker never does:
# its rqueue_handler_seconds histogram stays empty.


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


# -- API: run() leaves the process's signal handlers as it found them ------------------
#
# rqueue.aio.Worker.run puts back the SIGTERM / SIGINT handlers it replaced
# when it returns (rqueue/aio/worker.py, run's finally); rqueue.Worker.run
# installs its own (rqueue/worker/control.py, run) and never puts the old
# ones back: after the worker has ended, Ctrl-C in the process only logs
# "second SIGINT: stopping at once" for a worker that no longer runs, and
# no KeyboardInterrupt comes. Unsure which is meant (the docs say neither);
# the asyncio worker's is taken as right, as nothing else could stop such
# a process once its worker has returned.


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


# -- API (guards against LOSS): a server that may evict is refused at connect -------------
#
# rqueue.connect reads maxmemory-policy and raises EvictionPolicy for
# anything but noeviction unless allow_eviction=True (docs/memory.md, "A
# server that may evict is refused"; rqueue/connection/open.py
# _check_server). rqueue.aio.connect "raises the same exceptions" by its
# docstring, but rqueue/aio/connect.py (_open, _check_version) checks the
# version alone and rqueue.aio.connect has no allow_eviction: an asyncio
# client works on an allkeys-lru server without a word, where Redis may
# silently evict stored messages, leases and ack floors.


@pytest.fixture
def lru_server() -> Iterator:
    server = start_server("redis", extra_args=["--maxmemory-policy", "allkeys-lru"])
    yield server
    server.stop()


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


# -- LOSS of an ack (the message runs again): stop(now=True) cuts the dispatcher's call --
#
# docs/worker.md, Stopping: a stop at once cuts off "any call Redis leaves
# unanswered for STOP_PATIENCE"; "with Redis up the worker still settles
# what finished and leaves". The threaded worker lets the dispatcher's call
# under way finish (its watchdog cuts it only past STOP_PATIENCE, 0.5 s:
# rqueue/worker/reconnect.py _watch), so the acks it carries are applied.
# rqueue.aio.Worker._wake (rqueue/aio/worker.py) calls cut_off_soon(),
# which would end the call STOP_PATIENCE later, but also cancels the
# dispatcher task at once: an ack_and_fetch under way is cancelled before
# Redis answers, the acks it carried were already drained from the ledger
# and are never sent again, and the leave hands the finished messages back:
# they run a second time.


@BOTH
@MEMORY
def test_a_stop_at_once_still_applies_the_acks_of_the_call_under_way(kind, backend, prefix, live, monkeypatch):
    import rqueue.aio.consumer
    import rqueue.consumer

    carrying = threading.Event()
    sync_call = rqueue.consumer.Consumer.ack_and_fetch
    async_call = rqueue.aio.consumer.Consumer.ack_and_fetch

    # given a dispatcher whose round trip that carries acks takes 0.2 s (a
    # slow network), well under STOP_PATIENCE
    def slow_sync(self, acks, n, wait=None, may_wait=False):
        acks = list(acks)
        if acks:
            carrying.set()
            time.sleep(0.2)
        return sync_call(self, acks, n, wait, may_wait)

    async def slow_async(self, acks, n, wait=None, may_wait=False):
        acks = list(acks)
        if acks:
            carrying.set()
            await asyncio.sleep(0.2)
        return await async_call(self, acks, n, wait, may_wait)

    monkeypatch.setattr(rqueue.consumer.Consumer, "ack_and_fetch", slow_sync)
    monkeypatch.setattr(rqueue.aio.consumer.Consumer, "ack_and_fetch", slow_async)
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


# -- LOSS of an ack (the message runs again): cancelling run() cuts the dispatcher's call --
#
# rqueue.aio.Worker.run: "Cancelling the task that awaits it stops the
# worker as stop does (grace period included)" (docs/aio.md too). But run
# awaits the dispatcher task unshielded (rqueue/aio/worker.py, run: "await
# self._dispatching"), so the cancellation of run's task cancels the
# dispatcher's call under way as well: the acks that call carried were
# drained from the ledger and are never sent again, and the leave hands
# those finished messages back. A graceful stop of either worker (the
# threaded one here) lets the call finish and its acks apply.


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
def test_a_graceful_stop_applies_the_acks_of_the_call_under_way(kind, backend, prefix, live, monkeypatch):
    import rqueue.aio.consumer
    import rqueue.consumer

    carrying = threading.Event()
    sync_call = rqueue.consumer.Consumer.ack_and_fetch
    async_call = rqueue.aio.consumer.Consumer.ack_and_fetch

    # given a dispatcher whose round trip that carries acks takes 0.2 s
    def slow_sync(self, acks, n, wait=None, may_wait=False):
        acks = list(acks)
        if acks:
            carrying.set()
            time.sleep(0.2)
        return sync_call(self, acks, n, wait, may_wait)

    async def slow_async(self, acks, n, wait=None, may_wait=False):
        acks = list(acks)
        if acks:
            carrying.set()
            await asyncio.sleep(0.2)
        return await async_call(self, acks, n, wait, may_wait)

    monkeypatch.setattr(rqueue.consumer.Consumer, "ack_and_fetch", slow_sync)
    monkeypatch.setattr(rqueue.aio.consumer.Consumer, "ack_and_fetch", slow_async)
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


# -- API: a plain handle on a queue partitioned since it was read ----------------------------
#
# docs/aio.md: "A plain handle on a queue another process partitioned after
# this client read the partitionings sends its publish to the partitions,
# as the sync client does; its first join is refused with QueuePartitioned
# (nothing is written)". The sync client does both (rqueue/publishing.py
# send re-routes on QueuePartitioned; tests/test_partitioning_window.py).
# rqueue.aio.Queue.publish_many and Consumer.join call check_plain() first
# (rqueue/aio/queue.py), which reads the prefix's partitionings and raises
# InvalidSetting ("the queue was partitioned after this client read the
# partitionings"): the publish is refused instead of going to the
# partitions, and the join raises InvalidSetting, not QueuePartitioned.


@pytest.mark.parametrize("api_kind", ["sync", "async"])
@MEMORY
def test_a_stale_plain_handle_publishes_to_the_partitions(api_kind, backend, prefix, live):
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

        results = asyncio.run(main())
    # then the messages went to the partitions
    assert all(r.partition is not None for r in results)
    assert live.queue("orders").stats().last_seq == 2


@pytest.mark.parametrize("api_kind", ["sync", "async"])
@MEMORY
def test_a_stale_plain_handles_join_is_refused_as_partitioned(api_kind, backend, prefix, live):
    if api_kind == "sync":
        stale = rqueue.connect(backend, prefix=prefix, settings_ttl=60)
        try:
            plain = stale.queue("orders")
            live.queue("orders", partitions=2)
            with pytest.raises(rqueue.QueuePartitioned):
                plain.consumer("g")
        finally:
            stale.close()
    else:

        async def main():
            stale = await rqueue.aio.connect(backend, prefix=prefix, settings_ttl=60)
            try:
                plain = stale.queue("orders")
                await asyncio.to_thread(live.queue, "orders", 2)
                # when the stale process joins a group through its plain handle, then it is refused by name
                with pytest.raises(rqueue.QueuePartitioned):
                    await plain.consumer("g").join()
            finally:
                await stale.close()

        asyncio.run(main())


# -- DELAY: a stop at once waits out the join's retry pause ---------------------------------
#
# docs/worker.md, Stopping: a stop at once retries nothing, and "with Redis
# down or silent it ends within about a second". The threaded Reconnector
# pauses between retries on the hard-stop event (rqueue/worker/reconnect.py,
# _again's pause: "A stop at once ends the pause, and the next attempt
# raises"). AsyncReconnector.call (rqueue/aio/reconnect.py) pauses with a
# plain asyncio.sleep, and Worker._wake cancels only the dispatcher task,
# which does not exist yet while run() is still joining: a stop at once
# during an outage at the join waits out the pause under way (up to 1.5 x
# LONGEST_PAUSE, 3 s; here the pause is made 5 s to show it).


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


# -- API (signature): concurrency is keyword-only on one worker alone ------------------------
#
# rqueue.Worker(queue, group, handler, *, concurrency=..., ...) takes every
# option by keyword (rqueue/worker/control.py); rqueue.aio.Worker(queue,
# group, handler, concurrency=..., *, ...) also takes concurrency as a
# fourth positional argument (rqueue/aio/worker.py). Code written for the
# asyncio worker (Worker(q, "g", h, 8)) raises TypeError on the threaded one.
# The threaded signature is taken as right (docs/aio.md: "It takes the same
# keyword arguments").


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_concurrency_is_taken_by_keyword_only(kind):
    async def main():
        client = await rqueue.aio.connect("memory://kw-only", prefix="kw")
        try:
            rqueue.aio.Worker(client.queue("orders"), "g", lambda d: None, 4)
        finally:
            await client.close()

    with pytest.raises(TypeError):
        if kind == "threaded":
            client = rqueue.connect("memory://kw-only", prefix="kw")
            try:
                rqueue.Worker(client.queue("orders"), "g", lambda d: None, 4)
            finally:
                client.close()
        else:
            asyncio.run(main())
