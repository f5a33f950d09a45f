"""Dead letters: reject, term and max_deliveries, the history headers, drops,
dead-letter queues (own, named, their naming), replay exactly once to the
right group, purge and events (guarantee 10 in docs/guarantees.md)."""

from __future__ import annotations

import json
import logging

import pytest
from support import logview
from support.aio_bridge import parametrize_api
from support.raw import group_key
from support.servers import SINGLE_SERVERS

import rqueue
from rqueue.engine.keys import LAYOUT_ENV

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)


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


# -- dead-lettering -------------------------------------------------------------------------


def test_max_deliveries_dead_letters_after_the_last_attempt(client, queue, clock):
    # given max_deliveries 3 and a message that fails every attempt
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
    # when the third attempt's lease runs out
    clock.advance(2)
    # then the next message flows, and the failing one is a dead letter with its history
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
    assert h["x-rq-incarnation"] == client.redis.hget(queue.keys.meta, "inc").decode()
    s = queue.stats()
    assert (s.dead_letters, s.group("g").dead_lettered, s.group("g").ack_floor) == (1, 1, 1)


def test_reject_and_term_dead_letter_at_once(queue):
    # given two deliveries
    queue.publish_many([b"r", b"t"])
    c = queue.consumer("g")
    dr, dt = c.fetch(2)
    # when one is rejected and the other termed
    dr.reject()
    dt.term("bad schema")
    # then both are dead letters at once, with their reasons
    dead = queue.dead_letter_queue.peek()
    assert [(m.data, m.headers["x-rq-reason"]) for m in dead] == [(b"r", "rejected"), (b"t", "terminated")]
    assert dead[1].headers["x-rq-error"] == "bad schema"
    assert queue.stats().group("g").ack_floor == 2


def test_dead_letter_carries_its_history(client, queue, clock):
    # given max_deliveries 2 and a message with a header
    client.configure("orders", max_deliveries=2)
    published = queue.publish(b"p", headers={"trace": "abc"})
    c = queue.consumer("g")
    # when both attempts fail, a second apart
    c.fetch()[0].nack(delay=0, error="first failure")
    clock.advance(1)
    c.fetch()[0].nack(delay=0, error="second failure")
    # then the dead letter names where it came from, why, and when
    [d] = queue.dead_letters()
    assert (d.queue, d.group, d.seq, d.reason, d.deliveries) == ("orders", "g", published.seq, "max-deliveries", 2)
    assert (d.error, d.data, d.headers) == ("second failure", b"p", {"trace": "abc"})
    assert d.first_delivery_ms == clock.now_ms - 1000 and d.last_delivery_ms == clock.now_ms
    assert d.published_ms == clock.now_ms - 1000 and d.dead_lettered_ms == clock.now_ms


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


def test_dead_letter_none_drops_and_counts(client, queue):
    # given dead_letter None
    client.configure("orders", dead_letter=None)
    queue.publish(b"m")
    c = queue.consumer("g")
    # when a delivery is rejected
    c.fetch()[0].reject()
    # then it is dropped, counted, and settled
    s = queue.stats()
    assert (s.dead_letters, s.group("g").dropped, s.group("g").ack_floor) == (0, 1, 1)


def test_drop_is_logged_at_warning(client, queue, caplog):
    # given dead_letter None
    client.configure("orders", dead_letter=None)
    queue.publish(b"m")
    # when a delivery is rejected
    with caplog.at_level(logging.WARNING, logger="rqueue"):
        queue.consumer("g").fetch()[0].reject()
    # then the drop is logged at warning, naming the message
    assert any("dropped" in r.message and "orders/1" in r.message for r in caplog.records)


# -- dead-letter queues ----------------------------------------------------------------------


def test_dead_letter_queue_is_a_queue(client, queue):
    # given a rejected delivery
    queue.publish(b"m")
    queue.consumer("g").fetch()[0].reject()
    # when the dead-letter queue is consumed like any queue
    dlq = client.queue("DLQ.orders")
    [d] = dlq.consumer("inspect").fetch()
    # then it holds the message, in the queue's hash slot
    assert d.data == b"m" and d.headers["x-rq-reason"] == "rejected"
    assert dlq.keys.base.startswith(queue.keys.base)


