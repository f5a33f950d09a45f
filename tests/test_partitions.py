"""Partitioned queues: routing by key, id or round-robin; fair fetching
across partitions; stats that add up; one stored partition count; workers;
dead letters per partition. Runs on every backend, the cluster included."""

from __future__ import annotations

import threading

import pytest
import redis
from click.testing import CliRunner
from support.aio_bridge import parametrize_api
from support.servers import SINGLE_SERVERS, start_server, wait_for

import rqueue
from rqueue.cli import cli
from rqueue.constants import MAX_BATCH
from rqueue.engine.keys import partitions_key
from rqueue.partitions import partition_of

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)


@pytest.fixture
def pq(client):
    return client.queue("orders", partitions=3)


def test_same_key_same_partition_order_kept_per_key(client, pq):
    # given messages of three keys, interleaved
    keys = [f"customer-{i % 3}" for i in range(30)]
    results = pq.publish_many([f"{k}:{i}".encode() for i, k in enumerate(keys)], keys=keys)
    # then every message of a key went to that key's partition
    for k, r in zip(keys, results, strict=True):
        assert r.partition == partition_of(k, 3)
    # and a consumer sees each key's messages in publish order
    c = pq.consumer("g")
    seen: dict[str, list[int]] = {}
    while ds := c.fetch(7):
        for d in ds:
            k, i = d.data.decode().split(":")
            seen.setdefault(k, []).append(int(i))
        c.ack(ds)
    assert {k: sorted(v) for k, v in seen.items()} == seen
    assert sum(len(v) for v in seen.values()) == 30


def test_without_key_messages_go_round_robin(pq):
    # when 30 messages without key or id are published one by one
    parts = [pq.publish(b"m").partition for _ in range(30)]
    # then every partition took 10
    assert sorted(parts.count(p) for p in range(3)) == [10, 10, 10]


def test_an_id_routes_so_that_a_duplicate_is_caught(pq):
    # given a message published with an id and no key
    first = pq.publish(b"a", id="order-42")
    # when it is published again (alone, then in a batch)
    again = pq.publish(b"a", id="order-42")
    batch = pq.publish_many([b"x", b"a"], ids=["other", "order-42"])
    # then the copies were recognised in the same partition
    assert not first.duplicate and again.duplicate and batch[1].duplicate
    assert again.partition == first.partition == batch[1].partition and again.seq == first.seq
    assert pq.stats().last_seq == 2


def test_fetch_is_fair_across_partitions(pq):
    # given five messages in each partition
    for p in range(3):
        pq.parts[p].publish_many([f"p{p}-{i}".encode() for i in range(5)])
    c = pq.consumer("g")
    # when fetching one at a time
    got = [c.fetch(1)[0] for _ in range(6)]
    # then each call starts at the next partition
    assert [d.consumer.queue.partition for d in got] == [0, 1, 2, 0, 1, 2]
    # and a larger fetch fills from several partitions
    more = c.fetch(5)
    assert len(more) == 5 and len({d.consumer.queue.partition for d in more}) >= 2


def test_stats_add_up_over_partitions(pq):
    # given 9 messages over the partitions, 4 acked, 2 held
    pq.publish_many([b"m"] * 9)
    c = pq.consumer("g")
    ds = c.fetch(6)
    c.ack(ds[:4])
    s = pq.stats()
    # then the totals are the sums of the partitions' figures
    g = s.group("g")
    assert (s.last_seq, s.depth, g.acked, g.in_flight, g.pending) == (9, 5, 4, 2, 5)
    assert len(s.partitions) == 3 and sum(p.last_seq for p in s.partitions) == 9
    assert sum(p.group("g").in_flight for p in s.partitions) == 2
    assert [m.name for m in g.consumers] == [c.name] and g.consumers[0].held == 2


