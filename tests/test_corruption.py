"""A missing or damaged key is named, never passed over: a record deleted
before its group read it is a dead letter (`missing-record`), a deleted
queue meta, lease or delivery state, a cursor moved back and garbage in a
floor are RQ_CORRUPT (CorruptRecord) naming the key, and change nothing
they cannot account for (docs/doctor.md)."""

from __future__ import annotations

import pytest
from support import logview
from support.aio_bridge import parametrize_api
from support.raw import group_key

import rqueue
from rqueue import doctor
from rqueue.engine import commands

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

# -- records --------------------------------------------------------------------------------


def test_deleted_undelivered_record_is_a_dead_letter_not_a_silent_settle(client, queue):
    # given a group that exists before three messages, the second's record deleted
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b", b"c"])
    logview.delete(client.redis, queue.keys, 2)
    # when the group fetches, then the others are delivered
    assert [d.seq for d in c.fetch(10)] == [1, 3]
    # and the lost one is a dead letter that names the key, with an event
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.reason, dead.data) == (2, "missing-record", b"")
    assert queue.keys.msgs in dead.error
    assert any(e["event"] == "dead-lettered" and e["seq"] == "2" for e in queue.events())
    # and a replay leaves it where it is: there is nothing to replay
    result = queue.replay_dead_letters("g")
    assert (result.replayed, result.skipped) == (0, 1)
    assert [d.seq for d in queue.dead_letters()] == [2]


def test_record_deleted_while_waiting_for_redelivery_is_a_dead_letter(client, queue):
    # given a nacked message whose record is then deleted
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b"])
    first, _ = c.fetch(2)
    first.nack(delay=0)
    logview.delete(client.redis, queue.keys, 1)
    # when the group fetches, then it is a dead letter, not a silent settle
    assert c.fetch(10) == []
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.reason) == (1, "missing-record")


def test_record_gone_before_a_new_group_joined_is_no_corruption(client, queue):
    # given a record settled by the only group, above its floor (deleted then)
    a = queue.consumer("a")
    queue.publish_many([b"1", b"2"])
    _, second = a.fetch(2)
    second.ack()
    # when a second group joins and reads from the floor
    b = queue.consumer("b")
    # then it gets what is left, and no dead letter is made of the gap. A
    # stream log keeps a record settled above the lowest floor until the
    # floor passes it, and a group made later starts at the trim point, so
    # it is handed seq 2 too (docs/layout-d-plan.md, "Step 3, first part
    # (built)"): there is no gap there.
    assert [d.seq for d in b.fetch(10)] == ([1, 2] if logview.is_stream(queue.keys) else [1])
    assert queue.dead_letters() == []


# -- the queue's meta -----------------------------------------------------------------------


def test_deleted_meta_refuses_publish_instead_of_reusing_seqs(client, queue):
    # given a queue whose messages were all handled, then its meta hash deleted
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b", b"c"])
    c.ack(c.fetch(3))
    queue.publish(b"d")
    client.redis.delete(queue.keys.meta)
    # when a message is published (with and without an id), then it is refused, naming the key
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.meta}.*missing") as refused:
        queue.publish(b"x")
    assert refused.value.key == queue.keys.meta
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.meta}.*missing"):
        queue.publish(b"y", id="m1")
    # and nothing was stored or overwritten
    assert client.redis.exists(queue.keys.meta) == 0
    assert logview.seqs(client.redis, queue.keys) == [4]


def test_deleted_meta_fails_fetch_and_stats_instead_of_negative_pending(client, queue):
    # given a group that read one of two messages, then the meta hash deleted
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b"])
    c.fetch(1)
    client.redis.delete(queue.keys.meta)
    # when the group fetches or the stats are read, then both name the key
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.meta}.*missing"):
        c.fetch(10)
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.meta}.*missing"):
        queue.stats()


def test_a_new_queue_with_a_group_and_no_meta_is_not_corrupt(client, queue):
    # given a group on a queue never published to (no meta hash yet)
    c = queue.consumer("g")
    # when it fetches, reads stats and a message is published, then all work
    assert c.fetch(10) == []
    assert queue.stats().group("g").pending == 0
    assert queue.publish(b"a").seq == 1


# -- leases and delivery states -------------------------------------------------------------


def test_deleted_lease_is_named_by_the_next_idle_fetch(client, queue, clock):
    # given a delivery whose lease entry is deleted, and its holder gone
    a = queue.consumer("g", name="a")
    b = queue.consumer("g", name="b")
    queue.publish(b"x")
    a.fetch(1)
    client.redis.zrem(group_key(queue, "g", "lease"), 1)
    clock.advance(queue.settings().ack_wait + 1)
    # when another consumer finds nothing to fetch, then it says why, naming the lease set
    with pytest.raises(rqueue.CorruptRecord, match=group_key(queue, "g", "lease")):
        b.fetch(1)