def test_dead_letter_queue_naming_is_settable(backend, prefix):
    # given a client that names dead-letter queues <queue>.dead
    client = rqueue.connect(backend, prefix=prefix, dlq_prefix="", dlq_suffix=".dead")
    q = client.queue("orders")
    assert q.dead_letter_queue.name == "orders.dead"
    assert client.queue("orders.dead").keys == q.keys.dead_letters
    # when a delivery is rejected, then it lands in orders.dead, a queue like any
    q.publish(b"m")
    q.consumer("g").fetch()[0].reject()
    assert [m.data for m in client.queue("orders.dead").peek()] == [b"m"]
    assert "orders.dead" in client.queues()
    client.close()
    # and a naming without prefix and suffix is refused
    with pytest.raises(rqueue.InvalidInput, match="not both empty"):
        rqueue.connect(backend, prefix=prefix, dlq_prefix="", dlq_suffix="")


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_named_dead_letter_queue_is_refused_on_a_cluster(client, queue):
    # given a cluster client, when a named dead-letter target is configured
    with pytest.raises(rqueue.InvalidSetting, match="dead_letter='parking-lot'.*own dead-letter queue"):
        client.configure("orders", dead_letter="parking-lot")
    # then nothing was stored, and an override given to a consumer is refused as well
    assert queue.settings().dead_letter == "dlq"
    with pytest.raises(rqueue.InvalidSetting, match="another slot"):
        queue.consumer("g", dead_letter="parking-lot")


# a cluster refuses a named dead-letter queue (the test above)
@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)
def test_named_dead_letter_queue(client, queue):
    # given a named dead-letter queue
    client.configure("orders", dead_letter="parking-lot")
    queue.publish(b"m")
    # when a delivery is termed
    queue.consumer("g").fetch()[0].term("nope")
    # then it lands there, and replay takes it back from there
    [m] = client.queue("parking-lot").peek()
    assert (m.data, m.headers["x-rq-queue"], m.headers["x-rq-reason"]) == (b"m", "orders", "terminated")
    assert queue.replay_dead_letters().replayed == 1
    assert client.queue("parking-lot").peek() == []


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)
def test_stats_count_dead_letters_in_a_named_target(client, queue):
    # given a named dead-letter queue
    client.configure("orders", dead_letter="parking-lot")
    queue.publish(b"m")
    # when a delivery is rejected
    queue.consumer("g").fetch()[0].reject()
    # then the queue's stats count it
    assert queue.stats().dead_letters == 1


# -- replay --------------------------------------------------------------------------------------


def test_replay_returns_to_that_group_only_with_a_fresh_count(queue):
    # given two groups; group "a" dead-letters seq 2, group "b" acks everything
    queue.publish_many([b"1", b"2", b"3"])
    b = queue.consumer("b")
    kill(queue, "a", 2)
    b.ack(b.fetch(10))
    # when the dead letters are replayed
    result = queue.replay_dead_letters()
    # then only group "a" gets seq 2 again: its count starts again, but it says it was delivered before
    assert (result.replayed, result.by_group) == (1, {"a": 1})
    a = queue.consumer("a")
    ds = a.fetch(10)
    assert [(d.seq, d.data, d.delivery_count, d.redelivered) for d in ds] == [(2, b"2", 1, True)]
    assert b.fetch(10) == []
    ds[0].ack()
    s = queue.stats()
    assert (s.dead_letters, s.depth, s.group("a").in_flight) == (0, 0, 0)


def test_replay_with_two_groups_keeps_the_message_until_its_group_settles_it(queue):
    # given groups g and h; g dead-letters seq 1 and replays it
    queue.publish(b"m")
    g, h = queue.consumer("g"), queue.consumer("h")
    g.fetch()[0].reject()
    queue.replay_dead_letters()
    # when h settles seq 1 (the last group to do so)
    h.fetch()[0].ack()
    # then g still gets it, and only then is the record deleted
    [d] = g.fetch()
    assert (d.seq, d.data, d.delivery_count) == (1, b"m", 1)
    assert queue.stats().depth == 1
    d.ack()
    s = queue.stats()
    assert (s.depth, s.group("g").pending, s.group("h").pending) == (0, 0, 0)


def test_replayed_message_rejected_after_the_other_group_settled_is_dead_lettered_again(queue):
    # given groups g and h; g dead-letters seq 1 and replays it
    queue.publish(b"m")
    g, h = queue.consumer("g"), queue.consumer("h")
    g.fetch()[0].reject()
    queue.replay_dead_letters()
    # when h settles seq 1 and then g rejects it again
    [d] = g.fetch()
    h.fetch()[0].ack()
    d.reject()
    # then it is a dead letter again, not dropped
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.data) == (1, b"m")
    assert queue.stats().group("g").dropped == 0


