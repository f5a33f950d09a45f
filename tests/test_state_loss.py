"""Redis losing a queue's state is detected (guarantee 12 in
docs/guarantees.md): each queue has an incarnation id, returned by publish,
fetch, heartbeat and join; a client that sees it change, or a seq go back,
logs at ERROR, records a "state-lost" event, says what is gone, and a
consumer drops what it held, so that no settle from before the loss touches
a new message. Also: delete() leaves no de-duplication id behind, and a
replayed dead letter says it was delivered before.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import logview
from support.aio_bridge import parametrize_api
from support.layouts import both_layouts  # noqa: F401  (every test on both layouts)
from support.servers import start_server, wait_for
from test_aio_worker import AsyncWorkerThread

import rqueue
from rqueue import LossKind, LostDelivery, statewatch
from rqueue.engine.keys import LAYOUT_ENV
from rqueue.randomness import Randomness
from rqueue.results import MessageState
from rqueue.statewatch import StateWatch
from rqueue.stored_results import encode_value

QUEUE = "orders"


pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)


def wipe(client: rqueue.Client) -> None:
    """Every key of the client's prefix deleted: Redis as after a restart
    without its data, a FLUSHALL or a failover to an empty replica (the
    prefix alone: the servers are shared by the session)."""
    for key in list(client.redis.scan_iter(match=f"{client.prefix}:*", count=1000)):
        client.redis.delete(key)


def roll_back(client: rqueue.Client, queue: rqueue.Queue, to: int) -> None:
    """The queue as a replica that missed every publish after seq ``to``
    would have it: same incarnation, last seq ``to``, later records gone."""
    client.redis.hset(queue.keys.meta, "seq", to)
    logview.roll_back(client.redis, queue.keys, to)
    # The groups' cursors with it: a cursor left above the last seq is damage
    # of another kind (tests/test_corruption.py), not a rollback.
    for group in queue.groups():
        key = queue.keys.group(group).state
        cursor = int(client.redis.hget(key, "cursor") or 0)
        if cursor > to:
            client.redis.hset(key, mapping={"cursor": to, "cursor_checked": to})


def replica_of(client: rqueue.Client, queue: rqueue.Queue) -> Callable[[], None]:
    """A replica of the queue as it is now that receives nothing more: the
    function returned fails over to it (every key of the queue, its groups'
    included, as it was when the replica stopped)."""
    r = client.redis
    pattern = queue.keys.base.replace("{", "[{]").replace("}", "[}]") + "*"
    dumped = {key: r.dump(key) for key in r.keys(pattern)}

    def fail_over() -> None:
        for key in r.keys(pattern):
            r.delete(key)
        for key, value in dumped.items():
            r.restore(key, 0, value)

    return fail_over


def sees_the_floor(queue: rqueue.Queue, consumer: rqueue.Consumer) -> None:
    """``consumer`` fetches once while its group is paused: nothing is
    handed out, and the reply tells it the group's ack floor."""
    queue.pause(consumer.group)
    try:
        assert consumer.fetch(1) == []
    finally:
        queue.resume(consumer.group)


def state_lost_events(queue: rqueue.Queue) -> list[dict[str, str]]:
    return [e for e in queue.events() if e["event"] == "state-lost"]


def test_a_queue_gets_one_incarnation_from_its_first_call(client, queue):
    # when a queue is first published to, and then joined
    queue.publish(b"a")
    inc = client.redis.hget(queue.keys.meta, "inc")
    c = queue.consumer("g")
    # then its meta holds one incarnation id, kept by every later call, and no loss is seen
    assert inc is not None and inc.startswith(b"i") and len(inc) == 17
    c.fetch(1)
    queue.publish(b"b")
    assert client.redis.hget(queue.keys.meta, "inc") == inc
    assert queue.last_state_loss is None and c.last_state_loss is None and c.state_epoch == 0


def test_a_publisher_sees_the_queue_start_again(client, queue, caplog):
    # given three confirmed publishes
    queue.publish_many([b"a", b"b", b"c"])
    # when Redis loses every key and the next publish makes the queue anew
    wipe(client)
    with caplog.at_level(logging.ERROR, logger="rqueue"):
        r = queue.publish(b"d")
        queue.publish(b"e")
    # then the publish stands, and the loss is reported once: log, event and last_state_loss
    assert r.seq == 1
    loss = queue.last_state_loss
    assert loss is not None and loss.kind is LossKind.INCARNATION
    assert (loss.gone_above, loss.last_seq_seen, loss.confirmed_gone, loss.noticed_by) == (0, 3, 3, "publisher")
    assert loss.new_incarnation == client.redis.hget(queue.keys.meta, "inc").decode()
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR and "lost state" in rec.getMessage()]
    assert len(errors) == 1 and QUEUE in errors[0].getMessage()
    wait_for(lambda: state_lost_events(queue) != [])  # the asyncio client writes it in the background
    [event] = state_lost_events(queue)
    assert (event["reason"], event["confirmed_gone"], event["noticed_by"]) == ("incarnation-changed", "3", "publisher")


def test_a_publisher_sees_its_seqs_go_back(client, queue):
    # given five confirmed publishes
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"])
    # when Redis comes back as it was after seq 2 (a replica that was behind, a rolled-back AOF)
    roll_back(client, queue, 2)
    r = queue.publish(b"6")
    # then the new seq, 3, is reported as gone back: seqs 3..5 this client confirmed are gone
    assert r.seq == 3
    loss = queue.last_state_loss
    assert loss is not None and loss.kind is LossKind.SEQ_WENT_BACK
    assert (loss.gone_above, loss.last_seq_seen, loss.confirmed_gone) == (2, 5, 3)
    assert loss.incarnation == loss.new_incarnation
    # and it is reported once: the next publish is judged from there
    queue.publish(b"7")
    assert queue.last_state_loss is loss and len(state_lost_events(queue)) == 1


