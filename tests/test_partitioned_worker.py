"""The worker of a partitioned queue: one fetch loop over every partition,
sharing ``concurrency`` handler threads (fewer threads than partitions
work), fair between partitions, and a loss of Redis state in one partition
leaves the other partitions' deliveries alone."""

from __future__ import annotations

import asyncio
import threading

import pytest
from support.servers import wait_for
from test_aio_worker import run_worker

import rqueue
import rqueue.aio


def handler_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("rqueue-handler-"))


@pytest.mark.parametrize("backend", ["redis", "cluster"], indirect=True)
def test_one_thread_serves_six_partitions_fairly(client):
    # given 6 partitions with 20 messages each, and a worker of one handler thread
    pq = client.queue("orders", partitions=6)
    for p, part in enumerate(pq.parts):
        part.publish_many([f"{p}:{i}".encode() for i in range(20)])
    order: list[int] = []
    before = handler_threads()
    w = rqueue.Worker(pq, "g", lambda d: order.append(int(d.data.split(b":")[0])), concurrency=1, prefetch=2)
    assert isinstance(w, rqueue.PartitionedWorker) and w.concurrency == 1
    # when it runs
    w.start()
    try:
        wait_for(lambda: len(order) >= 120, timeout=30)
        # then it ran one handler thread, not one per partition
        assert handler_threads() - before == 1
    finally:
        w.stop()
        assert w.join(30)
    # and every partition was served from the start: the first 24 handled hold each partition at least twice
    assert sorted(order) == sorted(p for p in range(6) for _ in range(20))
    assert all(order[:24].count(p) >= 2 for p in range(6)), order[:24]
    assert w.stats.acked == 120 and pq.stats().group("g").pending == 0


def test_a_loss_in_one_partition_leaves_the_other_partitions_deliveries_current(client):
    # given a partitioned consumer holding one delivery of each of two partitions
    pq = client.queue("orders", partitions=2)
    pq.parts[0].publish(b"a")
    pq.parts[1].publish(b"b")
    c = pq.consumer("g")
    ds = sorted(c.fetch(2), key=lambda d: d.consumer.queue.partition)
    # when Redis loses partition 1's state (its keys go) and a new message makes it anew
    client.redis.delete(*[k for k in client.redis.scan_iter(match=pq.parts[1].keys.base + "*")])
    pq.parts[1].publish(b"c")
    c.fetch(2)
    # then partition 1's old delivery is judged lost, partition 0's stays current, and settles
    assert c.consumers[1].state_epoch == 1 and c.consumers[0].state_epoch == 0
    assert [d.epoch == c.epoch_for(d) for d in ds] == [True, False]
    c.ack(ds[0])
    with pytest.raises(rqueue.LostDelivery):
        c.ack(ds[1])


def test_a_failing_batch_handler_on_three_partitions_dead_letters_each_message_once(client):
    # given 3 partitions with 10 messages each, dead-lettered at their first failure,
    # and a batch handler of 10 that fails
    client.configure("orders", max_deliveries=1)
    pq = client.queue("orders", partitions=3)
    for p, part in enumerate(pq.parts):
        part.publish_many([f"{p}:{i}".encode() for i in range(10)])

    def fail(ds):
        raise ValueError("database down")

    w = rqueue.Worker(pq, "g", rqueue.BatchHandler(fail, size=10), concurrency=1, prefetch=10)
    # when it runs
    w.start()
    try:
        wait_for(lambda: sum(len(part.dead_letters(limit=20)) for part in pq.parts) == 30, timeout=30)
    finally:
        w.stop()
        assert w.join(30)
    # then each message was dead-lettered once with the batch's error, nothing left pending,
    # and the worker counted each nack once
    dead = [m for part in pq.parts for m in part.dead_letters(limit=20)]
    assert sorted(m.data for m in dead) == sorted(f"{p}:{i}".encode() for p in range(3) for i in range(10))
    assert {(m.reason, m.error) for m in dead} == {("max-deliveries", "ValueError: database down")}
    assert (w.stats.nacked, w.stats.dead_lettered, w.stats.late_settles) == (30, 30, 0)
    assert pq.stats().group("g").pending == 0


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_heartbeat_failing_in_one_partition_still_extends_the_other_partitions_leases(client, kind):
    # given a consumer of two partitions holding a delivery of partition 1
    # whose lease is about to run out, and removed from partition 0's group
    pq = client.queue("orders", partitions=2)
    pq.parts[1].publish(b"b")
    lease = pq.parts[1].keys.group("g").lease

    def about_to_expire_and_removed_from_partition_0(c, d) -> None:
        client.redis.zadd(lease, {str(d.seq): 1})
        pq.parts[0].consumer("g", name=c.consumers[0].name).close()

    if kind == "threaded":
        c = pq.consumer("g")
        [d] = c.fetch(1)
        about_to_expire_and_removed_from_partition_0(c, d)
        # when it beats
        with pytest.raises(rqueue.NotMember):
            c.heartbeat([d], 5.0)
    else:

        async def beat() -> None:
            aclient = await rqueue.aio.connect(client.url, prefix=client.prefix)
            try:
                c = (await aclient.open_queue("orders", partitions=2)).consumer("g")
                [d] = await c.fetch(1)
                about_to_expire_and_removed_from_partition_0(c, d)
                # when it beats
                with pytest.raises(rqueue.NotMember):
                    await c.heartbeat([d], 5.0)
            finally:
                await aclient.close()

        asyncio.run(beat())
    # then the removal is raised, after partition 1's lease was extended
    assert client.redis.zscore(lease, "1") > 1


