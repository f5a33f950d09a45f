"""Behaviour that drifted between the synchronous code and its asyncio twin:
each test passes on the twin that is right (the threaded worker and the
docs, unless a test says otherwise) and fails on the other one.

The worker tests run both workers side by side as tests/test_aio_worker.py
does (``kind`` threaded / async); the client tests run both clients
(``api`` sync / async, tests/support/aio_bridge.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from support.aio_bridge import parametrize_api
from support.servers import start_server

import rqueue
import rqueue.aio
import rqueue.aio.worker

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


# -- LOG: a corrupt record refusing an ack is logged at ERROR -------------------------
#
# Dispatcher._record_acks (rqueue/worker/dispatcher.py) logs an ack refused
# with CorruptRecord at ERROR ("damage, not a late ack: said loudly"), the
# others at INFO; rqueue.aio.Worker._record_acks logs every refusal at INFO,
# the damage included.


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