def test_deleted_delivery_state_is_a_dead_letter_when_its_lease_runs_out(client, queue, clock):
    # given a delivery whose state is deleted
    a = queue.consumer("g", name="a")
    queue.publish_many([b"x", b"y"])
    [d] = a.fetch(1)
    client.redis.hdel(group_key(queue, "g", "dlv"), 1)
    # when its holder acks it, then the ack names the missing state and settles nothing
    with pytest.raises(rqueue.CorruptRecord, match=group_key(queue, "g", "dlv")):
        d.ack()
    # and when its lease runs out, then it is a dead letter, not stuck
    clock.advance(queue.settings().ack_wait + 1)
    b = queue.consumer("g", name="b")
    assert [x.seq for x in b.fetch(1)] == [2]
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.reason, dead.data) == (1, "corrupted-state", b"x")
    assert group_key(queue, "g", "dlv") in dead.error


# -- cursor and floors ----------------------------------------------------------------------


def test_cursor_moved_back_is_refused_before_any_handler_runs_again(client, queue):
    # given two groups, the first having acked all three messages, its cursor then moved back
    g1 = queue.consumer("g1")
    g2 = queue.consumer("g2")
    queue.publish_many([b"a", b"b", b"c"])
    g1.ack(g1.fetch(3))
    client.redis.hset(queue.keys.group("g1").state, "cursor", 0)
    # when the first group fetches, then it is refused, naming the group's key
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.group('g1').state}.*cursor"):
        g1.fetch(10)
    # and the second group still gets every message
    assert [d.data for d in g2.fetch(10)] == [b"a", b"b", b"c"]


@pytest.mark.parametrize("garbage", [b"garbage", b"-3", b"1.5"])
@pytest.mark.sync_only("the doctor (rqueue.doctor) works on a sync queue")
def test_garbage_in_a_floor_is_named_not_a_lua_error(client, queue, garbage):
    # given a group holding a delivery, its floor then overwritten
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b"])
    [d] = c.fetch(1)
    client.redis.hset(queue.keys.floors, "g", garbage)
    floor = f"{queue.keys.floors}: field g"
    # when it acks or reads stats, then each names the key and field, and the ack settles nothing
    with pytest.raises(rqueue.CorruptRecord, match=floor):
        d.ack()
    with pytest.raises(rqueue.CorruptRecord, match=floor):
        queue.stats()
    # and the refused ack changed nothing: once the floor is set right, the doctor finds nothing,
    # the delivery is still held, and its ack goes through
    client.redis.hset(queue.keys.floors, "g", 0)
    assert doctor.examine(queue) == []
    d.ack()
    assert [(d.seq, d.delivery_count) for d in c.fetch(10)] == [(2, 1)]


@pytest.mark.sync_only("the doctor (rqueue.doctor) works on a sync queue")
def test_deleted_lease_of_a_member_removed_as_dead_is_an_event_and_the_doctor_repairs_it(client, queue, clock):
    # given a delivery whose lease entry is deleted, its holder then silent
    a = queue.consumer("g", name="a")
    b = queue.consumer("g", name="b")
    queue.publish(b"x")
    a.fetch(1)
    client.redis.zrem(group_key(queue, "g", "lease"), 1)
    clock.advance(queue.settings().ack_wait + 1)
    # when another member's heartbeat removes it, then a "corrupt" event names the keys
    b.heartbeat([], timeout=1)
    [event] = [e for e in queue.events() if e["event"] == "corrupt"]
    assert group_key(queue, "g", "lease") in event["reason"] and "field a counted 1" in event["reason"]
    # and the doctor finds the message stranded, and its repair offers it again
    found = doctor.examine(queue)
    assert [(f.kind, f.seq) for f in found] == [(doctor.Kind.STATE_STRANDED, 1)]
    doctor.repair(queue, found)
    assert [(d.seq, d.delivery_count) for d in b.fetch(1)] == [(1, 2)]


@pytest.mark.sync_only("the doctor (rqueue.doctor) works on a sync queue")
def test_a_fetch_that_meets_a_deleted_meta_with_a_redelivery_due_is_refused_and_the_repair_hands_it_out(client, queue):
    # given a nacked message ready for redelivery, two unread, then the meta hash deleted
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b", b"c"])
    [first] = c.fetch(1)
    first.nack(delay=0)
    client.redis.delete(queue.keys.meta)
    # when the group fetches, then it is refused, naming the meta hash (nothing is handed out or changed)
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.meta}.*missing"):
        c.fetch(10)
    # and after the doctor's repair the redelivery goes out, then the two unread
    doctor.repair(queue, doctor.examine(queue))
    assert [(d.seq, d.delivery_count) for d in c.fetch(10)] == [(1, 2), (2, 1), (3, 1)]


def test_deleted_lease_of_a_live_holder_comes_back_with_its_next_extension(client, queue, clock):
    # given a delivery whose lease entry is deleted, its holder alive
    a = queue.consumer("g", name="a")
    queue.publish(b"x")
    [d] = a.fetch(1)
    client.redis.zrem(group_key(queue, "g", "lease"), 1)
    # when the holder extends it (in_progress, or a Worker's heartbeat), then the lease is back
    a.in_progress(d)
    assert client.redis.zscore(group_key(queue, "g", "lease"), 1) is not None
    # and a "corrupt" event names the lease set; running out, it is offered again
    [event] = [e for e in queue.events() if e["event"] == "corrupt"]
    assert group_key(queue, "g", "lease") in event["reason"]
    clock.advance(queue.settings().ack_wait + 1)
    assert [(x.seq, x.delivery_count) for x in queue.consumer("g", name="b").fetch(1)] == [(1, 2)]


