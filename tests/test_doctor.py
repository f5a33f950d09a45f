"""`rqueue doctor`: the checks of a queue's invariants (rqueue/doctor.py) on
every backend, each repair taking the queue back to a state the scripts
accept without losing or repeating a message, and the command's output and
exit codes."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner
from support import logview
from support.raw import group_key

import rqueue
from rqueue import doctor
from rqueue.cli import cli
from rqueue.doctor import Kind, Outcome
from rqueue.engine import commands
from rqueue.engine.keys import LogLayout
from rqueue.errors import CorruptRecord


def kinds(findings: list[doctor.Finding]) -> list[tuple[Kind, int | None]]:
    return sorted((f.kind, f.seq) for f in findings)


def test_a_queue_in_every_normal_state_is_clean(client, queue, clock):
    # given a queue with settled, in-flight, nacked, delayed, acked-above-floor and unread messages, two groups
    a = queue.consumer("g", name="a")
    other = queue.consumer("h")
    queue.publish_many([b"1", b"2", b"3", b"4", b"5", b"6"])
    d1, d2, d3, d4 = a.fetch(4)
    d1.ack()
    d3.ack()
    d2.nack(delay=30)
    other.fetch(1)[0].nack(delay=0)
    # and a delayed publish passed over, a dead letter replayed, a purged group
    queue.publish(b"later", delay=60)
    a.fetch(10)
    client.configure("orders", max_deliveries=1)
    d4.nack(delay=0)
    client.configure("orders", max_deliveries=5)
    queue.replay_dead_letters("g")
    queue.consumer("p").fetch(2)
    queue.purge("p")
    # when the doctor examines it, then it finds nothing
    assert doctor.examine(queue) == []


def test_a_queue_under_flow_control_is_clean(client, queue, clock):
    # given priority messages delivered and acked above the cursor, some
    # waiting in the group's priority set, some passed by the scan, a rate
    # limit, a paused group and a queue on hold
    client.configure("orders", rate_limit=100)
    a = queue.consumer("g", name="a")
    other = queue.consumer("h")
    queue.publish_many([b"1", b"2", b"3", b"4", b"5", b"6"], priority=[0, 5, 9, 0, 3, 0])
    d3, d2 = a.fetch(2)
    assert (d3.seq, d2.seq) == (3, 2)
    d3.ack()
    [d5, d1] = a.fetch(2)
    d1.ack()
    other.fetch(1)
    queue.pause("h")
    queue.pause(mode="hold")
    queue.publish(b"7", priority=9)
    # when the doctor examines it, then it finds nothing
    assert doctor.examine(queue) == []
    # and after everything is settled either
    queue.resume("h")
    queue.resume()
    for c in (a, other):
        while got := c.fetch(10):
            c.ack(got)
    d2.ack()
    d5.ack()
    assert doctor.examine(queue) == []


def test_a_queue_with_ordering_keys_is_clean(client, queue):
    # given keyed messages out, acked above the cursor, waiting in the group's
    # key queue behind a busy key, and plain ones
    client.configure("orders", key_concurrency=2)
    c = queue.consumer("g")
    queue.publish_many([b"a1", b"a2", b"a3", b"p", b"b1", b"b2"], key=["a", "a", "a", None, "b", "b"])
    *got, last = c.fetch(3)
    last.ack()
    # when the doctor examines it, then it finds nothing
    assert doctor.examine(queue) == []
    # and after everything is settled either
    while more := c.fetch(10) + got:
        c.ack(more)
        got = []
    assert doctor.examine(queue) == []


@pytest.mark.parametrize("deleted", ["key_busy", "key_ready"])
def test_an_ordering_key_in_no_line_is_found_and_put_back(client, queue, clock, deleted):
    # given key a with a1 out and a2 waiting, key b with b1 delayed and b2 behind it
    queue.publish_many([b"a1", b"a2"], key="a")
    queue.publish(b"b1", key="b", delay=5)
    queue.publish(b"b2", key="b")
    c = queue.consumer("g")
    [a1] = c.fetch(10)
    # when the group's busy keys or its ready keys are deleted, a1 acked and b1 due
    client.redis.delete(getattr(queue.keys.group("g"), deleted))
    a1.ack()
    clock.advance(5)
    # then the key left in no line hands out nothing (the other key flows)
    stranded, other = ("a", [b"b1", b"b2"]) if deleted == "key_busy" else ("b", [b"a2"])
    flowed = []
    while got := c.fetch(10):
        c.ack(got)
        flowed += [d.data for d in got]
    assert flowed == other
    # and the doctor finds it, and its repair puts it back: its messages come, in order
    findings = doctor.examine(queue)
    assert [(f.kind, stranded in f.detail) for f in findings] == [(Kind.KEY_STRANDED, True)]
    [done] = doctor.repair(queue, findings)
    assert done.outcome is Outcome.REPAIRED
    assert doctor.examine(queue) == []
    flowed = []
    while got := c.fetch(10):
        c.ack(got)
        flowed += [d.data for d in got]
    assert flowed == ([b"a2"] if stranded == "a" else [b"b1", b"b2"])


@pytest.mark.parametrize(
    ("held", "kind"),
    [
        # a priority message out above plain ones unread, and a plain one acked: a cursor
        # set to the priority message's seq skipped the unread ones (found by a second run)
        ("priority above unread", Kind.CURSOR_BELOW_RUN),
        # plain messages out, none acked: nothing was found, and the next fetch handed them out again
        ("plain, none acked", Kind.CURSOR_BELOW_DELIVERY),
        # only priority messages acked: nothing was found, and every fetch was refused
        ("priority acked", Kind.CURSOR_BELOW_RUN),
        # only a priority message out: nothing was found, and every fetch was refused
        ("priority out", Kind.CURSOR_BELOW_DELIVERY),
    ],
)
def test_a_deleted_group_hash_is_repaired_in_one_run(client, queue, held, kind):
    # given a group holding (and having acked) some messages, with more unread
    a = queue.consumer("g", name="a")
    queue.publish_many([b"1", b"2", b"3", b"4"])
    if held == "plain, none acked":
        assert [d.seq for d in a.fetch(2)] == [1, 2]
        unread = [3, 4]
    else:
        urgent = queue.publish(b"urgent", priority=5).seq
        out = a.fetch(3 if held == "priority above unread" else 1)
        assert [d.seq for d in out] == [urgent, 1, 2][: len(out)]
        if held != "priority out":
            a.ack(out[-1] if held == "priority above unread" else out[0])
        unread = [3, 4] if held == "priority above unread" else [1, 2, 3, 4]
    # when the group's hash is deleted
    client.redis.delete(queue.keys.group("g").state)
    # then a fetch hands out nothing twice: it is refused, naming the missing cursor
    b = queue.consumer("g", name="b")
    if held != "priority above unread":
        with pytest.raises(rqueue.CorruptRecord, match="field cursor is missing"):
            b.fetch(10)
    # and one run of the doctor finds the cursor and repairs everything
    found = doctor.examine(queue)
    assert kind in {f.kind for f in found}
    assert all(r.outcome is Outcome.REPAIRED for r in doctor.repair(queue, found))
    assert doctor.examine(queue) == []
    # and the unread messages are handed out once each, as first deliveries, and nothing else
    assert [(d.seq, d.delivery_count) for d in b.fetch(10)] == [(s, 1) for s in unread]
    assert b.fetch(10) == []


def test_deleted_lease_is_found_and_repaired_into_a_redelivery(client, queue, clock):
    # given a delivery whose lease entry was deleted, its holder gone
    a = queue.consumer("g", name="a")
    b = queue.consumer("g", name="b")
    queue.publish(b"x")
    a.fetch(1)
    client.redis.zrem(group_key(queue, "g", "lease"), 1)
    # when the doctor examines it, then the state without a lease and the holder's count are named
    found = doctor.examine(queue)
    assert kinds(found) == [(Kind.COUNT_MISMATCH, None), (Kind.STATE_WITHOUT_LEASE, 1)]
    assert {f.key for f in found} == {group_key(queue, "g", "dlv"), queue.keys.group("g").consumers}
    # when it repairs, then the message gets a lease that runs out now, and is offered again
    repairs = doctor.repair(queue, found)
    assert [r.outcome for r in repairs] == [Outcome.REPAIRED, Outcome.GONE]
    assert doctor.examine(queue) == []
    [again] = b.fetch(1)
    assert (again.seq, again.delivery_count) == (1, 2)


def test_deleted_state_is_found_and_repaired_into_a_dead_letter(client, queue):
    # given a leased message whose delivery state was deleted
    a = queue.consumer("g", name="a")
    queue.publish(b"x")
    a.fetch(1)
    client.redis.hdel(group_key(queue, "g", "dlv"), 1)
    # when the doctor examines and repairs it
    found = doctor.examine(queue)
    assert kinds(found) == [(Kind.COUNT_MISMATCH, None), (Kind.LEASE_WITHOUT_STATE, 1)]
    repairs = doctor.repair(queue, found)
    # then the message is a dead letter (never deleted), the counts add up and the queue is clean
    assert [r.outcome for r in repairs] == [Outcome.REPAIRED, Outcome.REPAIRED]
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.reason, dead.data) == (1, "corrupted-state", b"x")
    assert doctor.examine(queue) == []
    assert a.fetch(1) == []


def test_cursor_moved_back_is_repaired_without_handing_out_anything_twice(client, queue):
    # given two groups, g1 with three acked, one held and one unread message, its cursor moved back to 0
    g1 = queue.consumer("g1")
    g2 = queue.consumer("g2")
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"])
    got = g1.fetch(4)
    g1.ack(got[:3])
    client.redis.hset(queue.keys.group("g1").state, "cursor", 0)
    # when the doctor examines it, then the cursor is named with its repair
    [found] = doctor.examine(queue)
    assert (found.kind, found.key) == (Kind.CURSOR_BELOW_FLOOR, queue.keys.group("g1").state)
    # when it repairs, then g1 gets only the unread message, and g2 every one
    [fixed] = doctor.repair(queue, [found])
    assert fixed.outcome is Outcome.REPAIRED
    assert [d.seq for d in g1.fetch(10)] == [5]
    assert [d.seq for d in g2.fetch(10)] == [1, 2, 3, 4, 5]
    assert doctor.examine(queue) == []


def test_a_lost_priority_log_entry_does_not_move_the_cursor_past_an_unread_message(client, queue):
    # given a plain message never delivered (seq 1) and a priority message
    # held (seq 2), and the queue's priority log deleted (damage)
    c = queue.consumer("g")
    queue.publish(b"plain")
    queue.publish(b"urgent", priority=9)
    [held] = c.fetch(1)
    assert held.seq == 2
    client.redis.delete(queue.keys.prio)
    # when the doctor examines the queue and repairs what it found
    found = doctor.examine(queue)
    doctor.repair(queue, found)
    # then the cursor stays (the held seq may be a priority message): the
    # plain message is still handed out, and nothing twice
    assert Kind.CURSOR_BELOW_DELIVERY not in {f.kind for f in found}
    c.ack(held)
    assert [d.seq for d in c.fetch(10)] == [1]


def test_a_lost_priority_log_does_not_move_the_cursor_past_unread_messages(client, queue):
    # given plain messages never handed out (seqs 1-3) and priority messages
    # handed out apart from the cursor and acked (seqs 4-6: an acked run
    # above the cursor), and the queue's priority log deleted (damage)
    c = queue.consumer("g", prefetch=10)
    queue.publish_many([b"plain-1", b"plain-2", b"plain-3"])
    queue.publish_many([b"urgent-4", b"urgent-5", b"urgent-6"], priority=9)
    first = c.fetch(3)
    assert sorted(d.seq for d in first) == [4, 5, 6]
    c.ack(first)
    client.redis.delete(queue.keys.prio)
    # when the doctor repairs what it finds until nothing is left to repair
    for _ in range(3):
        found = doctor.examine(queue)
        if not any(f.fix for f in found):
            break
        doctor.repair(queue, found)
    # then nothing is left to report, and the plain messages are each handed out once
    assert doctor.examine(queue) == []
    got = []
    while more := c.fetch(10):
        c.ack(more)
        got += [(d.data, d.delivery_count) for d in more]
    assert sorted(got) == [(b"plain-1", 1), (b"plain-2", 1), (b"plain-3", 1)]
    # (a stream log's side records of 4-6, which fetch deletes by their
    # priority log entries, are then left: side-record-leaked, deleted)
    leaked = doctor.examine(queue)
    assert {f.kind for f in leaked} <= {Kind.SIDE_LEAKED}
    doctor.repair(queue, leaked)
    assert doctor.examine(queue) == []


def test_a_group_the_floors_hash_lost_is_found_and_registered_again(client, queue):
    # given the queue's one group, its first message settled (floor 1) and
    # two unread, and the floors hash (the registry of groups) deleted
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b", b"c"])
    c.ack(c.fetch(1))
    c.close()
    client.redis.delete(queue.keys.floors)
    # when a consumer joins, then it is refused, sent to the doctor
    with pytest.raises(CorruptRecord):
        queue.consumer("g").fetch(1)
    # when the doctor examines the queue, then it names the group, with its floor known
    [found] = doctor.examine(queue)
    assert (found.kind, found.group, found.key) == (Kind.GROUP_UNREGISTERED, "g", queue.keys.floors)
    assert found.fix == ("register", "1")
    # when it repairs, then the group is registered again at its floor: the
    # queue is clean, and a consumer gets the unread messages, nothing twice
    [done] = doctor.repair(queue, [found])
    assert done.outcome is Outcome.REPAIRED
    assert doctor.examine(queue) == []
    assert queue.groups() == ["g"]
    c = queue.consumer("g")
    assert [d.data for d in c.fetch(10)] == [b"b", b"c"]


@pytest.mark.parametrize("lost", ["floors", "field"])
def test_a_group_the_floors_hash_lost_beside_another_is_reported_with_what_to_do(client, queue, lost):
    # given two groups that settled different seqs, and the floors hash
    # deleted (or group g's field alone)
    g, h = queue.consumer("g"), queue.consumer("h")
    queue.publish_many([b"a", b"b", b"c"])
    g.ack(g.fetch(2))
    h.ack(h.fetch(1))
    if lost == "floors":
        client.redis.delete(queue.keys.floors)
    else:
        client.redis.hdel(queue.keys.floors, "g")
    # when the doctor examines the queue, then it names each group missing,
    # with no repair (its floor is not known) and what to do instead
    found = doctor.examine(queue)
    missing = ["g", "h"] if lost == "floors" else ["g"]
    assert [(f.kind, f.group, f.fix) for f in found] == [(Kind.GROUP_UNREGISTERED, m, ()) for m in missing]
    assert all(f.repair is None and f"HSET {queue.keys.floors} {f.group} <floor>" in f.detail for f in found)
    # and when the operator sets the floors back, the queue is clean
    client.redis.hset(queue.keys.floors, mapping={"g": 2, "h": 1})
    assert doctor.examine(queue) == []


def test_deleted_meta_is_repaired_so_seqs_go_on(client, queue):
    # given a queue whose meta hash was deleted, with a message unread
    c = queue.consumer("g")
    queue.publish_many([b"1", b"2", b"3"])
    c.ack(c.fetch(2))
    client.redis.delete(queue.keys.meta)
    # when the doctor examines and repairs it
    [found] = doctor.examine(queue)
    assert (found.kind, found.key, found.fix) == (Kind.META_MISSING, queue.keys.meta, ("meta", "3"))
    # (and says what went with the hash, which the repair does not restore)
    assert "pause (or hold) and retention mode" in found.detail
    assert doctor.repair(queue, [found])[0].outcome is Outcome.REPAIRED
    # then publishing goes on after the last seq, and nothing is handed out twice
    assert queue.publish(b"4").seq == 4
    assert [d.data for d in c.fetch(10)] == [b"3", b"4"]


@pytest.mark.parametrize("groups", [1, 2])
def test_deleted_meta_of_a_queue_with_priority_messages_gets_its_flow_flag_back(client, queue, groups):
    # given a priority message handed out apart from the cursor and acked
    # (with two groups the other has yet to read it), then the meta hash deleted
    if groups == 2:
        queue.consumer("other", name="x").close()
    a = queue.consumer("g", name="a")
    queue.publish(b"plain-1")
    queue.publish(b"urgent-2", priority=5)
    queue.publish(b"plain-3")
    [d] = a.fetch(1)
    assert d.seq == 2
    a.ack(d)
    client.redis.delete(queue.keys.meta)
    # when the doctor examines and repairs the queue
    found = doctor.examine(queue)
    assert {f.kind for f in found} == {Kind.META_MISSING, Kind.FLOW_FLAG_MISSING}
    assert all(r.outcome is Outcome.REPAIRED for r in doctor.repair(queue, found))
    # then it is clean, and the group hands out the plain messages, never the acked one again
    assert doctor.examine(queue) == []
    b = queue.consumer("g", name="b")
    assert [(m.seq, m.data) for m in b.fetch(10)] == [(1, b"plain-1"), (3, b"plain-3")]


def test_a_flow_flag_deleted_alone_is_found_and_written_again(client, queue):
    # given a queue whose keyed message waits in the priority log, and meta field prio deleted
    queue.consumer("g")
    queue.publish(b"k-1", key="k")
    client.redis.hdel(queue.keys.meta, "prio")
    # when the doctor examines and repairs it, then the field is back and the queue clean
    [found] = doctor.examine(queue)
    assert (found.kind, found.fix) == (Kind.FLOW_FLAG_MISSING, ("prio",))
    assert doctor.repair(queue, [found])[0].outcome is Outcome.REPAIRED
    assert client.redis.hget(queue.keys.meta, "prio") is not None
    assert doctor.examine(queue) == []


def test_missing_record_is_reported_not_repaired(client, queue):
    # given an unread message whose record was deleted
    queue.consumer("g")
    queue.publish_many([b"1", b"2"])
    logview.delete(client.redis, queue.keys, 2)
    # when the doctor examines it, then it names the record's key, with no repair
    [found] = doctor.examine(queue)
    assert (found.kind, found.key, found.seq, found.repair) == (Kind.RECORD_MISSING, queue.keys.msgs, 2, None)


def test_a_partitioned_queue_is_examined_partition_by_partition(client):
    # given a partitioned queue whose partition 1 lost a lease
    q = client.queue("parted", partitions=2)
    part = q.parts[1]
    part.publish(b"x")
    part.consumer("g", name="a").fetch(1)
    client.redis.zrem(group_key(part, "g", "lease"), 1)
    # when the doctor examines it, then the finding names the partition
    found = doctor.examine(q)
    assert {f.queue for f in found} == {"parted/1"}


# -- the command -----------------------------------------------------------------------------


def run(backend, prefix, *args):
    return CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, *args])


@pytest.fixture
def plain(backend, prefix):
    """A client on the real clock, as the command's."""
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