def test_partition_count_is_stored_once_for_every_process(client, backend, prefix, pq):
    # given a queue created with 3 partitions, then another client
    other = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    try:
        # then the other client finds it partitioned
        assert isinstance(other.queue("orders"), rqueue.PartitionedQueue)
        assert other.queue("orders").partitions == 3
        # and its dead-letter queue is partitioned like it
        assert other.queue("DLQ.orders").partitions == 3
        # and asking for another count is refused, changing nothing
        with pytest.raises(rqueue.InvalidSetting, match="has 3 partitions; the number cannot change"):
            other.queue("orders", partitions=4)
        assert client.queue("orders").partitions == 3
    finally:
        other.close()


def test_a_queue_with_messages_cannot_be_partitioned_later(client):
    # given a plain queue that holds a message
    client.queue("plain").publish(b"m")
    # when it is asked for with partitions, then that is refused and it stays plain
    with pytest.raises(rqueue.InvalidSetting, match="'plain' already exists without partitions"):
        client.queue("plain", partitions=2)
    assert isinstance(client.queue("plain"), rqueue.Queue)
    assert client.queue("plain").stats().last_seq == 1


@pytest.mark.parametrize("bad", [0, -1, 1025, 2.0, True, "3"])
def test_bad_partition_counts_are_refused(client, bad):
    # when a queue is asked for with a bad count, then that is refused and nothing is created
    with pytest.raises(rqueue.InvalidInput, match="partitions must be a whole number from 1 to 1024"):
        client.queue("orders", partitions=bad)
    assert isinstance(client.queue("orders"), rqueue.Queue)


def test_one_bad_message_stores_nothing_in_any_partition(pq):
    # given a batch whose message 4 is bad
    payloads = [b"a", b"b", b"c", b"d", "not bytes", b"f"]
    with pytest.raises(rqueue.InvalidInput, match="message 4 of the batch"):
        pq.publish_many(payloads, keys=["x", "y", "z", "x", "y", "z"])
    # then no partition stored anything
    assert pq.stats().last_seq == 0


@pytest.mark.parametrize(
    "keys, match",
    [
        (["a"], "keys has 1 entries for 2 payloads"),
        (["a", 7], "partition key must be a non-empty str or None, not 7"),
        (["a", ""], "partition key must be a non-empty str or None, not ''"),
    ],
)
def test_bad_keys_are_refused(pq, keys, match):
    # when a batch comes with bad keys, then they are named and nothing is stored
    with pytest.raises(rqueue.InvalidInput, match=match):
        pq.publish_many([b"a", b"b"], keys=keys)
    assert pq.stats().last_seq == 0


def test_settling_by_partition_tag(pq):
    # given one message in partition 2
    pq.parts[2].publish(b"m")
    c = pq.consumer("g")
    d = c.fetch(1)[0]
    # when it is acked by its partition tag, then it is settled
    c.ack(f"2/{d.tag}")
    assert pq.stats().group("g").acked == 1
    # and a tag without a partition, or of no partition, is refused by name
    with pytest.raises(rqueue.InvalidInput, match=r"'1\.1\.ab' is not a delivery tag of a partitioned queue"):
        c.ack("1.1.ab")
    with pytest.raises(rqueue.InvalidInput, match=r"with a partition from 0 to 2"):
        c.ack("3/1.1.ab")
    # and a second ack of the same delivery says so
    with pytest.raises(rqueue.AlreadyAcked):
        c.ack(f"2/{d.tag}")


def test_nack_and_dead_letters_stay_in_their_partition(client, pq):
    # given one attempt per message and a message in each of two partitions
    client.configure("orders", max_deliveries=1)
    pq.publish_many([b"a", b"b"], keys=["k0", "k1"])
    c = pq.consumer("g")
    ds = c.fetch(2)
    # when both fail for good
    for d in ds:
        c.nack(d, error="boom")
    # then each is a dead letter of its own partition, and replay returns it there
    dead = pq.dead_letters()
    assert sorted((d.partition, d.data) for d in dead) == sorted((d.consumer.queue.partition, d.data) for d in ds)
    assert {d.error for d in dead} == {"boom"} and pq.stats().dead_letters == 2
    assert client.queue("DLQ.orders").stats().last_seq == 2
    result = pq.replay_dead_letters()
    assert (result.selected, result.replayed) == (2, 2)
    again = c.fetch(2)
    assert sorted(d.data for d in again) == [b"a", b"b"]
    assert all(d.delivery_count == 1 for d in again)


