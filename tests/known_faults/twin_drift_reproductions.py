"""Behaviour that drifted between the synchronous code and its asyncio twin:
each test passes on the twin that is right (the threaded worker and the
docs, unless a test says otherwise) and fails on the other one.

The worker tests run both workers side by side as tests/test_aio_worker.py
does (``kind`` threaded / async); the client tests run both clients
(``api`` sync / async, tests/support/aio_bridge.py)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from support.aio_bridge import parametrize_api

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