def test_command_exit_codes_json_and_repair(backend, prefix, plain):
    # given a clean queue, then exit code 0
    q = plain.queue("orders")
    q.publish(b"x")
    q.consumer("g", name="a").fetch(1)
    clean = run(backend, prefix, "doctor", "orders")
    assert (clean.exit_code, clean.stdout.strip()) == (0, "queue orders: clean")
    # given a deleted lease, then exit code 1 and the finding in JSON
    plain.redis.zrem(group_key(q, "g", "lease"), 1)
    broken = run(backend, prefix, "doctor", "orders", "--json")
    report = json.loads(broken.stdout)
    assert broken.exit_code == 1 and not report["clean"]
    assert [f["kind"] for f in report["findings"]] == ["state-without-lease", "count-mismatch"]
    # when it repairs, then it says what it did and exits 0
    fixed = run(backend, prefix, "doctor", "orders", "--repair")
    assert fixed.exit_code == 0, fixed.output
    assert "repaired  state-without-lease" in fixed.stdout and "0 findings remain" in fixed.stdout
    # an unknown queue is 3, a bad name 2
    assert run(backend, prefix, "doctor", "nope").exit_code == 3
    assert run(backend, prefix, "doctor", "bad name").exit_code == 2


def test_seqs_a_lost_acked_run_held_are_reported_not_handed_out_again(client, queue):
    # given two groups, g1 having acked 2 and 3 above its floor (1 held), its acked runs then deleted
    g1 = queue.consumer("g1")
    queue.consumer("g2")
    queue.publish_many([b"1", b"2", b"3"])
    _, d2, d3 = g1.fetch(3)
    g1.ack([d2, d3])
    client.redis.delete(queue.keys.group("g1").acked)
    # when the doctor examines and repairs it
    found = [f for f in doctor.examine(queue) if f.kind is Kind.UNTRACKED]
    # then 2 and 3 are named, without a repair: another group's count says they may have been settled
    assert [(f.seq, f.repair) for f in found] == [(2, None), (3, None)]
    assert doctor.repair(queue, found) == []
    assert [d.seq for d in g1.fetch(10)] == []


