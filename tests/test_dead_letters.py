"""Dead letters: history headers, replay exactly once to the right group,
purge, events, named targets, drops, unroutable messages (SPEC guarantee 10)."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import SINGLE_SERVERS

import rqueue


def kill(queue, group, *seqs, reason="rejected", keep_rest=False):
    """Dead-letters the given seqs for ``group``; acks every other message,
    or with ``keep_rest`` puts them back."""
    c = queue.consumer(group, name=f"killer-{group}")
    for d in c.fetch(100):
        if d.seq in seqs:
            d.term(reason) if reason == "terminated" else d.reject(reason=reason)
        elif keep_rest:
            d.nack(delay=0)
        else:
            d.ack()
    c.close()


def test_dead_letter_carries_its_history(client, queue, clock):
    client.configure("orders", max_deliveries=2)
    published = queue.publish(b"p", headers={"trace": "abc"})
    c = queue.consumer("g")
    c.fetch()[0].nack(delay=0, error="first failure")
    clock.advance(1)
    c.fetch()[0].nack(delay=0, error="second failure")
    [d] = queue.dead_letters()
    assert (d.queue, d.group, d.seq, d.reason, d.deliveries) == ("orders", "g", published.seq, "max-deliveries", 2)
    assert (d.error, d.data, d.headers) == ("second failure", b"p", {"trace": "abc"})
    assert d.first_delivery_ms == clock.now_ms - 1000 and d.last_delivery_ms == clock.now_ms
    assert d.published_ms == clock.now_ms - 1000 and d.dead_lettered_ms == clock.now_ms


def test_replay_puts_back_a_record_an_older_consumer_could_not_read(client, queue):
    # given a compact record that a consumer of an older version (which knew
    # only the text form) moved aside byte for byte as corrupted-record
    queue.publish(b"hello")
    record = client.redis.hget(queue.keys.msgs, 1)
    kill(queue, "g", 1)
    dlq = queue.dead_letter_queue
    [dseq] = [int(s) for s in client.redis.hkeys(dlq.keys.msgs)]
    [letter] = dlq.peek()
    headers = {**letter.headers, "x-rq-reason": "corrupted-record", "x-rq-published": ""}
    hjson = json.dumps(headers, separators=(",", ":")).encode()
    client.redis.hset(dlq.keys.msgs, dseq, b":%d:%d:%s%s" % (letter.published_ms, len(hjson), hjson, record))
    # when it is replayed by this version
    assert queue.replay_dead_letters("g").replayed == 1
    # then the record is back as it was, and reads as the first publish
    assert client.redis.hget(queue.keys.msgs, 1) == record
    [d] = queue.consumer("g").fetch()
    assert (d.data, d.headers, d.published_ms) == (b"hello", {}, int.from_bytes(record[1:7], "big"))


def test_replay_returns_to_that_group_only_with_a_fresh_count(queue):
    # given two groups; group "a" dead-letters seq 2, group "b" acks everything
    queue.publish_many([b"1", b"2", b"3"])
    b = queue.consumer("b")
    kill(queue, "a", 2)
    b.ack(b.fetch(10))
    # when the dead letters are replayed
    result = queue.replay_dead_letters()
    # then only group "a" gets seq 2 again, as a first delivery
    assert (result.replayed, result.by_group) == (1, {"a": 1})
    a = queue.consumer("a")
    ds = a.fetch(10)
    assert [(d.seq, d.data, d.delivery_count, d.redelivered) for d in ds] == [(2, b"2", 1, False)]
    assert b.fetch(10) == []
    ds[0].ack()
    s = queue.stats()
    assert (s.dead_letters, s.depth, s.group("a").in_flight) == (0, 0, 0)


def test_replay_of_a_seq_inside_a_run_of_acks_splits_the_run_and_counts_it_pending(queue):
    # given seq 1 held, 2 and 4 acked and 3 dead-lettered: one run 2..4 above the floor
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"])
    c = queue.consumer("g")
    d1, d2, d3, d4, d5 = c.fetch(5)
    c.ack([d2, d4])
    d3.reject()
    runs_key = queue.keys.group("g").as_list()[9]
    r = queue.client.redis
    assert r.zrange(runs_key, 0, -1, withscores=True) == [(b"2", 4.0)]
    assert queue.stats().group("g").pending == 2
    # when it is replayed
    assert queue.replay_dead_letters().replayed == 1
    # then the run is split around it and it counts as pending again
    assert r.zrange(runs_key, 0, -1, withscores=True) == [(b"2", 2.0), (b"4", 4.0)]
    assert queue.stats().group("g").pending == 3
    # and once it and the rest are acked, the floor passes everything
    [again] = c.fetch(5)
    assert again.seq == 3
    c.ack([again, d1, d5])
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending, r.zcard(runs_key), queue.stats().depth) == (5, 0, 0, 0)


def test_replay_leaves_alone_a_dead_letter_whose_seq_is_not_a_whole_number(client, queue):
    # given seq 1 held, 2, 4 and 5 acked and 3 dead-lettered: one run 2..5
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"])
    queue.consumer("g", name="holder").fetch(1)
    kill(queue, "g", 3)
    runs_key = queue.keys.group("g").as_list()[9]
    assert client.redis.zrange(runs_key, 0, -1, withscores=True) == [(b"2", 5.0)]
    # and its dead letter's seq header damaged to 3.5
    dlq = queue.dead_letter_queue
    [dseq] = [int(s) for s in client.redis.hkeys(dlq.keys.msgs)]
    [letter] = dlq.peek()
    hjson = json.dumps({**letter.headers, "x-rq-seq": "3.5"}, separators=(",", ":")).encode()
    client.redis.hset(dlq.keys.msgs, dseq, b":%d:%d:%s%s" % (letter.published_ms, len(hjson), hjson, letter.data))
    # when the dead letters are replayed
    result = queue.replay_dead_letters()
    # then it is left alone, and the run and the count of what is pending are as they were
    assert (result.replayed, result.skipped) == (0, 1)
    assert client.redis.zrange(runs_key, 0, -1, withscores=True) == [(b"2", 5.0)]
    assert queue.stats().group("g").pending == 1 and queue.stats().dead_letters == 1


def test_replay_twice_or_interrupted_replays_each_once(queue):
    queue.publish_many([b"m"] * 6)
    kill(queue, "g", 1, 2, 3, 4)
    # an interrupted run replayed only the first two
    assert queue.replay_dead_letters(limit=2).replayed == 2
    # running again (twice) finishes the job without doubling anything
    assert queue.replay_dead_letters().replayed == 2
    assert queue.replay_dead_letters().replayed == 0
    c = queue.consumer("g")
    assert sorted(d.seq for d in c.fetch(100)) == [1, 2, 3, 4]
    assert queue.stats().dead_letters == 0


def test_replay_filters_and_dry_run(queue):
    queue.publish_many([b"m"] * 5)
    kill(queue, "g", 1, 2, reason="rejected", keep_rest=True)
    kill(queue, "g", 3, 4, reason="terminated")
    plan = queue.replay_dead_letters(reason="terminated", dry_run=True)
    assert (plan.selected, plan.replayed, plan.by_group) == (2, 0, {"g": 2})
    assert queue.stats().dead_letters == 4  # a dry run changes nothing
    assert queue.replay_dead_letters(reason="terminated", seq_from=4, seq_to=4).replayed == 1
    assert [d.seq for d in queue.dead_letters()] == [1, 2, 3]
    assert [d.seq for d in queue.dead_letters(reason="rejected", limit=1)] == [1]


def test_replayed_message_can_die_and_be_replayed_again(queue):
    queue.publish(b"m")
    kill(queue, "g", 1)
    queue.replay_dead_letters()
    kill(queue, "g", 1, reason="terminated")
    [d] = queue.dead_letters()
    assert (d.seq, d.reason, d.deliveries) == (1, "terminated", 1)
    assert queue.replay_dead_letters().replayed == 1


def test_crash_after_dead_lettering_loses_and_doubles_nothing(backend, prefix, clock):
    # given a message dead-lettered by a consumer whose process then dies
    first = rqueue.connect(backend, prefix=prefix, clock=clock)
    q = first.queue("orders")
    q.publish_many([b"a", b"b"])
    c = q.consumer("g", name="dies")
    d1, d2 = c.fetch(2)
    d1.reject()
    first.close()  # no graceful leave: d2 is still held
    # when a new process takes over after the lease ran out
    clock.advance(31)
    second = rqueue.connect(backend, prefix=prefix, clock=clock)
    q2 = second.queue("orders")
    got = q2.consumer("g").fetch(10)
    # then the dead letter is there once, and only the other message comes back
    assert [d.seq for d in got] == [2] and [d.seq for d in q2.dead_letters()] == [1]
    second.close()


def test_purge_deletes_selected_dead_letters(queue):
    queue.publish_many([b"m"] * 3)
    kill(queue, "g", 1, 2, 3)
    assert queue.purge_dead_letters(seq_to=2) == 2
    assert [d.seq for d in queue.dead_letters()] == [3]
    assert queue.events()[-1]["event"] == "purged"


def test_events_record_dead_letters_drops_and_replays(client, queue):
    queue.publish_many([b"m", b"n"])
    kill(queue, "g", 1, keep_rest=True)
    queue.replay_dead_letters()
    client.configure("orders", dead_letter=None)
    kill(queue, "g", 2)
    kinds = [(e["event"], e["seq"], e["group"]) for e in queue.events()]
    assert kinds == [("dead-lettered", "1", "g"), ("replayed", "1", "g"), ("dropped", "2", "g")]


def test_drop_is_logged_at_warning(client, queue, caplog):
    client.configure("orders", dead_letter=None)
    queue.publish(b"m")
    with caplog.at_level(logging.WARNING, logger="rqueue"):
        queue.consumer("g").fetch()[0].reject()
    assert any("dropped" in r.message and "orders/1" in r.message for r in caplog.records)


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_named_dead_letter_queue_is_refused_on_a_cluster(client, queue):
    # given a cluster client, when a named dead-letter target is configured
    with pytest.raises(rqueue.InvalidSetting, match="dead_letter='parking-lot'.*own dead-letter queue"):
        client.configure("orders", dead_letter="parking-lot")
    # then nothing was stored, and an override given to a consumer is refused as well
    assert queue.settings().dead_letter == "dlq"
    with pytest.raises(rqueue.InvalidSetting, match="another slot"):
        queue.consumer("g", dead_letter="parking-lot")


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a cluster refuses it (test above)
def test_named_dead_letter_queue(client, queue):
    client.configure("orders", dead_letter="parking-lot")
    queue.publish(b"m")
    queue.consumer("g").fetch()[0].term("nope")
    [m] = client.queue("parking-lot").peek()
    assert (m.data, m.headers["x-rq-queue"], m.headers["x-rq-reason"]) == (b"m", "orders", "terminated")
    assert queue.replay_dead_letters().replayed == 1
    assert client.queue("parking-lot").peek() == []


def test_poison_message_fails_forever_while_others_flow(client, queue, clock):
    client.configure("orders", max_deliveries=-1, redelivery_delay=1)
    queue.publish_many([b"poison"] + [b"ok"] * 20)
    c = queue.consumer("g", prefetch=5)
    done = 0
    for _ in range(40):
        for d in c.fetch(5):
            if d.data == b"poison":
                d.nack(error="always fails")
            else:
                d.ack()
                done += 1
        clock.advance(0.5)
    g = queue.stats().group("g")
    assert done == 20 and g.ack_floor == 0 and g.pending == 1 and g.nacked >= 10


def test_unroutable_mandatory_publish_goes_to_the_alternate(client, queue):
    client.configure("orders", alternate="orders-unrouted")
    [r] = queue.publish_many([b"m"], mandatory=True)
    assert (r.alternate, r.seq) == ("orders-unrouted", 1)
    assert queue.stats().last_seq == 0
    assert [m.data for m in client.queue("orders-unrouted").peek()] == [b"m"]


def test_unroutable_without_alternate_stores_nothing(queue):
    with pytest.raises(rqueue.Unroutable, match="orders"):
        queue.publish(b"m", mandatory=True)
    assert queue.stats().last_seq == 0


def test_dead_letter_queue_naming_is_settable(backend, prefix):
    client = rqueue.connect(backend, prefix=prefix, dlq_prefix="", dlq_suffix=".dead")
    q = client.queue("orders")
    assert q.dead_letter_queue.name == "orders.dead"
    assert client.queue("orders.dead").keys == q.keys.dead_letters
    q.publish(b"m")
    q.consumer("g").fetch()[0].reject()
    assert [m.data for m in client.queue("orders.dead").peek()] == [b"m"]
    assert "orders.dead" in client.queues()
    client.close()
    with pytest.raises(rqueue.InvalidInput, match="not both empty"):
        rqueue.connect(backend, prefix=prefix, dlq_prefix="", dlq_suffix="")


def test_lease_expiry_follows_the_redelivery_policy(client, queue, clock):
    client.configure("orders", ack_wait=1, redelivery_delay=5)
    queue.publish(b"m")
    c = queue.consumer("g")
    c.fetch()
    clock.advance(1)  # the lease runs out: the message waits 5 s more
    assert c.fetch() == []
    assert queue.stats().group("g").delayed == 1
    clock.advance(4.9)
    assert c.fetch() == []
    clock.advance(0.1)
    assert [d.delivery_count for d in c.fetch()] == [2]


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)
def test_stats_count_dead_letters_in_a_named_target(client, queue):
    client.configure("orders", dead_letter="parking-lot")
    queue.publish(b"m")
    queue.consumer("g").fetch()[0].reject()
    assert queue.stats().dead_letters == 1