def test_fetch_with_timeout_wakes_on_a_publish_to_any_partition(pq):
    # given a consumer waiting in fetch
    c = pq.consumer("g")
    got: list[rqueue.Delivery] = []
    t = threading.Thread(target=lambda: got.extend(c.fetch(1, timeout=5)))
    t.start()
    # when a message is published to one partition, then the fetch returns it
    pq.parts[1].publish(b"late")
    t.join(10)
    assert [d.data for d in got] == [b"late"]


@pytest.mark.sync_only("the threaded Worker takes a sync queue")
def test_worker_on_a_partitioned_queue_handles_every_message_once(client, pq):
    # given 60 messages over three partitions
    pq.publish_many([f"m{i}".encode() for i in range(60)], keys=[f"k{i % 7}" for i in range(60)])
    handled: list[bytes] = []
    lock = threading.Lock()

    def handler(d):
        with lock:
            handled.append(d.data)

    # when a worker runs on it
    w = rqueue.Worker(pq, "g", handler, concurrency=4, heartbeat_timeout=5)
    assert isinstance(w, rqueue.PartitionedWorker) and w.partitions == 3 and w.concurrency == 4
    w.start()
    wait_for(lambda: len(handled) >= 60)
    w.stop()
    assert w.join(30)
    # then every message was handled exactly once and acked
    assert sorted(handled) == sorted(f"m{i}".encode() for i in range(60))
    assert w.stats.acked == 60 and pq.stats().group("g").pending == 0


def test_delete_removes_every_partition(client, pq):
    # given a partitioned queue in use, with deliveries in flight
    pq.publish_many([b"m"] * 6)
    pq.consumer("g").fetch(2)
    # when it is deleted, then that is refused while they are in flight
    with pytest.raises(rqueue.QueueInUse, match="2 deliveries in flight"):
        pq.delete()
    # and with force no key of it is left and the name is free again
    assert pq.delete(force=True) > 0
    assert isinstance(client.queue("orders"), rqueue.Queue)
    assert all(part.stats().last_seq == 0 for part in pq.parts)


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_partitions_spread_over_the_shards_of_a_cluster(client, servers):
    # given a queue of 12 partitions on a cluster of 3 primaries
    pq = client.queue("spread", partitions=12)
    pq.publish_many([b"m"] * 12)
    # then its partitions are served by more than one primary
    cluster = servers["cluster"]
    primaries = {cluster.primary_of(part.keys.msgs).port for part in pq.parts}
    assert len(primaries) >= 2


def test_cli_creates_publishes_by_key_and_shows_summed_stats(client, backend, prefix):
    def run(*args):
        return CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, *args], catch_exceptions=False)

    # when a partitioned queue is created and fed from the command line
    created = run("create", "jobs", "--partitions", "4", "--json")
    assert created.exit_code == 0 and '"partitions": 4' in created.output
    assert run("publish", "jobs", "hello", "--key", "user-1").exit_code == 0
    assert run("publish", "jobs", "world", "--key", "user-1").exit_code == 0
    # then both messages are in the partition of their key, and stats add up
    q = client.queue("jobs")
    assert q.parts[partition_of("user-1", 4)].stats().last_seq == 2
    shown = run("stats", "jobs", "--json")
    assert shown.exit_code == 0 and '"last_seq": 2' in shown.output
    # and another count is refused with exit code 2; on a plain queue a key is an ordering key
    again = run("create", "jobs", "--partitions", "2")
    assert again.exit_code == 2 and "has 4 partitions" in again.output
    plain = run("publish", "plain", "m", "--key", "k")
    assert plain.exit_code == 0 and client.redis.zrange(client.queue("plain").keys.prio, 0, -1) == [b"1:k:k"]
    bad = run("publish", "plain", "m", "--key", "a b")
    assert bad.exit_code == 2 and "key='a b'" in bad.output