def test_replay_in_a_single_group_leaves_exact_bookkeeping(queue):
    # given one group; seq 2 is dead-lettered above the floor and replayed
    queue.publish_many([b"1", b"2", b"3"])
    c = queue.consumer("g")
    d1, d2, d3 = c.fetch(3)
    d2.reject()
    queue.replay_dead_letters()
    # when the others are acked, then only the replayed one is pending
    c.ack([d1, d3])
    assert queue.stats().group("g").pending == 1
    # and once it is acked, the floor passes all three and nothing is left
    [again] = c.fetch()
    again.ack()
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending, queue.stats().depth) == (3, 0, 0)
    assert queue.client.redis.zcard(group_key(queue, "g", "acked")) == 0


def test_replay_keeps_user_headers_and_reason_and_does_not_count_a_redelivery(queue):
    # given a message with its own headers, rejected
    queue.publish(b"m", headers={"x-rq-custom": "mine", "k": "v"})
    c = queue.consumer("g")
    c.fetch()[0].reject(reason="because")
    # when it is replayed
    queue.replay_dead_letters()
    # then it comes with the same headers and the deliveries before its replay, not counted as a
    # redelivery, and the event names the reason
    [d] = c.fetch()
    assert d.headers == {"x-rq-custom": "mine", "k": "v", "x-rq-replayed-deliveries": "1"}
    assert queue.stats().group("g").redelivered == 0
    replayed = [e for e in queue.events() if e["event"] == "replayed"]
    assert replayed[0]["reason"] == "rejected"


def test_replay_of_a_seq_inside_a_run_of_acks_splits_the_run_and_counts_it_pending(queue):
    # given seq 1 held, 2 and 4 acked and 3 dead-lettered: one run 2..4 above the floor
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"])
    c = queue.consumer("g")
    d1, d2, d3, d4, d5 = c.fetch(5)
    c.ack([d2, d4])
    d3.reject()
    runs_key = group_key(queue, "g", "acked")
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


@pytest.mark.parametrize("layout", ["hash", "stream"])
@pytest.mark.parametrize("flow", [{"priority": 5}, {"key": "k"}], ids=["priority", "key"])
def test_a_dead_letter_handed_out_above_the_cursor_is_replayed_once(backend, prefix, clock, monkeypatch, layout, flow):
    # given a priority (or keyed) message handed out ahead of an older plain one, and rejected:
    # its dead letter's seq is above the group's cursor and ack floor
    monkeypatch.setenv(LAYOUT_ENV, layout)
    c = rqueue.connect(backend, prefix=prefix, clock=clock, settings_ttl=0)
    q = c.queue("orders")
    consumer = q.consumer("g", "a")
    q.publish(b"plain")
    q.publish(b"flow", **flow)
    (d,) = consumer.fetch(1)
    assert (d.data, d.seq) == (b"flow", 2)
    d.reject(reason="bad")
    assert q.stats().group("g").ack_floor == 0
    # when the operator replays it
    result = q.replay_dead_letters()
    # then it is replayed, and handed out once, beside the plain message
    assert (result.replayed, result.skipped, len(q.dead_letters())) == (1, 0, 0)
    handed = consumer.fetch(10)
    assert sorted((x.data, x.seq) for x in handed) == [(b"flow", 2), (b"plain", 1)]
    assert consumer.fetch(10) == []
    consumer.ack(handed)
    g = q.stats().group("g")
    assert (g.ack_floor, g.pending, q.stats().depth) == (2, 0, 0)
    c.close()


def test_a_dead_letter_above_the_cursor_after_a_reset_back_is_left_to_the_groups_fetches(queue):
    # given a priority message handed out ahead of an older plain one and rejected, then the
    # group reset back over it: its fetches hand it out again by themselves (group h keeps
    # the records stored)
    consumer = queue.consumer("g", "a")
    queue.create_group("h")
    queue.publish(b"plain")
    queue.publish(b"urgent", priority=5)
    (d,) = consumer.fetch(1)
    d.reject(reason="bad")
    queue.reset_group("g", "first")
    # when the operator replays it, then it is skipped (replayed too, it would go out twice)
    result = queue.replay_dead_letters()
    assert (result.replayed, result.skipped, len(queue.dead_letters())) == (0, 1, 1)
    # and the group is handed each message once
    handed = consumer.fetch(10)
    assert sorted(x.data for x in handed) == [b"plain", b"urgent"]
    assert consumer.fetch(10) == []


