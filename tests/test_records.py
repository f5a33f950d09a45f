"""Stored records: the compact and the text form, and what a record or a
delivery state that does not parse costs (only itself: it is dead-lettered
as corrupted, the rest flows)."""

from __future__ import annotations

import pytest
from support import logview
from support.raw import group_key

import rqueue
from rqueue.engine.record import decode_record, not_before

# -- the two forms -----------------------------------------------------------------------


def test_compact_and_text_records_decode_alike(client, queue, clock):
    # given the same payload stored compact (no headers) and as text (a delay, headers)
    queue.publish(b"p")
    queue.publish(b"p", delay=1)
    queue.publish(b"p", headers={"k": "v"})
    raw = [logview.record(client.redis, queue.keys, seq) or b"" for seq in (1, 2, 3)]
    assert raw[0][:1] == b"~" and raw[1][:1].isdigit() and raw[2][:1] == b":"
    # when they are peeked and fetched, then each reads as the same payload and published time
    assert [(m.data, m.published_ms) for m in queue.peek(3)] == [(b"p", clock.now_ms)] * 3
    clock.advance(2)
    got = queue.consumer("g").fetch(3)
    assert [(d.data, d.headers, d.published_ms) for d in got] == [
        (b"p", {}, clock.now_ms - 2000),
        (b"p", {}, clock.now_ms - 2000),
        (b"p", {"k": "v"}, clock.now_ms - 2000),
    ]


def test_short_compact_record_does_not_decode():
    # given a compact record too short for its published time
    # when it is decoded, then it is named corrupt with its length
    with pytest.raises(rqueue.CorruptRecord, match="compact record of 3 bytes"):
        decode_record(b"~\x01\x02", "here")


def test_a_text_records_not_before_is_read_from_its_head(client, queue, clock):
    # given a message published with a delay and one with headers alone
    queue.publish(b"p", delay=5)
    queue.publish(b"p", headers={"k": "v"})
    delayed, plain = (logview.record(client.redis, queue.keys, seq) or b"" for seq in (1, 2))
    # when their not-before is read, then the delayed one's is its time, the other has none
    assert not_before(delayed, "here") == clock.now_ms + 5000
    assert not_before(plain, "here") is None


@pytest.mark.parametrize("record", [b"soon:1:0:p", b"no head at all", b""])
def test_a_not_before_that_is_no_time_is_named_corrupt(record):
    with pytest.raises(rqueue.CorruptRecord, match="no time in ms"):
        not_before(record, "here")


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
    assert logview.record(client.redis, queue.keys, 1) == b"~" + published.to_bytes(6, "big") + b"p"
    [again] = c.fetch()
    assert (again.data, again.published_ms) == (b"p", published)


# -- what does not parse ---------------------------------------------------------------------


@pytest.mark.parametrize("broken", [b"garbage", b"~\x01\x02"], ids=["text", "short-compact"])
def test_corrupted_record_is_dead_lettered_not_delivered(client, queue, broken):
    # given a record that does not parse (a compact one needs the tag and 6 bytes of published_ms)
    queue.publish_many([b"a", b"b"])
    logview.replace(client.redis, queue.keys, 1, broken)
    # when the group fetches, then only the good message is delivered
    c = queue.consumer("g")
    assert [d.data for d in c.fetch(10)] == [b"b"]
    # and the broken one is in the dead-letter queue byte for byte
    [dead] = queue.dead_letter_queue.peek()
    assert (dead.data, dead.headers["x-rq-reason"]) == (broken, "corrupted-record")


def test_record_with_bad_header_json_costs_only_itself(client, queue):
    # given 3 records, the second with headers that do not parse
    queue.publish_many([b"1", b"2", b"3"])
    logview.replace(client.redis, queue.keys, 2, b":1:5:{nopeX")
    # when the group fetches, then the others are delivered
    c = queue.consumer("g")
    assert [d.seq for d in c.fetch(10)] == [1, 3]
    # and the broken one is a dead letter
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.reason) == (2, "corrupted-record")


def test_corrupt_delivery_state_is_moved_aside_and_the_rest_flows(client, queue):
    # given 3 nacked deliveries, the third's delivery state damaged
    queue.publish_many([b"1", b"2", b"3"])
    c = queue.consumer("g")
    for d in c.fetch(3):
        d.nack(delay=0)
    client.redis.hset(group_key(queue, "g", "dlv"), 3, b"nonsense")
    # when the group fetches, then the others come again
    assert [d.seq for d in c.fetch(10)] == [1, 2]
    # and the damaged one is a dead letter
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.reason) == (3, "corrupted-state")


def test_a_header_cut_inside_a_utf8_character_reads_with_a_replacement():
    # given a text record whose headers end in half of "é", as an older rqueue cut an error text
    headers = b'{"x-rq-error":"a\xc3"}'
    record = b":1700000000000:" + str(len(headers)).encode() + b":" + headers + b"payload"
    # when it is decoded, then it reads, the cut byte replaced, and the payload whole
    published, decoded, payload = decode_record(record, "test")
    assert (published, decoded, payload) == (1700000000000, {"x-rq-error": "a\ufffd"}, b"payload")
