"""Fencing (guarantee 11 in docs/guarantees.md): a settle takes effect only
for the delivery it names. Every tag carries the random token of the fetch
that made it, so a tag or Delivery of another consumer, group or queue, one
this consumer already nacked, or one from before Redis lost its data is
refused with an error naming it, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.aio_bridge import parametrize_api
from support.refusals import nothing_changes

import rqueue
from rqueue import NotHeld, StaleDelivery, UnknownDeliveryTag

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

SETTLE_OPS: dict[str, Callable[[rqueue.Consumer, Any], Any]] = {
    "ack": lambda c, ref: c.ack(ref),
    "nack": lambda c, ref: c.nack(ref),
    "reject": lambda c, ref: c.reject(ref),
    "term": lambda c, ref: c.term(ref, "why"),
    "in_progress": lambda c, ref: c.in_progress(ref),
}


def wipe(client: rqueue.Client) -> None:
    """Every key of the client's prefix deleted: Redis as after a restart
    without its data, a FLUSHALL or a failover to an empty replica."""
    for key in list(client.redis.scan_iter(match=f"{client.prefix}:*", count=1000)):
        client.redis.delete(key)


def test_tags_carry_the_fetch_token(queue):
    # given two fetches of the same group
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("g")
    first, second = c.fetch(2), c.fetch(1)
    # then each delivery's tag is <seq>.<count>.<token>, one token per fetch call, a letter first
    assert first[0].token[0].isalpha() and first[0].token.isalnum()
    assert [d.tag for d in first] == [f"{d.seq}.1.{first[0].token}" for d in first]
    assert second[0].token != first[0].token and second[0].tag == f"3.1.{second[0].token}"


@pytest.mark.parametrize("op", list(SETTLE_OPS))
def test_a_delivery_of_another_group_settles_nothing(client, queue, op):
    # given seq 1 delivered in group g1 to a and in group g2 to x: same seq, same count
    queue.publish(b"m")
    a, x = queue.consumer("g1", name="a"), queue.consumer("g2", name="x")
    [d], [dx] = a.fetch(1), x.fetch(1)
    assert (d.seq, d.delivery_count) == (dx.seq, dx.delivery_count)
    # when x is handed a's Delivery, or its tag text
    with nothing_changes(client, queue), pytest.raises(NotHeld, match=d.tag):
        SETTLE_OPS[op](x, d)
    with nothing_changes(client, queue), pytest.raises(UnknownDeliveryTag, match=d.tag):
        SETTLE_OPS[op](x, d.tag)
    # then x's own delivery is untouched and settles as usual
    x.ack(dx)
    assert queue.stats().group("g2").acked == 1 and queue.stats().group("g1").acked == 0


def test_a_delivery_of_another_queue_settles_nothing(client):
    # given seq 1 of two queues delivered to consumers of the same name and group
    q1, q2 = client.queue("one"), client.queue("two")
    q1.publish(b"1")
    q2.publish(b"2")
    c1, c2 = q1.consumer("g", name="w"), q2.consumer("g", name="w")
    [d1], [d2] = c1.fetch(1), c2.fetch(1)
    # when q2's consumer acks q1's delivery by its tag
    with nothing_changes(client), pytest.raises(UnknownDeliveryTag, match=d1.tag):
        c2.ack(d1.tag)
    # then q2's message is still held and settles with its own tag
    c2.ack(d2)
    assert q2.stats().group("g").acked == 1 and q1.stats().group("g").in_flight == 1


@pytest.mark.parametrize("op", list(SETTLE_OPS))
def test_a_nacked_delivery_cannot_be_settled_again(client, queue, op):
    # given a delivery nacked with a delay (a retry in 30 s)
    queue.publish(b"m")
    c = queue.consumer("g")
    [d] = c.fetch(1)
    d.nack(delay=30)
    # when the same delivery is acked, nacked, rejected, termed or extended afterwards
    with nothing_changes(client, queue), pytest.raises(StaleDelivery, match=d.tag):
        SETTLE_OPS[op](c, d)
    # then the retry still stands: nothing acked, the message waits in the delay set
    g = queue.stats().group("g")
    assert (g.acked, g.nacked, g.delayed, g.in_flight) == (0, 1, 1, 0)


def test_a_tag_from_before_redis_lost_its_data_settles_nothing(client, queue):
    # given a delivery 1.1 held by w while Redis loses every key of the queue
    queue.publish(b"old")
    w = queue.consumer("g", name="w")
    [old] = w.fetch(1)
    wipe(client)
    # and, after the loss, a new message that gets seq 1 again, delivered to w as 1.1 too
    w.rejoin()
    queue.publish(b"new")
    [new] = w.fetch(1)
    assert (new.seq, new.delivery_count, new.data) == (old.seq, old.delivery_count, b"new")
    # when the old delivery's handler acks it
    with nothing_changes(client, queue, skip=(":events",)), pytest.raises(UnknownDeliveryTag, match=old.tag):
        w.ack(old.tag)
    # then the new message is not settled by it: still in flight, and its own ack settles it
    assert queue.stats().group("g").in_flight == 1
    new.ack()
    assert queue.stats().group("g").acked == 1


def test_a_late_ack_does_not_settle_a_message_handed_out_again(client, queue, clock):
    # given w1's lease on seq 1 ran out and w2 got it again
    queue.publish(b"m")
    w1, w2 = queue.consumer("g", name="w1"), queue.consumer("g", name="w2")
    [old] = w1.fetch(1)
    clock.advance(queue.settings().ack_wait + 1)
    [new] = w2.fetch(1)
    # when w1 acks its earlier delivery by its tag: refused, so that no handler
    # of w2's is about to start on a message already acked (guarantee 3)
    with nothing_changes(client, queue), pytest.raises(rqueue.StaleDelivery):
        w1.ack(old.tag)
    # then w2's delivery settles it
    new.ack()
    assert queue.stats().group("g").acked == 1


def test_a_late_ack_with_another_token_is_refused(client, queue, clock):
    # given w1's lease on seq 1 ran out and w2 got it again
    queue.publish(b"m")
    w1, w2 = queue.consumer("g", name="w1"), queue.consumer("g", name="w2")
    [old] = w1.fetch(1)
    clock.advance(queue.settings().ack_wait + 1)
    w2.fetch(1)
    # when w1 acks seq 1's first delivery with a token that is not its fetch's
    forged = f"{old.seq}.{old.delivery_count}.{'z' * len(old.token)}"
    with nothing_changes(client, queue), pytest.raises(rqueue.NotHeld, match=forged):
        w1.ack(forged)
    # then the message is still held by w2
    assert queue.stats().group("g").in_flight == 1