def test_replay_leaves_alone_a_dead_letter_whose_seq_is_not_a_whole_number(client, queue):
    # given seq 1 held, 2, 4 and 5 acked and 3 dead-lettered: one run 2..5
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"])
    queue.consumer("g", name="holder").fetch(1)
    kill(queue, "g", 3)
    runs_key = group_key(queue, "g", "acked")
    assert client.redis.zrange(runs_key, 0, -1, withscores=True) == [(b"2", 5.0)]
    # and its dead letter's seq header damaged to 3.5
    dlq = queue.dead_letter_queue
    [dseq] = logview.seqs(client.redis, dlq.keys)
    [letter] = dlq.peek()
    hjson = json.dumps({**letter.headers, "x-rq-seq": "3.5"}, separators=(",", ":")).encode()
    logview.replace(
        client.redis, dlq.keys, dseq, b":%d:%d:%s%s" % (letter.published_ms, len(hjson), hjson, letter.data)
    )
    # when the dead letters are replayed
    result = queue.replay_dead_letters()
    # then it is left alone, and the run and the count of what is pending are as they were
    assert (result.replayed, result.skipped) == (0, 1)
    assert client.redis.zrange(runs_key, 0, -1, withscores=True) == [(b"2", 5.0)]
    assert queue.stats().group("g").pending == 1 and queue.stats().dead_letters == 1


def test_replay_twice_or_interrupted_replays_each_once(queue):
    # given 4 dead letters
    queue.publish_many([b"m"] * 6)
    kill(queue, "g", 1, 2, 3, 4)
    # when a replay is interrupted after the first two
    assert queue.replay_dead_letters(limit=2).replayed == 2
    # then running it again (twice) finishes the job without doubling anything
    assert queue.replay_dead_letters().replayed == 2
    assert queue.replay_dead_letters().replayed == 0
    c = queue.consumer("g")
    assert sorted(d.seq for d in c.fetch(100)) == [1, 2, 3, 4]
    assert queue.stats().dead_letters == 0


def test_replay_filters_and_dry_run(queue):
    # given 2 rejected and 2 terminated dead letters
    queue.publish_many([b"m"] * 5)
    kill(queue, "g", 1, 2, reason="rejected", keep_rest=True)
    kill(queue, "g", 3, 4, reason="terminated")
    # when a dry run selects the terminated ones, then it counts them and changes nothing
    plan = queue.replay_dead_letters(reason="terminated", dry_run=True)
    assert (plan.selected, plan.replayed, plan.by_group) == (2, 0, {"g": 2})
    assert queue.stats().dead_letters == 4
    # and a replay by reason and seq range takes only those
    assert queue.replay_dead_letters(reason="terminated", seq_from=4, seq_to=4).replayed == 1
    assert [d.seq for d in queue.dead_letters()] == [1, 2, 3]
    assert [d.seq for d in queue.dead_letters(reason="rejected", limit=1)] == [1]


def test_replayed_message_can_die_and_be_replayed_again(queue):
    # given a dead letter that was replayed
    queue.publish(b"m")
    kill(queue, "g", 1)
    queue.replay_dead_letters()
    # when it dies again
    kill(queue, "g", 1, reason="terminated")
    # then it is a dead letter again, and can be replayed again
    [d] = queue.dead_letters()
    assert (d.seq, d.reason, d.deliveries) == (1, "terminated", 1)
    assert queue.replay_dead_letters().replayed == 1


def test_replay_puts_back_a_record_an_older_consumer_could_not_read(client, queue):
    # given a compact record that an older consumer (which reads only the
    # text form) moved aside byte for byte as corrupted-record
    queue.publish(b"hello")
    record = logview.record(client.redis, queue.keys, 1)
    assert record is not None
    kill(queue, "g", 1)
    dlq = queue.dead_letter_queue
    [dseq] = logview.seqs(client.redis, dlq.keys)
    [letter] = dlq.peek()
    headers = {**letter.headers, "x-rq-reason": "corrupted-record", "x-rq-published": ""}
    hjson = json.dumps(headers, separators=(",", ":")).encode()
    logview.replace(client.redis, dlq.keys, dseq, b":%d:%d:%s%s" % (letter.published_ms, len(hjson), hjson, record))
    # when it is replayed
    assert queue.replay_dead_letters("g").replayed == 1
    # then the record is back as it was, and reads as the first publish
    assert logview.record(client.redis, queue.keys, 1) == record
    [d] = queue.consumer("g").fetch()
    assert (d.data, d.headers, d.published_ms) == (
        b"hello",
        {"x-rq-replayed-deliveries": "1"},
        int.from_bytes(record[1:7], "big"),
    )