def test_deleted_meta_of_a_queue_without_groups_is_repaired_past_its_highest_record(client, queue):
    # given a queue without groups whose first 1,500 records were purged, then its meta hash deleted
    queue.publish_many([b"m"] * 1502)
    logview.delete(client.redis, queue.keys, *range(1, 1501))
    client.redis.delete(queue.keys.meta)
    # when the doctor repairs it, then publishing goes on after the highest record
    [found] = doctor.examine(queue)
    assert found.fix == ("meta", "1502")
    doctor.repair(queue, [found])
    assert queue.publish(b"n").seq == 1503


def test_deleted_dead_letter_meta_refuses_dead_lettering_until_repaired(client, queue):
    # given two dead letters, then the dead-letter queue's meta hash deleted
    client.configure("orders", max_deliveries=1)
    c = queue.consumer("g")
    queue.publish_many([b"1", b"2", b"3"])
    first, second, third = c.fetch(3)
    first.nack(delay=0)
    second.nack(delay=0)
    client.redis.delete(queue.keys.dead_letters.meta)
    # when another message fails, then dead-lettering is refused, overwriting nothing
    with pytest.raises(rqueue.CorruptRecord, match="dead letter 1 exists"):
        third.nack(delay=0)
    assert logview.seqs(client.redis, queue.keys.dead_letters) == [1, 2]
    # when the doctor repairs it, then the next dead letter comes after them
    [found] = doctor.examine(queue)
    assert (found.kind, found.fix) == (Kind.DEAD_LETTER_SEQ_TAKEN, ("dead-letter-seq", "2"))
    doctor.repair(queue, [found])
    third.nack(delay=0)
    assert [(d.dlq_seq, d.data) for d in queue.dead_letters()] == [(1, b"1"), (2, b"2"), (3, b"3")]


