"""Acking: the group's ack floor, retention until every group settled a
message, multiple acks, late acks, ack_and_fetch, and the runs of acks kept
above the floor."""

from __future__ import annotations

import pytest
from support import logview
from support.aio_bridge import parametrize_api
from support.raw import group_key

import rqueue
from rqueue.engine import commands

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

# -- the ack floor -------------------------------------------------------------------


def test_ack_floor_is_exact_with_gaps(queue):
    # given 5 deliveries held by one consumer
    queue.publish_many([b"m"] * 5)
    c = queue.consumer("g")
    d1, d2, d3, d4, d5 = c.fetch(5)
    # when 2 and 4 are acked, then the floor stays at 0 with 3 pending
    c.ack([d2, d4])
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending) == (0, 3)
    # and when 1 is acked, the floor moves up to 2
    d1.ack()
    assert queue.stats().group("g").ack_floor == 2
    # and when the rest are acked, the floor passes everything
    c.ack([d3, d5])
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending, g.in_flight) == (5, 0, 0)


def test_nothing_acked_is_delivered_again(queue, clock):
    # (guarantee 2: after a confirmed ack, never delivered again to the group)
    # given 3 deliveries, of which 1 and 3 are acked
    queue.publish_many([b"m"] * 3)
    c = queue.consumer("g", ack_wait=1)
    d1, d2, d3 = c.fetch(3)
    c.ack([d1, d3])
    # when every lease runs out, then only 2 comes again
    clock.advance(5)
    again = c.fetch(10)
    assert [d.seq for d in again] == [2]
    again[0].ack()
    # and once it is acked too, nothing comes again
    clock.advance(5)
    assert c.fetch(10) == []


def test_work_queue_retention_waits_for_every_group(queue):
    # given two groups, of which a acked both messages
    queue.publish_many([b"a", b"b"])
    a, b = queue.consumer("a"), queue.consumer("b")
    a.ack(a.fetch(2))
    # then the records stay while b has not settled them
    assert queue.stats().depth == 2
    # when b acks them out of order, then each record goes once both groups settled it
    db = b.fetch(2)
    b.ack(db[1])
    # A stream log keeps a record settled above the lowest floor until the
    # floor passes it, and the depth counts it (docs/layout-d-plan.md, "Step
    # 3, first part (built)"): there seq 2 stays until b settles seq 1.
    assert queue.stats().depth == (2 if logview.is_stream(queue.keys) else 1)
    b.ack(db[0])
    assert queue.stats().depth == 0


def test_acks_above_the_floor_kept_as_a_set_by_an_older_version_become_runs_when_a_consumer_joins(queue):
    # given a group whose acks above the floor are a set, one member per
    # seq, as an older rqueue kept them, and no acked_above count
    queue.publish_many([b"1", b"2", b"3", b"4", b"5", b"6"])
    c = queue.consumer("g")
    d1, d2, d3, d4, d5, d6 = c.fetch(6)
    c.ack([d2, d3, d5])
    r = queue.client.redis
    runs_key = group_key(queue, "g", "acked")
    r.delete(runs_key)
    r.sadd(runs_key, 2, 3, 5)
    r.hdel(queue.keys.group("g").state, "acked_above")
    # when a consumer joins
    queue.consumer("g", name="newer")
    # then the set is runs, counted, and acks and stats go on from there
    assert r.zrange(runs_key, 0, -1, withscores=True) == [(b"2", 3.0), (b"5", 5.0)]
    assert queue.stats().group("g").pending == 3
    c.ack([d1, d4])
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending, r.zcard(runs_key)) == (5, 1, 0)
    d6.ack()
    assert queue.stats().group("g").ack_floor == 6


# -- multiple acks ----------------------------------------------------------------------


def test_ack_multiple_acks_earlier_deliveries_of_this_consumer(queue):
    # given 4 deliveries held by one consumer
    queue.publish_many([b"m"] * 4)
    c = queue.consumer("g")
    ds = c.fetch(4)
    # when the third is acked with multiple=True
    c.ack(ds[2], multiple=True)
    # then it and the ones before it are acked, the fourth is still in flight
    assert queue.stats().group("g").ack_floor == 3
    assert queue.stats().group("g").in_flight == 1


