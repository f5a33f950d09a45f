"""Single keys of a queue deleted, and a queue delete cut off between its
DEL calls: guarantee 15 (a missing key a script meets is reported, never
passed over) and guarantee 3 (no handler for a message its group acked)."""

from __future__ import annotations

import random

import pytest
import redis
from support.servers import SINGLE_SERVERS

import rqueue
from rqueue import doctor
from rqueue.engine import store
from rqueue.engine.keys import LogLayout


# The cut is made on the single-server client's DEL.
@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)
@pytest.mark.parametrize("dels", [1, 2, 3])
def test_a_queue_delete_cut_off_between_its_dels_can_be_run_again_to_the_end(client, queue, monkeypatch, dels):
    # given a queue with more keys than one DEL takes: groups with acked
    # runs, a delayed nack and deliveries returned to ready
    monkeypatch.setattr(store, "DELETE_BATCH", 10)
    groups = [f"g{i}" for i in range(6)]
    for g in groups:
        queue.consumer(g).close()
    queue.publish_many([f"m{i}".encode() for i in range(6)])
    for g in groups:
        c = queue.consumer(g, name="a")
        ds = c.fetch(6)
        c.ack([ds[0], ds[2]])
        ds[1].nack(delay=30)
        c.close()  # 4, 5 and 6 back to ready
    # when a delete is cut off after its first DELs (the process killed,
    # the connection lost), and then run again
    real = client.redis.delete
    calls = []

    def cut(*keys: str) -> int:
        calls.append(keys)
        if len(calls) > dels:
            raise redis.ConnectionError("killed")
        return real(*keys)

    monkeypatch.setattr(client.redis, "delete", cut)
    with pytest.raises(rqueue.RQueueError):
        queue.delete()
    monkeypatch.setattr(client.redis, "delete", real)
    queue.delete()
    # then no key of the queue is left
    assert client.redis.keys(f"{client.prefix}:*{{orders}}*") == []
    # and a queue made again under the name hands each new message out once
    again = client.queue("orders")
    c = again.consumer("g5", name="b")
    again.publish_many([f"n{i}".encode() for i in range(6)])
    assert sorted(d.data for d in c.fetch(20)) == sorted(f"n{i}".encode() for i in range(6))


def test_a_deleted_group_registry_is_reported_not_a_group_made_again_over_its_state(client, queue):
    # given a group that acked 1, 2 (its floor) and 4 (above it) and holds 3,
    # beside another group that keeps the records stored
    queue.consumer("other").close()
    a = queue.consumer("g", name="a")
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"])
    d1, d2, d3, d4 = a.fetch(4)
    a.ack([d1, d2, d4])
    # when the queue's floors hash (the group registry) is deleted and a
    # second consumer joins and fetches
    client.redis.delete(queue.keys.floors)
    try:
        b = queue.consumer("g", name="b")
        handed = [(d.seq, d.delivery_count) for d in b.fetch(10)]
    except rqueue.CorruptRecord as exc:
        assert queue.keys.floors in str(exc)
        return
    # then nothing acked is handed out again, nor 3 while a holds it
    assert handed == [(5, 1)]


def test_a_deleted_priority_log_does_not_hand_out_an_acked_priority_message_again(client, queue):
    # given a priority message handed out ahead of plain ones and acked
    # while the cursor is still below it (another group keeps the records)
    queue.consumer("other").close()
    a = queue.consumer("g", name="a")
    queue.publish_many([b"p0", b"p1", b"p2"])
    urgent = queue.publish(b"urgent", priority=5).seq
    first = a.fetch(2)
    assert [d.seq for d in first] == [urgent, 1]
    first[0].ack()
    # when the queue's priority log is deleted and the group fetches on
    client.redis.delete(queue.keys.prio)
    try:
        handed = [d.seq for d in a.fetch(10)]
    except rqueue.CorruptRecord as exc:
        assert queue.keys.prio in str(exc)
        return
    # then the acked message is not handed out again
    assert urgent not in handed


def test_a_deleted_key_flight_entry_is_reported_not_a_key_stranded_silently(client, queue):
    # given keyed messages of one key, the first handed out, the rest waiting
    client.configure("orders", key_concurrency=1)
    a = queue.consumer("g", name="a")
    for i in range(3):
        queue.publish(f"k{i}".encode(), key="K")
    [first] = a.fetch(10)
    # when the group's kflight hash is deleted and the first is acked
    client.redis.delete(queue.keys.group("g").key_flight)
    try:
        first.ack()
        handed = [d.data for d in a.fetch(10)]
    except rqueue.CorruptRecord as exc:
        assert queue.keys.group("g").key_flight in str(exc)
        return
    # then the next message of the key is handed out (or the damage is
    # named above): not a key left with nothing to hand it out, found only
    # by `rqueue doctor` (key-stranded)
    assert handed == [b"k1"], [f.kind for f in doctor.examine(queue)]
    assert any(e["event"] == "corrupt" and queue.keys.group("g").key_flight in e["reason"] for e in queue.events())


