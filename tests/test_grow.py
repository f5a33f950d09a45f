"""Growing a partitioned queue's partitions, live: nothing is lost or
stored twice, consumers and workers take up the new partitions, ids keep
de-duplicating across the change, and order per key holds for every key
whose partition stays the same."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner
from support.servers import wait_for

import rqueue
from rqueue.cli import cli
from rqueue.engine import commands
from rqueue.partitions import partition_of
from rqueue.placement import Layout


def drain(c, n=50):
    out = []
    while ds := c.fetch(n):
        out += ds
        c.ack(ds)
    return out


def test_growing_keeps_every_message_and_a_consumer_takes_up_the_new_partitions(client):
    # given a queue of 3 partitions with 30 keyed messages, and a consumer
    pq = client.queue("orders", partitions=3)
    keys = [f"k{i % 10}" for i in range(30)]
    pq.publish_many([f"{k}:{i}".encode() for i, k in enumerate(keys)], keys=keys)
    c = pq.consumer("g")
    # when it grows to 6 and 30 more are published
    grown = client.grow_partitions("orders", 6)
    assert grown.partitions == 6 and grown.layout.previous == 3
    pq.publish_many([f"{k}:{i}".encode() for i, k in enumerate(keys, 30)], keys=keys)
    # then the new messages use the new partitions, the old stay where they were
    assert all(pq.parts[p].stats().last_seq for p in {partition_of(k, 6) for k in keys} - {0, 1, 2})
    assert pq.partitions == 6 and sum(p.last_seq for p in pq.stats().partitions) == 60
    # and the consumer made before the growth gets all 60, once each
    got = drain(c)
    assert sorted(d.data for d in got) == sorted(f"{k}:{i}".encode() for i, k in enumerate(keys + keys))
    # and a key whose partition stayed the same is seen in publish order
    for key in {k for k in keys if partition_of(k, 3) == partition_of(k, 6)}:
        seen = [int(d.data.split(b":")[1]) for d in got if d.data.startswith(key.encode() + b":")]
        assert seen == sorted(seen), key
    assert pq.stats().group("g").pending == 0


def test_ids_keep_deduplicating_across_a_growth(client):
    # given 40 messages with ids in 3 partitions
    pq = client.queue("orders", partitions=3)
    ids = [f"order-{i}" for i in range(40)]
    first = pq.publish_many([b"m"] * 40, ids=ids)
    # when the queue grows to 7 and the same ids are published again (one by one and in a batch)
    pq.grow(7)
    again = [pq.publish(b"m", id=ids[0])] + pq.publish_many([b"m"] * 39, ids=ids[1:])
    # then every one is a duplicate of its first copy, and nothing more is stored
    assert all(r.duplicate for r in again)
    assert [(r.partition, r.seq) for r in again] == [(r.partition, r.seq) for r in first]
    assert pq.stats().last_seq == 40
    # and a new id goes to its partition under 7
    assert pq.publish(b"n", id="order-new").partition == partition_of("order-new", 7)


def test_a_process_that_still_routes_by_the_old_count_loses_nothing(client, backend, prefix):
    stale = rqueue.connect(backend, prefix=prefix, settings_ttl=60)
    try:
        old = stale.queue("orders", partitions=2)
        c = client.queue("orders").consumer("g")
        client.grow_partitions("orders", 5)
        # when the stale process publishes by its 2 partitions
        old.publish_many([f"s{i}".encode() for i in range(10)], keys=[f"k{i}" for i in range(10)])
        client.queue("orders").publish_many([f"f{i}".encode() for i in range(10)], keys=[f"k{i}" for i in range(10)])
        # then a consumer of the grown queue gets both
        assert len(drain(c)) == 20
    finally:
        stale.close()


def test_what_a_growth_refuses_changes_nothing(client, clock):
    pq = client.queue("orders", partitions=3)
    with pytest.raises(rqueue.InvalidSetting, match="has 3 partitions; they only grow"):
        client.grow_partitions("orders", 2)
    with pytest.raises(rqueue.InvalidSetting, match="'plain' is not partitioned"):
        client.grow_partitions("plain", 4)
    with pytest.raises(rqueue.InvalidSetting, match="is a dead-letter queue"):
        client.grow_partitions("DLQ.orders", 4)
    with pytest.raises(rqueue.InvalidInput, match="partitions must be a whole number"):
        client.grow_partitions("orders", 0)
    assert client.grow_partitions("orders", 3).partitions == 3  # the same count: nothing to do
    pq.grow(4)
    # a second growth within one de-duplication window is refused, then allowed after it
    with pytest.raises(rqueue.InvalidSetting, match="may grow again once its de-duplication window"):
        client.grow_partitions("orders", 5)
    assert client.queue("orders").partitions == 4
    clock.advance(pq.settings().dedup_window + 1)
    assert client.grow_partitions("orders", 5).partitions == 5
    # and the dead-letter queue grows with it
    assert client.queue("DLQ.orders").partitions == 5


@pytest.mark.parametrize("backend", ["redis", "cluster"], indirect=True)
def test_a_growth_under_a_running_worker_and_producer_loses_and_repeats_nothing(backend, prefix):
    # given a worker and a producer (ids, keys) on a queue of 2 partitions, on the real clock
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0.2)
    producer = rqueue.connect(backend, prefix=prefix, settings_ttl=0.2)
    try:
        pq = client.queue("orders", partitions=2)
        handled: list[bytes] = []
        lock = threading.Lock()

        def handle(d):
            with lock:
                handled.append(d.data)

        w = rqueue.Worker(pq, "g", handle, concurrency=2, heartbeat_timeout=5)
        w.start()
        sent: list[bytes] = []
        stop = threading.Event()

        def produce():
            q = producer.queue("orders")
            i = 0
            while not stop.is_set() or i < 200:
                body = f"m{i}".encode()
                q.publish(body, id=body.decode(), key=f"k{i % 13}")
                sent.append(body)
                i += 1

        t = threading.Thread(target=produce)
        t.start()
        wait_for(lambda: len(sent) >= 100, timeout=30)
        # when the queue grows to 5 while both run
        grown = client.grow_partitions("orders", 5)
        wait_for(lambda: all(part.stats().last_seq > 0 for part in grown.parts), timeout=30)
        wait_for(lambda: len(sent) >= 300, timeout=30)
        stop.set()
        t.join(30)
        # then every message is handled exactly once, the new partitions included
        wait_for(lambda: len(handled) >= len(sent), timeout=30)
        w.stop()
        assert w.join(30)
        assert sorted(handled) == sorted(sent)
    finally:
        client.close()
        producer.close()


def test_cli_grows_and_reports(client, backend, prefix):
    client.queue("jobs", partitions=2)
    run = lambda *a: CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, *a])  # noqa: E731
    grown = run("partitions", "jobs", "--grow", "4", "--json")
    assert grown.exit_code == 0, grown.output
    out = json.loads(grown.output)
    assert (out["partitions"], out["before"], out["previous"]) == (4, 2, 2)
    shown = run("partitions", "jobs")
    assert shown.exit_code == 0 and "4 partitions" in shown.output and "from 2" in shown.output
    bad = run("partitions", "jobs", "--grow", "3")
    assert bad.exit_code == 2 and "they only grow" in bad.output


def test_a_growth_that_meets_another_one_grows_from_what_that_one_stored(client):
    # given a queue of 3 partitions whose marker another process has just grown to 4 (its copy not yet written)
    pq = client.queue("orders", partitions=3)
    four = Layout(4, (*pq.salts, 0)).text()
    plain = rqueue.Queue(client, "orders").keys
    status, _ = commands.mark_partitioned(client.scripts, plain, four, pq.layout.text(), "orders")
    assert status is commands.MarkStatus.STORED
    # when this process grows it to 6 from the 3 it read
    grown = client.grow_partitions("orders", 6)
    # then it grew from the 4 the marker held, and the copy every process reads says 6
    assert (grown.partitions, grown.layout.previous) == (6, 4)
    other = rqueue.connect(client.url, prefix=client.prefix)
    try:
        assert other.queue("orders").partitions == 6
    finally:
        other.close()
    assert pq.stats().last_seq == 0 and len(pq.stats().partitions) == 6