def test_purge_of_a_group_whose_cursor_moved_back_is_refused_and_changes_nothing(client, queue):
    # given two groups, g1 having acked both messages, its cursor then moved back
    g1 = queue.consumer("g1")
    g2 = queue.consumer("g2")
    queue.publish_many([b"a", b"b"])
    g1.ack(g1.fetch(2))
    client.redis.hset(queue.keys.group("g1").state, "cursor", 0)
    # when g1 is purged, then it is refused naming the group's key (settling them again would delete them under g2)
    with pytest.raises(rqueue.CorruptRecord, match="cursor is 0, below the ack floor 2"):
        queue.purge("g1")
    assert [d.data for d in g2.fetch(10)] == [b"a", b"b"]


def test_replay_into_a_group_whose_floor_is_garbage_is_refused_and_changes_nothing(client, queue):
    # given a dead letter of group g, then g's floor overwritten
    client.configure("orders", max_deliveries=1)
    c = queue.consumer("g")
    queue.publish(b"a")
    c.fetch(1)[0].nack(delay=0)
    client.redis.hset(queue.keys.floors, "g", b"zz")
    # when it is replayed, then the floor is named and the dead letter stays
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.floors}: field g"):
        queue.replay_dead_letters("g")
    assert [d.seq for d in queue.dead_letters()] == [1]


def test_nack_and_reject_of_a_delivery_whose_state_was_deleted_name_the_key(client, queue):
    # given a held delivery whose state was deleted
    c = queue.consumer("g")
    queue.publish(b"x")
    [d] = c.fetch(1)
    client.redis.hdel(group_key(queue, "g", "dlv"), 1)
    # when it is nacked or rejected, then both name the states' key
    for settle in (d.nack, d.term):
        with pytest.raises(rqueue.CorruptRecord, match=group_key(queue, "g", "dlv")):
            settle()


def test_a_worker_stops_on_a_damaged_queue_naming_the_key_and_the_doctor(client, queue):
    # given a queue whose meta hash was deleted under a group
    queue.publish(b"m")
    queue.consumer("g", "c0").close()
    client.redis.delete(queue.keys.meta)
    # when a worker runs on it
    worker = rqueue.Worker(queue, "g", lambda d: None, concurrency=1, scheduler=False)
    # then it stops with the error, naming the key and what to run, instead of carrying on
    with pytest.raises(rqueue.CorruptRecord) as stopped:
        worker.run(install_signal_handlers=False)
    assert queue.keys.meta in str(stopped.value) and "rqueue doctor" in str(stopped.value)


@pytest.mark.sync_only("a tracked publish is the sync engine's (the Spark writer's)")
def test_a_tracked_publish_refuses_a_deleted_meta_as_publish_does(client, queue):
    # given a queue with a message and a group that settled it, whose meta hash was deleted
    from rqueue.engine import commands

    queue.publish(b"m")
    c = queue.consumer("g")
    c.ack(c.fetch(1))
    queue.publish(b"kept")
    client.redis.delete(queue.keys.meta)
    # when a Spark writer's tracked publish stores a row
    # then it is refused naming the key, and nothing is stored (seqs are not reused)
    with pytest.raises(rqueue.CorruptRecord, match=f"{queue.keys.meta}.*missing"):
        commands.publish_tracked(
            client.scripts, queue.keys, "run:0", "", 60_000, "position", 0, [(None, 0, b"row")], queue.name
        )
    assert client.redis.exists(queue.keys.meta) == 0
    assert logview.count(client.redis, queue.keys) == 1


def test_nack_available_names_a_damaged_delivery_state_as_its_status_alone_as_among_others(client, queue):
    # given two held deliveries, each alone in a nack_available, then both together, whose states are garbage
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g", prefetch=2)
    d1, d2 = c.fetch(2)
    for seq in (1, 2):
        client.redis.hset(group_key(queue, "g", "dlv"), seq, b"nonsense")
    # when they are nacked leniently, together and then the first alone
    together = c.nack_available([d1, d2], delay=0)
    alone = c.nack_available([d1], delay=0)
    # then the damage is each one's status, returned not raised, both times
    assert [type(s).__name__ for s in together] == ["CorruptRecord", "CorruptRecord"]
    assert [type(s).__name__ for s in alone] == ["CorruptRecord"]


@pytest.mark.sync_only("it reads a reply with the sync engine's fetch")
def test_a_fetch_reply_cut_inside_a_delivery_raises_rather_than_dropping_it(client, queue):
    # given a fetch's reply of two deliveries, its last record cut off
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g")
    mark = c._watch.mark()
    reply = commands.fetch(c._group_call(), 2, "tcut")
    cut = reply._replace(raw=reply.raw[:-1])
    # when the consumer reads it, then it raises: no delivery goes unsaid
    with pytest.raises(ValueError):
        c._parse(cut, mark)
