"""Purging a group or a queue, and deleting a queue."""

from __future__ import annotations

import pytest
from support.aio_bridge import parametrize_api
from support.refusals import nothing_changes

import rqueue

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)


def test_purge_settles_everything_not_in_flight(queue, clock):
    # given 6 messages and a delayed one; group g holds 1, nacked 2 with a
    # delay, and another group h
    queue.publish_many([b"m"] * 6)
    queue.publish(b"later", delay=60)
    c = queue.consumer("g")
    held = c.fetch(2)
    held[1].nack(delay=30)
    other = queue.consumer("h")
    # when group g is purged
    assert queue.purge("g") == {"g": 6}
    # then only its in-flight delivery is left, and h is untouched
    g = queue.stats().group("g")
    assert (g.pending, g.in_flight, g.delayed, g.ready) == (1, 1, 0, 0)
    assert len(other.fetch(10)) == 6
    held[0].ack()
    assert queue.stats().group("g").ack_floor == 7


def test_purge_of_a_queue_without_groups_drops_its_records(queue):
    # given a queue without a group that holds 3 records
    queue.publish_many([b"m"] * 3)
    # when it is purged, then its records are gone, for a group created later too
    assert queue.purge() == {"": 3}
    assert queue.stats().depth == 0
    assert queue.consumer("late").fetch(10) == []


def test_delete_removes_every_key_of_the_queue_only(backend, prefix):
    # given a queue with ids, a group and a dead letter, and another queue
    client = rqueue.connect(backend, prefix=prefix)
    q, other = client.queue("orders"), client.queue("orders2")
    q.publish_many([b"a", b"b"], ids=["a", "b"])
    other.publish(b"keep")
    c = q.consumer("g")
    c.fetch()[0].reject()
    # when the queue is deleted
    assert q.delete() > 0
    r = client.redis
    left = [k for k in r.scan_iter(match=f"{prefix}:*") if b"{orders}" in k]
    # then only its de-duplication ids stay, until their window ends, and the other queue is untouched
    assert sorted(left) == sorted(k.encode() for k in (q.keys.message_id("a"), q.keys.message_id("b")))
    assert all(0 < r.pttl(k) <= 120_000 for k in left)
    assert client.queues() == ["orders2"] and other.stats().depth == 1
    client.close()


def test_delete_refuses_while_deliveries_are_in_flight(client, queue):
    # given a consumer holding a delivery of the queue
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g")
    [d] = c.fetch(1)
    # when the queue is deleted without force
    with nothing_changes(client, queue), pytest.raises(rqueue.QueueInUse, match="1 deliveries in flight") as exc:
        queue.delete()
    # then it names the queue and the count, and the consumer goes on
    assert (exc.value.queue, exc.value.in_flight) == ("orders", 1)
    d.ack()
    # and once nothing is in flight, it deletes
    assert queue.delete() > 0
    assert queue.stats().depth == 0


def test_delete_with_force_deletes_what_is_in_flight(client, queue):
    # given a consumer holding a delivery
    queue.publish(b"a")
    c = queue.consumer("g")
    [d] = c.fetch(1)
    # when the queue is deleted with force
    assert queue.delete(force=True) > 0
    # then it is gone, and the consumer's settle of the old delivery changes nothing
    with pytest.raises(rqueue.DeliveryError):
        d.ack()
    assert queue.stats().depth == 0 and queue.groups() == []


def test_delete_refuses_a_force_that_is_not_a_bool(client, queue):
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput, match="force must be True or False"):
        queue.delete(force="yes")