def test_duplicates_are_not_counted_as_gone(client, queue):
    # given five publishes with ids, then a batch whose first id is a duplicate: new seqs 6 and 7
    queue.publish_many([b"1", b"2", b"3", b"4", b"5"], ids=["a", "b", "c", "d", "e"])
    results = queue.publish_many([b"a", b"f", b"g"], ids=["a", "f", "g"])
    assert [(r.seq, r.duplicate) for r in results] == [(1, True), (6, False), (7, False)]
    # when Redis comes back as it was after seq 5
    roll_back(client, queue, 5)
    queue.publish(b"h")
    # then the two confirmed publishes above seq 5 are gone, and no more
    loss = queue.last_state_loss
    assert loss is not None and (loss.gone_above, loss.last_seq_seen, loss.confirmed_gone) == (5, 7, 2)


def test_publishes_from_several_threads_are_no_loss(client, queue):
    # when threads publish through one queue at once, their replies arriving in any order
    def publish() -> None:
        for _ in range(30):
            queue.publish(b"x")

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # then no loss is seen
    assert queue.last_state_loss is None and state_lost_events(queue) == []


def test_a_consumer_drops_what_it_held_and_settles_none_of_it(client, queue):
    # given w holding seq 1 and 2 when Redis loses its data
    queue.publish_many([b"old1", b"old2"])
    w = queue.consumer("g", name="w")
    old = w.fetch(2)
    wipe(client)
    # when new messages are published (seqs 1 and 2 again) and w fetches (joining again)
    queue.publish_many([b"new1", b"new2"])
    new = w.fetch(2)
    assert [(d.seq, d.delivery_count, d.data) for d in new] == [(1, 1, b"new1"), (2, 1, b"new2")]
    # then w reports the loss with the deliveries it dropped
    loss = w.last_state_loss
    assert loss is not None and (loss.kind, loss.deliveries_dropped) == (LossKind.INCARNATION, 2)
    assert w.state_epoch == 1 and all(d.epoch == 1 for d in new)
    # and an old delivery settles nothing: refused before anything is sent
    for settle in (lambda d: d.ack(), lambda d: d.nack(), lambda d: d.reject(), lambda d: d.in_progress()):
        with pytest.raises(LostDelivery, match=old[0].tag) as raised:
            settle(old[0])
        assert raised.value.loss is loss
    statuses = w.ack_available([old[0], new[0]])
    assert isinstance(statuses[0], LostDelivery) and statuses[1] is None
    # and the new messages are still theirs to settle: one acked by its own delivery, one in flight
    g = queue.stats().group("g")
    assert (g.acked, g.in_flight) == (1, 1)
    new[1].ack()
    assert queue.stats().group("g").acked == 2


def test_a_consumer_sees_the_last_seq_go_back(client, queue):
    # given a consumer that fetched seqs 1..4
    queue.publish_many([b"1", b"2", b"3", b"4"])
    c = queue.consumer("g", name="c")
    held = c.fetch(4)
    c.ack(held[:2])
    # when Redis comes back as it was after seq 2
    roll_back(client, queue, 2)
    c.fetch(1)
    # then the fetch reports it, and what was held is dropped
    loss = c.last_state_loss
    assert loss is not None and loss.kind is LossKind.SEQ_WENT_BACK
    assert (loss.gone_above, loss.last_seq_seen, loss.deliveries_dropped) == (2, 4, 2)
    with pytest.raises(LostDelivery):
        held[2].ack()


def test_a_consumer_sees_its_groups_acks_go_back_and_runs_none_of_those_messages_again(client, queue, clock):
    # given seq 1 dead-lettered, and c holding seqs 2..4 when a replica stops receiving
    client.configure(QUEUE, max_deliveries=1)
    queue.publish_many([b"1", b"2", b"3", b"4"])
    c = queue.consumer("g", name="c")
    [first] = c.fetch(1)
    first.nack(delay=0)
    client.configure(QUEUE, max_deliveries=5)
    held = c.fetch(3)
    fail_over = replica_of(client, queue)
    # when c acks them and sees the group's floor at 4, and Redis fails over to the replica
    c.ack(held)
    assert c.fetch(1) == [] and queue.stats().group("g").in_flight == 0
    fail_over()
    assert c.fetch(4) == []  # the replica has them in flight, leased to c
    # then that fetch reports the acks lost: the floor went back from 4 to 1, the messages are kept
    loss = c.last_state_loss
    assert loss is not None and loss.kind is LossKind.ACKS_WENT_BACK
    assert (loss.gone_above, loss.floor_seen, loss.confirmed_gone, loss.group) == (1, 4, 0, "g")
    assert "group 'g' went back from 4 to 1" in str(loss)
    wait_for(lambda: state_lost_events(queue) != [])  # the asyncio client writes it in the background
    [event] = state_lost_events(queue)
    assert (event["reason"], event["seq"], event["floor_seen"], event["group"]) == ("acks-went-back", "1", "4", "g")
    # when seq 1 is replayed from the dead-letter queue (below the floor c saw)
    queue.replay_dead_letters()
    # then it is handed out: an operator asked for it
    [again] = c.fetch(4)
    assert (again.seq, again.replayed) == (1, True)
    again.ack()
    # when the leases of 2..4 run out and they are offered again
    clock.advance(queue.settings().ack_wait + 1)
    assert c.fetch(4) == []
    # then c set them aside unrun, in the dead-letter queue (acked or dead-lettered before, the floor
    # does not say which), and the group settled everything
    assert [(d.seq, d.reason) for d in queue.dead_letters()] == [(s, "settled-before-loss") for s in (2, 3, 4)]
    g = queue.stats().group("g")
    assert (g.in_flight, g.pending, g.ack_floor) == (0, 0, 4)
    # and what comes next is handed out as before, with no loss more
    queue.publish(b"5")
    assert [d.seq for d in c.fetch(4)] == [5]
    assert c.last_state_loss is loss and len(state_lost_events(queue)) == 1