@pytest.fixture
def live(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


@pytest.mark.parametrize("kind", ["threaded", "async"])
@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_a_removal_from_one_partition_drops_only_that_partitions_waiting_deliveries(kind, backend, prefix, live):
    # given a worker of one thread busy with its first message, holding three
    # messages of each of two partitions (the others wait for the thread)
    pq = live.queue("orders", partitions=2)
    for p, part in enumerate(pq.parts):
        part.publish_many([f"{p}:{i}".encode() for i in range(3)])
    ran: list[tuple[int, int]] = []  # (partition, delivery count) of each run
    started, release = threading.Event(), threading.Event()

    def handler(d):
        ran.append((int(d.data.split(b":")[0]), d.delivery_count))
        started.set()
        release.wait(10)

    w = run_worker(kind, backend, prefix, pq, handler, concurrency=1, prefetch=6, heartbeat_interval=0.1)
    try:
        assert started.wait(10)
        wait_for(lambda: sum(part.stats().group("g").pending for part in pq.parts) == 6)
        first = ran[0][0]
        # when partition 0's group removes it (a twin of its name leaves), and
        # another member takes partition 0's three messages and acks them
        member = w.consumer.consumers[0].name
        pq.parts[0].consumer("g", name=member).close()
        with pq.parts[0].consumer("g", name="other") as other:
            other.ack(other.fetch(3))
        wait_for(lambda: member in [c.name for c in pq.parts[0].stats().group("g").consumers])
        release.set()
        # then partition 1's waiting messages still run from the worker, once
        # each and without waiting out a lease; only partition 0's waiting ones are dropped
        wait_for(lambda: pq.parts[1].stats().group("g").acked == 3, timeout=10)
        wait_for(lambda: w.stats.stale_skipped == 3 - (first == 0))
    finally:
        release.set()
        w.stop()
        assert w.join(10)
    assert sorted(r for r in ran if r[0] == 1) == [(1, 1)] * 3
    assert [r for r in ran if r[0] == 0] == ([(0, 1)] if first == 0 else [])
    assert pq.parts[1].stats().group("g").redelivered == 0


def test_a_partitioned_heartbeat_names_the_partitions_that_removed_the_member(client):
    # given a consumer of three partitions removed from partitions 0 and 2's groups
    pq = client.queue("orders", partitions=3)
    c = pq.consumer("g")
    c.fetch(1)
    for p in (0, 2):
        pq.parts[p].consumer("g", name=c.consumers[p].name).close()
    # when it beats, then the removal names both partitions
    with pytest.raises(rqueue.NotMember) as removal:
        c.heartbeat([], 5.0)
    assert removal.value.partitions == (0, 2)
    # and a rejoin after it joins those two again, leaving partition 1's member as it was
    joins = c.join_marks()
    c.rejoin(removal.value)
    assert [a - b for a, b in zip(c.join_marks(), joins)] == [1, 0, 1]
    c.heartbeat([], 5.0)