def test_a_last_seq_far_above_the_records_is_one_finding_and_a_bounded_check(client, queue):
    # given a group, one stored message, and a last seq set far above it
    queue.consumer("g", "c0").close()
    queue.publish(b"m")
    client.redis.hset(queue.keys.meta, "seq", 100_000_000)
    # when the doctor examines the queue
    found = doctor.examine(queue)
    # then the gap is one finding naming the highest stored record, not one per seq
    missing = [f for f in found if f.kind is doctor.Kind.RECORD_MISSING]
    assert len(missing) == 1
    assert "to 100000000" in missing[0].detail and "highest stored record 1" in missing[0].detail


def test_many_missing_records_are_reported_up_to_a_limit(client, queue):
    # given a group that has not read 1,500 messages whose records were deleted, and one kept above them
    queue.consumer("g", "c0").close()
    queue.publish_many([b"m"] * 1_502)
    logview.delete(client.redis, queue.keys, *range(2, 1_502))
    # when the doctor examines the queue
    found = [f for f in doctor.examine(queue) if f.kind is doctor.Kind.RECORD_MISSING]
    # then it names UNTRACKED_MAX of them, then says it stopped
    assert len(found) == doctor.UNTRACKED_MAX + 1
    assert "the check stopped there" in found[-1].detail