def test_messages_set_aside_after_lost_acks_are_not_judged_otherwise_and_the_next_fetch_is_due_at_once(
    client, queue, clock
):
    # given c holding 1..4 under a ttl of 10 s, a replica then, and c's acks of 1..3 after it (floor 3)
    client.configure(QUEUE, ttl=10)
    queue.publish_many([b"1", b"2", b"3", b"4"])
    c = queue.consumer("g", name="c")
    held = c.fetch(4)
    fail_over = replica_of(client, queue)
    c.ack(held[:3])
    sees_the_floor(queue, c)
    # when Redis fails over to the replica, and the four come back once their leases and ttl ran out
    fail_over()
    clock.advance(queue.settings().ack_wait + 10)
    statuses, got, due_in = c.ack_and_fetch([], 4)
    # then 1..3 are set aside as settled before the loss, not as expired; 4, never settled, is
    # judged as ever (expired); and the caller is told to fetch again at once
    assert got == [] and due_in == 0
    assert [(d.seq, d.reason) for d in queue.dead_letters()] == [
        (1, "settled-before-loss"),
        (2, "settled-before-loss"),
        (3, "settled-before-loss"),
        (4, "expired"),
    ]


def test_a_message_set_aside_after_lost_acks_keeps_a_failure_in_place_of_its_lost_result(client, queue, clock):
    # given a queue that keeps results, c holding 1..2, a replica then, and c's results and acks of both after it
    client.configure(QUEUE, results=True)
    queue.publish_many([b"1", b"2"])
    c = queue.consumer("g", name="c")
    held = c.fetch(2)
    fail_over = replica_of(client, queue)
    c.ack_results([(d, encode_value(b"done")) for d in held], event=False)
    assert queue.result(1, timeout=0).value == b"done"
    sees_the_floor(queue, c)
    # when Redis fails over to the replica, which lost the results with the acks, and the two come back
    fail_over()
    clock.advance(queue.settings().ack_wait + 1)
    assert c.fetch(2) == []
    # then a caller waiting for a result is answered at once: set aside, not run again
    for seq in (1, 2):
        result = queue.result(seq, timeout=0)
        assert not result.ok and result.failure.reason == "settled-before-loss"
        assert "before Redis lost acks" in result.failure.error


def test_a_restore_from_before_a_reset_is_a_loss(client, queue):
    # given c that acked 1..4 (floor 4), a replica then, and after it acks of 5..8 (floor 8), and a reset
    # back whose messages c handled again (a new generation, floor 8 again)
    queue.create_group("other")  # keeps the records, so that the reset hands them out again
    queue.publish_many([b"%d" % i for i in range(1, 9)])
    c = queue.consumer("g", name="c")
    c.ack(c.fetch(4))
    sees_the_floor(queue, c)
    fail_over = replica_of(client, queue)
    c.ack(c.fetch(4))
    sees_the_floor(queue, c)
    queue.reset_group("g", "first")
    c.ack(c.fetch(8))
    sees_the_floor(queue, c)
    assert c.last_state_loss is None
    # when Redis fails over to the replica: the generation before the reset, floor 4
    fail_over()
    # then c reports the loss, naming both generations, and sets 5..8 aside unrun
    assert c.fetch(8) == []
    loss = c.last_state_loss
    assert loss is not None and loss.kind is LossKind.ACKS_WENT_BACK
    assert (loss.gone_above, loss.floor_seen, loss.generations) == (4, 8, (3, 2))  # "other" took generation 1
    assert "went back from generation 3 (ack floor 8) to generation 2" in str(loss)
    assert [(d.seq, d.reason) for d in queue.dead_letters()] == [(s, "settled-before-loss") for s in (5, 6, 7, 8)]


def test_seqs_taken_back_after_a_loss_of_acks_are_new_messages(client, queue):
    # given c that saw the floor at 6 when Redis lost acks (a replica from when 1..6 were published and
    # 1..2 acked), then lost publishes too (a replica from when only 1..4 were)
    queue.publish_many([b"1", b"2", b"3", b"4"])
    c = queue.consumer("g", name="c")
    c.ack(c.fetch(2))
    older = replica_of(client, queue)
    queue.publish_many([b"5", b"6"])
    older_acks = replica_of(client, queue)
    c.ack(c.fetch(4))
    sees_the_floor(queue, c)
    older_acks()
    sees_the_floor(queue, c)
    assert c.last_state_loss is not None and c.last_state_loss.kind is LossKind.ACKS_WENT_BACK
    older()
    sees_the_floor(queue, c)
    assert c.last_state_loss.kind is LossKind.SEQ_WENT_BACK
    # when 5 and 6 are published again, as new messages
    queue.publish_many([b"new5", b"new6"])
    # then they are handed out and run: only 3 and 4, settled before, are set aside
    got = c.fetch(10)
    assert [(d.seq, d.data) for d in got] == [(5, b"new5"), (6, b"new6")]
    assert [(d.seq, d.reason) for d in queue.dead_letters()] == [(3, "settled-before-loss"), (4, "settled-before-loss")]


