"""Placement of partitions by slot ownership: every partitioned queue of a
cluster spreads its partitions over the primaries it had when the queue was
created; `rqueue rebalance` and stats report where each partition lives."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import rqueue
from rqueue.cli import cli
from rqueue.engine.keys import partitions_key
from rqueue.placement import Layout


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_every_queue_puts_its_partitions_on_every_primary(client, servers):
    # given a cluster of 3 primaries
    cluster = servers["cluster"]
    # when 20 queues of 3 partitions and one of 7 are created
    for i in range(20):
        pq = client.queue(f"q{i}", partitions=3)
        # then each queue's 3 partitions are on 3 different primaries (by the cluster's own answer)
        assert len({cluster.primary_of(part.keys.msgs).port for part in pq.parts}) == 3, pq.salts
        assert pq.placement().balanced
    seven = client.queue("seven", partitions=7)
    served = [cluster.primary_of(part.keys.msgs).port for part in seven.parts]
    assert sorted(served.count(port) for port in set(served)) == [2, 2, 3]
    # and another process finds the same keys
    other = rqueue.connect(client.url, prefix=client.prefix)
    try:
        assert [p.keys.base for p in other.queue("seven").parts] == [p.keys.base for p in seven.parts]
    finally:
        other.close()


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_placed_partitions_work_end_to_end(client):
    # given a placed queue whose partitions have salted hash tags
    pq = client.queue("work", partitions=3)
    # when messages go through it by key and are consumed
    keys = [f"k{i}" for i in range(30)]
    pq.publish_many([k.encode() for k in keys], keys=keys)
    c = pq.consumer("g")
    seen = []
    while ds := c.fetch(10):
        seen += [d.data for d in ds]
        c.ack(ds)
    # then every message came back once, and the dead-letter queue shares each partition's slot
    assert sorted(seen) == sorted(k.encode() for k in keys)
    for part, dead in zip(pq.parts, pq.dead_letter_queue.parts, strict=True):
        assert part.keys.base.split("}")[0] == dead.keys.base.split("}")[0]


def test_stats_and_rebalance_report_where_each_partition_lives(client, backend, prefix):
    # given a partitioned queue with a message
    pq = client.queue("jobs", partitions=4)
    pq.publish(b"m", key="a")
    # then stats list each partition's hash tag, slot and node
    s = pq.stats()
    assert [p.partition for p in s.placement] == [0, 1, 2, 3]
    assert all(p.hash_tag.startswith("{jobs/") for p in s.placement)
    # and `rqueue rebalance` reports the same, moving nothing
    run = lambda *a: CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, *a])  # noqa: E731
    shown = run("rebalance", "jobs", "--json")
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    assert report["partitions"] == 4 and report["balanced"] is True
    assert [p["slot"] for p in report["placement"]] == [p.slot for p in s.placement]
    if client.cluster:
        assert sorted(report["per_node"].values()) == [1, 1, 2]
    else:
        assert [p["node"] for p in report["placement"]] == [""] * 4 and report["per_node"] == {}
    text = run("rebalance", "jobs")
    assert text.exit_code == 0 and "balanced" in text.output and "partition" in text.output
    stats_text = run("stats", "jobs")
    assert "partitions on: 0 " in stats_text.output
    # and a queue that is not partitioned is refused by name
    plain = run("rebalance", "plain")
    assert plain.exit_code == 2 and "is not partitioned" in plain.output


@pytest.mark.parametrize(
    "value, match",
    [
        (b"3:1,2", "does not list one placement salt per partition"),
        (b"3:a,b,c", "placement salt"),
        (b"x:1", "number of partitions"),
    ],
)
def test_a_corrupt_layout_is_reported(client, value, match):
    # given a stored layout that does not parse
    client.redis.hset(partitions_key(client.prefix), "jobs", value)
    # then asking for the queue names the stored value
    with pytest.raises(rqueue.CorruptRecord, match=match):
        client.queue("jobs")


def test_a_layout_round_trips_and_a_plain_one_stays_a_number():
    assert Layout.parse("4", "k") == Layout.plain(4) and Layout.plain(4).text() == "4"
    salted = Layout(3, (0, 7, 2))
    assert Layout.parse(salted.text(), "k") == salted and salted.text() == "3:0,7,2"