def test_a_busy_queue_gives_no_findings_of_a_moment(backend, prefix):
    # given a queue that a producer and a consumer (acking, nacking now and then) keep busy
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    queue = client.queue("orders")
    queue.consumer("g")  # the group exists before the first publish
    stop = threading.Event()
    done = {"published": 0, "acked": 0}

    def produce() -> None:
        # at most 200 messages ahead of the consumer: each examination reads a bounded queue
        while not stop.is_set():
            if done["published"] - done["acked"] < 200:
                queue.publish_many([b"x"] * 20)
                done["published"] += 20
            else:
                stop.wait(0.005)

    def consume() -> None:
        c = queue.consumer("g")
        turn = 0
        while not stop.is_set():
            for d in c.fetch(10, timeout=0.05):
                turn += 1
                if turn % 7 == 0:
                    d.nack(delay=0)
                else:
                    d.ack()
                    done["acked"] += 1

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        # when the doctor examines it again and again while it changes
        found = [f for _ in range(8) for f in doctor.examine(queue)]
    finally:
        stop.set()
        for t in threads:
            t.join()
        client.close()
    # then it finds nothing: what its unsynchronised reads saw is confirmed in one atomic look first
    assert found == []


def test_a_check_answers_whether_a_finding_holds_and_changes_nothing(client, queue):
    # given a delivery whose lease entry was deleted, and a seq whose record was deleted
    a = queue.consumer("g", name="a")
    queue.publish_many([b"x", b"y"])
    a.fetch(1)
    client.redis.zrem(group_key(queue, "g", "lease"), 1)
    logview.delete(client.redis, queue.keys, 2)
    call = queue.group_call("g")
    before = {k: client.redis.dump(k) for k in sorted(client.redis.keys(f"{client.prefix}*"))}
    # when each finding is checked, then the damaged ones hold, a sound seq is gone, and nothing changed
    assert commands.still_so(call, "state-without-lease", ["1"])
    assert commands.still_so(call, "record-missing", ["2"])
    assert not commands.still_so(call, "record-missing", ["1"])
    assert commands.still_so(call, "counts")
    assert {k: client.redis.dump(k) for k in sorted(client.redis.keys(f"{client.prefix}*"))} == before
    # when the lease is repaired, then its check answers gone
    assert commands.repair(call, "state-without-lease", ["1"]).done
    assert not commands.still_so(call, "state-without-lease", ["1"])