def test_ack_multiple_skips_earlier_deliveries_that_moved_on(queue, clock):
    # given a holding two deliveries whose leases ran out
    queue.publish_many([b"1", b"2"])
    a = queue.consumer("g", name="a", ack_wait=1)
    b = queue.consumer("g", name="b")
    d1, d2 = a.fetch(2)
    clock.advance(2)
    # when seq 1 is redelivered to b and acked there, and a acks 2 with multiple=True
    b.ack(b.fetch(1))
    a.ack(d2, multiple=True)  # d2's lease also ran out, but nobody took it: a late ack
    # then a's ack skips seq 1 (no longer a's) and the floor passes both
    assert queue.stats().group("g").ack_floor == 2


def test_a_refused_ack_of_an_earlier_delivery_leaves_the_later_one_of_that_seq_held(queue, clock):
    # given a consumer that got seq 1 twice (its first lease ran out), and seq 2
    queue.publish_many([b"1", b"2"])
    c = queue.consumer("g", ack_wait=1)
    [old] = c.fetch(1)
    clock.advance(2)
    new, d2 = c.fetch(2)
    assert (new.seq, new.delivery_count, d2.seq) == (1, 2, 2)
    # when the earlier delivery's ack is refused (a newer one is out)
    [refused] = c.ack_available([old])
    assert isinstance(refused, rqueue.StaleDelivery)
    assert refused.tag == old.tag == f"1.1.{old.token}"
    # then the later one is still held: its lease is extended in place, and an
    # ack of seq 2 with multiple=True acks it too
    before = new.deadline_ms
    clock.advance(0.5)
    c.in_progress(new)
    assert new.deadline_ms > before
    c.ack(d2, multiple=True)
    g = queue.stats().group("g")
    assert (g.ack_floor, g.in_flight) == (2, 0)


# -- late acks ---------------------------------------------------------------------------


def test_late_ack_from_an_earlier_delivery_of_a_message_handed_out_again_is_stale(queue, clock):
    # given a message whose lease ran out at slow and that fast got again
    queue.publish(b"m")
    slow = queue.consumer("g", ack_wait=1)
    fast = queue.consumer("g")
    [old] = slow.fetch()
    clock.advance(2)
    [new] = fast.fetch()
    # when slow acks its earlier delivery, it is stale: fast may be about to run it
    with pytest.raises(rqueue.StaleDelivery, match=old.tag):
        old.ack()
    # then fast's delivery completes the message
    new.ack()
    assert queue.stats().group("g").ack_floor == 1


def test_foreign_late_ack_is_refused(queue, clock):
    # given a message delivered twice to a
    queue.publish(b"m")
    a = queue.consumer("g", name="a", ack_wait=1)
    b = queue.consumer("g", name="b")
    [first] = a.fetch()
    clock.advance(2)
    [current] = a.fetch()  # delivery 2, to a again
    # when b acks the first delivery, which it never received, by its tag, then that is refused
    with pytest.raises(rqueue.NotHeld, match=first.tag):
        b.ack(first.tag)
    current.ack()


# -- ack_and_fetch ------------------------------------------------------------------------


def test_ack_and_fetch_is_one_call_that_acks_before_it_fetches(client, queue, monkeypatch):
    # given a consumer with a prefetch of 2 holding 2 deliveries, and no ack script call allowed
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("g", prefetch=2)
    first = c.fetch(2)

    def no_second_call(**_kw):
        raise AssertionError("ack_and_fetch sent the ack script as a call of its own")

    monkeypatch.setattr(client.scripts, "ack", no_second_call)
    # when it acks them (and an unknown tag) and fetches in one call: the two
    # acks free the two prefetch slots for the fetch of the same call
    statuses, got, due_in = c.ack_and_fetch([*first, f"9.1.{first[0].token}"], 5)
    # then the acks are applied, the unknown tag is reported, and the freed room is filled
    assert statuses[:2] == [None, None] and isinstance(statuses[2], rqueue.DeliveryError)
    assert [d.seq for d in got] == [3] and due_in is None
    assert queue.stats().group("g").acked == 2


@pytest.mark.sync_only("it removes the consumer with the sync engine's leave")
def test_ack_and_fetch_of_a_removed_consumer_joins_again_and_still_acks(client, queue):
    # given a consumer holding two deliveries
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g")
    d1, d2 = c.fetch(2)
    # and removed from the group behind its back (as a dead member would be): both go back
    commands.leave(queue.group_call("g", c.settings(), c.name), c.name, graceful=True)
    # when it acks one and fetches in one call
    statuses, got, _ = c.ack_and_fetch([d1], 5)
    # then it joins again, the late ack of the delivery it really received is
    # accepted, and the other comes back as a redelivery
    assert statuses == [None]
    assert [(d.seq, d.delivery_count) for d in got] == [(2, 2)]
    assert queue.stats().group("g").acked == 1
