"""Redelivery: leases that run out, in_progress, nack, reject with requeue,
the redelivery policy (delay, multiplier, cap, jitter), and redeliveries
ahead of new messages."""

from __future__ import annotations

from support.aio_bridge import parametrize_api
from support.raw import group_key

import rqueue

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

# -- leases -----------------------------------------------------------------------------


def test_expired_lease_is_redelivered_with_exact_count(queue, clock):
    # (guarantee 5: the delivery count is persisted with the delivery)
    # given a delivery with a lease of 2 s
    queue.publish(b"m")
    c = queue.consumer("g", ack_wait=2)
    [d] = c.fetch()
    assert d.delivery_count == 1
    # when the lease has not run out, then nothing comes again
    clock.advance(1.9)
    assert c.fetch() == []
    # and once it ran out, the same seq comes again with count 2
    clock.advance(0.2)
    [again] = c.fetch()
    assert (again.seq, again.delivery_count, again.redelivered) == (d.seq, 2, True)
    assert queue.stats().group("g").expired == 1


def test_count_survives_a_client_that_forgets_everything(backend, prefix, clock):
    # (guarantee 5, from a fresh client: a crashed process, on the same data)
    # given a delivery made by a client that is gone
    first = rqueue.connect(backend, prefix=prefix, clock=clock)
    q = first.queue("orders")
    q.publish(b"m")
    q.consumer("g", name="w1", ack_wait=1).fetch()
    first.close()
    clock.advance(2)
    # when a new client fetches after the lease ran out
    second = rqueue.connect(backend, prefix=prefix, clock=clock)
    [d] = second.queue("orders").consumer("g", name="w2").fetch()
    # then the count carries on from the stored one
    assert (d.delivery_count, d.redelivered) == (2, True)
    second.close()


def test_in_progress_extends_the_lease(queue, clock):
    # given a delivery with a lease of 2 s
    queue.publish(b"m")
    c = queue.consumer("g", ack_wait=2)
    other = queue.consumer("g")
    [d] = c.fetch()
    clock.advance(1.5)
    # when in_progress is called 1.5 s in
    d.in_progress()
    clock.advance(1.5)
    # then 3 s in the lease still holds: another consumer gets nothing
    assert other.fetch() == []
    d.ack()


def test_in_progress_available_extends_what_is_held_and_names_the_rest(queue, clock):
    # given three deliveries with leases of 2 s: one acked, one whose lease ran out and was delivered again
    queue.publish_many([b"m"] * 3)
    c = queue.consumer("g", ack_wait=2, prefetch=3)
    other = queue.consumer("g", ack_wait=60)
    d1, d2, d3 = c.fetch(3)
    d1.ack()
    clock.advance(1.5)
    c.in_progress(d3)
    clock.advance(1.0)
    assert [d.seq for d in other.fetch(3)] == [2]
    # when the three are extended in one call
    statuses = c.in_progress_available([d1, d2, d3])
    # then the one still held is extended, and each other one gets its own error
    assert [type(s).__name__ for s in statuses] == ["AlreadyAcked", "StaleDelivery", "NoneType"]
    clock.advance(1.5)
    assert other.fetch(3) == []  # 4 s in: d3's lease holds
    d3.ack()


def test_in_progress_available_names_a_state_that_does_not_parse_and_extends_the_others(client, queue, clock):
    # given three deliveries with leases of 2 s, the second one's delivery state overwritten with garbage
    queue.publish_many([b"m"] * 3)
    c = queue.consumer("g", ack_wait=2, prefetch=3)
    d1, d2, d3 = c.fetch(3)
    client.redis.hset(group_key(queue, "g", "dlv"), 2, b"nonsense")
    leases = group_key(queue, "g", "lease")
    before = [client.redis.zscore(leases, seq) for seq in (1, 2, 3)]
    clock.advance(1.5)
    # when the three are extended in one call (a batch's check), and then beaten for (a heartbeat)
    statuses = c.in_progress_available([d1, d2, d3])
    beaten = c.heartbeat([d1, d2, d3], timeout=60).statuses
    # then the damaged one is named, alone, and the two others are extended by the 1.5 s that passed
    for got in (statuses, beaten):
        assert [type(s).__name__ for s in got] == ["NoneType", "CorruptRecord", "NoneType"]
    after = [client.redis.zscore(leases, seq) for seq in (1, 2, 3)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1500, 0, 1500]
    assert client.redis.hget(group_key(queue, "g", "dlv"), 2) == b"nonsense"


def test_nack_available_nacks_what_is_held_and_names_the_rest(queue, clock):
    # given three deliveries, the second acked
    queue.publish_many([b"m"] * 3)
    c = queue.consumer("g", prefetch=3)
    d1, d2, d3 = c.fetch(3)
    d2.ack()
    # when the three are nacked in one call, and then the acked one alone
    statuses = c.nack_available([d1, d2, d3], delay=0, error="boom")
    alone = c.nack_available([d2])
    # then the held ones are requeued, and each refusal is its status, not raised
    assert [s if isinstance(s, str) else type(s).__name__ for s in statuses] == ["requeued", "AlreadyAcked", "requeued"]
    assert [type(s).__name__ for s in alone] == ["AlreadyAcked"]
    assert [(d.seq, d.delivery_count) for d in c.fetch(3)] == [(1, 2), (3, 2)]