def test_messages_published_after_a_loss_of_publishes_and_acks_run(client, queue, clock):
    # given c that saw seqs 1..8 and the group's floor at 8, and a replica from when 1..4 were
    # published and 1..2 acked
    queue.publish_many([b"1", b"2", b"3", b"4"])
    c = queue.consumer("g", name="c")
    c.ack(c.fetch(2))
    older = replica_of(client, queue)
    queue.publish_many([b"5", b"6", b"7", b"8"])
    c.ack(c.fetch(6))
    sees_the_floor(queue, c)
    # when Redis fails over to the replica, and six new messages take seqs 5..10 before c calls again
    older()
    clock.advance(1)
    new = [b"new%d" % seq for seq in range(5, 11)]
    assert [r.seq for r in queue.publish_many(new)] == list(range(5, 11))
    # then c reports the acks lost (its seqs did not go back), sets aside 3 and 4, settled before,
    # and hands out the new messages: published after it saw the floor, they are not what it settled
    got = c.fetch(10)
    assert c.last_state_loss is not None and c.last_state_loss.kind is LossKind.ACKS_WENT_BACK
    assert [d.data for d in got] == new
    assert [(d.seq, d.reason) for d in queue.dead_letters()] == [(3, "settled-before-loss"), (4, "settled-before-loss")]


def holds_seq_1_and_acked_2_to_4_above_the_floor(
    client: rqueue.Client, queue: rqueue.Queue, by: str = "ack"
) -> tuple[Any, Callable[[], None]]:
    """Consumer "c" holding seq 1 and done with 2..4 (priority messages,
    handed out first), acked above the group's floor (0: 1 is held), and a
    replica of the queue from before the fetch; ``by`` "ack" (ack.lua's
    reply carries no floor) or "ack_and_fetch" (the fetch's reply does)."""
    queue.publish(b"1")
    queue.publish_many([b"2", b"3", b"4"], priority=9)
    c = queue.consumer("g", name="c")
    fail_over = replica_of(client, queue)
    held = c.fetch(4)
    assert [d.seq for d in held] == [2, 3, 4, 1]
    if by == "ack":
        c.ack(held[:3])
    else:
        statuses, got, _ = c.ack_and_fetch(held[:3], 1)
        assert statuses == [None, None, None] and got == []
    assert queue.stats().group("g").ack_floor == 0
    return c, fail_over


@pytest.mark.parametrize("by", ["ack", "ack_and_fetch"])
def test_acks_above_the_floor_that_redis_lost_are_reported_and_those_messages_set_aside(client, queue, by):
    # given c holding 1 and done with 2..4, acked above the floor, and a replica from before those acks
    c, fail_over = holds_seq_1_and_acked_2_to_4_above_the_floor(client, queue, by)
    assert c.last_state_loss is None
    # when Redis fails over to the replica: same incarnation, seqs and floor, the acks gone
    fail_over()
    got = c.fetch(4)
    # then c reports the acks lost, sets 2..4 aside unrun, and runs 1 (never acked)
    assert [d.seq for d in got] == [1]
    loss = c.last_state_loss
    assert loss is not None and loss.kind is LossKind.ACKS_LOST
    assert (loss.seqs, loss.gone_above, loss.group, loss.deliveries_dropped) == ((2, 3, 4), 0, "g", 0)
    assert "handed out again 3 messages" in str(loss)
    wait_for(lambda: state_lost_events(queue) != [])  # the asyncio client writes it in the background
    [event] = state_lost_events(queue)
    assert (event["reason"], event["group"]) == ("acks-lost", "g")
    assert [(d.seq, d.reason) for d in queue.dead_letters()] == [(s, "settled-before-loss") for s in (2, 3, 4)]
    # and what it got is settled as ever: no loss more
    got[0].ack()
    assert c.fetch(4) == []
    g = queue.stats().group("g")
    assert (g.ack_floor, g.in_flight, g.pending) == (4, 0, 0)
    assert c.last_state_loss is loss and len(state_lost_events(queue)) == 1


def test_acks_above_the_floor_lost_with_the_floor_are_set_aside_by_the_fetch_that_shows_the_loss(client, queue):
    # given c that acked 1 (floor 1) and 3..4 above it (priority messages; 2 still held), and a
    # replica from before every ack
    queue.publish_many([b"1", b"2"])
    queue.publish_many([b"3", b"4", b"5"], priority=9)
    c = queue.consumer("g", name="c")
    fail_over = replica_of(client, queue)
    held = {d.seq: d for d in c.fetch(5)}
    c.ack([held[1], held[3], held[4]])
    sees_the_floor(queue, c)
    # when Redis fails over to the replica: the floor back from 1 to 0, the acks of 3 and 4 gone
    fail_over()
    got = c.fetch(5)
    # then that one fetch reports the floor going back, and sets aside 1 (at or below the floor c
    # saw) and 3 and 4 (acks c saw above it); 2 and 5, never acked, run
    assert sorted(d.seq for d in got) == [2, 5]
    loss = c.last_state_loss
    assert loss is not None and loss.kind is LossKind.ACKS_WENT_BACK
    assert [(d.seq, d.reason) for d in queue.dead_letters()] == [(s, "settled-before-loss") for s in (1, 3, 4)]
    wait_for(lambda: state_lost_events(queue) != [])
    assert [e["reason"] for e in state_lost_events(queue)] == ["acks-went-back"]


