"""Membership of a group: leaving gracefully, a closed consumer, heartbeats,
and the removal of members whose liveness passed."""

from __future__ import annotations

import pytest
from support.refusals import names_input, nothing_changes

import rqueue
from rqueue.engine import commands


def test_graceful_leave_returns_unacked_at_once(queue):
    # given 3 messages, 2 of them held by a
    queue.publish_many([b"m"] * 3)
    a = queue.consumer("g", name="a")
    b = queue.consumer("g", name="b")
    held = a.fetch(2)
    # when a leaves, then it returns both
    assert a.close() == 2
    # and b gets them at once, ahead of the new one, and is the only member left
    got = b.fetch(10)
    assert [d.seq for d in got] == [1, 2, 3]
    assert [d.redelivered for d in got] == [True, True, False]
    assert [c.name for c in queue.stats().group("g").consumers] == ["b"]
    assert held
    # and a can no longer fetch
    with pytest.raises(rqueue.RQueueError):
        a.fetch()


def test_closed_consumer(client, queue, held):
    # given a consumer that left its group
    held.w2.close()
    # when it is used again
    with nothing_changes(client, queue):
        with pytest.raises(rqueue.RQueueError, match="name='w2'.*is closed"):
            held.w2.fetch(1)
        with pytest.raises(rqueue.RQueueError, match="is closed"):
            held.w2.ack(f"3.1.{held.d1.token}")


def test_members_are_judged_by_their_own_liveness(queue, clock):
    # given members with a liveness of 60 s and of 1 s
    plain = queue.consumer("g", name="plain", liveness=60)
    worker = queue.consumer("g", name="worker", liveness=1)
    # when 30 s pass, then the other's heartbeat removes nobody
    clock.advance(30)
    assert worker.heartbeat([], timeout=1).removed == 0
    # and when 61 s passed, it removes the silent member
    clock.advance(31)
    assert worker.heartbeat([], timeout=1).removed == 1
    assert [c.name for c in queue.stats().group("g").consumers] == ["worker"]
    assert plain.fetch() == []  # it joins again on its next fetch


def test_the_fetch_that_joins_again_says_when_a_waiting_message_falls_due(queue, clock):
    # given a member removed as silent while a message waits 5 s
    plain = queue.consumer("g", name="plain", liveness=1)
    other = queue.consumer("g", name="other", liveness=60)
    queue.publish(b"later", delay=5)
    clock.advance(2)
    assert other.heartbeat([], timeout=60).removed == 1
    # when it fetches, with acks riding on the fetch as a worker's do, and joins again
    _, got, due_in = plain.ack_and_fetch([], 1)
    # then it gets nothing yet, and is told when the message falls due
    assert got == [] and due_in == pytest.approx(3, abs=0.01)


def test_lost_fetch_reply_is_handed_back_uncounted(client, queue):
    # given a fetch applied in Redis whose reply never reached the client
    queue.publish_many([b"1", b"2"])
    c = queue.consumer("g", name="w")
    commands.fetch(queue.group_call("g", queue.settings(), "w"), 2, "lost")
    # when the client syncs what it knows (nothing)
    result = c.heartbeat([], timeout=5, sync=True)
    # then both come back as first deliveries
    assert result.handed_back == 2
    assert [(d.seq, d.delivery_count) for d in c.fetch(10)] == [(1, 1), (2, 1)]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 1e300, True, "5"])
def test_bad_heartbeat_timeout_is_refused_and_changes_nothing(client, queue, held, bad):
    # given w1 holding two deliveries
    # when it sends a heartbeat with a timeout that is no duration it can keep
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
        held.w1.heartbeat([held.d1, held.d2], timeout=bad)
    # then the error names the argument and the value
    names_input(exc.value, "timeout must be a positive number of seconds", repr(bad))
