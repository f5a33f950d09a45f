"""Flow control in the fetch script: pause and resume of groups and queues,
priorities (docs/flow-control.md)."""

from __future__ import annotations

import time

import pytest
from support.servers import wait_for

import rqueue
from rqueue import InvalidInput, QueuePaused, doctor
from rqueue.engine import commands

# -- pause and resume of a group ----------------------------------------------------


def test_a_paused_group_hands_out_nothing_and_keeps_acks_working(queue):
    # given a group whose consumer holds one of three messages
    queue.publish_many([b"a", b"b", b"c"])
    c, other = queue.consumer("g"), queue.consumer("other")
    [d] = c.fetch(1)
    # when the group is paused
    assert queue.pause("g") is True
    assert queue.pause("g") is False  # already so
    # then fetches hand out nothing, and the ack of what it holds works
    assert c.fetch(10) == []
    c.ack(d)
    stats = queue.stats().group("g")
    assert stats.paused and stats.acked == 1 and stats.in_flight == 0
    # and another group of the queue is not paused
    assert [x.seq for x in other.fetch(10)] == [1, 2, 3]
    # when it is resumed, then the rest flows
    assert queue.resume("g") is True
    assert queue.resume("g") is False
    assert [x.seq for x in c.fetch(10)] == [2, 3]
    assert not queue.stats().group("g").paused


def test_a_paused_groups_expired_lease_is_redelivered_on_resume_not_before(queue, clock):
    # given a delivery whose holder is paused while it holds it
    queue.publish(b"a")
    w1, w2 = queue.consumer("g", name="w1"), queue.consumer("g", name="w2")
    [d] = w1.fetch(1)
    queue.pause("g")
    # when its lease runs out during the pause
    clock.advance(queue.settings().ack_wait + 1)
    # then nobody gets it again while paused; the holder may still extend nothing
    assert w2.fetch(1) == []
    assert queue.stats().group("g").in_flight == 1
    # and after resume the next fetch hands it out again, as a redelivery
    queue.resume("g")
    [again] = w2.fetch(1)
    assert (again.seq, again.delivery_count, again.redelivered) == (1, 2, True)
    # and the old holder's late ack is stale now that w2 holds it (guarantee 3); w2's settles it
    with pytest.raises(rqueue.StaleDelivery):
        w1.ack(d)
    w2.ack(again)
    assert queue.stats().group("g").acked == 1


def test_pausing_a_group_that_does_not_exist_is_refused(queue):
    queue.publish(b"a")
    with pytest.raises(rqueue.NotMember):
        queue.pause("nope")


# -- pause and resume of a queue ----------------------------------------------------


def test_a_queue_paused_to_refuse_refuses_publishes_and_stores_nothing(queue):
    # given a queue with one message and a group
    queue.publish(b"a")
    c = queue.consumer("g")
    # when it is paused with mode refuse
    queue.pause(mode="refuse")
    # then a publish, with or without an id, raises QueuePaused and stores nothing
    with pytest.raises(QueuePaused):
        queue.publish(b"b")
    with pytest.raises(QueuePaused):
        queue.publish_many([b"c", b"d"], ids=["x", "y"])
    stats = queue.stats()
    assert stats.paused == "refuse" and stats.last_seq == 1 and stats.depth == 1
    # and consumers still drain what is stored
    assert [d.seq for d in c.fetch(10)] == [1]
    # and after resume publishes get the next seq
    queue.resume()
    assert queue.publish(b"e").seq == 2
    assert queue.stats().paused == ""


def test_a_queue_paused_to_refuse_before_its_first_publish_keeps_no_seq(queue):
    queue.pause(mode="refuse")
    with pytest.raises(QueuePaused):
        queue.publish(b"a")
    queue.resume()
    assert queue.publish(b"b").seq == 1


