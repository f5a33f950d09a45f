"""Behaviour of the core engine, one SPEC statement per test."""

from __future__ import annotations

import pytest

import rqueue
from rqueue.engine.record import decode_record


def seqs(deliveries):
    return [d.seq for d in deliveries]


# -- publish ---------------------------------------------------------------


def test_publish_assigns_increasing_seqs(queue):
    rs = queue.publish_many([b"a", b"b", b"c"])
    assert [r.seq for r in rs] == [1, 2, 3]
    assert queue.publish(b"d").seq == 4


def test_duplicate_id_inside_window_is_confirmed_but_not_stored(queue):
    # given a message published with an id
    first = queue.publish(b"x", id="order-42")
    # when the same id is published again, alone and inside a batch
    again = queue.publish(b"x2", id="order-42")
    batch = queue.publish_many([b"y", b"y-dup"], ids=["order-43", "order-43"])
    # then the duplicates name the first seq and nothing extra is stored
    assert again == rqueue.PublishResult(first.seq, True)
    assert [r.duplicate for r in batch] == [False, True]
    assert batch[1].seq == batch[0].seq
    assert queue.stats().last_seq == 2


def test_duplicate_window_expires(client, queue, clock):
    client.configure("orders", dedup_window=10)
    queue.publish(b"x", id="a")
    clock.advance(9)
    assert queue.publish(b"x", id="a").duplicate
    clock.advance(2)
    assert not queue.publish(b"x", id="a").duplicate


def test_queue_without_group_keeps_what_is_published(queue):
    queue.publish_many([b"a", b"b"])
    # a group created later sees everything retained
    c = queue.consumer("late")
    assert [d.data for d in c.fetch(10)] == [b"a", b"b"]


def test_delayed_publish_waits_and_others_flow(queue, clock):
    queue.publish(b"later", delay=5)
    queue.publish(b"now")
    c = queue.consumer("g")
    assert [d.data for d in c.fetch(10)] == [b"now"]
    assert queue.stats().scheduled == 1
    clock.advance(5)
    [d] = c.fetch(10)
    assert (d.data, d.delivery_count) == (b"later", 1)


# -- fetch, caps -------------------------------------------------------------


def test_prefetch_caps_one_consumer(queue):
    queue.publish_many([b"m"] * 10)
    c = queue.consumer("g", prefetch=3)
    assert len(c.fetch(10)) == 3
    assert c.fetch(10) == []


def test_max_inflight_caps_the_group_at_every_instant(client, queue):
    # guarantee 4: max_inflight and prefetch hold at every instant
    client.configure("orders", max_inflight=5)
    queue.publish_many([b"m"] * 20)
    a, b = queue.consumer("g", prefetch=4), queue.consumer("g", prefetch=4)
    held = a.fetch(10) + b.fetch(10)
    assert len(held) == 5
    assert queue.stats().group("g").in_flight == 5
    assert b.fetch(10) == [] and a.fetch(10) == []
    # acking frees exactly that much room
    a.ack(held[0])
    assert len(b.fetch(10)) == 1
    assert queue.stats().group("g").in_flight == 5


def test_groups_fan_out_and_compete_inside(queue):
    queue.publish_many([b"1", b"2", b"3", b"4"])
    a1, a2 = queue.consumer("a", prefetch=2), queue.consumer("a", prefetch=2)
    b = queue.consumer("b")
    got_a = seqs(a1.fetch(10)) + seqs(a2.fetch(10))
    assert sorted(got_a) == [1, 2, 3, 4] and len(set(got_a)) == 4
    assert seqs(b.fetch(10)) == [1, 2, 3, 4]


# -- acks and the floor ------------------------------------------------------


def test_ack_floor_is_exact_with_gaps(queue):
    queue.publish_many([b"m"] * 5)
    c = queue.consumer("g")
    d1, d2, d3, d4, d5 = c.fetch(5)
    c.ack([d2, d4])
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending) == (0, 3)
    d1.ack()
    assert queue.stats().group("g").ack_floor == 2
    c.ack([d3, d5])
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending, g.in_flight) == (5, 0, 0)


def test_nothing_acked_is_delivered_again(queue, clock):
    # guarantee 2: after a confirmed ack, never delivered again to the group
    queue.publish_many([b"m"] * 3)
    c = queue.consumer("g", ack_wait=1)
    d1, d2, d3 = c.fetch(3)
    c.ack([d1, d3])
    clock.advance(5)  # every lease runs out
    again = c.fetch(10)
    assert seqs(again) == [2]
    again[0].ack()
    clock.advance(5)
    assert c.fetch(10) == []


