"""rqueue.aio, the client on redis-py's asyncio client: the same operations,
awaited, on every kind of URL, with the same state in Redis and the same
exceptions as the sync client."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from support.servers import start_server

import rqueue
import rqueue.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_sentinel import start_group  # noqa: E402


def run(coro):
    return asyncio.run(coro)


async def aconnect(url: str, prefix: str, **options) -> rqueue.aio.Client:
    return await rqueue.aio.connect(url, prefix=prefix, **options)


def test_every_operation_on_every_backend(backend, prefix):
    # given an asyncio client and a sync client of the same queues
    sync = rqueue.connect(backend, prefix=prefix, settings_ttl=0)

    async def main() -> None:
        client = await aconnect(backend, prefix, settings_ttl=0)
        await client.configure("orders", max_deliveries=2)
        q = client.queue("orders")
        async with q.consumer("g", name="w1") as c:
            # when messages are published, fetched and settled every way
            first = await q.publish(b"hello", headers={"k": "v"}, id="order-1")
            again = await q.publish(b"hello", id="order-1")
            assert (first.seq, again.seq, again.duplicate) == (1, 1, True)
            assert [r.seq for r in await q.publish_many([b"b", b"c", b"d", b"e"])] == [2, 3, 4, 5]
            ds = await c.fetch(5, timeout=1)
            assert [(d.seq, d.data, d.headers) for d in ds[:2]] == [(1, b"hello", {"k": "v"}), (2, b"b", {})]
            await ds[0].ack()
            assert await ds[1].nack(delay=0) == "requeued"
            await ds[2].term("bad input")
            await ds[3].reject(reason="no")
            deadline = await ds[4].in_progress()
            assert deadline >= ds[4].deadline_ms
            statuses, more, _ = await c.ack_and_fetch([ds[4]], 5)
            assert statuses == [None]
            assert [(d.seq, d.delivery_count) for d in more] == [(2, 2)]
            assert await more[0].nack(error="again") == "dead"  # max_deliveries reached
            # then stats, dead letters, replay and purge agree with the sync client's view
            stats = await q.stats()
            assert (stats.last_seq, stats.dead_letters) == (5, 3)
            assert stats.group("g").acked == 2
            dead = await q.dead_letters()
            reasons = sorted((d.seq, d.reason) for d in dead)
            assert reasons == [(2, "max-deliveries"), (3, "terminated"), (4, "rejected")]
            assert [d.seq for d in sync.queue("orders").dead_letters()] == [d.seq for d in dead]
            replayed = await q.replay(reason="rejected")
            assert (replayed.selected, replayed.replayed) == (1, 1)
            assert (await q.purge()) == {"g": 1}
            await c.ack(await c.fetch(5))  # nothing left to fetch: acking none is a no-op
        assert sync.queue("orders").stats().group("g").consumers == []  # left on exit
        await client.close()

    try:
        run(main())
        g = sync.queue("orders").stats().group("g")
        assert (g.acked, g.dead_lettered, g.in_flight) == (2, 3, 0)
    finally:
        sync.close()


def test_the_async_client_leaves_the_same_state_as_the_sync_one(prefix):
    # given the same steps, clock and random numbers on both clients
    url = "memory://same-state-" + prefix
    clock_a, clock_b = rqueue.ManualClock(), rqueue.ManualClock()
    sync = rqueue.connect(url, prefix=prefix + "s", clock=clock_a, randomness=rqueue.Randomness(seed=3))
    qs = sync.queue("orders")
    sync.configure("orders", redelivery_delay=2.0, redelivery_jitter=0.5)
    qs.publish_many([b"a", b"b", b"c"], headers={"h": "1"})
    with qs.consumer("g", name="w") as c:
        d1, d2, d3 = c.fetch(3)
        d1.ack()
        d2.nack(error="boom")
        clock_a.advance(40)

    async def main() -> None:
        client = await aconnect(url, prefix + "a", clock=clock_b, randomness=rqueue.Randomness(seed=3))
        q = client.queue("orders")
        await client.configure("orders", redelivery_delay=2.0, redelivery_jitter=0.5)
        await q.publish_many([b"a", b"b", b"c"], headers={"h": "1"})
        async with q.consumer("g", name="w") as c:
            e1, e2, e3 = await c.fetch(3)
            await e1.ack()
            await e2.nack(error="boom")
            clock_b.advance(40)
        await client.close()

    run(main())
    # then every key holds the same: the engine built the same KEYS and ARGV
    assert dump(sync.redis, prefix + "a") == dump(sync.redis, prefix + "s")
    sync.close()


def dump(r, prefix: str) -> dict[str, object]:
    """Every key under ``prefix`` (named without it) with its value."""
    out: dict[str, object] = {}
    for key in sorted(r.keys(prefix + ":*") + r.keys("{" + prefix + ":*")):
        kind = r.type(key).decode()
        value = {
            "hash": lambda k: r.hgetall(k),
            "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
            "set": lambda k: sorted(r.smembers(k)),
            "string": lambda k: r.get(k),
            "list": lambda k: r.lrange(k, 0, -1),
            "stream": lambda k: [fields for _, fields in r.xrange(k)],
        }[kind](key)
        if kind == "hash" and b"inc" in value:  # each client draws its own incarnation id from the OS
            value[b"inc"] = b"<incarnation>"
        out[key.decode().replace(prefix, "<prefix>", 1)] = value
    assert out, f"no key under {prefix}"
    return out


def test_a_waiting_fetch_does_not_block_the_loop_and_wakes_on_publish(backend, prefix):
    async def main() -> tuple[float, float, list[float], list[int]]:
        client = await aconnect(backend, prefix)
        q = client.queue("orders")
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        async def publish_later() -> None:
            await asyncio.sleep(0.3)
            await q.publish(b"late")

        async with q.consumer("g") as c:
            t = asyncio.create_task(ticker())
            p = asyncio.create_task(publish_later())
            started = time.monotonic()
            got = await c.fetch(1, timeout=5)
            waited = time.monotonic() - started
            t.cancel()
            await p
            await c.ack(got)
        await client.close()
        return started, waited, ticks, [d.seq for d in got]

    started, waited, ticks, seqs = run(main())
    # the fetch ended on the publish, not its timeout, and the loop ran
    # meanwhile: ticks inside the wait, which a blocked loop cannot make
    # (however few a loaded machine allows)
    assert seqs == [1]
    assert 0.25 < waited < 4
    assert sum(1 for t in ticks if started + 0.05 < t < started + waited - 0.05) >= 3


def test_the_first_calls_after_a_redis_restart_succeed_as_the_sync_clients_do(prefix):
    # given a sync and an asyncio client whose pooled connections have each served script calls
    # and plain reads
    server = start_server("redis")
    try:
        sync = rqueue.connect(server.url, prefix=prefix)
        sq = sync.queue("orders")
        sq.publish(b"before")
        sq.stats()

        async def main() -> None:
            client = await aconnect(server.url, prefix)
            q = client.queue("orders")
            await q.publish(b"before")
            await q.stats()
            # when Redis restarts without its data, closing every connection
            server.stop()
            server.start()
            # then the sync client's first calls succeed on new connections
            assert sq.stats().last_seq == 0
            assert sq.publish(b"after-sync").seq == 1
            # and so do the asyncio client's: a script call, a plain read, a consumer's
            assert (await q.publish(b"after-aio")).seq == 2
            assert (await q.stats()).last_seq == 2
            async with q.consumer("g", name="w1") as c:
                got = await c.fetch(10)
                assert [d.data for d in got] == [b"after-sync", b"after-aio"]
                await c.ack(got)
            await client.close()

        run(main())
        sync.close()
    finally:
        server.stop()


def test_the_same_exceptions_as_the_sync_client(prefix):
    url = "memory://errors-" + prefix

    async def main() -> None:
        with pytest.raises(rqueue.InvalidURL, match="scheme must be one of"):
            await rqueue.aio.connect("http://x")
        with pytest.raises(rqueue.InvalidURL, match="must be a str"):
            await rqueue.aio.connect(b"redis://x")  # type: ignore[arg-type]
        with pytest.raises(rqueue.ConnectionFailed) as failed:
            await rqueue.aio.connect("redis://user:s3cret@127.0.0.1:1/0")
        assert "s3cret" not in str(failed.value)
        with pytest.raises(rqueue.InvalidName):
            await rqueue.aio.connect(url, prefix="bad prefix")
        client = await aconnect(url, prefix)
        q = client.queue("orders")
        with pytest.raises(rqueue.InvalidSetting, match="max_deliveries"):
            await client.configure("orders", max_deliveries="x")
        with pytest.raises(rqueue.InvalidName):
            client.queue("bad name")
        with pytest.raises(rqueue.Unroutable):
            await q.publish(b"x", mandatory=True)
        await client.configure("orders", max_payload=4)
        with pytest.raises(rqueue.PayloadTooLarge):
            await q.publish(b"12345")
        with pytest.raises(rqueue.InvalidInput):
            await q.publish_many(b"not a list")  # type: ignore[arg-type]
        with pytest.raises(rqueue.InvalidInput, match="durable"):
            await q.publish(b"x", durable="yes")  # type: ignore[arg-type]
        with pytest.raises(rqueue.NotDurable, match="refused WAIT") as short:
            await q.publish(b"x", durable=True)  # memory:// has no WAIT: stored, not confirmed
        assert short.value.results[0].seq >= 1
        async with q.consumer("g") as c:
            await q.publish(b"1")
            [d] = await c.fetch(1)
            await d.ack()
            with pytest.raises(rqueue.AlreadyAcked):
                await d.ack()
            with pytest.raises(rqueue.InvalidInput):
                await c.ack("not-a-tag")
            with pytest.raises(rqueue.InvalidInput):
                await c.fetch(0)
        await client.close()

    run(main())


def test_a_group_made_on_a_queue_partitioned_after_connect_is_refused_then_served(prefix):
    # given an asyncio client connected before another process partitioned "orders"
    url = "memory://parts-" + prefix

    async def main() -> None:
        client = await aconnect(url, prefix)
        stale = client.queue("orders")
        assert isinstance(stale, rqueue.aio.Queue)
        rqueue.connect(url, prefix=prefix).queue("orders", partitions=2)
        # when the plain handle makes a group: refused by name, nothing written
        with pytest.raises(rqueue.QueuePartitioned, match="2 partitions"):
            await stale.create_group("g")
        # then the client has learned it: queue() gives the partitioned queue, which works
        q = client.queue("orders")
        assert await q.groups() == []
        assert isinstance(q, rqueue.aio.PartitionedQueue) and q.partitions == 2
        results = await q.publish_many([b"a", b"b"], keys=["k1", "k2"])
        assert [r.partition for r in results] == [q.partition_for("k1"), q.partition_for("k2")]
        assert (await q.stats()).last_seq == 2
        # and open_queue reads the layout afresh and creates one
        made = await client.open_queue("other", partitions=3)
        assert isinstance(made, rqueue.aio.PartitionedQueue) and made.partitions == 3
        with pytest.raises(rqueue.InvalidSetting, match="cannot change"):
            await client.open_queue("other", partitions=4)
        assert rqueue.connect(url, prefix=prefix).queue("other").partitions == 3
        await client.close()

    run(main())


def test_unix_socket_and_sentinel_urls(tmp_path, prefix):
    sock = tmp_path / "redis.sock"
    server = start_server("redis", extra_args=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    group = start_group()

    async def round_trip(url: str) -> list[bytes]:
        client = await aconnect(url, prefix)
        q = client.queue("orders")
        async with q.consumer("g") as c:
            await q.publish(b"via " + url.split(":")[0].encode())
            got = await c.fetch(1, timeout=5)
            await c.ack(got)
        await client.close()
        return [d.data for d in got]

    try:
        assert run(round_trip(f"unix://{sock}")) == [b"via unix"]
        assert run(round_trip(group.url + "/0")) == [b"via redis+sentinel"]
        # a sentinel URL naming no service the sentinels know fails as the sync client's does
        with pytest.raises(rqueue.ConnectionFailed, match="knows service"):
            run(aconnect(group.url.rsplit("/", 1)[0] + "/nosuch", prefix))
        # rediss:// speaks TLS: a plain server does not answer it
        with pytest.raises(rqueue.ConnectionFailed):
            run(aconnect(server.url.replace("redis://", "rediss://"), prefix, connect_timeout=2))
    finally:
        server.stop()
        group.stop()


def test_a_call_redis_leaves_unanswered_fails_after_the_socket_timeout(prefix):
    # given a client with a short socket timeout whose server stops answering
    server = start_server("redis")
    try:

        async def main() -> float:
            client = await aconnect(server.url, prefix, socket_timeout=0.5)
            q = client.queue("orders")
            await q.publish(b"1")
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                # when a publish is sent, then it fails as a lost connection
                # (it may or may not have been applied), not hanging
                with pytest.raises(rqueue.ConnectionLost):
                    await q.publish(b"2")
                waited = time.monotonic() - started
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            # and the next call works on a fresh connection
            assert (await q.publish(b"3")).seq >= 2
            await client.close()
            return waited

        assert 0.4 < run(main()) < 3
    finally:
        server.stop()


def test_aio_publish_takes_a_priority(backend, prefix):
    # given an async client publishing with priorities
    async def main() -> list[bytes]:
        client = await aconnect(backend, prefix)
        q = client.queue("prio")
        async with q.consumer("g") as c:
            await q.publish(b"low", priority=1)
            await q.publish_many([b"plain", b"high"], priority=[0, 9])
            got = [d.data for d in await c.fetch(10, timeout=1)]
        await client.close()
        return got

    # then the group hands them out by priority
    assert run(main()) == [b"high", b"low", b"plain"]


def test_aio_pause_and_resume_of_a_group_and_a_queue(backend, prefix):
    # given an async client with a group holding one message
    async def main() -> tuple[list[bytes], list[bytes], str, bool]:
        client = await aconnect(backend, prefix)
        q = client.queue("paused")
        async with q.consumer("g") as c:
            await q.publish(b"one")
            # when the group is paused, then its fetch hands out nothing
            assert await q.pause("g")
            assert not await q.pause("g")  # already so
            held = [d.data for d in await c.fetch(10)]
            assert await q.resume("g")
            got = [d.data for d in await c.fetch(10, timeout=1)]
            # when the queue is paused with refuse, then a publish is refused and stats say so
            await q.pause(mode="refuse")
            state = (await q.stats()).paused
            try:
                await q.publish(b"two")
                refused = False
            except rqueue.QueuePaused:
                refused = True
            await q.resume()
        await client.close()
        return held, got, state, refused

    held, got, state, refused = run(main())
    assert (held, got, state, refused) == ([], [b"one"], "refuse", True)


def test_aio_stats_show_a_paused_queue_and_group(backend, prefix):
    # given a queue and group paused by the sync client
    sync = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    q = sync.queue("held")
    q.publish(b"a")
    q.consumer("g").close()
    q.pause("g")
    q.pause(mode="hold")

    async def main() -> tuple[str, bool]:
        client = await aconnect(backend, prefix)
        stats = await client.queue("held").stats()
        await client.close()
        return stats.paused, stats.group("g").paused

    # then the async client's stats say so
    assert run(main()) == ("hold", True)
    sync.close()