def test_a_queue_on_hold_stores_publishes_and_hands_out_only_what_came_before(queue, clock):
    # given a queue with two messages, one of them delivered and nacked
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g")
    [first] = c.fetch(1)
    # when it is put on hold and more is published
    queue.pause(mode="hold")
    assert [r.seq for r in queue.publish_many([b"c", b"d"])] == [3, 4]
    first.nack()
    # then the redelivery and the message published before the hold flow,
    # the ones published after it do not
    assert [(d.seq, d.delivery_count) for d in c.fetch(10)] == [(1, 2), (2, 1)]
    assert c.fetch(10) == []
    assert queue.stats().paused == "hold" and queue.stats().depth == 4
    # and a second hold keeps the first one's point
    assert queue.pause(mode="hold") is False
    # when it is resumed, then they are handed out
    queue.resume()
    assert [d.seq for d in c.fetch(10)] == [3, 4]


def test_a_bad_pause_mode_is_refused_and_changes_nothing(queue):
    with pytest.raises(InvalidInput, match="mode"):
        queue.pause(mode="later")
    assert queue.stats().paused == ""


def test_a_paused_partitioned_queue_pauses_every_partition(client):
    # given a queue of 3 partitions with a message in each
    q = client.queue("parts", partitions=3)
    q.publish_many([b"a", b"b", b"c"])
    c = q.consumer("g")
    # when its group is paused, then no partition hands out anything
    q.pause("g")
    assert c.fetch(10) == []
    assert q.stats().group("g").paused
    # and after resume every message flows
    q.resume("g")
    assert len(c.fetch(10)) == 3


# -- priorities ---------------------------------------------------------------------


def test_higher_priority_first_fifo_within_a_priority_and_plain_last(queue):
    # given plain messages and messages of priorities 5 and 9, interleaved
    queue.publish(b"p0-a")
    queue.publish(b"p5-a", priority=5)
    queue.publish(b"p9-a", priority=9)
    queue.publish(b"p0-b")
    queue.publish_many([b"p5-b", b"p9-b"], priority=[5, 9])
    c = queue.consumer("g", prefetch=100)
    # when one fetch takes them all, then 9s, then 5s, then plain, each FIFO
    assert [d.data for d in c.fetch(10)] == [b"p9-a", b"p9-b", b"p5-a", b"p5-b", b"p0-a", b"p0-b"]
    assert c.fetch(10) == []


def test_due_redeliveries_come_before_any_priority(queue, clock):
    # given a plain message nacked while a priority 9 message waits
    queue.publish(b"plain")
    c = queue.consumer("g")
    [d] = c.fetch(1)
    queue.publish(b"urgent", priority=9)
    d.nack()
    # then the redelivery comes first, then the priority message
    assert [(x.data, x.delivery_count) for x in c.fetch(10)] == [(b"plain", 2), (b"urgent", 1)]


def test_priorities_one_at_a_time_and_acks_move_the_floor(queue):
    # given messages of mixed priorities fetched one by one and acked
    queue.publish_many([b"a", b"b", b"c", b"d"], priority=[0, 3, 0, 7])
    c = queue.consumer("g")
    got = []
    while batch := c.fetch(1):
        got.append(batch[0].data)
        batch[0].ack()
    # then the order is by priority, and every message is settled once
    assert got == [b"d", b"b", b"a", b"c"]
    g = queue.stats().group("g")
    assert (g.ack_floor, g.acked, g.pending, g.in_flight) == (4, 4, 0, 0)


@pytest.mark.parametrize("kind", ["priority", "key"])
def test_an_acked_flow_message_the_scan_has_not_passed_is_never_dead_lettered(queue, kind):
    # given the only group's first message, a priority (or keyed) one, acked
    # before the scan of plain messages passed it: the floor passes the cursor
    option = {"priority": 5} if kind == "priority" else {"key": "a"}
    c = queue.consumer("g")
    queue.publish_many([b"1", b"2"], **option)
    [first] = c.fetch(1)
    first.ack()
    assert doctor.examine(queue) == []  # a floor above the cursor is no finding here
    # when more come and a fetch has room for the plain scan too
    queue.publish(b"3", **option)
    queue.publish(b"4")
    got = []
    while batch := c.fetch(5):
        got += batch
        c.ack(batch)
    # then the rest is handed out once each, and the acked one is no dead letter
    assert sorted(d.seq for d in got) == [2, 3, 4]
    assert queue.dead_letters() == []
    g = queue.stats().group("g")
    assert (g.ack_floor, g.dead_lettered, g.in_flight) == (4, 0, 0)
    # and the doctor finds nothing wrong
    assert doctor.examine(queue) == []