def test_ack_multiple_acks_earlier_deliveries_of_this_consumer(queue):
    queue.publish_many([b"m"] * 4)
    c = queue.consumer("g")
    ds = c.fetch(4)
    c.ack(ds[2], multiple=True)
    assert queue.stats().group("g").ack_floor == 3
    assert queue.stats().group("g").in_flight == 1


def test_work_queue_retention_waits_for_every_group(queue):
    queue.publish_many([b"a", b"b"])
    a, b = queue.consumer("a"), queue.consumer("b")
    a.ack(a.fetch(2))
    assert queue.stats().depth == 2
    db = b.fetch(2)
    b.ack(db[1])  # out of order: the record goes once both groups settled it
    assert queue.stats().depth == 1
    b.ack(db[0])
    assert queue.stats().depth == 0


# -- leases, redelivery --------------------------------------------------------


def test_expired_lease_is_redelivered_with_exact_count(queue, clock):
    # guarantee 5: the delivery count is persisted with the delivery
    queue.publish(b"m")
    c = queue.consumer("g", ack_wait=2)
    [d] = c.fetch()
    assert d.delivery_count == 1
    clock.advance(1.9)
    assert c.fetch() == []
    clock.advance(0.2)
    [again] = c.fetch()
    assert (again.seq, again.delivery_count, again.redelivered) == (d.seq, 2, True)
    assert queue.stats().group("g").expired == 1


def test_count_survives_a_client_that_forgets_everything(backend, prefix, clock):
    # guarantee 5, from a fresh client (a crashed process) on the same data
    first = rqueue.connect(backend, prefix=prefix, clock=clock)
    q = first.queue("orders")
    q.publish(b"m")
    q.consumer("g", name="w1", ack_wait=1).fetch()
    first.close()
    clock.advance(2)
    second = rqueue.connect(backend, prefix=prefix, clock=clock)
    [d] = second.queue("orders").consumer("g", name="w2").fetch()
    assert (d.delivery_count, d.redelivered) == (2, True)
    second.close()


def test_in_progress_extends_the_lease(queue, clock):
    queue.publish(b"m")
    c = queue.consumer("g", ack_wait=2)
    other = queue.consumer("g")
    [d] = c.fetch()
    clock.advance(1.5)
    d.in_progress()
    clock.advance(1.5)
    assert other.fetch() == []
    d.ack()


def test_redeliveries_come_before_new_messages_lowest_seq_first(queue, clock):
    # guarantee 6: after a restart pending redeliveries are offered first
    queue.publish_many([b"m"] * 6)
    c = queue.consumer("g", ack_wait=1, prefetch=3)
    c.fetch(3)  # 1, 2, 3 are leased and then abandoned
    clock.advance(2)
    fresh = queue.consumer("g", prefetch=10)
    assert seqs(fresh.fetch(10)) == [1, 2, 3, 4, 5, 6]


def test_nack_requeues_ahead_of_every_later_message(queue):
    # guarantee 8
    queue.publish_many([b"m"] * 5)
    c = queue.consumer("g", prefetch=2)
    d1, d2 = c.fetch(2)
    d2.nack(delay=0)
    d1.ack()
    assert seqs(c.fetch(2)) == [2, 3]


def test_nack_with_delay_holds_back_only_that_message(queue, clock):
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("g")
    d1 = c.fetch()[0]
    d1.nack(delay=10)
    assert seqs(c.fetch(10)) == [2, 3]
    assert queue.stats().group("g").delayed == 1
    clock.advance(10)
    [d] = c.fetch(10)
    assert (d.seq, d.delivery_count) == (1, 2)


def test_redelivery_policy_worked_example(client, queue, clock):
    # Artemis: delay 5000 ms, multiplier 2, cap 15000 ms, no jitter:
    # waits of 5000, 10000, 15000, 15000 ms between attempts
    client.configure("orders", redelivery_delay=5, redelivery_multiplier=2, max_redelivery_delay=15, max_deliveries=-1)
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
    assert waits == [5000, 10000, 15000, 15000]


