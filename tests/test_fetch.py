"""Fetching: prefetch and max_inflight, groups that each see every message
and share it among their consumers, blocking fetches, and peeking."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
from support.aio_bridge import parametrize_api
from support.refusals import names_input, nothing_changes
from support.servers import SINGLE_SERVERS, start_server, wait_for

import rqueue
import rqueue.aio
from rqueue import InvalidInput
from rqueue.engine import commands, notify

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

NAN = float("nan")
INF = float("inf")


# -- caps and groups -----------------------------------------------------------------


def test_prefetch_caps_one_consumer(queue):
    # given 10 messages and a consumer with a prefetch of 3
    queue.publish_many([b"m"] * 10)
    c = queue.consumer("g", prefetch=3)
    # when it asks for 10, then it gets 3, and nothing more while it holds them
    assert len(c.fetch(10)) == 3
    assert c.fetch(10) == []


def test_max_inflight_caps_the_group_at_every_instant(client, queue):
    # (guarantee 4: max_inflight and prefetch hold at every instant)
    # given a group capped at 5 in flight and two consumers with a prefetch of 4
    client.configure("orders", max_inflight=5)
    queue.publish_many([b"m"] * 20)
    a, b = queue.consumer("g", prefetch=4), queue.consumer("g", prefetch=4)
    # when both fetch, then the group holds 5, not 8
    held = a.fetch(10) + b.fetch(10)
    assert len(held) == 5
    assert queue.stats().group("g").in_flight == 5
    assert b.fetch(10) == [] and a.fetch(10) == []
    # and acking one frees room for exactly one
    a.ack(held[0])
    assert len(b.fetch(10)) == 1
    assert queue.stats().group("g").in_flight == 5


def test_groups_fan_out_and_compete_inside(queue):
    # given 4 messages, two consumers of group a and one of group b
    queue.publish_many([b"1", b"2", b"3", b"4"])
    a1, a2 = queue.consumer("a", prefetch=2), queue.consumer("a", prefetch=2)
    b = queue.consumer("b")
    # when they fetch, then a's consumers share the messages, each one once
    got_a = [d.seq for d in a1.fetch(10)] + [d.seq for d in a2.fetch(10)]
    assert sorted(got_a) == [1, 2, 3, 4] and len(set(got_a)) == 4
    # and b gets every message too
    assert [d.seq for d in b.fetch(10)] == [1, 2, 3, 4]


# -- blocking fetches ------------------------------------------------------------------


def test_an_idle_fetch_waits_in_redis_and_wakes_up_on_publish(backend, prefix, monkeypatch):
    # given a consumer waiting in fetch, with polling made too slow to matter
    monkeypatch.setattr(rqueue.consumer, "IDLE_POLL_INTERVAL", 60.0)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    c = q.consumer("g", wait_in_redis=True)
    # (on one server it waits in Redis, not on the channel; a cluster's
    # pipelines take script calls only, so its consumers wait on the channel)
    in_redis = not isinstance(client.redis, redis.RedisCluster)
    assert not c.waits_on_wakes()  # (not before a fetch found nothing)
    if in_redis:
        monkeypatch.setattr(client.notifier, "wait", lambda *a, **k: pytest.fail("waited on the channel"))
    got: list[rqueue.Delivery] = []
    t = threading.Thread(target=lambda: got.extend(c.fetch(1, timeout=30)))
    t.start()
    if in_redis:
        # (its first fetch found nothing: it is the queue's waiter)
        wait_for(lambda: waiter_of(client, q) == c.name and c.waits_on_wakes())
    # when a message is published
    q.publish(b"wake")
    # then the waiting fetch returns it long before its poll or timeout
    wait_for(lambda: not t.is_alive())
    assert [d.data for d in got] == [b"wake"]
    # and the publish used the mark: one entry in the wake stream, the mark
    # gone (a cluster's consumer claims no role, so its publish adds none)
    assert client.redis.exists(q.keys.wakes) == in_redis and waiter_of(client, q) is None
    # and the waiter's client did not subscribe to the channel (its notifier
    # thread would wake at every publish)
    assert client.notifier.listens(q.keys.wake_channel) is not in_redis
    client.close()


def waiter_of(client: rqueue.Client, q: rqueue.Queue) -> str | None:
    """The consumer that the queue's meta field "wake" names as its waiter
    ("<group> <consumer> <until_ms>")."""
    value = client.redis.hget(q.keys.meta, "wake")
    return None if value is None else value.decode().split(" ")[1]


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_channel_subscribed_again_after_a_break_counts_as_an_announcement(kind, prefix):
    """What is published while a client's subscription is broken never
    reaches it: its resubscription wakes the waiters so that they fetch once
    more, rather than wait for their poll."""
    server = start_server("redis")  # (of its own: every subscription on it is closed)
    admin = redis.Redis.from_url(server.url)
    channel = f"{prefix}:chan"

    async def run_async() -> None:
        client = await rqueue.aio.connect(server.url, prefix=prefix)
        try:
            await check(client.notifier.generation)
        finally:
            await client.close()

    async def check(generation) -> None:
        numsub = [(channel.encode(), 1)]

        async def poll(condition, what: str) -> None:
            # (an asyncio client subscribes on this loop: it must not block)
            deadline = asyncio.get_running_loop().time() + 10
            while not await condition():
                assert asyncio.get_running_loop().time() < deadline, f"{what} within 10 s"
                await asyncio.sleep(0.01)

        async def subscribed() -> bool:
            return admin.pubsub_numsub(channel) == numsub

        # given a client subscribed to a channel, and a waiter's generation
        before = await generation(channel)
        await poll(subscribed, "not subscribed")
        # when the server closes the subscription's connection, and nothing is published
        admin.client_kill_filter(_type="pubsub")

        # then it is subscribed again, and its generation moved twice: at the
        # break (the waiters fetch while it is down), and at the resubscription
        # (what was published meanwhile was missed)
        async def settled() -> bool:
            return await subscribed() and await generation(channel) >= before + 2

        await poll(settled, "not subscribed again")

    try:
        if kind == "async":
            asyncio.run(run_async())
        else:
            client = rqueue.connect(server.url, prefix=prefix)

            async def generation(ch: str) -> int:
                return client.notifier.generation(ch)

            try:
                asyncio.run(check(generation))
            finally:
                client.close()
    finally:
        admin.close()
        server.stop()


def test_a_connection_that_held_is_tried_again_soon_and_a_flapping_one_every_half_second():
    # (the pause after a break of the wake-up channel's connection, made at 10.0 s)
    assert notify.reconnect_pause(10.0, 10.0 + notify.STEADY_SECONDS) == notify.FIRST_RECONNECT_PAUSE == 0.05
    assert notify.reconnect_pause(10.0, 10.0 + notify.STEADY_SECONDS - 0.01) == notify.RECONNECT_PAUSE == 0.5
    assert notify.reconnect_pause(10.0, 10.0) == notify.RECONNECT_PAUSE  # (a connection refused at once)


def test_wait_in_redis_is_true_or_false(client, queue):
    # when it is set to anything else, then it is refused, naming the setting, and nothing changes
    with nothing_changes(client), pytest.raises(rqueue.InvalidSetting) as err:
        client.configure("orders", wait_in_redis="yes")
    names_input(err.value, "wait_in_redis", "true or false")
    with pytest.raises(rqueue.InvalidSetting):
        queue.consumer("g", wait_in_redis=1)


def test_a_fetch_that_finds_nothing_marks_the_queue_only_for_a_consumer_that_waits_in_redis(client, queue):
    # when a consumer without wait_in_redis finds nothing, then the queue is not marked
    plain = queue.consumer("g", name="plain")
    assert plain.fetch(1) == []
    assert client.redis.hget(queue.keys.meta, "wake") is None
    # and a publish then adds no wake-up
    queue.publish(b"a")
    assert client.redis.exists(queue.keys.wakes) == 0
    assert [d.data for d in plain.fetch(1)] == [b"a"]
    # when one with it finds nothing, then it is the queue's waiter, and the next publish adds one
    if isinstance(client.redis, redis.RedisCluster):
        return  # (a cluster's consumers wait on the channel)
    waiting = queue.consumer("g", name="waiting", wait_in_redis=True)
    assert idle(waiting) == []
    assert waiter_of(client, queue) == "waiting" and waiting.waits_on_wakes()
    queue.publish(b"b")
    assert client.redis.xlen(queue.keys.wakes) == 1 and client.redis.hget(queue.keys.meta, "wake") is None


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_one_idle_consumer_of_a_queue_waits_in_redis_and_the_others_on_the_channel(client, queue):
    # given two consumers that wait in Redis when idle, and a finds nothing first
    a = queue.consumer("g", name="a", wait_in_redis=True)
    b = queue.consumer("g2", name="b", wait_in_redis=True)
    assert idle(a) == [] and a.waits_on_wakes()
    # when b finds nothing too, then the role stays a's: b waits on the channel
    assert idle(b) == [] and not b.waits_on_wakes()
    assert waiter_of(client, queue) == "a"
    # and a's next empty fetch keeps it
    assert idle(a) == [] and a.waits_on_wakes() and not b.waits_on_wakes()
    # when a message is published, then it adds a wake-up and frees the role
    queue.publish(b"m")
    assert client.redis.xlen(queue.keys.wakes) == 1 and waiter_of(client, queue) is None
    # and the next consumer to find nothing takes it
    assert [d.data for d in a.fetch(1)] == [b"m"] and not a.waits_on_wakes()
    assert [d.data for d in b.fetch(1)] == [b"m"]
    assert idle(b) == [] and b.waits_on_wakes() and waiter_of(client, queue) == "b"
    assert idle(a) == [] and not a.waits_on_wakes()


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_consumers_of_one_name_in_two_groups_are_two_candidates_for_the_role(client, queue):
    # given consumers named alike in two groups, the first the queue's waiter
    first = queue.consumer("g1", name="w", wait_in_redis=True)
    second = queue.consumer("g2", name="w", wait_in_redis=True)
    assert idle(first) == [] and first.waits_on_wakes()
    # when the other finds nothing, then it is not taken for the waiter
    assert idle(second) == [] and not second.waits_on_wakes()
    assert client.redis.hget(queue.keys.meta, "wake").startswith(b"g1 w ")


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_a_waiter_that_stops_fetching_gives_the_role_up_after_a_second(client, queue, clock):
    # given a is the queue's waiter, then goes away without a word (killed)
    a = queue.consumer("g", name="a", wait_in_redis=True)
    b = queue.consumer("g", name="b", wait_in_redis=True)
    assert idle(a) == [] and a.waits_on_wakes()
    # when 0.99 s pass, then b still waits on the channel
    clock.advance(0.99)
    assert idle(b) == [] and not b.waits_on_wakes()
    # when more than a second has passed since a's last fetch, then b takes the role
    clock.advance(0.02)
    assert idle(b) == [] and b.waits_on_wakes() and waiter_of(client, queue) == "b"
    # and a, back, waits on the channel
    assert idle(a) == [] and not a.waits_on_wakes()


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
@pytest.mark.parametrize("damaged", [b"1", b"", b"x", b"x 99999999999999", b"x -5", b"\xff\xfe"])
def test_a_damaged_waiter_field_leaves_the_role_free(client, queue, damaged):
    # given the meta field naming the waiter damaged (or left by an older
    # rqueue, which wrote "1"), and a consumer that finds nothing
    c = queue.consumer("g", name="c", wait_in_redis=True)
    client.redis.hset(queue.keys.meta, "wake", damaged)
    # when it fetches as an idle worker does, then it takes the role
    assert idle(c) == [] and c.waits_on_wakes() and waiter_of(client, queue) == "c"


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_a_publish_to_a_queue_with_idle_consumers_wakes_one_in_redis(backend, prefix, monkeypatch):
    # given three consumers waiting in fetch, with polling made too slow to matter
    monkeypatch.setattr(rqueue.consumer, "IDLE_POLL_INTERVAL", 60.0)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    consumers = [q.consumer("g", name=f"c{i}", wait_in_redis=True) for i in range(3)]
    lock = threading.Lock()
    in_redis: list[str] = []  # who waits in Redis now
    on_channel: list[int] = []  # the threads waiting on the channel now
    real_wait, real_channel = commands.wait_then_fetch, client.notifier.wait

    def wait_then_fetch(call, *args):
        with lock:
            in_redis.append(call.consumer)
        try:
            return real_wait(call, *args)
        finally:
            with lock:
                in_redis.remove(call.consumer)

    def channel_wait(*args):
        with lock:
            on_channel.append(threading.get_ident())
        try:
            return real_channel(*args)
        finally:
            with lock:
                on_channel.remove(threading.get_ident())

    monkeypatch.setattr(commands, "wait_then_fetch", wait_then_fetch)
    monkeypatch.setattr(client.notifier, "wait", channel_wait)
    got: list[list[rqueue.Delivery]] = [[], [], []]
    threads = [
        threading.Thread(target=lambda c=c, g=g: g.extend(c.fetch(1, timeout=30))) for c, g in zip(consumers, got)
    ]
    for t in threads:
        t.start()
    for i in range(3):
        # (when all are idle: one waits in Redis, the others on the channel)
        alive = 3 - i
        wait_for(lambda alive=alive: (len(in_redis), len(on_channel)) == (1, alive - 1))
        # when a message is published
        q.publish(b"m%d" % i)
        wait_for(lambda i=i: sum(not t.is_alive() for t in threads) == i + 1)
    # then each consumer got one
    assert sorted(d.data for g in got for d in g) == [b"m0", b"m1", b"m2"]
    client.close()


def idle(c: rqueue.Consumer) -> list[rqueue.Delivery]:
    """A fetch of one whose caller would wait if it brought nothing (as an
    idle worker's is)."""
    _, got, _ = c.ack_and_fetch([], 1, may_wait=True)
    return got


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_only_a_fetch_whose_caller_would_wait_makes_its_consumer_the_waiter(client, queue):
    # given a consumer that waits in Redis when idle, holding one delivery
    c = queue.consumer("g", name="c", wait_in_redis=True)
    queue.publish(b"a")
    [d] = idle(c)
    # when it finds nothing in a fetch that will not wait, or one that acks,
    # then it is not the queue's waiter and the queue is not marked
    assert c.fetch(1) == [] and not c.waits_on_wakes()
    statuses, got, _ = c.ack_and_fetch([d], 1)
    assert statuses == [None] and got == [] and not c.waits_on_wakes()
    assert waiter_of(client, queue) is None
    # and a publish then adds no wake-up
    queue.publish(b"b")
    assert client.redis.exists(queue.keys.wakes) == 0


def test_a_busy_queue_adds_no_wake_up(client, queue):
    # given a consumer that waits in Redis when idle and keeps finding messages
    c = queue.consumer("g", wait_in_redis=True)
    queue.publish_many([b"a", b"b"])
    assert len(c.fetch(1)) == 1
    # when more are published while it finds some each time
    queue.publish(b"c")
    assert len(c.fetch(1)) == 1
    # then no publish wrote a wake-up: no fetch found nothing
    assert client.redis.exists(queue.keys.wakes) == 0


@pytest.mark.parametrize("flow", ["plain", "priority", "partitioned"])
def test_a_ready_message_behind_more_delayed_ones_than_a_call_passes_over_comes_without_a_poll(
    backend, prefix, monkeypatch, flow
):
    # given more delayed messages than one fetch passes over (1,000 from the
    # log's scan, or 100 picks from the priority set), then a ready one, and
    # polling made too slow to matter
    monkeypatch.setattr(rqueue.consumer, "IDLE_POLL_INTERVAL", 60.0)
    monkeypatch.setattr(rqueue.partitioned_consumer, "IDLE_POLL_INTERVAL", 60.0)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders", partitions=2) if flow == "partitioned" else client.queue("orders")
    c = q.consumer("g")
    priority, delayed = {"plain": (None, 1500), "priority": (5, 150), "partitioned": (None, 5000)}[flow]
    q.publish_many([b"later"] * delayed, delay=3600, priority=priority)
    q.publish(b"now", priority=priority)
    # when a consumer fetches with a timeout far below the poll
    got = c.fetch(1, timeout=20)
    # then the ready message comes: each call that stopped at its bound asked
    # for the next at once, rather than after the poll
    assert [d.data for d in got] == [b"now"]
    if flow != "partitioned":
        assert q.stats().group("g").delayed == delayed
    client.close()


def test_an_asyncio_partitioned_fetch_behind_many_delayed_messages_asks_again_at_once(backend, prefix, monkeypatch):
    # given a queue of two partitions, and polling made too slow to matter
    import rqueue.aio.partitions

    monkeypatch.setattr(rqueue.aio.partitions, "IDLE_POLL_INTERVAL", 60.0)
    setup = rqueue.connect(backend, prefix=prefix)
    setup.queue("orders", partitions=2)

    async def main() -> list[bytes]:
        ac = await rqueue.aio.connect(backend, prefix=prefix)
        try:
            q = ac.queue("orders")  # partitioned before this client connected
            assert isinstance(q, rqueue.aio.PartitionedQueue)
            c = q.consumer("g")
            assert await c.fetch(1) == []  # joins
            # and 2,500 delayed messages per partition, more than a call
            # passes over, then a ready one
            await q.publish_many([b"later"] * 5000, delay=3600)
            await q.publish(b"now")
            # when the consumer fetches with a timeout far below the poll
            return [d.data for d in await c.fetch(1, timeout=20)]
        finally:
            await ac.close()

    # then the ready message comes
    assert asyncio.run(main()) == [b"now"]
    setup.close()


def test_an_idle_fetch_waits_on_the_channel_by_default_and_wakes_up_on_publish(backend, prefix, monkeypatch):
    # given a consumer waiting in fetch on the channel (wait_in_redis is off
    # by default), with polling made too slow to matter
    monkeypatch.setattr(rqueue.consumer, "IDLE_POLL_INTERVAL", 60.0)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    c = q.consumer("g")
    assert not c.waits_on_wakes()
    waiting = threading.Event()
    real_wait = client.notifier.wait

    def wait(*args):
        waiting.set()
        return real_wait(*args)

    monkeypatch.setattr(client.notifier, "wait", wait)
    got: list[rqueue.Delivery] = []
    t = threading.Thread(target=lambda: got.extend(c.fetch(1, timeout=30)))
    t.start()
    wait_for(waiting.is_set)
    # when a message is published
    q.publish(b"wake")
    # then the waiting fetch returns it long before its poll or timeout
    wait_for(lambda: not t.is_alive())
    assert [d.data for d in got] == [b"wake"]
    client.close()


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_an_idle_asyncio_fetch_waits_in_redis_and_wakes_up_on_publish(backend, prefix, monkeypatch):
    # given an asyncio consumer waiting in fetch, with polling made too slow
    # to matter and the channel out of use
    import rqueue.aio
    import rqueue.aio.consumer
    import rqueue.aio.notify

    monkeypatch.setattr(rqueue.aio.consumer, "IDLE_POLL_INTERVAL", 60.0)

    async def refuse(*args, **kwargs):
        pytest.fail("waited on the channel")

    monkeypatch.setattr(rqueue.aio.notify.AsyncNotifier, "wait", refuse)

    async def main() -> list[bytes]:
        client = await rqueue.aio.connect(backend, prefix=prefix)
        q = client.queue("orders")
        async with q.consumer("g", wait_in_redis=True) as c:
            fetching = asyncio.ensure_future(c.fetch(1, timeout=30))

            # (its first fetch found nothing: it is the queue's waiter)
            async def marked() -> None:
                while b" %s " % c.name.encode() not in (await client.redis.hget(q.keys.meta, "wake") or b""):
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(marked(), 10)
            # when a message is published
            await q.publish(b"wake")
            # then the waiting fetch returns it long before its poll or timeout
            got = await asyncio.wait_for(fetching, 10)
        await client.close()
        return [d.data for d in got]

    assert asyncio.run(main()) == [b"wake"]


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_a_message_that_came_without_a_wake_up_turns_the_consumer_to_the_channel(backend, prefix, monkeypatch, caplog):
    # given a consumer waiting in Redis (briefly), and a publisher that adds
    # no wake-up, as an older rqueue's (here the mark is taken away first)
    monkeypatch.setattr(rqueue.consumer, "IDLE_POLL_INTERVAL", 0.3)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    c = q.consumer("g", wait_in_redis=True)
    got: list[rqueue.Delivery] = []
    t = threading.Thread(target=lambda: got.extend(c.fetch(1, timeout=30)))
    t.start()
    wait_for(lambda: waiter_of(client, q) == c.name)
    client.redis.hdel(q.keys.meta, "wake")
    seen_ms = server_ms(client)
    wait_for(lambda: server_ms(client) > seen_ms)  # (published in a later ms than the fetch that marked)
    q.publish(b"unannounced")
    # when its wait runs out, then the fetch after it brings the message
    wait_for(lambda: not t.is_alive())
    assert [d.data for d in got] == [b"unannounced"] and client.redis.exists(q.keys.wakes) == 0
    # and the consumer waits on the channel from then on, and says why; it
    # claims the waiter role no more
    assert c.fetch(1, timeout=0.05) == [] and not c.waits_on_wakes() and waiter_of(client, q) is None
    assert "without a wake-up" in caplog.text
    client.close()


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_a_wake_up_added_as_the_wait_gave_up_keeps_the_consumer_waiting_in_redis(backend, prefix, monkeypatch, caplog):
    # given a consumer whose wait in Redis reports a timeout although a
    # publish added its wake-up meanwhile, as memory://'s blocking read does
    # when the entry lands while the read gives up (it takes its lock back)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    c = q.consumer("g", wait_in_redis=True)
    real = commands.wait_then_fetch

    def timed_out_meanwhile(call, wakes, since, *args):
        seen_ms = server_ms(client)
        wait_for(lambda: server_ms(client) > seen_ms)  # (published in a later ms than the fetch that marked)
        q.publish(b"m")
        return real(call, wakes, since, *args)._replace(since=since)

    monkeypatch.setattr(commands, "wait_then_fetch", timed_out_meanwhile)
    # when it waits, and the fetch after the wait brings the message
    got = c.fetch(1, timeout=10)
    assert [d.data for d in got] == [b"m"] and client.redis.xlen(q.keys.wakes) == 1
    # then it goes on waiting in Redis, as the wake-up did come, and warns of nothing
    monkeypatch.setattr(commands, "wait_then_fetch", real)
    assert c.fetch(1, timeout=0.05) == [] and c.waits_on_wakes()
    assert "without a wake-up" not in caplog.text
    client.close()


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_a_loss_of_the_queues_state_during_a_wait_keeps_the_consumer_waiting_in_redis(
    backend, prefix, monkeypatch, caplog
):
    # given a consumer waiting in Redis (briefly) on a marked queue
    monkeypatch.setattr(rqueue.consumer, "IDLE_POLL_INTERVAL", 0.3)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    c = q.consumer("g", wait_in_redis=True)
    got: list[rqueue.Delivery] = []
    t = threading.Thread(target=lambda: got.extend(c.fetch(1, timeout=30)))
    t.start()
    wait_for(lambda: waiter_of(client, q) == c.name)
    # when Redis loses the queue's state (the mark with it) and a message is
    # published in a later ms, which adds no wake-up
    client.redis.delete(q.keys.meta)
    seen_ms = server_ms(client)
    wait_for(lambda: server_ms(client) > seen_ms)
    q.publish(b"after the loss")
    # then the fetch after the wait brings it, the consumer reports the loss
    wait_for(lambda: not t.is_alive())
    assert [d.data for d in got] == [b"after the loss"] and c.state_epoch == 1
    # and it goes on waiting in Redis: a lost mark is no publisher without wake-ups
    assert c.fetch(1, timeout=0.05) == [] and c.waits_on_wakes()
    assert "without a wake-up" not in caplog.text
    client.close()


def server_ms(client: rqueue.Client) -> int:
    seconds, micros = client.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster's consumers wait on the channel
def test_a_wake_up_published_before_the_wait_is_not_missed(backend, prefix):
    # given a consumer whose fetch found nothing (the queue is marked)
    client = rqueue.connect(backend, prefix=prefix)
    queue = client.queue("orders")
    c = queue.consumer("g", wait_in_redis=True)
    assert idle(c) == []
    call = queue.group_call("g", consumer=c.name)
    # when a message is published before its wait reaches Redis
    queue.publish(b"early")
    # then a wait after the last wake-up it saw returns at once, with the message
    woken = commands.wait_then_fetch(call, queue.keys.wakes, commands.WAKE_ANY, 10_000, 1, "tearly")
    assert woken.since != commands.WAKE_ANY and not woken.refused
    assert [d[2][-5:] for d in woken.reply.deliveries()] == [b"early"]
    client.close()


def test_blocking_fetch_returns_empty_after_timeout(client, queue):
    c = queue.consumer("g")
    assert c.fetch(1, timeout=0.05) == []


# -- bad arguments ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, 10**9, True, 1.5, "1", None])
def test_fetch_with_a_bad_n(client, queue, held, n):
    # given a consumer with messages ready
    # when it asks for a bad number of deliveries
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w2.fetch(n)
    # then n is named with the allowed range
    names_input(exc.value, f"not {n!r}", "from 1 to 10000")


@pytest.mark.parametrize("n", [-1, True, 2.5, "3", None])
def test_ack_and_fetch_with_a_bad_n(client, queue, held, n):
    # given a consumer with messages ready and one delivery held
    [d] = held.w2.fetch(1)
    # when it acks and asks for a bad number of deliveries
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w2.ack_and_fetch([d], n)
    # then n is named, and the ack was not sent either
    names_input(exc.value, f"not {n!r}", ">= 0")


@pytest.mark.parametrize("timeout", [-1, -0.001, -INF, "1", None, True])
def test_fetch_with_a_bad_timeout(client, queue, held, timeout):
    # given a consumer with messages ready
    # when it fetches with a bad timeout
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w2.fetch(1, timeout=timeout)
    # then the timeout is named
    names_input(exc.value, f"timeout must be a number of seconds >= 0, not {timeout!r}")


@pytest.mark.parametrize("timeout", [NAN, INF], ids=["nan", "inf"])
def test_fetch_with_a_timeout_that_is_not_finite(client, queue, held, monkeypatch, timeout):
    # given a consumer whose fetch script fails the test at once if a fetch
    # gets past validation (a NaN timeout would make the wait loop endless)
    def passed_validation(*args, **kwargs):
        raise AssertionError(f"fetch accepted timeout={timeout}")

    monkeypatch.setattr(commands, "fetch", passed_validation)
    # when it fetches with timeout NaN or infinity
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w2.fetch(1, timeout=timeout)
    # then the timeout is named
    names_input(exc.value, f"timeout must be a number of seconds >= 0, not {timeout!r}")


# -- peeking ------------------------------------------------------------------------------


def test_peek_with_a_bad_n(client, queue, held):
    # given a queue with messages
    # when peek asks for 0
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="n must be a whole number >= 1, not 0"):
        queue.peek(0)


def test_peek_with_a_bad_after(client, queue, held):
    # given a queue with messages
    # when peek starts after a str
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="after"):
        queue.peek(1, after="x")