def test_messages_set_aside_for_lost_acks_run_when_replayed(client, queue):
    # given 2..4 set aside after Redis lost their acks
    c, fail_over = holds_seq_1_and_acked_2_to_4_above_the_floor(client, queue)
    fail_over()
    [one] = c.fetch(4)
    loss = c.last_state_loss
    one.ack()
    assert c.fetch(4) == []  # the group's scan passes 2..4 (a dead letter above it is not replayed yet)
    # when an operator replays them
    assert queue.replay_dead_letters().replayed == 3
    # then they are handed out and run: an operator asked for it, and no loss is reported
    got = c.fetch(4)
    assert [(d.seq, d.replayed) for d in got] == [(2, True), (3, True), (4, True)]
    c.ack(got)
    assert c.fetch(4) == [] and queue.stats().dead_letters == 0
    assert c.last_state_loss is loss and len(state_lost_events(queue)) == 1


def test_a_reset_of_the_group_hands_out_again_what_was_acked_above_the_floor(client, queue):
    # given c holding 1 and done with 2..4, acked above the floor (another group keeps the records)
    queue.create_group("other")
    c, _ = holds_seq_1_and_acked_2_to_4_above_the_floor(client, queue)
    # when the group is reset to its first message (a new generation; force: c holds 1)
    queue.reset_group("g", "first", force=True)
    # then every message is handed out again and runs: the operator's choice, no loss
    got = c.fetch(4)
    assert sorted(d.seq for d in got) == [1, 2, 3, 4]
    c.ack(got)
    assert c.last_state_loss is None and state_lost_events(queue) == []
    assert queue.stats().dead_letters == 0


@pytest.mark.sync_only("it reads the sync consumer's state watch")
def test_acks_above_the_floor_are_forgotten_once_the_floor_passes_them(client, queue):
    # given c holding 1 and done with 2..4, acked above the floor: remembered
    c, _ = holds_seq_1_and_acked_2_to_4_above_the_floor(client, queue)
    assert sorted(c._watch.acked_seqs) == [2, 3, 4]
    # when c acks 1, and a fetch tells it the floor is at 4
    c.ack(list(c._held.values()))
    sees_the_floor(queue, c)
    # then it remembers none of them
    assert c._watch.acked_seqs == {}
    # and acks in order are absorbed by the floor a fetch's reply reports: never remembered
    queue.publish_many([b"5", b"6"])
    statuses, got, _ = c.ack_and_fetch(c.fetch(2), 1)
    assert statuses == [None, None] and got == [] and c._watch.acked_seqs == {}


@pytest.mark.sync_only("it reads the sync consumer's state watch")
def test_acks_refused_are_not_remembered(client, queue):
    # given c holding 1 and 2 (2 a priority message), and 2 acked already
    queue.publish(b"1")
    queue.publish(b"2", priority=9)
    c = queue.consumer("g", name="c")
    two, one = c.fetch(2)
    assert (two.seq, one.seq) == (2, 1)
    c.ack(two)
    c._watch.acked_seqs.clear()
    # when c acks it again, and the ack is refused
    statuses = c.ack_available([two.tag])
    # then nothing is remembered
    assert statuses[0] is not None and c._watch.acked_seqs == {}


def a_watch(events: list[dict[str, str]]) -> StateWatch:
    """A consumer's state watch of group "g" that has seen incarnation
    "i1", last seq 10 and the group's generation 1 at floor 0; the events
    it records go to ``events``."""
    w = StateWatch(QUEUE, None, None, Randomness(1), "consumer c of group g", "g", record=events.append)  # type: ignore[arg-type]
    w.saw(w.mark(), "i1", 10, floor=(1, 0, 1000))
    return w


def test_a_watch_forgets_acks_as_the_floor_passes_them_and_all_at_a_reset():
    # given a watch that saw acks of 3, 5 and 7 confirmed above the floor (0), and of 0.. not
    w = a_watch([])
    w.acked(w.mark(), [3, 5, 7], 1, 0)
    assert sorted(w.acked_seqs) == [3, 5, 7]
    # when a fetch shows the floor at 5
    w.saw(w.mark(), "i1", 10, floor=(1, 5, 2000))
    # then it remembers 7 alone
    assert sorted(w.acked_seqs) == [7]
    # and acks at or below the floor a reply reports are not remembered
    w.acked(w.mark(), [6, 8], 1, 6)
    assert sorted(w.acked_seqs) == [7, 8]
    # when a fetch shows a new generation (a reset)
    w.saw(w.mark(), "i1", 10, floor=(2, 0, 3000))
    # then it remembers none, and reports no loss
    assert w.acked_seqs == {} and w.last_loss is None


def test_a_watch_remembers_at_most_acked_kept_seqs_the_lowest_forgotten_first(monkeypatch):
    monkeypatch.setattr(statewatch, "ACKED_KEPT", 3)
    w = a_watch([])
    w.acked(w.mark(), [2, 3, 4], 1, 0)
    w.acked(w.mark(), [5, 6], 1, 0)
    assert sorted(w.acked_seqs) == [4, 5, 6]


def test_a_watch_remembers_batches_acked_in_order_as_it_does_any_other(monkeypatch):
    # given a watch keeping at most 8 seqs, and a model of what it must
    # remember: each seq above the floor once (its first ack's stamp), the
    # lowest forgotten first when full, none at or below a floor seen
    monkeypatch.setattr(statewatch, "ACKED_KEPT", 8)
    rng = random.Random(7)
    w = a_watch([])
    model: dict[int, int] = {}
    floor, stamp, top = 0, 0, 1
    for _ in range(400):
        if rng.random() < 0.3:
            # when a fetch shows the floor moved up (at times past every seq remembered)
            floor = rng.choice([floor, floor + rng.randint(0, 4), max(model, default=floor)])
            w.saw(w.mark(), "i1", 10**6, floor=(1, floor, 1000))
            model = {seq: st for seq, st in model.items() if seq > floor}
        else:
            # when acks are confirmed: a rising batch above everything (the
            # batch path), or one out of order, repeated or at the floor
            if rng.random() < 0.6:
                seqs = list(range(top, top + rng.randint(1, 5)))
            else:
                seqs = [rng.randint(max(1, floor - 2), top + 3) for _ in range(rng.randint(1, 5))]
            top = max(top, *seqs) + 1
            w.acked(w.mark(), seqs, 1, floor)
            stamp += 1
            for seq in seqs:
                if seq > floor and seq not in model:
                    while len(model) >= 8:
                        del model[min(model)]
                    model[seq] = stamp
        # then it remembers what the model does, with the same stamps
        assert w.acked_seqs == model