def test_jitter_stays_within_bounds(client, queue, clock):
    client.configure("orders", redelivery_delay=10, redelivery_jitter=0.5, max_deliveries=-1)
    queue.publish_many([b"m"] * 20)
    c = queue.consumer("g", prefetch=20)
    for d in c.fetch(20):
        d.nack()
    g = queue.stats().group("g")
    assert g.delayed == 20
    due = sorted(int(s) for _, s in client.redis.zrange(queue.keys.group("g").as_list()[7], 0, -1, withscores=True))
    low, high = clock.now_ms + 5000, clock.now_ms + 15000
    assert all(low <= t <= high for t in due)
    assert len(set(due)) > 10  # the batch does not move in step


def test_max_deliveries_dead_letters_after_the_last_attempt(client, queue, clock):
    client.configure("orders", max_deliveries=3, ack_wait=1)
    queue.publish(b"poison", headers={"k": "v"})
    queue.publish(b"fine")
    c = queue.consumer("g", prefetch=1)
    for attempt in (1, 2, 3):
        [d] = c.fetch()
        assert (d.seq, d.delivery_count) == (1, attempt)
        if attempt < 3:
            d.nack(delay=0, error=f"boom {attempt}")
            clock.advance(0.1)
    clock.advance(2)  # the third attempt's lease runs out
    [d] = c.fetch()
    assert d.seq == 2
    [dead] = queue.dead_letter_queue.peek()
    assert dead.data == b"poison"
    h = dead.headers
    assert h["k"] == "v"
    assert (h["x-rq-queue"], h["x-rq-group"], h["x-rq-seq"], h["x-rq-reason"], h["x-rq-deliveries"]) == (
        "orders",
        "g",
        "1",
        "max-deliveries",
        "3",
    )
    assert "lease expired" in h["x-rq-error"]
    assert int(h["x-rq-first-delivery"]) < int(h["x-rq-last-delivery"])
    s = queue.stats()
    assert (s.dead_letters, s.group("g").dead_lettered, s.group("g").ack_floor) == (1, 1, 1)


def test_reject_and_term_dead_letter_at_once(queue):
    queue.publish_many([b"r", b"t"])
    c = queue.consumer("g")
    dr, dt = c.fetch(2)
    dr.reject()
    dt.term("bad schema")
    dead = queue.dead_letter_queue.peek()
    assert [(m.data, m.headers["x-rq-reason"]) for m in dead] == [(b"r", "rejected"), (b"t", "terminated")]
    assert dead[1].headers["x-rq-error"] == "bad schema"
    assert queue.stats().group("g").ack_floor == 2


def test_reject_with_requeue_offers_again(queue):
    queue.publish(b"m")
    c = queue.consumer("g")
    c.fetch()[0].reject(requeue=True)
    [d] = c.fetch()
    assert d.delivery_count == 2


def test_dead_letter_none_drops_and_counts(client, queue):
    client.configure("orders", dead_letter=None)
    queue.publish(b"m")
    c = queue.consumer("g")
    c.fetch()[0].reject()
    s = queue.stats()
    assert (s.dead_letters, s.group("g").dropped, s.group("g").ack_floor) == (0, 1, 1)


def test_dead_letter_queue_is_a_queue(client, queue):
    queue.publish(b"m")
    queue.consumer("g").fetch()[0].reject()
    dlq = client.queue("DLQ.orders")
    [d] = dlq.consumer("inspect").fetch()
    assert d.data == b"m" and d.headers["x-rq-reason"] == "rejected"
    assert dlq.keys.base.startswith(queue.keys.base)  # same hash slot


# -- membership ------------------------------------------------------------------


def test_graceful_leave_returns_unacked_at_once(queue):
    queue.publish_many([b"m"] * 3)
    a = queue.consumer("g", name="a")
    b = queue.consumer("g", name="b")
    held = a.fetch(2)
    assert a.close() == 2
    got = b.fetch(10)
    assert seqs(got) == [1, 2, 3]
    assert [d.redelivered for d in got] == [True, True, False]
    assert [c.name for c in queue.stats().group("g").consumers] == ["b"]
    assert held  # a's deliveries are stale now
    with pytest.raises(rqueue.RQueueError):
        a.fetch()


def test_late_ack_from_an_earlier_delivery_completes_the_message(queue, clock):
    queue.publish(b"m")
    slow = queue.consumer("g", ack_wait=1)
    fast = queue.consumer("g")
    [old] = slow.fetch()
    clock.advance(2)
    [new] = fast.fetch()
    old.ack()  # the work was done
    with pytest.raises(rqueue.AlreadyAcked, match=new.tag):
        new.ack()
    assert queue.stats().group("g").ack_floor == 1