@pytest.mark.parametrize("line", ["key_queue", "priority"])
def test_a_message_pulled_above_the_cursor_and_stranded_is_found_and_made_ready(client, queue, line):
    # given plain messages unread and two keyed (or priority) messages after
    # them, the first handed out and the second pulled into the group's key
    # queue (or priority set), where it waits above the cursor
    a = queue.consumer("g", name="a")
    queue.publish_many([b"p1", b"p2", b"p3"])
    if line == "key_queue":
        queue.publish_many([b"x1", b"x2"], key="K")
    else:
        queue.publish_many([b"x1", b"x2"], priority=[9, 5])
    [first] = a.fetch(1)
    assert (first.seq, first.data) == (4, b"x1")
    # when that key queue (or priority set) is deleted and the first is acked
    client.redis.delete(getattr(queue.keys.group("g"), line))
    first.ack()
    # then the doctor finds the second, stranded, though the cursor has not passed it
    found = doctor.examine(queue)
    assert [(f.kind, f.seq) for f in found] == [(doctor.Kind.UNTRACKED, 5)]
    assert "above the cursor 0" in found[0].detail
    if queue.keys.layout is LogLayout.STREAM:
        assert not found[0].fix  # a stream log's untracked seqs are reported alone
        return
    # and its repair makes it ready: handed out once, first (by its key or
    # priority, as it would have been), with the plain ones after it
    [done] = doctor.repair(queue, found)
    assert done.outcome is doctor.Outcome.REPAIRED
    assert doctor.examine(queue) == []
    got = []
    while more := a.fetch(10):
        a.ack(more)
        got += [(d.data, d.delivery_count) for d in more]
    assert got == [(b"x2", 1), (b"p1", 1), (b"p2", 1), (b"p3", 1)]


def test_a_small_fetch_after_the_meta_hash_was_deleted_is_refused_until_the_repair(client, queue):
    # given a priority message handed out ahead of plain ones and acked,
    # the cursor still below it (another group keeps the records)
    queue.create_group("other")
    c = queue.consumer("g")
    for i in range(10):
        queue.publish(f"m{i}".encode(), priority=9 if i == 4 else 0)
    (urgent,) = c.fetch(1)
    assert urgent.seq == 5
    c.ack(urgent)
    # when the meta hash is deleted, then a fetch small enough to read the records first is refused by name
    client.redis.delete(queue.keys.meta)
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.meta}: fields inc and seq are missing"):
        c.fetch(1)
    # and once the doctor repaired it, the group is handed the other nine once each, not the acked one
    doctor.repair(queue, doctor.examine(queue))
    handed = []
    while got := c.fetch(1):
        handed += [(d.seq, d.delivery_count) for d in got]
        c.ack(got)
    assert handed == [(s, 1) for s in range(1, 11) if s != 5]


@pytest.mark.parametrize("seed", [1, 3])
def test_keyed_messages_pulled_again_after_a_deleted_key_queue_are_all_handed_out(client, queue, seed):
    # given 40 messages, plain, priority and keyed (3 keys, up to a dozen
    # messages each), a consumer that took 10 and acked some of them, and
    # the group's key queue deleted (scratch/keydel.py of the attack branch)
    rnd = random.Random(seed)
    published = {}
    for i in range(40):
        kw = rnd.choice([{}, {"priority": rnd.randint(1, 9)}, {"key": f"k{rnd.randint(0, 2)}"}])
        published[queue.publish(b"m%d" % i, **kw).seq] = kw.get("key")
    first = queue.consumer("g", prefetch=100)
    got = first.fetch(10)
    acked = got[: rnd.randint(0, len(got))]
    first.ack(acked)
    done = [d.seq for d in acked]
    client.redis.delete(queue.keys.group("g").key_queue)
    # when the doctor repairs until nothing is left to repair, the consumer
    # leaves and another drains the queue until a fetch hands out nothing
    for _ in range(3):
        found = doctor.examine(queue)
        if not any(f.fix for f in found):
            break
        doctor.repair(queue, found)
    first.close()
    drain = queue.consumer("g", prefetch=100)
    for _ in range(100):
        # (a key hands out one message per fetch at key_concurrency 1: it is
        # busy until the next fetch sees its delivery settled, so a key with a
        # dozen messages takes a dozen fetches; the doctor finds nothing amiss
        # in between)
        ds = drain.fetch(50)
        if not ds:
            break
        drain.ack(ds)
        done += [d.seq for d in ds]
        assert not [f for f in doctor.examine(queue) if f.kind is doctor.Kind.KEY_STRANDED]
    # then each message is handed out once and each key's in order: in a
    # stream log, those the doctor only reports (untracked) are named
    dead = {d.seq for d in queue.dead_letters()}
    stuck = sorted(s for s in published if s not in done and s not in dead)
    assert len(done) == len(set(done))
    for key in {"k0", "k1", "k2"}:
        order = [s for s in done if published[s] == key]
        assert order == sorted(order)
    if queue.keys.layout is LogLayout.STREAM:
        assert set(stuck) <= {f.seq for f in doctor.examine(queue)}
    else:
        assert stuck == []
        assert doctor.examine(queue) == []