def test_a_watch_reports_a_lost_ack_once_per_loss_and_only_for_a_fetch_sent_after_it():
    # given a fetch sent before a watch saw the acks of 5 and 6 confirmed above the floor
    events: list[dict[str, str]] = []
    w = a_watch(events)
    before = w.mark()
    w.acked(w.mark(), [5, 6], 1, 0)
    # when that fetch's reply hands out 5 (it was handled by Redis before the ack)
    # then it is no loss
    assert w.acks_lost(before, w.epoch, 1, 0, [5]) == set() and w.last_loss is None
    # when a fetch sent after the ack hands out 5 again
    found = w.acks_lost(w.mark(), w.epoch, 1, 0, [5])
    # then the ack of 5 was lost: reported once
    assert found == {5} and w.last_loss is not None and w.last_loss.kind is LossKind.ACKS_LOST
    assert [(e["reason"], e["seq"]) for e in events] == [("acks-lost", "0")]
    # and 6, handed out by a later fetch, is part of the same loss: set aside, no report more
    loss = w.last_loss
    assert w.acks_lost(w.mark(), w.epoch, 1, 0, [6]) == {6}
    assert w.last_loss is loss and len(events) == 1 and w.acked_seqs == {}
    # and an ack seen after the loss, lost in turn, is a new loss
    w.acked(w.mark(), [7], 1, 0)
    assert w.acks_lost(w.mark(), w.epoch, 1, 0, [7]) == {7} and w.last_loss is not loss and len(events) == 2


def test_a_watch_does_not_remember_acks_of_a_call_sent_before_a_loss_it_saw():
    # given a call sent, and then a loss seen (the incarnation changed)
    w = a_watch([])
    sent = w.mark()
    w.saw(w.mark(), "i2", 3, floor=(1, 0, 2000))
    assert w.last_loss is not None and w.last_loss.kind is LossKind.INCARNATION
    # when that call's reply confirms acks above the floor
    w.acked(sent, [5], 1, 0)
    # then they are not remembered: they may be of the state before the loss
    assert w.acked_seqs == {}


def test_a_heartbeat_reports_a_loss(client, queue):
    # given a consumer that joined, and a second consumer of the group
    queue.publish(b"a")
    c = queue.consumer("g", name="c")
    [d] = c.fetch(1)
    # when the queue is made anew under it, with c a member again (another client joined it by name)
    wipe(client)
    other = rqueue.connect(client.url, prefix=client.prefix, settings_ttl=0)
    try:
        other.queue(QUEUE).consumer("g", name="c")
        c.heartbeat([], timeout=5)
    finally:
        other.close()
    # then the heartbeat saw the new incarnation
    assert c.last_state_loss is not None and c.last_state_loss.deliveries_dropped == 1
    with pytest.raises(LostDelivery):
        d.ack()


def test_a_partitioned_queue_reports_per_partition(client):
    # given a queue of two partitions, published to and consumed from in both
    q = client.queue("parted", partitions=2)
    q.publish_many([b"%d" % i for i in range(8)], keys=[str(i) for i in range(8)])
    c = q.consumer("g", name="w")
    held = c.fetch(8)
    assert {d.consumer.queue.partition for d in held} == {0, 1}
    # when Redis loses its data and both sides call again
    wipe(client)
    q.publish_many([b"%d" % i for i in range(8)], keys=[str(i) for i in range(8)])
    c.fetch(8)
    # then each partition's loss is reported, for the publisher and for the consumer
    assert all(loss is not None and loss.kind is LossKind.INCARNATION for loss in q.state_losses)
    assert all(loss is not None for loss in c.state_losses) and c.state_epoch == 2
    assert sum(loss.deliveries_dropped for loss in c.state_losses if loss is not None) == 8
    with pytest.raises(LostDelivery):
        c.ack(held[0])


@pytest.mark.sync_only("the asyncio partitioned queue's parts are read the same way; one client is enough")
# Not on a cluster: replica_of finds a partition's keys with KEYS, which there reaches one node only,
# so the fail-over now and then restores nothing.
@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)
def test_a_partitioned_consumer_sees_acks_above_the_floor_lost_in_its_partition(client):
    # given a partitioned consumer holding seq 1 of one partition and done with 2..4 there (priority
    # messages, acked above that partition's floor), and a replica of that partition from before
    q = client.queue("parted", partitions=2)
    p = q.partition_for("a")
    q.publish(b"1", key="a")
    q.publish_many([b"2", b"3", b"4"], keys=["a"] * 3, priority=9)
    c = q.consumer("g", name="w")
    fail_over = replica_of(client, q.parts[p])
    held = c.fetch(4)
    assert [(d.consumer.queue.partition, d.seq) for d in held] == [(p, 2), (p, 3), (p, 4), (p, 1)]
    c.ack(held[:3])
    # when that partition fails over to the replica
    fail_over()
    got = c.fetch(4)
    # then the consumer of that partition reports the acks lost and sets 2..4 aside; 1 runs
    assert [d.seq for d in got] == [1], (got, c.state_losses, q.parts[p].stats().group("g"))
    losses = c.state_losses
    assert losses[p] is not None and losses[p].kind is LossKind.ACKS_LOST and losses[p].seqs == (2, 3, 4)
    assert losses[1 - p] is None
    assert [(d.seq, d.reason) for d in q.parts[p].dead_letters()] == [(s, "settled-before-loss") for s in (2, 3, 4)]