@pytest.mark.parametrize("broken", [b"garbage", b"~\x01\x02"], ids=["text", "short-compact"])
def test_corrupted_record_is_dead_lettered_not_delivered(client, queue, broken):
    # given a record that does not parse (a compact one needs the tag and 6 bytes of published_ms)
    queue.publish_many([b"a", b"b"])
    client.redis.hset(queue.keys.msgs, 1, broken)
    # when the group fetches, only the good message is delivered
    c = queue.consumer("g")
    assert [d.data for d in c.fetch(10)] == [b"b"]
    # then the broken one is in the dead-letter queue byte for byte
    [dead] = queue.dead_letter_queue.peek()
    assert (dead.data, dead.headers["x-rq-reason"]) == (broken, "corrupted-record")


def test_short_compact_record_does_not_decode():
    with pytest.raises(rqueue.CorruptRecord, match="compact record of 3 bytes"):
        decode_record(b"~\x01\x02", "here")


def test_compact_and_text_records_decode_alike(client, queue, clock):
    # given the same payload stored compact (no headers) and as text (a delay, headers)
    queue.publish(b"p")
    queue.publish(b"p", delay=1)
    queue.publish(b"p", headers={"k": "v"})
    raw = client.redis.hmget(queue.keys.msgs, [1, 2, 3])
    assert raw[0][:1] == b"~" and raw[1][:1].isdigit() and raw[2][:1] == b":"
    # then peek and fetch read the same published time and payload from each
    assert [(m.data, m.published_ms) for m in queue.peek(3)] == [(b"p", clock.now_ms)] * 3
    clock.advance(2)
    got = queue.consumer("g").fetch(3)
    assert [(d.data, d.headers, d.published_ms) for d in got] == [
        (b"p", {}, clock.now_ms - 2000),
        (b"p", {}, clock.now_ms - 2000),
        (b"p", {"k": "v"}, clock.now_ms - 2000),
    ]


def test_dead_lettered_and_replayed_compact_record_keeps_its_published_time(client, queue, clock):
    # given a compact record dead-lettered by its group
    client.configure("orders", max_deliveries=1)
    queue.publish(b"p")
    published = clock.now_ms
    c = queue.consumer("g")
    clock.advance(5)
    c.fetch()[0].nack(delay=0)
    [d] = queue.dead_letters()
    assert (d.data, d.headers, d.published_ms) == (b"p", {}, published)
    # when it is replayed, the record is compact again with the first publish time
    client.configure("orders", max_deliveries=5)
    queue.replay_dead_letters("g")
    assert client.redis.hget(queue.keys.msgs, 1) == b"~" + published.to_bytes(6, "big") + b"p"
    [again] = c.fetch()
    assert (again.data, again.published_ms) == (b"p", published)


def test_purge_settles_everything_not_in_flight(queue, clock):
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
    queue.publish_many([b"m"] * 3)
    assert queue.purge() == {"": 3}
    assert queue.stats().depth == 0
    assert queue.consumer("late").fetch(10) == []


def test_ack_and_fetch_is_one_call_that_acks_before_it_fetches(client, queue, monkeypatch):
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("g", prefetch=2)
    first = c.fetch(2)

    def no_second_call(**_kw):
        raise AssertionError("ack_and_fetch sent the ack script as a call of its own")

    monkeypatch.setattr(client.scripts, "ack", no_second_call)
    # the two acks free the two prefetch slots for the fetch of the same call
    statuses, got, due_in = c.ack_and_fetch(first + ["9.1"], 5)
    assert statuses[:2] == [None, None] and isinstance(statuses[2], rqueue.DeliveryError)
    assert [d.seq for d in got] == [3] and due_in is None
    assert queue.stats().group("g").acked == 2


def test_ack_and_fetch_of_a_removed_consumer_joins_again_and_still_acks(client, queue):
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g")
    d1, d2 = c.fetch(2)
    # removed behind its back (as a dead member would be): both go back
    gk = queue.group_keys("g", c.settings())
    client.scripts.leave(keys=gk, args=queue._group_argv("g", c.name, c.settings(), [c.name, "graceful"]))
    statuses, got, _ = c.ack_and_fetch([d1], 5)
    # the late ack of the delivery it really received is accepted
    assert statuses == [None]
    assert [(d.seq, d.delivery_count) for d in got] == [(2, 2)]
    assert queue.stats().group("g").acked == 1