def test_redeliveries_come_before_new_messages_lowest_seq_first(queue, clock):
    # (guarantee 6: after a restart pending redeliveries are offered first)
    # given 6 messages of which 1, 2 and 3 were leased and abandoned
    queue.publish_many([b"m"] * 6)
    c = queue.consumer("g", ack_wait=1, prefetch=3)
    c.fetch(3)
    clock.advance(2)
    # when a fresh consumer fetches after the leases ran out
    fresh = queue.consumer("g", prefetch=10)
    # then the redeliveries come first, lowest seq first, then the new ones
    assert [d.seq for d in fresh.fetch(10)] == [1, 2, 3, 4, 5, 6]


# -- nack and reject with requeue ---------------------------------------------------------


def test_nack_requeues_ahead_of_every_later_message(queue):
    # (guarantee 8: nack puts the message back in its place)
    # given 5 messages, 1 and 2 held
    queue.publish_many([b"m"] * 5)
    c = queue.consumer("g", prefetch=2)
    d1, d2 = c.fetch(2)
    # when 2 is nacked without delay and 1 acked
    d2.nack(delay=0)
    d1.ack()
    # then 2 comes before 3
    assert [d.seq for d in c.fetch(2)] == [2, 3]


def test_nack_with_delay_holds_back_only_that_message(queue, clock):
    # given 3 messages
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("g")
    # when the first is nacked with a delay of 10 s
    d1 = c.fetch()[0]
    d1.nack(delay=10)
    # then the others flow, and it waits
    assert [d.seq for d in c.fetch(10)] == [2, 3]
    assert queue.stats().group("g").delayed == 1
    # and comes again once the delay is over
    clock.advance(10)
    [d] = c.fetch(10)
    assert (d.seq, d.delivery_count) == (1, 2)


def test_reject_with_requeue_offers_again(queue):
    # given a delivery
    queue.publish(b"m")
    c = queue.consumer("g")
    # when it is rejected with requeue=True
    c.fetch()[0].reject(requeue=True)
    # then it comes again, counted
    [d] = c.fetch()
    assert d.delivery_count == 2


# -- the redelivery policy -------------------------------------------------------------------


def test_redelivery_policy_worked_example(client, queue, clock):
    # (Artemis' worked example: delay 5000 ms, multiplier 2, cap 15000 ms, no
    # jitter: waits of 5000, 10000, 15000, 15000 ms between attempts)
    client.configure("orders", redelivery_delay=5, redelivery_multiplier=2, max_redelivery_delay=15, max_deliveries=-1)
    # when a message is nacked four times, each time waiting until it comes again
    queue.publish(b"m")
    c = queue.consumer("g")
    waits = []
    d = c.fetch()[0]
    for _ in range(4):
        d.nack()
        waited = 0
        while True:
            got = c.fetch()
            if got:
                d = got[0]
                break
            clock.advance(0.5)
            waited += 500
        waits.append(waited)
    # then the waits grow by the multiplier up to the cap
    assert waits == [5000, 10000, 15000, 15000]


def test_jitter_stays_within_bounds(client, queue, clock):
    # given a delay of 10 s with a jitter of 0.5
    client.configure("orders", redelivery_delay=10, redelivery_jitter=0.5, max_deliveries=-1)
    queue.publish_many([b"m"] * 20)
    c = queue.consumer("g", prefetch=20)
    # when 20 deliveries are nacked at once
    for d in c.fetch(20):
        d.nack()
    g = queue.stats().group("g")
    assert g.delayed == 20
    due = sorted(int(s) for _, s in client.redis.zrange(group_key(queue, "g", "delay"), 0, -1, withscores=True))
    # then each waits between 5 and 15 s, not all the same
    low, high = clock.now_ms + 5000, clock.now_ms + 15000
    assert all(low <= t <= high for t in due)
    assert len(set(due)) > 10  # the batch does not move in step


def test_lease_expiry_follows_the_redelivery_policy(client, queue, clock):
    # given a lease of 1 s and a redelivery delay of 5 s
    client.configure("orders", ack_wait=1, redelivery_delay=5)
    queue.publish(b"m")
    c = queue.consumer("g")
    c.fetch()
    # when the lease runs out
    clock.advance(1)
    assert c.fetch() == []
    assert queue.stats().group("g").delayed == 1
    # then the message comes again only once the delay is over too
    clock.advance(4.9)
    assert c.fetch() == []
    clock.advance(0.1)
    assert [d.delivery_count for d in c.fetch()] == [2]


def test_poison_message_fails_forever_while_others_flow(client, queue, clock):
    # given unlimited deliveries and a message that always fails
    client.configure("orders", max_deliveries=-1, redelivery_delay=1)
    queue.publish_many([b"poison"] + [b"ok"] * 20)
    c = queue.consumer("g", prefetch=5)
    done = 0
    # when a consumer nacks it every time and acks the others
    for _ in range(40):
        for d in c.fetch(5):
            if d.data == b"poison":
                d.nack(error="always fails")
            else:
                d.ack()
                done += 1
        clock.advance(0.5)
    # then every other message was handled, and the failing one is still pending
    g = queue.stats().group("g")
    assert done == 20 and g.ack_floor == 0 and g.pending == 1 and g.nacked >= 10