def test_events_of_every_partition_in_time_order(client, pq):
    # given a message dead-lettered in each of two partitions
    pq.parts[0].publish(b"a")
    pq.parts[2].publish(b"b")
    c = pq.consumer("g")
    for d in c.fetch(2):
        c.reject(d, reason="bad")
    # then the queue's events list both, each naming its partition
    events = pq.events(10)
    assert sorted(e["partition"] for e in events if e["event"] == "dead-lettered") == ["0", "2"]
    assert pq.events_after("0", 10) == events
    # and the queue list names its dead-letter queue
    assert client.queues() == ["DLQ.orders", "orders"]
    # and the dead-letter queue is partitioned like the queue
    dlq = pq.dead_letter_queue
    assert isinstance(dlq, rqueue.PartitionedQueue) and dlq.stats().last_seq == 2
    with pytest.raises(rqueue.InvalidInput, match="seqs are per partition"):
        dlq.peek(1, after=1)


# -- partial failures and what a partitioned queue refuses ----------------------


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster refuses named targets anyway
def test_a_named_dead_letter_target_is_refused_for_a_partitioned_queue(client, pq):
    # given a named dead-letter queue configured for a partitioned queue
    client.configure("orders", dead_letter="parking")
    pq.publish(b"m")
    # then a consumer is refused, naming the setting, and nothing was claimed
    with pytest.raises(rqueue.InvalidSetting, match="dead_letter='parking'.*partition's own dead-letter queue"):
        pq.consumer("g")
    assert pq.stats().last_seq == 1


def test_a_failing_partition_does_not_stop_the_others_and_the_error_says_what_was_stored(client, pq):
    # given a batch over every partition, and partition 1 broken (its seq counter is not a number)
    client.redis.hset(pq.parts[1].keys.meta, "seq", "x")
    keys = [f"k{i}" for i in range(12)]
    parts = [partition_of(k, 3) for k in keys]
    # when it is published
    with pytest.raises(rqueue.PartialPublish) as caught:
        pq.publish_many([b"m"] * 12, keys=keys)
    # then every other partition stored its messages, and the error lists them in the caller's order
    err = caught.value
    assert list(err.errors) == [1]
    assert [r is None for r in err.results] == [p == 1 for p in parts]
    assert [r.partition for r in err.results if r is not None] == [p for p in parts if p != 1]
    assert "partition 1" in str(err)
    assert [pq.parts[p].stats().last_seq for p in (0, 2)] == [parts.count(0), parts.count(2)]


def test_acks_over_partitions_settle_every_partition_and_name_the_bad_one(pq):
    # given one delivery in each partition, the middle one already acked
    for p in range(3):
        pq.parts[p].publish(b"m")
    c = pq.consumer("g")
    ds = sorted(c.fetch(3), key=lambda d: d.consumer.queue.partition)
    ds[1].ack()
    # when all three are acked in one call
    with pytest.raises(rqueue.AlreadyAcked, match=f"delivery tag 1/{ds[1].tag} "):
        c.ack(ds)
    # then the other partitions were settled all the same
    assert [pq.parts[p].stats().group("g").in_flight for p in range(3)] == [0, 0, 0]


def test_close_leaves_every_partition_even_when_one_fails(client, pq):
    c = pq.consumer("g")
    for p in (0, 2):
        pq.parts[p].publish(b"m")
    c.fetch(2)
    # partition 1's member is unusable: its close raises
    c.consumers[1].close = lambda: (_ for _ in ()).throw(rqueue.RQueueError("gone"))
    with pytest.raises(rqueue.RQueueError, match="gone"):
        c.close()
    # then partitions 0 and 2 got their deliveries back at once
    assert [pq.parts[p].stats().group("g").in_flight for p in (0, 2)] == [0, 0]


def test_fetch_keeps_what_it_claimed_when_a_later_partition_fails(pq):
    pq.parts[0].publish(b"a")
    c = pq.consumer("g")
    c.consumers[1].fetch = lambda n: (_ for _ in ()).throw(rqueue.RQueueError("partition 1 down"))
    # when a fetch starts at partition 0 and partition 1 fails, then the claimed delivery is returned
    got = c.fetch(5)
    assert [d.data for d in got] == [b"a"]


