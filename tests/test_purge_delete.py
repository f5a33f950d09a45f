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


def test_a_group_joining_while_the_queue_is_deleted_is_refused_and_leaves_nothing(backend, prefix, monkeypatch):
    # given a queue with group g, and another client whose consumers join a new group and g itself
    # right after the delete read which groups to delete
    from rqueue.engine.keys import QueueKeys

    client, other = rqueue.connect(backend, prefix=prefix), rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"a")
    q.consumer("g").close()
    refusals: list[str] = []
    order = QueueKeys.deletion_order

    def joined_meanwhile(self: QueueKeys, groups: list[str]) -> list[str]:
        for group in ("late", "g"):
            try:
                other.queue("orders").consumer(group, "w9").close()
            except rqueue.InvalidInput as exc:
                refusals.append(str(exc))
        return order(self, groups)

    monkeypatch.setattr(QueueKeys, "deletion_order", joined_meanwhile)
    # when the queue is deleted
    assert q.delete(force=True) > 0
    monkeypatch.undo()
    # then each join was refused, naming the delete (once per level: the queue and its dead letters)
    assert refusals and all("queue 'orders' is being deleted" in text for text in refusals)
    # and no key of the queue is left behind
    assert [k for k in client.redis.scan_iter(match=f"{prefix}:*") if b"{orders}" in k] == []
    # and the group joins and is served once the queue is used again
    q.publish(b"b")
    assert [d.data for d in other.queue("orders").consumer("late", "w9").fetch(5)] == [b"b"]
    client.close()
    other.close()


def test_a_delete_cut_off_is_reported_and_ended_by_the_next(backend, prefix):
    # given a queue whose delete was cut off after it marked the queue (meta field deleting)
    from rqueue import doctor

    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"a")
    client.redis.hset(q.keys.meta, "deleting", "1")
    # when the doctor examines it, then it names the delete
    assert [f.kind for f in doctor.examine(q)] == [doctor.Kind.DELETE_UNFINISHED]
    # and a group is refused, changing nothing
    with pytest.raises(rqueue.InvalidInput, match="is being deleted .*cut off ends when it is run again"):
        q.consumer("g")
    assert q.groups() == []
    # when the delete runs again, then it ends, and groups join again
    q.delete()
    assert doctor.examine(q) == []
    q.publish(b"b")
    assert [d.data for d in q.consumer("g").fetch(5)] == [b"b"]
    client.close()


def test_a_queue_deleted_by_another_client_is_listed_again_once_this_one_publishes_to_it(
    client, queue, backend, prefix
):
    # given a publisher that has published to the queue, and an operator's client that deletes it
    queue.publish(b"a")
    operator = rqueue.connect(backend, prefix=prefix)
    assert operator.queues() == ["orders"]
    operator.queue("orders").delete()
    assert operator.queues() == []
    # when the publisher publishes to it again (a new incarnation, which it reports as a loss)
    queue.publish_many([b"b", b"c"])
    # then the queue is listed again, for the CLI and the dashboard
    assert operator.queues() == ["orders"]
    assert operator.queue("orders").stats().depth == 2
    operator.close()


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
