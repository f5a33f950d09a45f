"""The partitioning window: a process that took a name for a plain queue
just before it was partitioned cannot store messages or groups there. The
marker in the plain queue's meta (partition.lua) is checked by publish and
join; a plain handle's publish goes to the partitions. Raw contracts of
partition.lua and of RQ_PARTITIONED in publish.lua and join.lua too."""

from __future__ import annotations

import pytest
import redis
from support.refusals import nothing_changes

import rqueue
from rqueue.engine.keys import partitions_key


@pytest.fixture
def stale(backend, prefix):
    """A second process whose cache keeps what it read for a minute."""
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=60)
    yield c
    c.close()


def test_a_plain_handle_read_before_partitioning_publishes_to_the_partitions(client, stale):
    # given a process that read "orders" as a plain queue
    plain = stale.queue("orders")
    assert isinstance(plain, rqueue.Queue)
    # when another process partitions it, and the first publishes through its plain handle
    pq = client.queue("orders", partitions=3)
    results = plain.publish_many([b"a", b"b", b"c"], ids=["1", "2", "3"])
    one = plain.publish(b"d")
    # then nothing is stored in the plain queue and every message is in a partition
    assert all(r.partition is not None for r in [*results, one])
    assert client.redis.hget(plain.keys.meta, "seq") is None and not client.redis.exists(plain.keys.msgs)
    assert pq.stats().last_seq == 4
    c = pq.consumer("g")
    assert sorted(d.data for d in c.fetch(10)) == [b"a", b"b", b"c", b"d"]
    # and the stale process now finds the queue partitioned
    assert isinstance(stale.queue("orders"), rqueue.PartitionedQueue)


def test_keyed_messages_of_a_stale_plain_handle_stay_together_in_one_partition(client, stale):
    # given a process that read "orders" as a plain queue, and the queue partitioned since
    plain = stale.queue("orders")
    client.queue("orders", partitions=3)
    # when it publishes messages with ordering keys through its plain handle
    results = plain.publish_many([b"a1", b"b1", b"a2", b"b2"], key=["a", "b", "a", "b"])
    # then each key's messages went to one partition, the one its key routes to
    by_key = {"a": {results[0].partition, results[2].partition}, "b": {results[1].partition, results[3].partition}}
    assert all(len(parts) == 1 and None not in parts for parts in by_key.values())
    routed = stale.queue("orders").publish(b"a3", key="a")
    assert by_key["a"] == {routed.partition}


def test_a_plain_consumer_read_before_partitioning_is_refused_and_changes_nothing(client, stale):
    plain = stale.queue("orders")
    pq = client.queue("orders", partitions=2)
    # when the stale process joins a group through its plain handle, then it is refused by name
    with nothing_changes(client, *pq.parts), pytest.raises(rqueue.QueuePartitioned, match="'orders' is partitioned"):
        plain.consumer("g")
    # and the next handle it asks for is the partitioned queue
    assert isinstance(stale.queue("orders"), rqueue.PartitionedQueue)


def test_a_creator_that_stopped_before_the_shared_copy_is_healed_by_the_first_publish(client, stale):
    # given the marker written but the prefix's copy missing (the creator stopped in between)
    pq = client.queue("orders", partitions=2)
    plain = rqueue.Queue(stale, "orders")
    client.redis.hdel(partitions_key(client.prefix), "orders")
    fresh = rqueue.connect(client.url, prefix=client.prefix)
    try:
        assert isinstance(fresh.queue("orders"), rqueue.Queue)  # the copy says plain
        # when a plain handle publishes, then the message goes to a partition and the copy is back
        assert fresh.queue("orders").publish(b"m").partition is not None
        assert client.redis.hget(partitions_key(client.prefix), "orders") is not None
        assert pq.stats().last_seq == 1 and isinstance(plain, rqueue.Queue)
    finally:
        fresh.close()


def test_deleting_a_partitioned_queue_removes_the_marker(client):
    pq = client.queue("orders", partitions=2)
    pq.publish(b"m")
    pq.delete()
    # then the name is a plain queue again that takes messages and groups
    q = client.queue("orders")
    assert isinstance(q, rqueue.Queue)
    q.publish(b"again")
    assert q.consumer("g").fetch(1)[0].data == b"again"


# -- raw contracts ---------------------------------------------------------------


def mark(client, keys, layout, expected=""):
    return client.scripts.partition(keys=[keys.meta, keys.msgs, keys.floors], args=[layout, expected])


def test_partition_script_creates_once_refuses_a_used_queue_and_grows_by_compare(client):
    keys = client.queue("raw").keys
    # create: stored once; a second create keeps the first
    assert mark(client, keys, "3") == [b"stored", b"3"]
    assert mark(client, keys, "4") == [b"kept", b"3"]
    # grow: only from the layout the caller read
    assert mark(client, keys, "5:0,0,0,1,2", "4") == [b"kept", b"3"]
    assert mark(client, keys, "5:0,0,0,1,2", "3") == [b"stored", b"5:0,0,0,1,2"]
    # a plain queue with a message, or with a group, is not partitioned
    used = client.queue("used")
    used.publish(b"m")
    assert mark(client, used.keys, "2") == [b"in-use", b""]
    grouped = client.queue("grouped")
    grouped.consumer("g")
    assert mark(client, grouped.keys, "2") == [b"in-use", b""]
    assert client.redis.hget(used.keys.meta, "partitioned") is None


def test_publish_and_join_of_a_marked_queue_answer_rq_partitioned(client):
    q = client.queue("raw")
    mark(client, q.keys, "3:0,1,2")
    keys = q.keys.publish_keys()
    with pytest.raises(redis.ResponseError, match=r"^RQ_PARTITIONED 3:0,1,2$"):
        client.scripts.publish(keys=keys, args=["", 60_000, "0", "", "itest", 0, 0, b"x"])
    with pytest.raises(redis.ResponseError, match=r"^RQ_PARTITIONED 3:0,1,2$"):
        client.scripts.join(keys=q.keys.group("g").as_list(), args=["g", "c", "", 1000, 10, 10, "", 1000, "itest"])
    assert client.redis.hgetall(q.keys.meta) == {b"partitioned": b"3:0,1,2"}
    assert not client.redis.exists(q.keys.msgs, q.keys.floors)
