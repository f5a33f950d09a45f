"""`rqueue dlq list|show|replay|purge` and `rqueue events`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import rqueue
from rqueue.cli import cli


@pytest.fixture
def dead(backend, prefix):
    """orders: seq 1 rejected, seq 2 terminated, seq 3 acked, by group g."""
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish_many([b"one", b"two", b"three"])
    c = q.consumer("g")
    d1, d2, d3 = c.fetch(3)
    d1.reject(reason="bad")
    d2.term("worse")
    d3.ack()
    yield q
    client.close()


def run(backend, prefix, *args, input=None):
    return CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, *args], input=input)


def test_dlq_list_table_and_json(backend, prefix, dead):
    text = run(backend, prefix, "dlq", "list", "orders")
    assert text.exit_code == 0, text.output
    assert "rejected" in text.stdout and "terminated" in text.stdout
    data = json.loads(run(backend, prefix, "dlq", "list", "orders", "--reason", "terminated", "--json").stdout)
    [d] = data["dead_letters"]
    assert (d["dlq_seq"], d["seq"], d["group"], d["reason"], d["error"]) == (2, 2, "g", "terminated", "worse")


def test_dlq_show(backend, prefix, dead):
    data = json.loads(run(backend, prefix, "dlq", "show", "orders", "1", "--json").stdout)
    assert (data["seq"], data["data"], data["reason"]) == (1, "one", "rejected")
    missing = run(backend, prefix, "dlq", "show", "orders", "9")
    assert missing.exit_code == 2 and "no dead letter with dlq seq 9" in missing.output


def test_dlq_replay_dry_run_then_for_real_twice(backend, prefix, dead):
    dry = json.loads(run(backend, prefix, "dlq", "replay", "orders", "--dry-run", "--json").stdout)
    assert (dry["selected"], dry["replayed"], dry["dry_run"]) == (2, 0, True)
    assert dead.stats().dead_letters == 2
    first = json.loads(run(backend, prefix, "dlq", "replay", "orders", "--json").stdout)
    second = json.loads(run(backend, prefix, "dlq", "replay", "orders", "--json").stdout)
    assert (first["replayed"], first["by_group"], second["replayed"]) == (2, {"g": 2}, 0)
    assert sorted(d.seq for d in dead.consumer("g").fetch(10)) == [1, 2]


def test_dlq_purge_asks_first(backend, prefix, dead):
    refused = run(backend, prefix, "dlq", "purge", "orders", input="n\n")
    assert refused.exit_code == 1 and dead.stats().dead_letters == 2
    done = run(backend, prefix, "dlq", "purge", "orders", "--group", "g", "--yes", "--json")
    assert json.loads(done.stdout) == {"purged": 2}
    assert dead.stats().dead_letters == 0


def test_events(backend, prefix, dead):
    data = json.loads(run(backend, prefix, "events", "orders", "--json").stdout)
    assert [(e["event"], e["seq"]) for e in data["events"]] == [("dead-lettered", 1), ("dead-lettered", 2)]
    assert "dead-lettered" in run(backend, prefix, "events", "orders").stdout


def test_dlq_bad_filters_are_named(backend, prefix, dead):
    bad = run(backend, prefix, "dlq", "replay", "orders", "--from-seq", "5", "--to-seq", "2")
    assert bad.exit_code == 2 and "seq_from 5 is above seq_to 2" in bad.output
    bad_group = run(backend, prefix, "dlq", "list", "orders", "--group", "a b")
    assert bad_group.exit_code == 2 and "invalid group name" in bad_group.output


def test_events_follow_prints_new_events(backend, prefix, dead):
    import threading

    # given a follower started on a queue with two events
    dead.publish(b"late")
    c = dead.consumer("g")
    [late] = c.fetch()
    # when a third happens while it follows
    timer = threading.Timer(0.3, late.reject)
    timer.start()
    out = run(backend, prefix, "events", "orders", "--follow", "--seconds", "1.5", "--json")
    timer.join()
    # then it is printed after the history
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(e["event"], e["seq"]) for e in lines] == [
        ("dead-lettered", 1),
        ("dead-lettered", 2),
        ("dead-lettered", 4),
    ]