def test_a_seq_settled_above_the_cursor_is_no_missing_record(client, queue):
    # given a plain message unread and a priority message handed out apart
    # from the cursor and acked: its record went with its ack, its seq is in
    # an acked run above the cursor (the doctor, reading as it goes, may have
    # seen it unsettled and without its record)
    a = queue.consumer("g", name="a")
    queue.publish(b"plain")
    queue.publish(b"urgent", priority=5)
    [urgent] = a.fetch(1)
    a.ack(urgent)
    # when the finding is confirmed, then it is gone
    assert not commands.still_so(queue.group_call("g"), "record-missing", [str(urgent.seq)])


@pytest.mark.parametrize("damage", ["record", "stub"])
def test_a_held_priority_message_is_listed_once(client, queue, damage):
    # given plain messages unread and a priority message handed out apart
    # from the cursor and held: its seq is both a delivery state of the
    # group and a seq above its cursor
    a = queue.consumer("g", name="a", prefetch=10)
    queue.publish_many([b"1", b"2", b"3"])
    queue.publish(b"urgent", priority=9)
    [held] = a.fetch(1)
    assert held.seq == 4
    # when its record is deleted (or, in a stream log, its stub entry alone)
    stream = queue.keys.layout is LogLayout.STREAM
    if damage == "stub" and stream:
        client.redis.xdel(queue.keys.msgs, "4-0")
        kind = Kind.STUB_MISSING
    else:
        logview.delete(client.redis, queue.keys, 4)
        kind = Kind.RECORD_MISSING
    # then the doctor lists it once (and counts it once toward the cap)
    assert kinds(doctor.examine(queue)) == [(kind, 4)]


def test_every_kind_of_finding_has_its_row_in_the_doctors_page():
    # given the doctor's page, whose table says what each finding means and what --repair does
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "doctor.md").read_text()
    rows = {
        cell.strip("` ")
        for line in page.splitlines()
        if line.startswith("| `")
        for cell in line.split("|")[1].split(",")
    }
    # when the kinds are listed, then each has a row
    assert sorted(kind.value for kind in Kind if kind.value not in rows) == []
