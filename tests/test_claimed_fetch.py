"""The claim (lua/fetch.lua, docs/layout-d-plan.md step 6): in the stream
layout a fetch that takes CLAIM_MIN first deliveries or more from the
cursor takes them without reading their records, and the client reads
those with one XRANGE of its own (rqueue/engine/commands.py, fill_claimed).
What a consumer gets must not differ from the one-round-trip scan's: the
same payloads, headers and order; delayed messages not before their time;
a missing record dead-lettered as missing-record; nothing below the
group's since dead-lettered. Every backend, both clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import logview
from support.aio_bridge import parametrize_api
from support.servers import wait_for

import rqueue
from rqueue.engine import commands
from rqueue.engine.async_scripts import AsyncScripts
from rqueue.engine.commands import CALL_MAX, CLAIM_MIN
from rqueue.engine.record import decode_record
from rqueue.engine.scripts import Scripts
from rqueue.errors import CorruptRecord
from rqueue.migration import migrate_prefix

pytest_generate_tests = parametrize_api

WAIT = 30  # ack_wait, s

# The publish arguments of the n-th message: plain, with a priority, or with a key of its own.
FLOW_ARGS: dict[str, Any] = {
    "plain": lambda n: {},
    "priority": lambda n: {"priority": 5},
    "key": lambda n: {"key": f"k{n}"},
}


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """The (first, last) seqs of every claim a fetch filled in this test."""
    seen: list[tuple[int, int]] = []
    fill = commands.fill_claimed

    def spy(reply: commands.FetchReply, entries: Any) -> commands.FetchReply:
        assert reply.claim is not None
        seen.append(reply.claim[1:])
        return fill(reply, entries)

    monkeypatch.setattr(commands, "fill_claimed", spy)
    yield seen


def test_a_large_fetch_claims_its_first_deliveries_and_hands_out_their_records_as_stored(client, claims):
    # given compact messages and messages with headers, in one queue
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 61)])
    q.publish(b"with-headers", headers={"k": "v"})
    q.publish_many([b"m%d" % i for i in range(62, 301)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # when the consumer fetches 100, then 100 more
    first = c.fetch(100)
    second = c.fetch(100)
    # then each fetch claimed its seqs, and every record came as published, in order
    assert claims == [(1, 100), (101, 200)]
    got = first + second
    assert [d.seq for d in got] == list(range(1, 201))
    assert [d.data for d in got if d.seq != 61] == [b"m%d" % i for i in range(1, 201) if i != 61]
    assert (got[60].data, got[60].headers) == (b"with-headers", {"k": "v"})
    assert all(d.delivery_count == 1 and not d.redelivered for d in got)
    assert len({d.published_ms for d in got}) >= 1 and all(d.published_ms > 0 for d in got)
    # and they settle as any delivery does
    c.ack(got)
    assert q.stats().groups[0].in_flight == 0


def test_a_claims_deliveries_are_left_out_of_the_reply_and_put_in_by_the_client(client, monkeypatch):
    # given 300 messages and a spy on the replies fill_claimed is given and gives back
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 301)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    given: list[tuple[tuple[int, int, int], int, int]] = []
    fill = commands.fill_claimed

    def spy(reply: commands.FetchReply, entries: Any) -> commands.FetchReply:
        filled = fill(reply, entries)
        assert reply.claim is not None
        given.append((reply.claim, len(reply.raw), len(filled.raw)))
        return filled

    monkeypatch.setattr(commands, "fill_claimed", spy)
    # when the consumer fetches 100, then 150 (more than one claim takes)
    got = c.fetch(100) + c.fetch(150)
    # then each reply ended where its claim's deliveries belong, or held only the scan's after them,
    # and the client put three items a claimed seq in
    (at1, lo1, hi1), len1, filled1 = given[0][0], given[0][1], given[0][2]
    assert (lo1, hi1) == (1, 100) and len1 == at1 and filled1 == at1 + 3 * 100
    (at2, lo2, hi2), len2, filled2 = given[1][0], given[1][1], given[1][2]
    assert (lo2, hi2) == (101, 100 + CALL_MAX) and len2 == at2 + 3 * (150 - CALL_MAX)
    assert filled2 == len2 + 3 * CALL_MAX
    # and every delivery came once, in order, as a first delivery
    assert [d.seq for d in got] == list(range(1, 251)) and {d.delivery_count for d in got} == {1}
    assert [d.data for d in got] == [b"m%d" % i for i in range(1, 251)]


def test_a_partitioned_queue_claims_in_each_partition(client, claims):
    # given a queue of 2 partitions with 300 messages spread over them
    q = client.queue("orders", partitions=2)
    q.publish_many([b"m%d" % i for i in range(300)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # when a consumer drains it 100 at a time
    got: list[Any] = []
    while batch := c.fetch(100):
        got += batch
        c.ack(batch)
    # then every message came once, with its payload, and the partitions' fetches claimed
    assert sorted(d.data for d in got) == sorted(b"m%d" % i for i in range(300))
    assert claims


def test_fewer_first_deliveries_than_claim_min_are_read_by_the_script(client, claims):
    # given fewer messages waiting than a claim takes
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, CLAIM_MIN)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # when a large fetch takes them
    got = c.fetch(100)
    # then nothing was claimed, and every message came
    assert claims == []
    assert [d.data for d in got] == [b"m%d" % i for i in range(1, CLAIM_MIN)]


def test_a_claim_stops_at_call_max_and_the_scan_reads_the_rest(client, claims):
    # given more messages than one call record holds
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 301)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # when one fetch takes 200
    got = c.fetch(200)
    # then the first CALL_MAX were claimed, and the rest read: all in order
    assert claims == [(1, CALL_MAX)]
    assert [d.data for d in got] == [b"m%d" % i for i in range(1, 201)]


def test_no_claim_while_a_delayed_publish_is_still_to_come(client, claims, clock):
    # given a queue with a message delayed by a minute among undelayed ones
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 41)])
    q.publish(b"later", delay=60)
    q.publish_many([b"m%d" % i for i in range(42, 101)])
    c = q.consumer("g", "c1", ack_wait=3600, prefetch=1000)
    # when a consumer fetches them all before its time
    got = c.fetch(100)
    # then nothing was claimed, and the delayed one was not handed out
    assert claims == []
    assert [d.seq for d in got] == [s for s in range(1, 101) if s != 41]
    # and when its time has come, it comes; with no delay to come, later fetches claim again
    clock.advance(61)
    assert [d.data for d in c.fetch(100)] == [b"later"]
    q.publish_many([b"n%d" % i for i in range(CLAIM_MIN)])
    assert [d.data for d in c.fetch(100)] == [b"n%d" % i for i in range(CLAIM_MIN)]
    assert claims == [(101, 100 + CLAIM_MIN)]


@pytest.mark.parametrize("waiting", [5, 150], ids=["fewer-than-the-claim", "more-than-the-claim"])
def test_delayed_messages_the_cursor_passed_do_not_stop_the_claim(client, claims, clock, waiting):
    # given a queue with messages delayed by a minute, which a consumer's
    # fetch passed over (they wait in the group's delay set), then plain
    # ones; fewer delayed than a claim takes are read from the schedule,
    # more are looked up by the claim's seqs (ZMSCORE)
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 11)])
    q.publish_many([b"later%d" % i for i in range(1, waiting + 1)], delay=60)
    c = q.consumer("g", "c1", ack_wait=3600, prefetch=1000)
    assert [d.seq for d in c.fetch(100)] == list(range(1, 11))
    q.publish_many([b"n%d" % i for i in range(1, 101)])
    # when it fetches again while the delayed ones are still to come
    got = c.fetch(100)
    # then the plain ones above the cursor were claimed, and no delayed one came early
    first = 11 + waiting
    assert claims == [(first, first + 99)]
    assert [d.data for d in got] == [b"n%d" % i for i in range(1, 101)]
    # and a delayed publish above the cursor stops the claim until the cursor passes it
    q.publish(b"later%d" % (waiting + 1), delay=60)
    q.publish_many([b"p%d" % i for i in range(1, 101)])
    assert [d.data for d in c.fetch(100)] == [b"p%d" % i for i in range(1, 101)]
    assert claims == [(first, first + 99)]
    q.publish_many([b"q%d" % i for i in range(1, 101)])
    assert [d.data for d in c.fetch(100)] == [b"q%d" % i for i in range(1, 101)]
    assert claims == [(first, first + 99), (first + 201, first + 300)]
    # and when their time comes, the delayed ones come, each once
    clock.advance(61)
    came = [d.data for d in c.fetch(1000)]
    assert sorted(came) == sorted(b"later%d" % i for i in range(1, waiting + 2))
    assert c.fetch(100) == []


def test_a_queue_with_priority_messages_is_read_by_the_script(client, claims):
    # given a queue that had a message with a priority (stubs in the log)
    q = client.queue("orders")
    q.publish(b"urgent", priority=9)
    q.publish_many([b"m%d" % i for i in range(1, 100)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # when a consumer fetches them
    got = c.fetch(100)
    # then nothing was claimed, and the priority message came first
    assert claims == []
    assert [d.data for d in got] == [b"urgent"] + [b"m%d" % i for i in range(1, 100)]


def test_a_claimed_seq_whose_entry_is_gone_is_dead_lettered_as_missing_record(client, claims):
    # given 100 messages, and the entry of seq 5 deleted from the log (an operator's XDEL)
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 101)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    assert logview.delete(client.redis, q.keys, 5) == 1
    # when a consumer fetches them
    got = c.fetch(100)
    # then the claim handed out the other 99, and seq 5 is a dead letter saying it was lost
    assert claims == [(1, 100)]
    assert [d.seq for d in got] == [s for s in range(1, 101) if s != 5]
    dead = q.dead_letters()
    assert [(d.seq, d.reason) for d in dead] == [(5, "missing-record")]
    # and nothing of it is held: the group's in-flight count is what the consumer holds
    c.ack(got)
    assert q.stats().groups[0].in_flight == 0


def test_a_delayed_message_claimed_because_the_schedule_was_deleted_waits_for_its_time_unrun(client, claims, clock):
    # given a message delayed by a minute among plain ones, and the queue's
    # schedule deleted (an operator's DEL), so that the claim cannot see it
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 41)])
    q.publish(b"later", delay=60)
    q.publish_many([b"m%d" % i for i in range(42, 101)])
    assert client.redis.delete(q.keys.sched) == 1
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # when a consumer fetches them all before its time
    got = c.fetch(100)
    # then the claim took them, and the delayed one was not handed out, nor dead-lettered
    assert claims == [(1, 100)]
    assert [d.seq for d in got] == [s for s in range(1, 101) if s != 41]
    assert q.dead_letters() == []
    (event,) = [e for e in q.events() if e["event"] == "corrupt"]
    assert event["seq"] == "41" and "before its time" in event["reason"]
    c.ack(got)
    assert c.fetch(100) == [] and q.stats().groups[0].in_flight == 0
    # and when its time comes, it comes once, as a first delivery
    clock.advance(61)
    (later,) = c.fetch(100)
    assert (later.seq, later.data, later.delivery_count) == (41, b"later", 1)
    c.ack(later)
    assert c.fetch(100) == []
    assert q.stats().groups[0].ack_floor == 100


def test_a_delayed_message_whose_claim_ran_out_before_it_was_set_aside_still_waits_for_its_time(
    client, claims, clock, monkeypatch
):
    # given a delayed message claimed before its time (the schedule deleted) by
    # a consumer whose set_aside call failed (its process died there)
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 41)])
    q.publish(b"later", delay=3600)
    q.publish_many([b"m%d" % i for i in range(42, 101)])
    client.redis.delete(q.keys.sched)
    c1 = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)

    def died(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the process died here")

    with monkeypatch.context() as patched:
        patched.setattr(commands, "set_aside", died)
        patched.setattr("rqueue.engine.async_commands.set_aside", died)
        with pytest.raises(ConnectionError):
            c1.fetch(100)
    # when its lease runs out and another consumer fetches
    clock.advance(WAIT + 1)
    c2 = q.consumer("g", "c2", ack_wait=WAIT, prefetch=1000)
    got = c2.fetch(1000)
    # then the 99 come again, and the delayed one, out again before its time, is set aside too
    assert sorted(d.seq for d in got) == [s for s in range(1, 101) if s != 41]
    assert all(d.delivery_count == 2 for d in got)
    c2.ack(got)
    assert c2.fetch(100) == [] and q.dead_letters() == []
    # and it comes at its time, once
    clock.advance(3600)
    assert [(d.seq, d.data) for d in c2.fetch(100)] == [(41, b"later")]


def migrated_with_gaps(backend: str, prefix: str, clock: Any) -> None:
    """Queue orders of 100 messages in the hash layout, whose only group (a)
    settled seqs 50..60 above its floor (the hash layout deleted those
    records one by one), then moved to the stream layout (rqueue migrate)."""
    old = logview.connect(backend, prefix, clock, "hash")
    try:
        q = old.queue("orders")
        q.publish_many([b"m%d" % i for i in range(1, 101)])
        a = q.consumer("a", "c1", ack_wait=WAIT, prefetch=1000)
        a.ack([d for d in a.fetch(100) if 50 <= d.seq <= 60])
        assert migrate_prefix(old).marked
    finally:
        old.close()


def test_a_group_made_after_a_migration_passes_over_the_seqs_the_hash_layout_deleted(backend, prefix, clock, claims):
    # given a hash-layout queue of 100 whose only group settled seqs 50..60 above its floor, so the
    # hash layout deleted those records one by one, then moved to the stream layout
    migrated_with_gaps(backend, prefix, clock)
    new = logview.connect(backend, prefix, clock, "stream")
    try:
        q = new.queue("orders")
        # when a group made after the move at the first seq fetches (its cursor below "gaps")
        q.create_group("b", start="first")
        got = q.consumer("b", "c2", ack_wait=WAIT, prefetch=1000).fetch(100)
        # then it gets every stored record, none of the deleted ones is a dead letter: nothing was claimed
        assert [d.seq for d in got] == [s for s in range(1, 101) if not 50 <= s <= 60]
        assert q.dead_letters() == []
        assert claims == []
        # and once past "gaps", its fetches claim again
        q.publish_many([b"n%d" % i for i in range(CLAIM_MIN)])
        assert len(q.consumer("b", "c2", ack_wait=WAIT, prefetch=1000).fetch(100)) == CLAIM_MIN
        assert claims == [(101, 100 + CLAIM_MIN)]
    finally:
        new.close()


@pytest.mark.sync_only("the doctor takes a sync queue")
@pytest.mark.parametrize("kind", ["plain", "priority", "key"])
@pytest.mark.parametrize("batch", [1, 100])
def test_after_a_migration_an_entry_deleted_above_its_last_seq_is_reported_and_dead_lettered(
    backend, prefix, clock, claims, kind, batch
):
    # given a hash-layout queue of 100 whose only group settled seqs 50..60 above its floor (the
    # hash layout deleted those records one by one), moved to the stream layout at seq 100
    from rqueue import doctor

    migrated_with_gaps(backend, prefix, clock)
    new = logview.connect(backend, prefix, clock, "stream")
    try:
        q = new.queue("orders")
        assert new.redis.hmget(q.keys.meta, "gaps", "gaps_to") == [b"1", b"100"]
        # and 100 more published after the move, then a group made (its since is seq 200), and
        # seq 150's entry deleted from the log (an operator's XDEL)
        for n in range(101, 201):
            q.publish(b"m%d" % n, **FLOW_ARGS[kind](n))
        q.create_group("b", start="first")
        assert logview.delete(new.redis, q.keys, 150) == 1
        # when the doctor examines the queue, then seq 150 is a missing record for both groups, and
        # the seqs the hash layout deleted are not
        found = [f for f in doctor.examine(q) if f.kind is doctor.Kind.RECORD_MISSING]
        assert sorted((f.group, f.seq) for f in found) == [("a", 150), ("b", 150)]
        # when the group drains the queue
        c = q.consumer("b", "c2", ack_wait=WAIT, prefetch=1000)
        got: list[int] = []
        while ds := c.fetch(batch):
            got += [d.seq for d in ds]
            c.ack(ds)
        # then every stored record is handed out, the hash layout's deletions are passed over, and
        # seq 150, lost after the move, is a dead letter saying so
        assert sorted(got) == [s for s in range(1, 201) if not 50 <= s <= 60 and s != 150]
        assert [(d.seq, d.reason) for d in q.dead_letters()] == [(150, "missing-record")]
        # and past the move's last seq a fetch of 100 claimed, though below the group's since (the
        # first fetch's scan took 100 records up to seq 111)
        assert claims == ([(112, 200)] if (kind, batch) == ("plain", 100) else [])
    finally:
        new.close()


def test_redis_losing_its_data_between_the_claim_and_the_read_hands_out_nothing(client, claims, monkeypatch):
    # given 100 messages and a consumer
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 101)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # and Redis losing every key after the fetch's script ran, before the client read the log
    fill = commands.fill_claimed

    def lost(reply: commands.FetchReply, entries: Any) -> commands.FetchReply:
        return fill(reply, [])

    monkeypatch.setattr(commands, "fill_claimed", lost)
    client.redis.delete(*client.redis.keys(q.keys.base + "*"))
    # when it fetches (the script sees an empty queue: nothing claimed) ...
    assert c.fetch(100) == []
    # ... and when the loss comes between the two calls
    q.publish_many([b"n%d" % i for i in range(1, 101)])
    got = c.fetch(100)
    # then the claimed seqs, without entries, are not handed out, and no error is raised
    assert got == []
    assert {d.reason for d in q.dead_letters()} <= {"missing-record"}


def test_a_waiting_consumer_woken_by_a_large_publish_gets_its_claimed_records(client, claims):
    # given a consumer that waits for news (in Redis where it can)
    q = client.queue("orders")
    q.publish(b"first")
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000, wait_in_redis=True)
    first = c.fetch(100)
    assert [d.data for d in first] == [b"first"]
    c.ack(first)
    # when 100 messages come while it waits
    publisher = threading.Timer(0.2, lambda: q.publish_many([b"m%d" % i for i in range(1, 101)]))
    publisher.start()
    try:
        got = c.fetch(100, timeout=10)
        while len(got) < 100:
            more = c.fetch(100 - len(got), timeout=10)
            assert more, "the rest never came"
            got += more
    finally:
        publisher.join()
    # then every record came as published, in order, some of them by a claim
    assert [d.data for d in got] == [b"m%d" % i for i in range(1, 101)]
    assert claims and all(first >= 2 for first, _ in claims)


def test_fill_claimed_reads_both_reply_shapes_and_names_what_is_missing():
    # given a reply that claimed seqs 7..10 from index 3, and the log's entries in either shape
    raw = [b"h0", b"h1", b"h2"]  # the claim's deliveries are not in the reply
    reply = commands.FetchReply(0, None, "", 10, 0, 0, [], "t", raw, 3, claim=(3, 7, 10))
    raw_shape = [[b"7-1700000000123", [b"p", b"a"]], [b"8-0", [b"r", b":5:0:b"]], [b"10-0", [b"s", b""]]]
    parsed_shape = [(b"7-1700000000123", {b"p": b"a"}), (b"8-0", {b"r": b":5:0:b"}), (b"10-0", {b"s": b""})]
    for entries in (raw_shape, parsed_shape):
        given = reply._replace(raw=list(raw))
        filled = commands.fill_claimed(given, entries)
        # then the claim's triples follow the reply's head, the reply given unchanged
        assert given.raw == raw and filled.raw[:3] == raw
        assert filled.raw[3::3] == [7, 8, 9, 10] and filled.raw[4::3] == [1] * 4
        # and a compact entry's record comes split (its id's time, its payload), a full one is as stored,
        # and a seq without an entry or with a stub is named missing
        assert filled.raw[5] == (1_700_000_000_123, b"a")
        assert decode_record(filled.raw[5], "") == (1_700_000_000_123, {}, b"a")
        assert filled.raw[8] == b":5:0:b"
        assert (filled.raw[11], filled.raw[14]) == (b"", b"")
        assert filled.missing == frozenset({9, 10})
    # and an entry outside the claim, or a second one of a seq, changes nothing
    filled = commands.fill_claimed(
        reply._replace(raw=list(raw)), [[b"6-0", [b"r", b"x"]], [b"7-0", [b"r", b"y"]], [b"7-1", [b"r", b"z"]]]
    )
    assert filled.raw[5] == b"y" and filled.missing == frozenset({8, 9, 10})
    # and as many entries as seqs, one of them a second of its seq where another's is gone, shift no record
    shifted = [[b"7-0", [b"r", b"a"]], [b"8-0", [b"r", b"b"]], [b"8-1", [b"r", b"x"]], [b"10-0", [b"r", b"d"]]]
    filled = commands.fill_claimed(reply._replace(raw=list(raw)), shifted)
    assert [filled.raw[i] for i in (5, 8, 11, 14)] == [b"a", b"b", b"", b"d"] and filled.missing == frozenset({9})
    # and a compact entry whose id's time is past 6 bytes, in order or not, gives a record that parses as none
    huge = b"%d" % (1 << 48)
    for entries in (
        [[b"7-5", [b"p", b"a"]], [b"8-" + huge, [b"p", b"b"]], [b"9-5", [b"p", b"c"]], [b"10-5", [b"p", b"d"]]],
        [[b"8-" + huge, [b"p", b"b"]]],
    ):
        filled = commands.fill_claimed(reply._replace(raw=list(raw)), entries)
        with pytest.raises(CorruptRecord):
            decode_record(filled.raw[8], "log[8]")


def test_a_hash_layout_queue_never_claims(backend, prefix, clock, claims):
    # given a queue whose log is a hash
    c = logview.connect(backend, prefix, clock, "hash")
    try:
        q = c.queue("orders")
        q.publish_many([b"m%d" % i for i in range(1, 101)])
        # when a consumer fetches 100
        got = q.consumer("g", "c1", ack_wait=WAIT).fetch(100)
        # then the script read them all
        assert claims == [] and [d.data for d in got] == [b"m%d" % i for i in range(1, 101)]
    finally:
        c.close()


def test_the_plain_fetch_keys_of_a_stream_log_end_with_the_schedule(prefix):
    # given a stream queue's keys and a hash queue's
    from rqueue.engine.keys import LogLayout, QueueKeys, fetch_plain_keys

    for layout, tail in ((LogLayout.STREAM, ":sched"), (LogLayout.HASH, ":events")):
        keys = QueueKeys(f"{prefix}:{{orders}}", layout=layout)
        listed = keys.group("g").as_list()
        # then the plain fetch's end with the schedule in the stream layout alone
        plain = fetch_plain_keys(listed)
        assert plain[-1].endswith(tail) and plain[-1] == (keys.sched if layout is LogLayout.STREAM else listed[16])


@pytest.mark.sync_only("the threaded Worker")
def test_a_worker_paused_between_the_claim_and_its_read_runs_nothing_handed_on_meanwhile(backend, prefix, monkeypatch):
    # given a worker taking 100 at a time from a queue with a 0.5 s lease, whose first read of
    # claimed records waits (as when the worker is paused right after the claim's reply came)
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=0.5)
    q = client.queue("orders")
    q.create_group("g")
    late, go_on, read_done = threading.Event(), threading.Event(), threading.Event()
    read = Scripts.read_log

    def paused(self: Scripts, *args: Any) -> Any:
        if late.is_set():
            return read(self, *args)
        late.set()
        go_on.wait(20)
        try:
            return read(self, *args)
        finally:
            read_done.set()

    monkeypatch.setattr(Scripts, "read_log", paused)
    calls: list[int] = []
    handler = rqueue.BatchHandler(lambda ds: [calls.append(d.seq) or True for d in ds], size=100)
    w = rqueue.Worker(q, "g", handler, concurrency=1, prefetch=100, heartbeat_interval=0.1)
    q.publish_many([b"m%d" % i for i in range(1, 101)])
    w.start()
    try:
        assert late.wait(10)
        # when another consumer takes all 100 once their lease ran out, acks the first 50 (the
        # log drops their entries) and holds the rest
        other = q.consumer("g", "other", prefetch=1000, ack_wait=60)
        got: list[rqueue.Delivery] = []
        wait_for(lambda: got.extend(other.fetch(100)) or len(got) == 100)
        other.ack([d for d in got if d.seq <= 50])
        wait_for(lambda: logview.count(client.redis, q.keys) == 50)
    finally:
        go_on.set()
    # then the worker, its read done, runs none of them, and none is a dead letter
    try:
        assert read_done.wait(10)
    finally:
        w.stop()
        assert w.join(10)
    assert calls == []
    assert q.dead_letters() == []
    assert {g.name: g.in_flight for g in q.stats().groups} == {"g": 50}
    client.close()


@pytest.mark.sync_only("the doctor takes a sync queue")
def test_a_repaired_meta_hash_holds_a_later_groups_claims_back_until_its_cursor_passes_its_since(client, claims):
    # given a stream queue of 100 messages whose meta hash was deleted (with it, whether a
    # migration left seqs without entries), then repaired, and a group made after it
    from rqueue import doctor

    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 101)])
    client.redis.delete(q.keys.meta)
    found = doctor.examine(q)
    assert [r.outcome for r in doctor.repair(q, found)] == [doctor.Outcome.REPAIRED] * len(found)
    # when its consumer fetches them (its cursor below its since) and more published after
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    got = c.fetch(100)
    q.publish_many([b"n%d" % i for i in range(CLAIM_MIN)])
    more = c.fetch(100)
    # then the script read the first 100 (the repair set "gaps": entries may have been deleted one
    # by one), and claims after them
    assert [d.data for d in got] == [b"m%d" % i for i in range(1, 101)]
    assert [d.data for d in more] == [b"n%d" % i for i in range(CLAIM_MIN)]
    assert client.redis.hmget(q.keys.meta, "gaps", "gaps_to") == [b"1", b"100"]
    assert claims == [(101, 100 + CLAIM_MIN)]


@pytest.mark.parametrize("how", ["replay", "purge"])
def test_a_group_made_on_a_dead_letter_queue_after_a_replay_or_purge_passes_over_what_went(client, claims, how):
    # given 100 dead letters, of which the first 50 were replayed (or purged): their entries
    # were deleted one by one from the dead-letter queue's log
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 101)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    for d in c.fetch(100):
        c.reject(d)
    if how == "replay":
        assert q.replay_dead_letters(seq_from=1, seq_to=50).replayed == 50
        c.ack(c.fetch(100))
    else:
        assert q.purge_dead_letters(seq_from=1, seq_to=50) == 50
    dlq = q.dead_letter_queue
    # when a group made on the dead-letter queue itself drains it
    audit = dlq.consumer("audit", "a1", ack_wait=WAIT, prefetch=1000)
    seen: list[Any] = []
    while batch := audit.fetch(100):
        seen += batch
        audit.ack(batch)
    # then it gets the 50 left, and the 50 that went are passed over, not dead-lettered again
    assert [d.seq for d in seen] == list(range(51, 101))
    assert dlq.dead_letters() == []


def test_a_claim_whose_queue_is_made_again_before_its_read_hands_out_nothing(client, backend, prefix, monkeypatch):
    # given 100 messages and a consumer, and another client that, between a claim and the read of
    # its records, deletes the queue, publishes 100 new messages and acks 50 of them in group g
    # (as when Redis restarts without its data and the queue is used again meanwhile)
    q = client.queue("orders")
    q.publish_many([b"old-%d" % i for i in range(100)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    other = rqueue.connect(backend, prefix=prefix)
    made_again = []

    def make_again() -> None:
        if made_again:
            return
        made_again.append(True)  # the other client's own claim reads as it is
        oq = other.queue("orders")
        oq.delete(force=True)
        oq.create_group("g")
        oq.create_group("h")  # keeps the new records
        oq.publish_many([b"new-%d" % i for i in range(100)])
        oc = oq.consumer("g", "c2")
        oc.ack(oc.fetch(50))

    read, read_async = Scripts.read_log, AsyncScripts.read_log

    def racing(self: Scripts, *args: Any) -> Any:
        make_again()
        return read(self, *args)

    async def racing_async(self: AsyncScripts, *args: Any) -> Any:
        make_again()
        return await read_async(self, *args)

    monkeypatch.setattr(Scripts, "read_log", racing)
    monkeypatch.setattr(AsyncScripts, "read_log", racing_async)
    # when the consumer fetches 50 (a claim)
    with pytest.raises(rqueue.errors.ConnectionLost, match="incarnation went from"):
        c.fetch(50)
    # then nothing was handed out: the records read are the new queue's
    assert made_again == [True]
    # and its next fetch tells of the loss, and hands out only what the new queue's group has not acked
    got = c.fetch(100)
    assert c.last_state_loss is not None
    assert [d.data for d in got] == [b"new-%d" % i for i in range(50, 100)]
    other.close()