def test_each_group_sees_every_priority_message_once(queue):
    # given two groups and a group created after the messages were published
    a = queue.consumer("a")
    queue.publish_many([b"x", b"y", b"z"], priority=[1, 0, 2])
    b = queue.consumer("b")
    # then each hands out all three, by priority
    assert [d.data for d in a.fetch(10)] == [b"z", b"x", b"y"]
    assert [d.data for d in b.fetch(10)] == [b"z", b"x", b"y"]


def test_a_purged_priority_message_is_not_handed_out(queue):
    # given a priority message the group has not read yet, and one in flight
    c = queue.consumer("g")
    queue.publish(b"held", priority=4)
    [held] = c.fetch(1)
    queue.publish_many([b"a", b"b"], priority=[4, 0])
    # when the group is purged, then the one in flight stays, the rest is settled
    assert queue.purge("g") == {"g": 2}
    assert c.fetch(10) == []
    held.ack()
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending, g.in_flight) == (3, 0, 0)


def test_a_delayed_priority_message_waits_its_delay(queue, clock):
    c = queue.consumer("g")
    queue.publish(b"later", priority=9, delay=5)
    queue.publish(b"now")
    assert [d.data for d in c.fetch(10)] == [b"now"]
    clock.advance(5)
    assert [d.data for d in c.fetch(10)] == [b"later"]


def test_a_queue_on_hold_holds_priority_messages_published_after_it(queue):
    c = queue.consumer("g")
    queue.publish(b"before", priority=2)
    queue.pause(mode="hold")
    queue.publish(b"after", priority=9)
    assert [d.data for d in c.fetch(10)] == [b"before"]
    queue.resume()
    assert [d.data for d in c.fetch(10)] == [b"after"]


@pytest.mark.parametrize("bad", [-1, 10, 1.5, "1", True])
def test_a_priority_out_of_range_is_refused_and_stores_nothing(queue, bad):
    with pytest.raises(InvalidInput, match="priority"):
        queue.publish(b"a", priority=bad)
    with pytest.raises(InvalidInput, match="priority"):
        queue.publish_many([b"a", b"b"], priority=[1, bad])
    with pytest.raises(InvalidInput, match="priority has 1 entries for 2"):
        queue.publish_many([b"a", b"b"], priority=[1])
    assert queue.stats().last_seq == 0


def test_an_unroutable_batch_keeps_its_priorities_in_the_alternate_queue(client):
    # given a queue without groups whose mandatory publishes go to an alternate queue
    client.configure("orders", alternate="spill")
    spill = client.queue("spill")
    c = spill.consumer("g")
    # when a mandatory batch with priorities is published
    client.queue("orders").publish_many([b"low", b"high"], mandatory=True, priority=[1, 8])
    # then the alternate queue hands them out by priority
    assert [d.data for d in c.fetch(10)] == [b"high", b"low"]


# -- rate limits --------------------------------------------------------------------


def test_a_rate_limit_holds_any_window_to_its_count_across_consumers(client, queue, clock):
    # given a group limited to 3 deliveries per second, two consumers, 10 messages
    client.configure("orders", rate_limit=3, rate_period=1.0)
    queue.publish_many([b"m"] * 10)
    a, b = queue.consumer("g", name="a"), queue.consumer("g", name="b")
    # when both fetch, then 3 in all are handed out in this second
    got = a.fetch(2) + b.fetch(10)
    assert len(got) == 3
    assert a.fetch(10) == [] and b.fetch(10) == []
    # and acking does not make room: the limit counts deliveries, not what is in flight
    for d in got:
        d.ack()
    assert b.fetch(10) == []
    # when the window has moved past them, then 3 more
    clock.advance(1.0)
    assert len(b.fetch(10)) == 3
    # and half a window later, nothing more
    clock.advance(0.5)
    assert a.fetch(10) == []


