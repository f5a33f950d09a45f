"""The stream layout of a queue's log (rqueue.engine.keys.LogLayout.STREAM,
the hidden setting of docs/layout-d-plan.md step 3): records in the stream
``<base>:log``, deleted at the ack as in the hash layout; replayed records
beside the queue's pins; a call sent the other layout's keys refused before
any write; a publish below the stream's newest entry refused and undone.
Every backend, memory:// included, runs the same scripts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from support import logview
from support.logview import connect

import rqueue
from rqueue import doctor
from rqueue.engine import commands
from rqueue.engine.keys import LogLayout
from rqueue.engine.loader import lua_dir
from rqueue.errors import CorruptRecord, LayoutMismatch
from rqueue.worker.scheduler import Scheduler


@pytest.fixture
def client(backend: str, prefix: str, clock: rqueue.ManualClock) -> Iterator[Any]:
    c = connect(backend, prefix, clock, "stream")
    yield c
    c.close()


def snapshot(r: Any, keys: Any) -> dict[str, Any]:
    """Every key of the queue, its dead-letter queue and their groups, dumped."""
    return {k: r.dump(k) for k in sorted(r.keys(keys.base.replace("{", "[{]").replace("}", "[}]") + "*"))}


def test_a_stream_queue_keeps_its_records_in_the_stream_and_deletes_them_at_the_ack(client):
    # given a stream-layout client and a queue with a group
    q = client.queue("orders")
    c = q.consumer("g")
    r = client.redis
    # when two plain messages and one with headers are published
    q.publish_many([b"a", b"b"])
    q.publish(b"c", headers={"k": "v"})
    # then they are entries of the stream: a plain one <seq>-<published ms> with its payload alone,
    # the other <seq>-0 with its whole record; the meta says so, and no hash log exists
    assert q.keys.layout is LogLayout.STREAM and q.keys.msgs.endswith(":log")
    now = client.clock.now_ms
    assert r.xrange(q.keys.msgs) == [
        (f"1-{now}".encode(), {b"p": b"a"}),
        (f"2-{now}".encode(), {b"p": b"b"}),
        (b"3-0", {b"r": f":{now}:9:".encode() + b'{"k":"v"}c'}),
    ]
    assert r.hget(q.keys.meta, "layout") == b"stream"
    assert r.exists(q.keys.msgs[: -len("log")] + "msgs") == 0
    # when they are fetched and acked, then each comes whole, with its publish time
    ds = c.fetch(10)
    assert [(d.seq, d.data, d.headers, d.published_ms) for d in ds] == [
        (1, b"a", {}, now),
        (2, b"b", {}, now),
        (3, b"c", {"k": "v"}, now),
    ]
    assert [m.data for m in q.peek()] == [b"a", b"b", b"c"]
    c.ack(ds)
    # then their entries are gone
    assert r.xlen(q.keys.msgs) == 0
    assert q.stats().depth == 0


def test_a_client_of_the_other_layout_is_refused_and_changes_nothing(client, backend, prefix, clock):
    # given a stream queue with a group, a message held and one waiting
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish_many([b"a", b"b"])
    [held] = c.fetch(1)
    other = connect(backend, prefix, clock, "hash")
    try:
        hq = other.queue("orders")
        before = snapshot(client.redis, q.keys)
        # when a hash-layout client publishes, joins the group or asks for stats
        # then each call is refused with LayoutMismatch, naming the layouts
        with pytest.raises(LayoutMismatch, match="stream layout"):
            hq.publish(b"x")
        with pytest.raises(LayoutMismatch):
            hq.consumer("g", name="other")
        with pytest.raises(LayoutMismatch):
            hq.stats()
        # and nothing in Redis changed
        assert snapshot(client.redis, q.keys) == before
        assert [d.seq for d in c.fetch(10)] == [2]
        held.ack()
    finally:
        other.close()


def test_a_hash_queue_refuses_a_stream_client(client, backend, prefix, clock):
    # given a queue of the hash layout with a message
    other = connect(backend, prefix, clock, "hash")
    try:
        other.queue("orders").publish(b"a")
        before = snapshot(client.redis, other.queue("orders").keys)
        # when a stream-layout client publishes to it
        with pytest.raises(LayoutMismatch, match="hash layout"):
            client.queue("orders").publish(b"b")
        # then nothing changed: no stream, the same last seq
        assert snapshot(client.redis, other.queue("orders").keys) == before
        assert other.queue("orders").stats().last_seq == 1
    finally:
        other.close()


def test_dead_letters_and_replay_of_a_stream_queue(client):
    # given a stream queue whose group rejects seq 2 and acks the rest
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish_many([b"1", b"2", b"3"])
    for d in c.fetch(10):
        d.reject(reason="bad") if d.seq == 2 else d.ack()
    r = client.redis
    dlq = q.keys.dead_letters
    # then the dead letter is an entry of the dead-letter queue's stream, and seq 2's entry is gone
    assert dlq.msgs.endswith(":dlq:log") and r.xlen(dlq.msgs) == 1
    assert r.hget(dlq.meta, "layout") == b"stream"
    assert r.xlen(q.keys.msgs) == 0
    # when it is replayed
    assert q.replay_dead_letters().replayed == 1
    # then its record is kept beside the queue's pins (below the stream's newest id)
    assert r.hget(q.keys.pinned, "r2") is not None
    assert r.xlen(dlq.msgs) == 0
    # and its record reads there, and the group gets it again, whole; once acked, nothing of it is left
    assert [m.data for m in q.peek_group("g")] == [b"2"]
    assert q.status(seq=2).published_ms is not None
    [d] = c.fetch(10)
    assert (d.seq, d.data, d.redelivered) == (2, b"2", True)
    d.ack()
    assert r.hget(q.keys.pinned, "r2") is None
    assert c.fetch(10) == []


def test_a_publish_below_the_streams_newest_entry_is_refused_and_undone(client):
    # given a stream queue whose stream holds an entry above its last seq (damage)
    q = client.queue("orders")
    q.consumer("g")
    q.publish(b"a")
    r = client.redis
    r.xadd(q.keys.msgs, {"r": b"planted"}, id="5-0")
    # when a message is published (seq 2)
    # then the publish is refused, naming the stream, and the last seq is as it was
    with pytest.raises(CorruptRecord, match="has held an entry at or above seq 2"):
        q.publish(b"b")
    assert r.hget(q.keys.meta, "seq") == b"1"
    assert r.xlen(q.keys.msgs) == 2


def test_a_new_stream_queue_whose_first_publish_is_refused_stores_no_layout(client):
    # given a stream whose newest entry is 9-0 and no meta (a new queue over damage)
    q = client.queue("orders")
    client.redis.xadd(q.keys.msgs, {"r": b"planted"}, id="9-0")
    client.redis.xdel(q.keys.msgs, "9-0")
    # when the first message is published, then it is refused and no seq or layout is written
    with pytest.raises(CorruptRecord):
        q.publish(b"a")
    assert client.redis.hmget(q.keys.meta, "seq", "layout") == [None, None]


def one_held_two_acked(q: Any) -> Any:
    """Seqs 1..3 published to ``q``; its group "g" holds seq 1 and acked 2
    and 3. Returns the delivery of seq 1."""
    g = q.consumer("g")
    q.publish_many([b"1", b"2", b"3"])
    held, *rest = g.fetch(3)
    g.ack(rest)
    return held


def test_records_settled_above_the_floor_stay_until_the_floor_passes_them(client):
    # given a stream queue with one group that holds seq 1 and acks seqs 2 and 3
    q = client.queue("orders")
    first = one_held_two_acked(q)
    r = client.redis
    # then their entries stay: the stream is trimmed at the ack floor only
    assert r.xlen(q.keys.msgs) == 3
    # when seq 1 is acked, the floor passes all three and the trim takes them
    first.ack()
    assert r.xlen(q.keys.msgs) == 0


def test_the_stream_is_trimmed_at_the_lowest_floor_of_its_groups(client):
    # given two groups; "fast" acks everything, "slow" nothing yet
    q = client.queue("orders")
    fast, slow = q.consumer("fast"), q.consumer("slow")
    q.publish_many([b"1", b"2"])
    fast.ack(fast.fetch(10))
    r = client.redis
    # then the records stay for "slow"
    assert r.xlen(q.keys.msgs) == 2
    held = slow.fetch(10)
    assert [d.data for d in held] == [b"1", b"2"]
    # and go once it acks them too (no per-seq counts are kept)
    slow.ack(held)
    assert r.xlen(q.keys.msgs) == 0
    assert r.exists(q.keys.settled) == 0


def test_deleting_the_lagging_group_lets_the_trim_pass(client):
    # given two groups; "fast" acked both messages, "slow" none
    q = client.queue("orders")
    fast = q.consumer("fast")
    q.consumer("slow")
    q.publish_many([b"1", b"2"])
    fast.ack(fast.fetch(10))
    # when "slow" is deleted and the queue's trim step runs
    q.delete_group("slow")
    q.trim()
    # then the records "fast" settled are gone
    assert client.redis.xlen(q.keys.msgs) == 0


def test_a_deleted_meta_hash_of_a_stream_queue_is_repaired_with_its_layout(client):
    # given a stream queue with a group that acked one of two messages, then its meta hash deleted
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish_many([b"1", b"2"])
    c.ack(c.fetch(1))
    client.redis.delete(q.keys.meta)
    # when the doctor repairs the queue
    repairs = doctor.repair(q, doctor.examine(q))
    # then the meta hash says the layout again, and the queue works on
    assert client.redis.hget(q.keys.meta, "layout") == b"stream", repairs
    q.publish(b"3")
    assert [d.data for d in c.fetch(10)] == [b"2", b"3"]


def test_seqs_of_a_lost_acked_run_are_reported_not_handed_out_again(client):
    # given one group that acked 2 and 3 above the held 1 (their entries stay), its acked runs then deleted
    q = client.queue("orders")
    g = q.consumer("g")
    q.publish_many([b"1", b"2", b"3"])
    held, d2, d3 = g.fetch(3)
    g.ack([d2, d3])
    client.redis.delete(q.keys.group("g").acked)
    # when the doctor examines and repairs the queue
    found = [f for f in doctor.examine(q) if f.kind is doctor.Kind.UNTRACKED]
    # then 2 and 3 are named without a repair: a stored record does not say no group settled them
    assert [(f.seq, f.repair) for f in found] == [(2, None), (3, None)]
    assert "keeps records settled above the lowest floor" in found[0].detail
    assert doctor.repair(q, found) == []
    # and nothing hands them out again
    held.ack()
    assert g.fetch(10) == []


def test_a_group_made_later_is_handed_what_others_settled_above_their_floors(client):
    # given one group that holds seq 1 and acked 2 and 3 (their entries stay above its floor)
    q = client.queue("orders")
    held = one_held_two_acked(q)
    # when a second group is made, then it starts at the trim point and is handed all three
    h = q.consumer("h")
    assert [d.seq for d in h.fetch(10)] == [1, 2, 3]
    held.ack()


def test_an_entry_whose_time_does_not_fit_costs_only_itself(client):
    # given a stream queue with a good message and, planted after it, a payload entry whose time is past 6 bytes
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish(b"good")
    client.redis.xadd(q.keys.msgs, {"p": b"bad"}, id="2-281474976710656")
    client.redis.hset(q.keys.meta, "seq", 2)
    # when the group fetches, then the good one is handed out and the other is dead-lettered whole
    assert [d.data for d in c.fetch(10)] == [b"good"]
    [letter] = q.dead_letter_queue.peek()
    assert (letter.headers["x-rq-reason"], letter.data) == ("corrupted-record", b"\0bad")


def test_purging_a_queue_without_groups_deletes_its_entries(client):
    # given a stream queue without groups holding 251 messages (more than one node of the stream), one with headers
    q = client.queue("orders")
    q.publish_many([b"m"] * 250)
    q.publish(b"h", headers={"k": "v"})
    # when it is purged, then all are counted and their entries are gone (an exact trim, not a node-wise one)
    assert sum(q.purge().values()) == 251
    assert client.redis.xlen(q.keys.msgs) == 0
    assert q.stats().depth == 0


def test_a_deleted_meta_hash_of_a_purged_stream_queue_is_repaired_past_its_newest_id(client):
    # given a stream queue without groups whose three messages were purged (the stream keeps its newest id),
    # then its meta hash deleted
    q = client.queue("orders")
    q.publish_many([b"1", b"2", b"3"])
    q.purge()
    client.redis.delete(q.keys.meta)
    # when the doctor repairs it, then publishing goes on after the newest id the stream held
    [found] = doctor.examine(q)
    assert found.fix == ("meta", "3")
    doctor.repair(q, [found])
    assert q.publish(b"4").seq == 4


def test_after_a_deleted_meta_hash_is_repaired_the_trim_goes_on(client):
    # given two groups that settled the first 5 of 10 messages, then the queue's meta hash deleted and repaired
    q = client.queue("orders")
    g, h = q.consumer("g"), q.consumer("h")
    q.publish_many([b"m"] * 10)
    g.ack(g.fetch(5))
    h.ack(h.fetch(5))
    client.redis.delete(q.keys.meta)
    doctor.repair(q, doctor.examine(q))
    # then the trim point is back at the lowest floor, and the entries go once both groups settle the rest
    assert client.redis.hget(q.keys.meta, "trimmed") == b"5"
    assert client.redis.xlen(q.keys.msgs) == 5
    g.ack(g.fetch(10))
    h.ack(h.fetch(10))
    assert client.redis.xlen(q.keys.msgs) == 0 and q.stats().depth == 0


def test_a_hash_client_cannot_make_a_group_on_a_stream_queue(client, backend, prefix, clock):
    # given a stream queue with one group
    q = client.queue("orders")
    q.consumer("g")
    q.publish(b"a")
    other = connect(backend, prefix, clock, "hash")
    try:
        # when a hash-layout client makes a consumer of a new group, then it is refused and no group is made
        with pytest.raises(LayoutMismatch):
            other.queue("orders").consumer("other")
        assert sorted(q.groups()) == ["g"]
    finally:
        other.close()


def test_a_client_of_the_other_layout_reads_no_records_it_cannot_see(client, backend, prefix, clock):
    # given a stream queue with a message and a dead letter, and a hash queue with the same
    q = client.queue("orders")
    client.configure("orders", max_deliveries=1)
    q.publish_many([b"a", b"b"])
    q.consumer("g").fetch(1)[0].nack(delay=0)
    other = connect(backend, prefix, clock, "hash")
    try:
        h = other.queue("hashed")
        other.configure("hashed", max_deliveries=1)
        h.publish_many([b"a", b"b"])
        h.consumer("g").fetch(1)[0].nack(delay=0)
        # when a client of the other layout peeks, lists or replays the dead letters,
        # then each read is refused, naming the layouts, where it would have found nothing
        for wrong, layout in ((other.queue("orders"), "stream"), (client.queue("hashed"), "hash")):
            with pytest.raises(LayoutMismatch, match=f"the {layout} layout"):
                wrong.peek()
            with pytest.raises(LayoutMismatch, match=f"the {layout} layout"):
                wrong.dead_letters()
            with pytest.raises(LayoutMismatch, match=f"the {layout} layout"):
                wrong.replay_dead_letters()
        # and the clients of the queues' own layouts read them
        assert [m.data for m in q.peek()] == [b"b"] and len(q.dead_letters()) == 1
        assert [m.data for m in h.peek()] == [b"b"] and len(h.dead_letters()) == 1
    finally:
        other.close()


def test_a_group_whose_hash_was_deleted_hands_out_nothing_it_settled(client):
    # given one group that holds seq 1 and acked 2 to 4 (their entries stay above its floor),
    # then the group's hash (its cursor) deleted
    q = client.queue("orders")
    g = q.consumer("g")
    q.publish_many([b"1", b"2", b"3", b"4"])
    held, *rest = g.fetch(4)
    g.ack(rest)
    client.redis.delete(q.keys.group("g").state)
    # when the group fetches, then it is refused, naming the missing cursor, and hands out nothing
    with pytest.raises(CorruptRecord, match="cursor is missing"):
        g.fetch(10)


def test_the_dead_letter_seq_repair_keeps_a_stream_dead_letter_queue_of_its_layout(client):
    # given a dead letter in a stream queue, then its dead-letter queue's meta hash deleted
    client.configure("orders", max_deliveries=1)
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish_many([b"1", b"2"])
    first, second = c.fetch(2)
    first.nack(delay=0)
    client.redis.delete(q.keys.dead_letters.meta)
    # when the doctor repairs the dead-letter seq
    [found] = doctor.examine(q)
    assert found.kind is doctor.Kind.DEAD_LETTER_SEQ_TAKEN
    doctor.repair(q, [found])
    # then the dead-letter queue is a stream queue again, and the next dead letter comes after the first
    assert client.redis.hget(q.keys.dead_letters.meta, "layout") == b"stream"
    second.nack(delay=0)
    assert [(d.dlq_seq, d.data) for d in q.dead_letters()] == [(1, b"1"), (2, b"2")]
    assert doctor.examine(q) == []


def test_a_schedule_to_a_queue_of_the_other_layout_holds_up_only_itself(client, backend, prefix, clock):
    # given two schedules of a stream client, one to a queue a hash client made
    hash_client = connect(backend, prefix, clock, "hash")
    hash_client.queue("other").publish(b"x")
    client.schedule("a", "other", every=10, payload=b"a")
    client.schedule("b", "fine", every=10, payload=b"b")
    clock.advance(10)
    # when a scheduler passes
    result = Scheduler(client).run_once()
    # then the other schedule fires, and the queue of the other layout is left as it was
    assert result.published == 1
    assert [m.data for m in client.queue("fine").peek()] == [b"b"]
    assert [m.data for m in hash_client.queue("other").peek()] == [b"x"]
    hash_client.close()


# -- the deletion of a long jump of the trim point, in steps ---------------------------------

# Seqs deleted a call by layout, as lua/includes/settle_shared.lua's sweep sets them.
SWEEP_STEPS = dict(
    zip(
        ("stream", "hash"),
        map(
            int,
            re.search(  # type: ignore[union-attr]
                r"local SWEEP_STEP = stream and (\d+) or (\d+)",
                (lua_dir() / "includes" / "settle_shared.lua").read_text(),
            ).groups(),
        ),
        strict=True,
    )
)


def jump_the_lowest_floor(q: Any, groups: list[str], n: int) -> tuple[Any, Any]:
    """n messages; every group but the first acks them all; the first holds
    seq 1 and acks the rest above it. Returns (its consumer, the delivery of seq 1)."""
    for low in range(0, n, 1000):
        q.publish_many([b"m"] * min(1000, n - low))
    consumers = [q.consumer(g) for g in groups]
    for c in consumers[1:]:
        while ds := c.fetch(1000):
            c.ack(ds)
    lagging = consumers[0]
    [first] = lagging.fetch(1)
    while ds := lagging.fetch(1000):
        lagging.ack(ds)
    return lagging, first


# Thousands of messages: the servers only (memory:// runs the same scripts in the test after it).
ON_SERVERS = pytest.mark.parametrize("backend", ["redis", "valkey", "cluster"], indirect=True)


@ON_SERVERS
@pytest.mark.parametrize(
    ("layout", "groups"), [("hash", ["slow", "fast"]), ("stream", ["slow", "fast"]), ("stream", ["slow"])]
)
def test_a_long_jump_of_the_trim_point_is_deleted_in_steps_by_the_calls_after_it(
    backend, prefix, clock, layout, groups
):
    # given a queue whose lowest floor is about to pass 2.2 steps of seqs acked above it
    c = connect(backend, prefix, clock, layout)
    q = c.queue("orders")
    r = c.redis
    step = SWEEP_STEPS[layout]
    n = 2 * step + step // 5
    lagging, first = jump_the_lowest_floor(q, groups, n)
    # when the lagging group acks seq 1
    first.ack()
    # then the trim point is at the end at once, and that call deleted one step only
    assert r.hmget(q.keys.meta, "trimmed", "swept") == [str(n).encode(), str(step).encode()]
    stored = logview.count(r, q.keys)
    # (the hash layout's records went with the last group's ack of each; what the steps
    # delete there is what counts would have missed)
    assert stored == (n - step if layout == "stream" else 0)
    # and the depth counts none of what waits for deletion
    assert q.stats().depth == 0
    # when the group fetches, finding nothing, twice
    assert lagging.fetch(10) == []
    assert r.hget(q.keys.meta, "swept") == str(2 * step).encode()
    assert q.stats().depth == 0
    assert lagging.fetch(10) == []
    # then the rest is gone, and so is the lag's mark
    assert logview.count(r, q.keys) == 0
    assert r.hmget(q.keys.meta, "trimmed", "swept") == [str(n).encode(), None]
    # and the queue goes on: a new message is handed out and trimmed at its ack as before
    q.publish(b"next")
    [d] = lagging.fetch(10)
    assert d.data == b"next" and d.seq == n + 1
    d.ack()
    c.close()


@pytest.mark.parametrize("layout", ["hash", "stream"])
@pytest.mark.parametrize("damage", [b"x", b"-3", b"1.5", b"99999999"])
def test_a_damaged_lag_mark_is_dropped_and_deletes_nothing_it_names(backend, prefix, clock, layout, damage):
    # given a queue of two groups with a message every group settled and one the slow group holds
    c = connect(backend, prefix, clock, layout)
    q = c.queue("orders")
    r = c.redis
    slow, fast = q.consumer("slow"), q.consumer("fast")
    q.publish_many([b"1", b"2"])
    fast.ack(fast.fetch(10))
    held = slow.fetch(10)
    slow.ack(held[:1])
    before = logview.records(r, q.keys)
    # when the meta hash's lag mark is damaged, and the slow group fetches
    r.hset(q.keys.meta, "swept", damage)
    assert slow.fetch(10) == []
    # then the mark is gone and no record changed
    assert r.hget(q.keys.meta, "swept") is None
    assert logview.records(r, q.keys) == before
    # and the held message is still settled as usual
    slow.ack(held[1:])
    assert logview.count(r, q.keys) == 0
    c.close()


@ON_SERVERS
def test_a_meta_hash_deleted_while_a_jump_is_deleted_is_repaired_and_the_deletion_goes_on(client):
    # given a stream queue whose trim point jumped 2.2 steps, one step deleted, then its meta hash deleted
    q = client.queue("orders")
    r = client.redis
    step = SWEEP_STEPS["stream"]
    n = 2 * step + step // 5
    lagging, first = jump_the_lowest_floor(q, ["g"], n)
    first.ack()
    r.delete(q.keys.meta)
    # when the doctor repairs it
    doctor.repair(q, doctor.examine(q))
    # then the trim point is back, and the entries below it are marked to go in steps, from the oldest
    assert r.hmget(q.keys.meta, "trimmed", "swept") == [str(n).encode(), str(step).encode()]
    assert r.xlen(q.keys.msgs) == n - step and q.stats().depth == 0
    # and the fetches after it delete them
    assert lagging.fetch(10) == [] and lagging.fetch(10) == []
    assert r.xlen(q.keys.msgs) == 0 and r.hget(q.keys.meta, "swept") is None


# -- the side hash of flow-controlled records ----------------------------------------------

FLOW = pytest.mark.parametrize("flow", ["priority", "key"])


def flow_of(kind: str, n: int) -> dict[str, Any]:
    """The publish arguments of the n-th message with a priority, or with a
    key of its own (a key hands out one delivery at a time)."""
    return {"priority": 5} if kind == "priority" else {"key": f"k{n}"}


def stub(seq: int) -> tuple[bytes, dict[bytes, bytes]]:
    """The stream entry of a message published with a priority or a key."""
    return (f"{seq}-0".encode(), {b"s": b""})


@FLOW
def test_a_prioritized_or_keyed_message_is_a_stub_in_the_stream_and_its_record_is_in_the_side(client, flow):
    # given a stream queue with a group
    q = client.queue("orders")
    c = q.consumer("g")
    r = client.redis
    now = client.clock.now_ms
    # when a plain message, then two with a priority or a key (one with headers) are published
    q.publish(b"plain")
    q.publish(b"a", **flow_of(flow, 2))
    q.publish(b"b", headers={"h": "v"}, **flow_of(flow, 3))
    # then the stream holds the plain one's entry and a stub for each other, whose records are in the side hash
    assert r.xrange(q.keys.msgs) == [(f"1-{now}".encode(), {b"p": b"plain"}), stub(2), stub(3)]
    assert sorted(r.hkeys(q.keys.side)) == [b"2", b"3"]
    assert r.hget(q.keys.side, 3) == f":{now}:9:".encode() + b'{"h":"v"}b'
    # and every read finds them: the depth, peek, status, the doctor (nothing to report)
    assert q.stats().depth == 3
    assert [m.data for m in q.peek()] == [b"plain", b"a", b"b"]
    assert q.status(seq=2).published_ms == now
    assert doctor.examine(q) == []
    # when the group fetches them, then each comes whole
    ds = c.fetch(10)
    assert sorted((d.seq, d.data, d.headers) for d in ds) == [(1, b"plain", {}), (2, b"a", {}), (3, b"b", {"h": "v"})]
    # and a redelivery reads its record through the stub too
    [again] = [d for d in ds if d.seq == 3]
    again.nack(delay=0)
    c.ack([d for d in ds if d.seq != 3])
    [d] = c.fetch(10)
    assert (d.seq, d.data, d.redelivered) == (3, b"b", True)


@FLOW
def test_side_records_go_once_every_group_settled_them(client, flow):
    # given two groups and three messages with a priority or a key
    q = client.queue("orders")
    a, b = q.consumer("a"), q.consumer("b")
    r = client.redis
    for n in range(3):
        q.publish(b"m%d" % n, **flow_of(flow, n))
    # when group a settles them all, then the side hash keeps them: group b still needs them
    a.ack(a.fetch(10))
    assert a.fetch(10) == []
    assert r.hlen(q.keys.side) == 3
    # when group b settles them too, then the next fetch deletes the side records with their stubs
    b.ack(b.fetch(10))
    assert b.fetch(10) == []
    assert r.exists(q.keys.side) == 0 and r.xlen(q.keys.msgs) == 0
    assert r.zcard(q.keys.prio) == 0
    assert q.stats().depth == 0


@ON_SERVERS
def test_side_records_a_long_jump_passed_are_deleted_1000_a_fetch(client):
    # given one group holding seq 1 (the highest priority) and acking 2,499 prioritized messages above it
    q = client.queue("orders")
    r = client.redis
    g = q.consumer("g")
    n = 2_500
    q.publish(b"first", priority=9)
    for low in range(1, n, 500):
        q.publish_many([b"m"] * min(500, n - low), priority=[1 + i % 8 for i in range(min(500, n - low))])
    [first] = g.fetch(1)
    assert first.seq == 1
    while ds := g.fetch(500):
        g.ack(ds)
    assert r.hlen(q.keys.side) == n
    # when seq 1 is acked (the trim point jumps past all of them)
    first.ack()
    # then each fetch after it deletes at most 1,000 side records, until none is left
    sizes = []
    while r.hlen(q.keys.side):
        assert g.fetch(10) == []
        sizes.append(r.hlen(q.keys.side))
    assert sizes == [1_500, 500, 0]
    assert r.zcard(q.keys.prio) == 0


@FLOW
def test_a_stub_whose_side_record_is_gone_is_reported_and_dead_lettered_as_missing_record(client, flow):
    # given a group, a plain message, then a prioritized or keyed one whose side record is then deleted
    q = client.queue("orders")
    c = q.consumer("g")
    r = client.redis
    q.publish(b"plain")
    q.publish(b"lost", **flow_of(flow, 2))
    r.hdel(q.keys.side, 2)
    # when the doctor examines the queue, then the stub counts as no record: seq 2's is missing
    found = [f for f in doctor.examine(q) if f.kind is doctor.Kind.RECORD_MISSING]
    assert [(f.seq, f.repair) for f in found] == [(2, None)]
    # when the group fetches, then the plain one is handed out and seq 2 is a dead letter, missing-record
    assert [d.seq for d in c.fetch(10)] == [1]
    [dead] = q.dead_letters()
    assert (dead.seq, dead.reason) == (2, "missing-record")
    # and a replay has nothing to hand out again
    assert q.replay_dead_letters("g").replayed == 0


@FLOW
def test_replay_of_a_seq_whose_record_is_in_the_side(client, flow):
    # given two groups and a prioritized or keyed message that group a rejects and group b holds
    q = client.queue("orders")
    a, b = q.consumer("a"), q.consumer("b")
    r = client.redis
    q.publish(b"twice", headers={"h": "v"}, **flow_of(flow, 1))
    [da] = a.fetch(10)
    [db] = b.fetch(10)
    da.reject(reason="bad")
    # when group a replays it while its stub and side record are kept for group b
    assert q.replay_dead_letters("a").replayed == 1
    assert r.hexists(q.keys.side, 1) and r.hget(q.keys.pinned, "r1") is not None
    # then group a gets it again, whole
    [again] = a.fetch(10)
    assert (again.seq, again.data, again.headers["h"], again.redelivered) == (1, b"twice", "v", True)
    # when group b acks it, and a fetch deletes the side record, then the replayed record still reads
    db.ack()
    assert b.fetch(10) == []
    assert r.exists(q.keys.side) == 0
    assert q.status(seq=1).published_ms is not None
    again.nack(delay=0)
    [third] = a.fetch(10)
    assert (third.seq, third.data) == (1, b"twice")
    # and once acked, nothing of it is left
    third.ack()
    assert r.hget(q.keys.pinned, "r1") is None and a.fetch(10) == []


@FLOW
def test_a_replay_after_the_side_record_went_reads_the_dead_letter(client, flow):
    # given one group that rejected a prioritized or keyed message, whose side record a fetch then deleted
    q = client.queue("orders")
    g = q.consumer("g")
    r = client.redis
    q.publish(b"once", **flow_of(flow, 1))
    g.fetch(10)[0].reject(reason="bad")
    assert g.fetch(10) == []
    assert r.exists(q.keys.side) == 0 and r.xlen(q.keys.msgs) == 0
    # when it is replayed, then the group gets it again from the dead letter's record
    assert q.replay_dead_letters().replayed == 1
    [d] = g.fetch(10)
    assert (d.seq, d.data, d.redelivered) == (1, b"once", True)
    d.ack()
    assert r.hget(q.keys.pinned, "r1") is None


# Headers in an order that Lua's tables do not keep (cjson.encode of a
# decoded object) on any backend: a record made again from the dead letter
# lists them otherwise.
MANY_HEADERS = {f"h{n}": str(n) for n in range(8)}


@pytest.mark.parametrize("layout", ["hash", "stream"])
@pytest.mark.parametrize("flow", [None, "priority", "key"])
def test_a_replayed_message_keeps_its_record_and_its_ttl_while_another_group_holds_it(
    backend, prefix, clock, layout, flow
):
    # given two groups, max_deliveries 1, and a message with headers and a time to live (found by the
    # model test on Redis and memory://: a replay whose side copy was the record made again)
    c = connect(backend, prefix, clock, layout)
    try:
        c.configure("orders", max_deliveries=1)
        q = c.queue("orders")
        a, b = q.consumer("a"), q.consumer("b")
        r = c.redis
        q.publish(b"quote", headers=MANY_HEADERS, ttl=0.5, **(flow_of(flow, 1) if flow else {}))
        stored = logview.record(r, q.keys, 1)
        # when group a nacks it (a dead letter: max-deliveries) and replays it while group b holds it
        [da] = a.fetch(10)
        [db] = b.fetch(10)
        da.nack()
        assert [d.reason for d in q.dead_letters()] == ["max-deliveries"]
        assert q.replay_dead_letters("a").replayed == 1
        # then its record is the one published, byte for byte (in a stream, its copy beside the pins too)
        assert logview.record(r, q.keys, 1) == stored
        if logview.is_stream(q.keys):
            assert r.hget(q.keys.pinned, "r1") == stored
        # when group b acks it (a stream trims its entry), then group a gets the record published, with
        # its headers in their order and its time to live
        db.ack()
        assert b.fetch(10) == []
        assert logview.records(r, q.keys) == {1: stored}
        [again] = a.fetch(10)
        assert (again.seq, again.data, again.redelivered) == (1, b"quote", True)
        published = [*MANY_HEADERS.items(), ("x-rq-ttl", "500")]
        assert list(again.headers.items()) == [*published, ("x-rq-replayed-deliveries", "1")]
        # when it is dead-lettered again, and replayed after every group settled it (its record made
        # again from the dead letter), then it keeps its time to live: once that ran out, it is
        # dead-lettered as expired, unrun
        again.nack()
        assert q.replay_dead_letters("a").replayed == 1
        clock.advance(1)
        assert a.fetch(10) == []
        assert [(d.seq, d.reason) for d in q.dead_letters()] == [(1, "expired")]
    finally:
        c.close()


def test_a_replay_sent_no_side_hash_is_refused_and_changes_nothing(client, monkeypatch):
    # given a stream queue whose group dead-lettered a keyed message
    q = client.queue("orders")
    g = q.consumer("g")
    q.publish(b"k", key="k1")
    g.fetch(10)[0].reject(reason="bad")
    before = snapshot(client.redis, q.keys)
    # when a replay call is sent without the side hash (a client of an earlier build)
    keys_of = commands.replay_keys
    monkeypatch.setattr(commands, "replay_keys", lambda call, result_keys: keys_of(call, result_keys)[:-1])
    # then it is refused before any write: it would copy no stub's record beside the pins
    with pytest.raises(LayoutMismatch, match="side hash"):
        q.replay_dead_letters()
    assert snapshot(client.redis, q.keys) == before


def test_purging_a_queue_without_groups_deletes_its_side_records(client):
    # given a stream queue without groups holding plain and prioritized messages
    q = client.queue("orders")
    r = client.redis
    q.publish_many([b"m"] * 3)
    q.publish_many([b"p"] * 3, priority=3)
    # when it is purged, then every message is counted and the stream and side hash are empty
    assert sum(q.purge().values()) == 6
    assert r.xlen(q.keys.msgs) == 0 and r.exists(q.keys.side) == 0


def test_purging_a_group_lets_its_side_records_go(client):
    # given one group and prioritized messages it has not read
    q = client.queue("orders")
    g = q.consumer("g")
    r = client.redis
    q.publish_many([b"p"] * 3, priority=3)
    # when the group is purged and fetches, then the side hash is empty
    q.purge("g")
    assert g.fetch(10) == []
    assert r.exists(q.keys.side) == 0 and r.xlen(q.keys.msgs) == 0


def test_deleting_a_queue_deletes_its_side_hash(client):
    # given a stream queue with a group and a prioritized message held
    q = client.queue("orders")
    g = q.consumer("g")
    q.publish(b"p", priority=3)
    g.fetch(10)
    assert q.keys.side in q.keys.all_static()
    # when the queue is deleted, then its side hash goes with its other keys
    q.delete(force=True)
    assert client.redis.exists(q.keys.side) == 0
    assert snapshot(client.redis, q.keys) == {}


@FLOW
def test_a_side_record_whose_priority_log_entry_is_lost_is_reported_and_repaired(client, flow):
    # given a group that settled two prioritized or keyed messages, the
    # priority log's entry of the first lost (damage) before the trim point passed it
    q = client.queue("orders")
    c = q.consumer("g")
    r = client.redis
    q.publish(b"a", **flow_of(flow, 1))
    q.publish(b"b", **flow_of(flow, 2))
    c.ack(c.fetch(10))
    r.zremrangebyscore(q.keys.prio, 1, 1)
    # when the group fetches (the trim point is past both), then the second's
    # side record goes with its entry, and the first's stays: nothing lists it
    assert c.fetch(10) == []
    assert r.hkeys(q.keys.side) == [b"1"]
    # when the doctor examines the queue, then it names the leaked record
    [found] = doctor.examine(q)
    assert (found.kind, found.key, found.fix) == (doctor.Kind.SIDE_LEAKED, q.keys.side, ("side-leak", "1"))
    # when it repairs, then the record is deleted and the queue is clean
    [fixed] = doctor.repair(q, [found])
    assert fixed.outcome is doctor.Outcome.REPAIRED
    assert r.exists(q.keys.side) == 0
    assert doctor.examine(q) == []


def test_a_side_leak_repair_deletes_only_what_no_group_needs_and_at_most_1000(client):
    # given a group holding a prioritized message (above the trim point)
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish(b"a", priority=5)
    [held] = c.fetch(1)
    call = q.group_call("")
    # when a repair names it as leaked, then it is no leak ("gone") and stays
    assert not commands.repair(call, "side-leak", ["1"]).done
    assert client.redis.hexists(q.keys.side, 1)
    # and a repair of more than 1,000 seqs is refused by name, changing nothing
    with pytest.raises(rqueue.InvalidInput, match="at most 1000"):
        commands.repair(call, "side-leak", [str(s) for s in range(1, 1002)])
    held.ack()


@FLOW
def test_a_stub_deleted_with_its_side_record_kept_is_reported_and_the_message_is_delivered(client, flow):
    # given a group, a plain message, then a prioritized or keyed one whose stub entry is deleted (damage)
    q = client.queue("orders")
    c = q.consumer("g")
    r = client.redis
    q.publish(b"plain")
    q.publish(b"kept", **flow_of(flow, 2))
    r.xdel(q.keys.msgs, "2-0")
    # when the doctor examines the queue, then it says the stub is gone and
    # the record is in the side hash, not that the record is missing
    found = doctor.examine(q)
    assert [(f.kind, f.seq, f.repair) for f in found] == [(doctor.Kind.STUB_MISSING, 2, None)]
    # when the group fetches, then both are handed out whole, none as a dead letter
    ds = c.fetch(10)
    assert sorted((d.seq, d.data) for d in ds) == [(1, b"plain"), (2, b"kept")]
    # and a redelivery reads the record from the side too
    [kept] = [d for d in ds if d.seq == 2]
    kept.nack(delay=0)
    [again] = c.fetch(10)
    assert (again.seq, again.data, again.redelivered) == (2, b"kept", True)
    assert q.status(seq=2).published_ms is not None
    again.ack()
    assert q.dead_letters() == []


@FLOW
def test_deleting_the_last_group_deletes_the_side_records_it_settled(client, flow):
    # given one group that settled three prioritized or keyed messages, and
    # their side records kept (the trim point passed them, no fetch since)
    q = client.queue("orders")
    c = q.consumer("g")
    r = client.redis
    for n in range(3):
        q.publish(b"m%d" % n, **flow_of(flow, n))
    c.ack(c.fetch(10))
    c.close()
    assert r.hlen(q.keys.side) == 3
    # when the group is deleted, then the side records and their priority log entries go
    q.delete_group("g")
    assert r.exists(q.keys.side) == 0 and r.zcard(q.keys.prio) == 0
    # and a side record left below the trim point of the queue without
    # groups (as beyond the 1,000 a deletion takes) is the doctor's to delete
    r.hset(q.keys.side, 1, b"left")
    r.zadd(q.keys.prio, {"1:5": 1})
    [found] = doctor.examine(q)
    assert (found.kind, found.fix) == (doctor.Kind.SIDE_LEAKED, ("side-leak", "1"))
    assert doctor.repair(q, [found])[0].outcome is doctor.Outcome.REPAIRED
    assert r.exists(q.keys.side) == 0


def test_a_small_fetch_of_a_stream_queue_whose_meta_hash_was_deleted_is_refused_until_the_repair(client):
    # given a stream queue whose one group acked a priority message apart from the cursor (its entry stays)
    q = client.queue("orders")
    c = q.consumer("g")
    for i in range(10):
        q.publish(f"m{i}".encode(), priority=9 if i == 4 else 0)
    (urgent,) = c.fetch(1)
    c.ack(urgent)
    # when its meta hash is deleted, then a fetch of one is refused by name, changing nothing
    client.redis.delete(q.keys.meta)
    before = snapshot(client.redis, q.keys)
    with pytest.raises(CorruptRecord, match=f"{q.keys.meta}: fields inc and seq are missing"):
        c.fetch(1)
    assert snapshot(client.redis, q.keys) == before
    # and after the doctor's repair the other nine are handed out once each, the acked one never
    doctor.repair(q, doctor.examine(q))
    handed = []
    while got := c.fetch(1):
        handed += [(d.seq, d.delivery_count) for d in got]
        c.ack(got)
    assert handed == [(s, 1) for s in range(1, 11) if s != urgent.seq]


@pytest.mark.parametrize("odd", ["headers", "priority"])
def test_a_batch_whose_message_at_a_new_hundred_is_no_plain_entry_stores_every_message_at_its_seq(client, odd):
    # given a stream queue holding seqs 1 to 150
    q = client.queue("orders")
    c = q.consumer("g", prefetch=1000)
    q.publish_many([b"old"] * 150)
    # when a batch of 100 is published whose 50th message (seq 200, where a new hundred starts) has headers
    # or a priority, and the others are plain
    payloads = [b"m%d" % (151 + i) for i in range(100)]
    if odd == "headers":
        results = q.publish_many(payloads, headers=[{"h": "x"} if i == 49 else None for i in range(100)])
    else:
        results = q.publish_many(payloads, priority=[5 if i == 49 else 0 for i in range(100)])
    # then every message took its seq, and each entry's id starts with the seq it stores
    assert [r.seq for r in results] == list(range(151, 251))
    ids = [int(e[0].split(b"-")[0]) for e in client.redis.xrange(q.keys.msgs)]
    assert ids == list(range(1, 251))
    # and each is handed out with its own payload
    got = {d.seq: d.data for d in c.fetch(1000)}
    assert {s: got[s] for s in range(151, 251)} == {s: b"m%d" % s for s in range(151, 251)}


@pytest.mark.parametrize("kind", ["plain", "priority", "key"])
@pytest.mark.parametrize("batch", [1, 10])
def test_an_entry_deleted_before_a_later_group_reads_it_is_reported_and_dead_lettered(client, kind, batch):
    # given ten messages published before any group, then a group made (its since is seq 10),
    # and seq 5's record deleted from the log (an operator's XDEL)
    q = client.queue("orders")
    for n in range(1, 11):
        q.publish(b"m%d" % n, **({} if kind == "plain" else flow_of(kind, n)))
    c = q.consumer("g", prefetch=100)
    assert logview.delete(client.redis, q.keys, 5) == 1
    # when the doctor examines the queue, then seq 5 is a missing record: a stream log loses
    # entries only to the trim, so it was not deleted as settled
    found = [f for f in doctor.examine(q) if f.kind is doctor.Kind.RECORD_MISSING]
    assert [f.seq for f in found] == [5]
    # when the group fetches them all, batch by batch
    got: list[int] = []
    while ds := c.fetch(batch):
        got += [d.seq for d in ds]
        c.ack(ds)
    # then the other nine are handed out, and seq 5 is a dead letter saying it was lost
    assert sorted(got) == [s for s in range(1, 11) if s != 5]
    assert [(d.seq, d.reason) for d in q.dead_letters()] == [(5, "missing-record")]


def test_a_gaps_bound_that_is_not_a_seq_is_reported_and_read_as_no_bound(client):
    # given ten messages, then a group made (its since is seq 10), a meta hash saying entries went
    # one by one up to "x7" (set by hand), and seq 5's entry deleted
    q = client.queue("orders")
    q.publish_many([b"m%d" % n for n in range(1, 11)])
    c = q.consumer("g", prefetch=100)
    client.redis.hset(q.keys.meta, mapping={"gaps": "1", "gaps_to": "x7"})
    assert logview.delete(client.redis, q.keys, 5) == 1
    # when the doctor examines the queue
    found = doctor.examine(q)
    # then the bound is a bad number, and seq 5 is no missing record: fetch reads the bound as none
    assert [(f.kind, f.key, f.detail) for f in found] == [
        (doctor.Kind.BAD_NUMBER, q.keys.meta, "field gaps_to holds 'x7', not a seq")
    ]
    # and the group's fetch passes over seq 5 as deleted before the group was made
    assert [d.seq for d in c.fetch(100)] == [s for s in range(1, 11) if s != 5]
    assert q.dead_letters() == []