def test_after_delete_an_id_is_no_duplicate(client, queue):
    # given a message published with id "1"
    assert not queue.publish(b"a", id="1").duplicate
    # when the queue is deleted and the same id published again
    queue.delete()
    r = queue.publish(b"b", id="1")
    # then it is stored: a new message, delivered
    assert (r.seq, r.duplicate) == (1, False)
    [d] = queue.consumer("g").fetch(1)
    assert d.data == b"b"
    # and the id counts from there, in the new incarnation; the delete was no loss to this client
    assert queue.publish(b"c", id="1").duplicate
    assert queue.last_state_loss is None


def test_a_replayed_dead_letter_says_it_was_delivered_before_and_counts_afresh(client, queue):
    # given a message dead-lettered after max_deliveries=2
    client.configure(QUEUE, max_deliveries=2)
    queue.publish(b"m")
    c = queue.consumer("g")
    for _ in range(2):
        [d] = c.fetch(1)
        d.nack(delay=0)
    assert queue.stats().dead_letters == 1
    # when it is replayed
    queue.replay_dead_letters()
    # then it comes back as a redelivery with its earlier deliveries in a header, its count at 1
    [d] = c.fetch(1)
    assert (d.delivery_count, d.redelivered, d.replayed) == (1, True, True)
    assert d.headers["x-rq-replayed-deliveries"] == "2"
    # and max_deliveries counts from the replay: one more failure requeues, the second dead-letters
    assert d.nack(delay=0) == "requeued"
    [d] = c.fetch(1)
    assert (d.delivery_count, d.redelivered, d.headers["x-rq-replayed-deliveries"]) == (2, True, "2")
    assert d.nack(delay=0) == "dead"


# -- a worker under a Redis that restarts without its data ------------------------------


