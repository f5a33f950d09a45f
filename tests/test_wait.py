"""Waiting until groups have settled what was published before the wait:
Queue.wait_settled and ``rqueue wait`` (rqueue/waiting.py)."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner
from support.aio_bridge import parametrize_api

import rqueue
from rqueue import NotSettled
from rqueue.cli import cli

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)


def test_returns_once_the_group_has_settled(queue):
    # given three messages of group billing, two settled (acked, dead-lettered)
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("billing", name="w1")
    d1, d2, d3 = c.fetch(3)
    d1.ack()
    d2.reject(reason="bad")
    # when the last one is acked while a wait is under way
    acker = threading.Timer(0.1, d3.ack)
    acker.start()
    try:
        settled = queue.wait_settled("billing", timeout=10)
    finally:
        acker.join()
    # then the wait returns, naming the last seq it waited for
    assert settled == {"billing": 3}
    assert queue.stats().groups[0].ack_floor == 3


def test_waits_for_every_group_and_not_for_later_messages(queue):
    # given two groups, one of them done
    queue.publish(b"a")
    fast, slow = queue.consumer("fast", name="f"), queue.consumer("slow", name="s")
    fast.fetch(1)[0].ack()
    [held] = slow.fetch(1)

    # when a wait for every group starts, and more is published during it
    def settle_then_publish() -> None:
        queue.publish(b"later")
        held.ack()

    t = threading.Timer(0.1, settle_then_publish)
    t.start()
    try:
        settled = queue.wait_settled(timeout=10)
    finally:
        t.join()
    # then it returned without waiting for the later message
    assert settled == {"fast": 1, "slow": 1}


def test_times_out_naming_what_is_behind(queue):
    # given a group that settled one of two messages
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("billing", name="w1")
    c.fetch(1)[0].ack()
    # when a wait runs out of time
    with pytest.raises(NotSettled, match=r"group 'billing' settled up to seq 1 of 2") as raised:
        queue.wait_settled("billing", timeout=0.2)
    # then the error says how far the group got, and is a TimeoutError
    assert raised.value.behind == {"billing": (1, 2)}
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, rqueue.RQueueError)


def test_bad_waits_are_refused(queue):
    # given a queue without groups
    queue.publish(b"a")
    # then waiting for any group, or a group it lacks, says so
    with pytest.raises(rqueue.InvalidInput, match="has no group to wait for"):
        queue.wait_settled(timeout=1)
    queue.consumer("billing", name="w1")
    with pytest.raises(rqueue.InvalidInput, match="has no group 'other'"):
        queue.wait_settled("other", timeout=1)
    with pytest.raises(rqueue.InvalidInput, match="timeout"):
        queue.wait_settled("billing", timeout=-1)
    # and an empty queue is settled at once
    empty = queue.client.queue("empty")
    empty.consumer("g", name="w")
    assert empty.wait_settled("g", timeout=0) == {"g": 0}


def test_cli_wait_with_json(prefix):
    url = f"memory://{prefix}"
    client = rqueue.connect(url, prefix=prefix)
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(cli, ["--url", url, "--prefix", prefix, "wait", *args])

    # given a partitioned queue whose group has not settled its two messages
    pq = client.queue("events", partitions=2)
    pq.publish_many([b"a", b"b"], keys=["k1", "k2"])
    c = pq.consumer("g", name="w")
    # when waiting runs out of time
    late = run("events", "--group", "g", "--timeout", "0.1", "--json")
    # then exit code 1, and the JSON says how far each group got
    assert late.exit_code == 1, late.output
    out = json.loads(late.output)
    assert out["settled"] is False and "did not settle" in out["error"] and set(out["behind"]) == {"g"}
    text = run("events", "--timeout", "0.1")
    assert text.exit_code == 1 and "error: queue 'events' did not settle" in text.output
    # when everything is acked, the wait returns at once
    for d in c.fetch(2):
        d.ack()
    done = run("events", "--group", "g", "--timeout", "5", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["settled"] is True and json.loads(done.output)["groups"] == {"g": 2}
    assert "settled by g" in run("events", "--timeout", "5").output
    # and a queue that does not exist is named
    missing = run("nothing", "--timeout", "1")
    assert missing.exit_code == 3 and "nothing" in missing.output
    client.close()
