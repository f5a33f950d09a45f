"""Refused settling: ack, nack, reject, term and in_progress given a tag that
is unknown, malformed, already settled, held by another consumer or stale,
or a bad argument. Each refusal names the tag or argument and changes
nothing (docs/guarantees.md, "Bad input"); the consumer keeps working.

The fixtures ``held`` and ``stale`` (tests/conftest.py) set up the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.aio_bridge import parametrize_api
from support.raw import group_key
from support.refusals import names_input, nothing_changes

import rqueue
from rqueue import AlreadyAcked, InvalidInput, NotHeld, StaleDelivery, UnknownDeliveryTag

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

NAN = float("nan")

# Every way to settle a delivery, by name.
SETTLE_OPS: dict[str, Callable[[rqueue.Consumer, Any], Any]] = {
    "ack": lambda c, ref: c.ack(ref),
    "nack": lambda c, ref: c.nack(ref),
    "reject": lambda c, ref: c.reject(ref),
    "term": lambda c, ref: c.term(ref, "why"),
    "in_progress": lambda c, ref: c.in_progress(ref),
}


# -- tags that were never handed out ------------------------------------------------------


@pytest.mark.parametrize("op", list(SETTLE_OPS))
@pytest.mark.parametrize(
    "tag",
    [
        pytest.param("999.1", id="never-published"),
        pytest.param("3.1", id="published-not-delivered"),
        pytest.param("1.2", id="count-not-reached"),
        pytest.param("1.0", id="count-zero"),
    ],
)
def test_unknown_tag(client, queue, held, op, tag):
    # given w1 holding 1.1 and 2.1, seq 3 not delivered yet
    tag = f"{tag}.{held.d1.token}"
    # when a tag that was never handed out is settled
    with nothing_changes(client, queue), pytest.raises(UnknownDeliveryTag) as exc:
        SETTLE_OPS[op](held.w1, tag)
    # then the tag is named, and the consumer keeps working
    assert exc.value.tag == tag
    names_input(exc.value, f"delivery tag {tag} ", "unknown")
    held.w1.ack([held.d1, held.d2])
    assert queue.stats().group("billing").ack_floor == 2


def test_tag_of_seq_zero_is_unknown(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when tag 0.1 is acked
    with nothing_changes(client, queue), pytest.raises(UnknownDeliveryTag, match="0.1"):
        held.w1.ack(f"0.1.{held.d1.token}")


@pytest.mark.parametrize("op", list(SETTLE_OPS))
@pytest.mark.parametrize(
    "tag",
    [
        "abc",
        "",
        "1",
        "1.",
        ".1",
        "1.x",
        "-1.1",
        "1.1",
        "1.1.1.1",
        "1.1.A",
        "1.1.",
        " 1.1.a",
        "1 .1.a",
        "01.1.a",
        "1.01.a",
    ],
)
def test_malformed_tag(client, queue, held, op, tag):
    # given w1 holding 1.1 and 2.1
    # when a string that is not a tag is settled
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        SETTLE_OPS[op](held.w1, tag)
    # then the string is named with the expected form
    names_input(exc.value, f"{tag!r} is not a delivery tag of the form <seq>.<count>")


@pytest.mark.parametrize("op", list(SETTLE_OPS))
@pytest.mark.parametrize("ref", [11, None, 1.1], ids=["int", "none", "float"])
def test_ref_that_is_not_a_tag(client, queue, held, op, ref):
    # given w1 holding 1.1 and 2.1
    # when something that is neither a Delivery nor a tag is settled
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        SETTLE_OPS[op](held.w1, ref)
    # then its type is named
    names_input(exc.value, "expected a Delivery", "delivery tag", f", not {type(ref).__name__}")


def test_tag_with_a_superscript_digit_is_named(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when a tag with a superscript digit is acked
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w1.ack("².1")
    # then the tag is named
    names_input(exc.value, "'².1' is not a delivery tag")


# -- tags already settled or held by another consumer ----------------------------------------


@pytest.mark.parametrize("op", list(SETTLE_OPS))
def test_settling_after_ack(client, queue, held, op):
    # given a delivery that was acked
    held.d1.ack()
    # when it is settled again (the second ack, or a nack, reject, ...)
    with nothing_changes(client, queue), pytest.raises(AlreadyAcked) as exc:
        SETTLE_OPS[op](held.w1, held.d1)
    # then the tag is named, and the consumer keeps working
    assert exc.value.tag == held.d1.tag
    names_input(exc.value, f"delivery tag {held.d1.tag} ", "already settled")
    held.d2.ack()
    assert queue.stats().group("billing").ack_floor == 2


def test_same_delivery_twice_in_one_ack_acks_nothing(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when one list acks 1.1 twice
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w1.ack([held.d1, held.d2, held.d1])
    # then the tag is named as given twice (not as settled: it is not), and not even the others were acked
    names_input(exc.value, f"delivery tag {held.d1.tag} is given twice in one ack")
    held.w1.ack([held.d1, held.d2])
    assert queue.stats().group("billing").ack_floor == 2


@pytest.mark.parametrize("op", list(SETTLE_OPS))
def test_tag_held_by_another_consumer(client, queue, held, op):
    # given w1 holding 1.1
    # when w2 of the same group settles it
    with nothing_changes(client, queue), pytest.raises(NotHeld) as exc:
        SETTLE_OPS[op](held.w2, held.d1.tag)
    # then the tag is named, and w1 can still ack it
    assert exc.value.tag == held.d1.tag
    names_input(exc.value, f"delivery tag {held.d1.tag} ", "not held by this consumer")
    held.d1.ack()
    assert queue.stats().group("billing").acked == 1


@pytest.mark.parametrize(
    "bad, error, tag",
    [
        pytest.param("999.1", UnknownDeliveryTag, "999.1.", id="unknown"),
        pytest.param("1.2", UnknownDeliveryTag, "1.2.", id="count-not-reached"),
        pytest.param("abc", InvalidInput, "'abc'", id="malformed"),
        pytest.param("w2", NotHeld, "3.1", id="held-by-w2"),
        pytest.param("acked", AlreadyAcked, "4.1", id="already-acked"),
    ],
)
def test_ack_list_with_one_bad_tag_acks_none(client, queue, held, bad, error, tag):
    # given w1 holding 1.1 and 2.1, w2 holding 3.1, and 4.1 acked by w1
    queue.publish(b"d")
    [d3] = held.w2.fetch(1)
    [d4] = held.w1.fetch(1)
    d4.ack()
    ref = {"w2": d3.tag, "acked": d4, "abc": "abc"}.get(bad, f"{bad}.{held.d1.token}")
    # when w1 acks a list with one bad tag in the middle
    with nothing_changes(client, queue), pytest.raises(error) as exc:
        held.w1.ack([held.d1, ref, held.d2])
    # then the bad tag is named and none of the list was acked
    names_input(exc.value, tag)
    assert queue.stats().group("billing").in_flight == 3
    # and the good ones can still be acked
    held.w1.ack([held.d1, held.d2])
    assert queue.stats().group("billing").ack_floor == 2


def test_ack_multiple_takes_one_delivery(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when ack(multiple=True) gets a list of two
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="exactly one delivery"):
        held.w1.ack([held.d1, held.d2], multiple=True)


# -- stale deliveries ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["nack", "reject", "term"])
def test_stale_delivery_cannot_be_nacked_or_dead_lettered(client, queue, stale, op):
    # given w1's lease on seq 1 ran out and w2 holds it as 1.2
    # when w1 nacks, rejects or terms its old delivery 1.1
    with nothing_changes(client, queue), pytest.raises(StaleDelivery) as exc:
        SETTLE_OPS[op](stale.w1, stale.old)
    # then the old tag is named and w2 still holds the message
    assert exc.value.tag == stale.old.tag
    names_input(exc.value, f"delivery tag {stale.old.tag} ", "no longer held")
    assert {c.name: c.held for c in queue.stats().group("billing").consumers} == {"w1": 0, "w2": 1}


def test_stale_delivery_cannot_be_extended(client, queue, stale):
    # given w1's lease on seq 1 ran out and w2 holds it as 1.2
    lease_before = client.redis.zrange(group_key(queue, "billing", "lease"), 0, -1, withscores=True)
    # when w1 extends its old delivery 1.1 (which records that w1 is alive,
    # so its heartbeat is left out of the comparison)
    with nothing_changes(client, skip=(":beats:billing",)), pytest.raises(StaleDelivery) as exc:
        stale.w1.in_progress(stale.old)
    # then the old tag is named and w2's lease is untouched
    names_input(exc.value, f"delivery tag {stale.old.tag} ", "no longer held")
    assert client.redis.zrange(group_key(queue, "billing", "lease"), 0, -1, withscores=True) == lease_before


def test_a_late_ack_of_a_message_handed_out_again_is_refused(client, queue, clock, stale):
    # given w1's lease on seq 1 ran out and w2 holds it as 1.2 (a handler may be about to start on it)
    # when w1 acks its old delivery 1.1
    with nothing_changes(client, queue), pytest.raises(StaleDelivery, match=stale.old.tag):
        stale.w1.ack(stale.old)
    # then nothing changed: w2's delivery settles it, and it is not delivered again
    stale.new.ack()
    g = queue.stats().group("billing")
    assert (g.ack_floor, g.in_flight, g.acked, [c.held for c in g.consumers]) == (1, 0, 1, [0, 0])
    clock.advance(queue.settings().ack_wait + 1)
    assert stale.w1.fetch(5) == [] and stale.w2.fetch(5) == []


def test_a_late_ack_of_a_message_waiting_to_be_handed_out_again_completes_it(client, queue, clock):
    # given w1's lease on seq 1 ran out and a fetch took it back into its 60 s redelivery delay
    client.configure(queue.name, redelivery_delay=60)
    queue.publish(b"a")
    w1, w2 = queue.consumer("billing", name="w1"), queue.consumer("billing", name="w2")
    [old] = w1.fetch(1)
    clock.advance(queue.settings().ack_wait + 1)
    assert w2.fetch(1) == []
    # when w1 acks its old delivery (the work was done, and nobody holds the message)
    w1.ack(old)
    # then the message is complete for the group, and it is not delivered again
    g = queue.stats().group("billing")
    assert (g.ack_floor, g.in_flight, g.acked) == (1, 0, 1)
    clock.advance(61)
    assert w1.fetch(5) == [] and w2.fetch(5) == []


# -- bad arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, why",
    [
        pytest.param(lambda d: d.nack(delay=-1), "delay -1 must be", id="nack-delay-negative"),
        pytest.param(lambda d: d.nack(delay=NAN), "delay nan must be", id="nack-delay-nan"),
        pytest.param(lambda d: d.nack(delay="1"), "delay '1' must be", id="nack-delay-str"),
        pytest.param(lambda d: d.nack(error=5), "error must be a str, not int", id="nack-error-int"),
        pytest.param(lambda d: d.reject(reason=5), "reason must be a str, not int", id="reject-reason-int"),
        pytest.param(lambda d: d.term(b"why"), "reason must be a str, not bytes", id="term-reason-bytes"),
    ],
)
def test_bad_settle_arguments(client, queue, held, call, why):
    # given w1 holding 1.1
    # when it is nacked, rejected or termed with a bad argument
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        call(held.d1)
    # then the argument is named and the delivery is still held
    names_input(exc.value, why)
    held.d1.ack()


def test_error_text_that_cannot_be_encoded(client, queue, held):
    # given w1 holding 1.1
    # when it is nacked with an error text holding a lone surrogate
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="error"):
        held.d1.nack(error="\ud800")


@pytest.mark.parametrize("requeue", ["why", 1, None], ids=["text", "one", "none"])
def test_reject_with_a_requeue_that_is_not_a_bool_is_refused(client, queue, held, requeue):
    # given w1 holding 1.1
    # when it is rejected with a requeue that is not True or False (a reason given in its place)
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.d1.reject(requeue)
    # then the value is named, and the message is neither offered again nor dead-lettered
    names_input(exc.value, "requeue must be True or False", repr(requeue))