def started_worker(kind: str, server: Any, queue: rqueue.Queue, handler: Any, **options: Any) -> Any:
    """A started Worker of group "g" (``kind`` "threaded", or "async": an
    rqueue.aio.Worker on a loop of its own, with a client of prefix "w")."""
    options = {"heartbeat_interval": 0.2, "heartbeat_timeout": 2, **options}
    if kind == "threaded":
        worker: Any = rqueue.Worker(queue, "g", handler, **options)
    else:
        worker = AsyncWorkerThread(server.url, "w", QUEUE, "g", handler, **options)
    worker.start()
    return worker


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_worker_under_a_redis_restarted_without_its_data(caplog, kind):
    """The scenario of a worker whose handlers are running when Redis comes
    back empty: new messages get the same seqs (and tags' seq and count) as
    the deliveries in hand. Every new message is handled, no old ack
    settles one, no waiting old delivery runs, and the loss is reported."""
    server = start_server("redis")  # no persistence: a restart loses everything
    client = rqueue.connect(server.url, prefix="w", settings_ttl=0)
    try:
        queue = client.queue(QUEUE)
        calls: list[bytes] = []
        release = threading.Event()
        lock = threading.Lock()

        def handler(d: rqueue.Delivery) -> None:
            with lock:
                calls.append(d.data)
            if d.data.startswith(b"old"):
                release.wait(30)

        # given a worker running two old messages, with two more waiting in it
        queue.publish_many([b"old1", b"old2", b"old3", b"old4"])
        worker = started_worker(kind, server, queue, handler, concurrency=2, prefetch=8)
        wait_for(lambda: len(calls) == 2)
        # when Redis restarts without its data and new messages are published (seqs 1.. again)
        with caplog.at_level(logging.ERROR):
            server.stop()
            server.start()
            new = [b"new%d" % i for i in range(1, 7)]
            results = queue.publish_many(new)
            assert [r.seq for r in results] == list(range(1, 7))
            # and the new messages are fetched while the old handlers still run
            wait_for(lambda: queue.stats().group("g").in_flight > 0 if queue.groups() else False)
            release.set()
            # then every new message is handled and acked, and no old waiting delivery runs
            wait_for(lambda: queue.stats().group("g").acked == len(new), timeout=20)
            worker.stop()
            assert worker.join(10) is not False
        assert sorted(c for c in calls if c.startswith(b"new")) == new
        assert sorted(c for c in calls if c.startswith(b"old")) == [b"old1", b"old2"]
        g = queue.stats().group("g")
        assert (g.acked, g.in_flight, g.pending) == (len(new), 0, 0)
        # and the loss is reported: the worker's consumer dropped what it held, the publisher saw it
        assert worker.consumer is not None
        loss = worker.consumer.last_state_loss
        assert loss is not None and loss.kind is LossKind.INCARNATION and loss.deliveries_dropped == 4
        assert queue.last_state_loss is not None and queue.last_state_loss.confirmed_gone == 4
        assert {e["noticed_by"] for e in state_lost_events(queue)} >= {"publisher"}
        assert any("lost state" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    finally:
        release.set()
        client.close()
        server.stop()


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_worker_under_a_redis_restarted_from_a_snapshot_older_than_its_acks(tmp_path, kind):
    """Redis comes back from a snapshot taken before the worker's acks (a
    rolled-back AOF, or a failover to a replica that missed them): the same
    seqs, the acks gone, every message to be handed out again. The worker
    reports the loss and runs no message at or below the ack floor it saw."""
    server = start_server("redis", data_dir=tmp_path / "redis")
    client = rqueue.connect(server.url, prefix="w", settings_ttl=0)
    try:
        queue = client.queue(QUEUE)
        runs: dict[int, int] = {}
        lock = threading.Lock()
        go = threading.Event()

        def handler(d: rqueue.Delivery) -> None:
            with lock:
                runs[d.seq] = runs.get(d.seq, 0) + 1
            if d.seq == 15 and runs[15] == 1:
                go.wait(30)

        # given 20 messages published, and a snapshot of Redis then
        queue.publish_many([b"m%d" % i for i in range(1, 21)])
        queue.consumer("g").close()  # the group exists in the snapshot
        client.redis.save()
        # and a worker that handled 1..14 and is running 15
        worker = started_worker(kind, server, queue, handler, concurrency=1, prefetch=4)
        wait_for(lambda: 15 in runs)
        # when Redis restarts from the snapshot: the same incarnation and seqs, no delivery and no ack
        server.stop()
        server.start()
        go.set()
        # then the group settles every message again
        wait_for(lambda: queue.stats().group("g").ack_floor == 20, timeout=20)
        worker.stop()
        assert worker.join(10) is not False
        assert sorted(runs) == list(range(1, 21))
        # and the worker reported the acks lost, ran nothing at or below the floor it had seen, and set
        # those messages aside in the dead-letter queue
        assert worker.consumer is not None
        loss = worker.consumer.last_state_loss
        assert loss is not None and loss.kind is LossKind.ACKS_WENT_BACK and loss.gone_above == 0
        assert 1 <= loss.floor_seen <= 14
        assert all(runs[seq] == 1 for seq in range(1, loss.floor_seen + 1)), runs
        aside = [(d.seq, d.reason) for d in queue.dead_letters()]
        assert aside == [(seq, "settled-before-loss") for seq in range(1, loss.floor_seen + 1)]
        assert [e["reason"] for e in state_lost_events(queue)] == ["acks-went-back"]
    finally:
        go.set()
        client.close()
        server.stop()


@pytest.mark.parametrize("layout", ["hash", "stream"])
@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_worker_under_a_redis_restarted_from_a_snapshot_older_than_its_acks_above_the_floor(
    tmp_path, monkeypatch, kind, layout
):
    """A worker acks priority messages while an older one (seq 1) runs, so
    its acks land above the group's floor (0). Redis restarts from a
    snapshot taken before those acks: the same incarnation, last seq and
    floor, the acked runs gone, so no seq and no floor goes back. The worker
    reports the acks lost, and runs none of those messages again: they are
    set aside in the dead-letter queue (formerly
    tests/known_faults/attack_rollback_acks.py)."""
    monkeypatch.setenv(LAYOUT_ENV, layout)
    server = start_server("redis", data_dir=tmp_path / "redis")
    client = rqueue.connect(server.url, prefix="w", settings_ttl=0)
    release = threading.Event()
    try:
        queue = client.queue(QUEUE)
        runs: collections.Counter[bytes] = collections.Counter()
        lock = threading.Lock()

        def handler(d: rqueue.Delivery) -> None:
            with lock:
                runs[d.data] += 1
            if d.data == b"slow":
                release.wait(30)

        # given seq 1 and five priority messages (seqs 2..6, handed out first), and a snapshot then
        queue.create_group("g")
        queue.publish(b"slow")
        priority = [b"p%d" % i for i in range(5)]
        queue.publish_many(priority, priority=9)
        client.redis.save()
        # and a worker that runs seq 1 (holding the floor at 0) and acked 2..6, its acks confirmed
        worker = started_worker(kind, server, queue, handler, concurrency=2, reconnect_timeout=20)
        wait_for(lambda: all(queue.status(seq=s).groups["g"].state is MessageState.ACKED for s in range(2, 7)))
        time.sleep(0.5)  # the reply of the fetch that carried the last acks has come back
        assert queue.stats().group("g").ack_floor == 0
        # when Redis restarts from the snapshot: the acks of 2..6 gone
        server.kill()
        server.start()
        # then the worker hands 2..6 out again to no handler: they go to the dead-letter queue
        wait_for(lambda: queue.stats().dead_letters == 5, timeout=20)
        time.sleep(0.3)
        release.set()
        wait_for(lambda: queue.stats().group("g").ack_floor == 6, timeout=20)
        worker.stop()
        assert worker.join(10) is not False
        assert {p: runs[p] for p in priority} == dict.fromkeys(priority, 1)
        assert [(d.seq, d.reason) for d in queue.dead_letters()] == [(s, "settled-before-loss") for s in range(2, 7)]
        # and it reported the acks lost once (its consumer's last loss, a state-lost event), naming the
        # seqs of the fetch that showed it (later fetches set the others aside as part of the same loss)
        assert worker.consumer is not None
        loss = worker.consumer.last_state_loss
        assert loss is not None and loss.kind is LossKind.ACKS_LOST and set(loss.seqs) <= set(range(2, 7))
        assert [e["reason"] for e in state_lost_events(queue)] == ["acks-lost"]
    finally:
        release.set()
        client.close()
        server.stop()


@pytest.mark.sync_only("it calls a script through the sync client's scripts")
def test_a_bad_incarnation_is_not_stored(client, queue):
    # when a foreign client offers an incarnation that is not a word
    keys = queue.keys.publish_keys()
    reply = client.scripts.publish(keys=keys, args=["", 1000, "0", "", "I:1", 0, 0, b"a"])
    # then the message is stored, and the queue has no incarnation until a call offers a good one
    assert reply == [b"", 1, 0] and not client.redis.hexists(queue.keys.meta, "inc")
    queue.publish(b"b")
    assert client.redis.hget(queue.keys.meta, "inc").startswith(b"i")