def test_a_queue_with_a_group_but_no_message_cannot_be_partitioned(client):
    # given a plain queue that has only a consumer so far
    client.queue("jobs").consumer("billing")
    # then partitioning it is refused
    with pytest.raises(rqueue.InvalidSetting, match="already exists without partitions"):
        client.queue("jobs", partitions=2)


def test_a_deleted_and_recreated_queue_is_seen_with_its_new_count(client, backend, prefix):
    other = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    try:
        assert client.queue("jobs", partitions=4).partitions == 4
        assert other.queue("jobs").partitions == 4
        client.queue("jobs").delete()
        client.queue("jobs", partitions=2)
        # then the other process routes over the new layout
        assert other.queue("jobs").partitions == 2
    finally:
        other.close()


@pytest.mark.parametrize("value", [b"abc", b"1", b"0", b"-3", b"99999"])
def test_a_corrupt_partition_count_is_reported(client, value):
    # given a stored partition count that is not a whole number from 1 to 1024
    client.redis.hset(partitions_key(client.prefix), "jobs", value)
    # when the queue is asked for, then the stored value is named corrupt
    with pytest.raises(rqueue.CorruptRecord, match=r":partitions\[jobs\]"):
        client.queue("jobs")


@pytest.mark.parametrize("tag", ["²/1.1", "x/1.1", "/1.1", "-1/1.1"])
def test_odd_partition_tags_are_refused_by_name(pq, tag):
    c = pq.consumer("g")
    # when a tag with an odd partition is acked, then it is named
    with pytest.raises(rqueue.InvalidInput, match="is not a delivery tag of a partitioned queue"):
        c.ack(tag)


def test_keys_as_one_string_are_refused(pq):
    # when the keys of a batch are one string, then that is refused and nothing stored
    with pytest.raises(rqueue.InvalidInput, match="keys must be a sequence"):
        pq.publish_many([b"a", b"b"], keys="ab")
    assert pq.stats().last_seq == 0


def test_dlq_show_needs_the_partition(client, backend, prefix, pq):
    # given a dead letter in partition 2
    pq.parts[2].publish(b"bad")
    c = pq.consumer("g")
    c.reject(c.fetch(1)[0], reason="no")
    run = lambda *a: CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, *a])  # noqa: E731
    # when the dead letters are listed, then each row starts with its partition
    listed = run("dlq", "list", "orders")
    assert listed.exit_code == 0 and listed.output.splitlines()[0].split()[0] == "partition"
    # and showing one needs its partition
    missing = run("dlq", "show", "orders", "1")
    assert missing.exit_code == 2 and "give --partition from 0 to 2" in missing.output
    shown = run("dlq", "show", "orders", "1", "--partition", "2", "--json")
    assert shown.exit_code == 0 and '"partition": 2' in shown.output and '"data": "bad"' in shown.output


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
@pytest.mark.sync_only("it patches the sync client's cluster pipeline")
def test_a_lost_reply_from_one_node_does_not_stop_the_others_nor_run_twice(client, servers, monkeypatch):
    # given a queue of 12 partitions over 3 primaries, and one primary whose replies get lost after it ran the calls
    pq = client.queue("spread", partitions=12)
    cluster = servers["cluster"]
    node_of = {p: cluster.primary_of(part.keys.msgs).port for p, part in enumerate(pq.parts)}
    lossy = node_of[0]
    pq.publish_many([b"warm-up"] * 12, keys=[f"k{i}" for i in range(12)])  # every node knows the script

    class LosingPipeline:
        def __init__(self, pipe):
            self.pipe = pipe

        def execute_command(self, *args):
            self.pipe.execute_command(*args)

        def execute(self, raise_on_error=True):
            self.pipe.execute(raise_on_error=False)
            raise redis.ConnectionError("Connection closed by server.")

    class LossyNode:
        """A node client whose pipelines lose their replies; anything else goes to the real one."""

        def __init__(self, conn):
            self.conn = conn

        def pipeline(self, transaction=False):
            return LosingPipeline(self.conn.pipeline(transaction=False))

        def __getattr__(self, name):
            return getattr(self.conn, name)

    real = client.redis.get_redis_connection

    def connection(node):
        conn = real(node)
        return LossyNode(conn) if node.port == lossy else conn

    monkeypatch.setattr(client.redis, "get_redis_connection", connection)
    keys = [f"k{i}" for i in range(36)]
    # when a batch goes to every partition
    with pytest.raises(rqueue.PartialPublish) as caught:
        pq.publish_many([b"m"] * 36, keys=keys)
    # then the other nodes' partitions were stored and reported, the lossy node's are unknown (None) ...
    err = caught.value
    assert {p for p in err.errors} == {p for p in range(12) if node_of[p] == lossy}
    assert all((r is None) == (node_of[partition_of(k, 12)] == lossy) for k, r in zip(keys, err.results, strict=True))
    monkeypatch.undo()
    # ... and nothing was sent twice: every message is stored exactly once
    assert pq.stats().last_seq == 12 + 36