def test_a_fetch_held_back_by_the_rate_limit_says_when_to_come_back(client, queue, clock):
    # given a limit of 2 per 10 seconds, reached
    client.configure("orders", rate_limit=2, rate_period=10.0)
    queue.publish_many([b"m"] * 5)
    c = queue.consumer("g")
    assert len(c.fetch(5)) == 2
    clock.advance(4)
    # when it fetches again, then nothing, and the next due time is when the window has room
    reply = commands.fetch(queue.group_call("g", queue.settings(), c.name), 5, "tok")
    assert list(reply.deliveries()) == []
    assert reply.next_due_ms - reply.now_ms == 6000
    # and a blocking fetch waits that long, not busy-looping (the test clock moves)
    clock.advance(6)
    assert len(c.fetch(5)) == 2


def test_redeliveries_count_against_the_rate_limit(client, queue, clock):
    client.configure("orders", rate_limit=1, rate_period=1.0)
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g")
    [d] = c.fetch(5)
    d.nack()
    assert c.fetch(5) == []  # the redelivery waits for the window too
    clock.advance(1)
    [again] = c.fetch(5)
    assert (again.seq, again.delivery_count) == (1, 2)


@pytest.mark.parametrize("values", [{"rate_limit": -1}, {"rate_limit": 1.5}, {"rate_period": 0}])
def test_a_bad_rate_setting_is_refused(client, values):
    with pytest.raises(rqueue.InvalidSetting):
        client.configure("orders", **values)


def test_the_worker_sleeps_against_the_rate_limit(client, monkeypatch):
    # given a group on the real clock limited to 5 deliveries per 0.5 s, and 12 messages
    fetches = []
    real_fetch = commands.fetch

    def counted(*args, **kwargs):
        fetches.append(time.monotonic())
        return real_fetch(*args, **kwargs)

    monkeypatch.setattr(commands, "fetch", counted)
    real = rqueue.connect(client.url, prefix=client.prefix, settings_ttl=0)
    try:
        real.configure("paced", rate_limit=5, rate_period=0.5)
        q = real.queue("paced")
        q.publish_many([b"m"] * 12)
        # Each delivery's time as Redis saw it at its fetch (its deadline less
        # the lease): the window the script holds, whatever the handlers'
        # threads lag on a loaded machine.
        lease_ms = round(q.settings().ack_wait * 1000)
        done: list[int] = []
        w = rqueue.Worker(q, "g", lambda d: done.append(d.deadline_ms - lease_ms), concurrency=4)
        w.start()
        try:
            wait_for(lambda: len(done) == 12, timeout=10)
        finally:
            w.stop()
            w.join(10)
    finally:
        real.close()
    # then it took two windows at least, no window held more than 5
    done.sort()
    assert done[-1] - done[0] >= 1000
    for t in done:
        assert sum(1 for u in done if t <= u < t + 500) <= 5
    # and the worker slept until the window had room instead of fetching again and again
    assert len(fetches) < 40, f"{len(fetches)} fetches for 12 messages"


def test_a_deleted_priority_log_hands_nothing_out_twice(queue):
    # given priority messages the group moved to its priority set, one of them delivered
    queue.publish_many([b"a", b"b", b"c"], priority=[0, 5, 5])
    c = queue.consumer("g")
    [first] = c.fetch(1)
    assert first.data == b"b"
    # when the queue's priority log is deleted (damage)
    queue.client.redis.delete(queue.keys.prio)
    # then the rest is handed out once each, the delivered one not again
    rest = c.fetch(10)
    assert sorted(d.data for d in rest) == [b"a", b"c"]
    first.ack()
    for d in rest:
        d.ack()
    g = queue.stats().group("g")
    assert (g.ack_floor, g.pending, g.in_flight) == (3, 0, 0)


def test_a_hold_that_began_on_an_empty_queue_holds_without_refusing(client, queue):
    # given a group, and the queue put on hold before its first publish
    c = queue.consumer("g")
    queue.pause(mode="hold")
    queue.publish_many([b"1", b"2", b"3"], priority=[0, 5, 0])
    # when the group fetches, then nothing is handed out, and no damage is reported
    assert c.fetch(3) == []
    # and once resumed, every message comes, the priority one first
    queue.resume()
    assert [d.seq for d in c.fetch(3)] == [2, 1, 3]