# -- purge and events -------------------------------------------------------------------------------


def test_purge_deletes_selected_dead_letters(queue):
    # given 3 dead letters
    queue.publish_many([b"m"] * 3)
    kill(queue, "g", 1, 2, 3)
    # when the first two are purged, then only the third is left, and the purge is an event
    assert queue.purge_dead_letters(seq_to=2) == 2
    assert [d.seq for d in queue.dead_letters()] == [3]
    assert queue.events()[-1]["event"] == "purged"


def test_purge_leaves_dead_letters_newer_than_its_time_bound(queue, clock):
    # given two dead letters, and a third one a second later
    queue.publish_many([b"m"] * 3)
    kill(queue, "g", 1, 2, keep_rest=True)
    bound = clock.now_ms
    clock.advance(1)
    kill(queue, "g", 3)
    # when a purge is bounded by the time of the first two, then the third stays
    assert queue.purge_dead_letters(dead_lettered_to=bound) == 2
    assert [d.seq for d in queue.dead_letters()] == [3]
    # and a bound that is no time is refused, changing nothing
    with pytest.raises(rqueue.InvalidInput, match="dead_lettered_to"):
        queue.purge_dead_letters(dead_lettered_to=-1)
    assert len(queue.dead_letters()) == 1


def test_events_record_dead_letters_drops_and_replays(client, queue):
    # given a dead letter that is replayed, then a drop
    queue.publish_many([b"m", b"n"])
    kill(queue, "g", 1, keep_rest=True)
    queue.replay_dead_letters()
    client.configure("orders", dead_letter=None)
    kill(queue, "g", 2)
    # then the events list them in order
    kinds = [(e["event"], e["seq"], e["group"]) for e in queue.events()]
    assert kinds == [("dead-lettered", "1", "g"), ("replayed", "1", "g"), ("dropped", "2", "g")]


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_an_error_text_cut_to_its_limit_stays_whole_characters(client, queue, char):
    # given a delivery rejected with a reason of more than 1,024 bytes, of characters of 2 to 4 bytes
    client.configure("orders", events=["failed"])
    queue.publish(b"x")
    c = queue.consumer("g")
    [d] = c.fetch(1)
    reason = "a" + char * 600
    # when it is dead-lettered, its error cut to 1,024 bytes in the script
    c.reject(d, reason=reason)
    # then the dead-letter queue and the event read, each text a prefix of whole characters, within the limit
    [dead] = queue.dead_letters()
    assert reason.startswith(dead.error) and 1024 - len(char.encode()) < len(dead.error.encode()) <= 1024
    [failed] = [e for e in queue.events() if e["event"] == "failed"]
    assert reason.startswith(failed["reason"]) and len(failed["reason"].encode()) <= 1024


@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)  # a named dead-letter queue
def test_a_dead_letter_of_a_queue_deleted_and_made_again_is_not_replayed_into_the_new_one(client):
    # given a queue whose named dead-letter queue outlives it, and seq 2 of it rejected
    client.configure("orders", dead_letter="shared-dlq")
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish_many([b"old-1", b"old-2", b"old-3"])
    for d in c.fetch(10):
        d.reject() if d.seq == 2 else d.ack()
    # when the queue is deleted and made again, with a group that acks its own seqs 1 to 3
    # and another that keeps their records
    q.delete(force=True)
    q = client.queue("orders")
    q.create_group("g")
    q.create_group("h")
    q.publish_many([b"new-1", b"new-2", b"new-3"])
    c = q.consumer("g")
    c.ack(c.fetch(10))
    # and the dead letters are replayed
    result = q.replay_dead_letters()
    # then the old letter is left alone, not reopened as the new seq 2
    assert (result.replayed, result.skipped) == (0, 1)
    assert c.fetch(10) == []
    [letter] = q.dead_letters()
    assert (letter.seq, letter.data) == (2, b"old-2")