def test_a_partition_whose_later_call_fails_reports_what_its_earlier_calls_stored(prefix):
    # given a server that fills up after one publish call of MAX_BATCH messages (see test_publish.py)
    server = start_server("redis")
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        pq = client.queue("orders", partitions=2)
        pq.publish(b"warm-up", key="k")  # the script is loaded
        client.redis.config_set("maxmemory", client.redis.info("memory")["used_memory"] + 4_500_000)
        # when a batch of three calls goes to one partition
        with pytest.raises(rqueue.PartialPublish) as caught:
            pq.publish_many(
                [b"m" * 400] * (3 * MAX_BATCH),
                ids=[f"o-{i}" for i in range(3 * MAX_BATCH)],
                keys=["k"] * (3 * MAX_BATCH),
            )
        # then the messages of its first call are listed as stored in that partition, the rest as not
        err = caught.value
        p = partition_of("k", 2)
        assert [(r.seq, r.partition) for r in err.results[:MAX_BATCH]] == [(s, p) for s in range(2, MAX_BATCH + 2)]
        assert err.results[MAX_BATCH:] == [None] * (2 * MAX_BATCH)
        assert list(err.errors) == [p] and isinstance(err.errors[p], rqueue.OutOfMemory)
        assert pq.parts[p].stats().last_seq == MAX_BATCH + 1
        client.close()
    finally:
        server.stop()


def test_the_available_settles_of_a_partitioned_consumer_take_one_delivery_as_a_plain_consumer_does(client):
    # given a partitioned queue and one delivery of it
    pq = client.queue("orders", partitions=2)
    pq.publish_many([b"a", b"b"])
    c = pq.consumer("g", prefetch=2)
    d1, d2 = c.fetch(2)
    # when one delivery, not a list, is extended and then nacked leniently
    extended = c.in_progress_available(d1)
    nacked = c.nack_available(d2, delay=0)
    # then each is settled as a list of one would be (rqueue.Consumer takes either)
    assert extended == [None]
    assert nacked == ["requeued"]


def test_nack_available_of_a_partitioned_consumer_keeps_the_order_of_deliveries_across_partitions(client):
    # given deliveries of three partitions, one of them acked
    pq = client.queue("orders", partitions=3)
    for part in pq.parts:
        part.publish_many([b"a", b"b"])
    c = pq.consumer("g", prefetch=6)
    ds = c.fetch(6)
    assert len({d.consumer.queue.partition for d in ds}) == 3
    ds.sort(key=lambda d: (d.seq, -d.consumer.queue.partition))  # the partitions interleaved
    c.ack(ds[2])
    # when all are nacked in one call
    statuses = c.nack_available(ds, delay=0)
    # then each has its own status, in the order given, and the nacked ones come again
    assert [s if isinstance(s, str) else type(s).__name__ for s in statuses] == [
        "requeued",
        "requeued",
        "AlreadyAcked",
        "requeued",
        "requeued",
        "requeued",
    ]
    again = c.fetch(6)
    assert sorted((d.consumer.queue.partition, d.seq) for d in again) == sorted(
        (d.consumer.queue.partition, d.seq) for i, d in enumerate(ds) if i != 2
    )
