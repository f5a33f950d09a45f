"""Time to live and the retry deadline (docs/lifecycle.md): a message past
its ttl is never handed to a handler but dead-lettered as expired (or
dropped and counted); a failed attempt past the retry deadline
dead-letters it as deadline. Both clients, every backend."""

from __future__ import annotations

import pytest
from support.aio_bridge import parametrize_api
from support.counting import count_calls

import rqueue
from rqueue.engine import async_commands, commands

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)


def reasons(queue: rqueue.Queue) -> list[tuple[int, str]]:
    return [(d.seq, d.reason) for d in queue.dead_letters()]


def test_a_message_past_its_ttl_is_dead_lettered_as_expired_not_handed_out(client, queue, clock):
    # given a message with a ttl of 5 s and one without, and a group
    c = queue.consumer("g")
    queue.publish(b"short", ttl=5)
    queue.publish(b"plain")
    # when 5 s pass before a fetch
    clock.advance(5)
    got = c.fetch(10)
    # then only the plain message is handed out, and the other is a dead letter named expired
    assert [d.data for d in got] == [b"plain"]
    assert reasons(queue) == [(1, "expired")]
    [dead] = queue.dead_letters()
    assert "time to live of 5 s ran out" in dead.error
    assert queue.stats().group("g").in_flight == 1


def test_the_messages_of_a_fetch_past_their_ttl_are_dead_lettered_in_one_call(client, queue, clock, monkeypatch):
    # given 40 messages with a ttl of 5 s, a plain one behind them, and a group
    c = queue.consumer("g")
    for i in range(40):
        queue.publish(b"short %d" % i, ttl=5)
    queue.publish(b"plain")
    calls = [count_calls(monkeypatch, module, "set_aside", "reject") for module in (commands, async_commands)]
    # when 5 s pass before a fetch of all of them
    clock.advance(5)
    got = c.fetch(100)
    # then the plain one is handed out and the 40 are dead letters named expired, moved by one call
    assert [d.data for d in got] == [b"plain"]
    assert reasons(queue) == [(seq, "expired") for seq in range(1, 41)]
    assert [sum(c[name] for c in calls) for name in ("set_aside", "reject")] == [1, 0]
    assert queue.stats().group("g").in_flight == 1


def test_a_message_past_its_ttl_keeps_its_failure_as_its_result(client, queue, clock):
    # given a queue that keeps results, a message with a ttl of 5 s and a group
    client.configure("orders", results=True)
    c = queue.consumer("g")
    queue.publish(b"short", ttl=5)
    # when 5 s pass before a fetch
    clock.advance(5)
    assert c.fetch(10) == []
    # then a caller waiting for its result learns at once that it expired, with the dead letter's text
    result = queue.result(1, timeout=0)
    assert not result.ok
    assert result.failure.reason == "expired"
    assert result.failure.error == queue.dead_letters()[0].error


def test_a_message_within_its_ttl_is_handed_out(client, queue, clock):
    c = queue.consumer("g")
    queue.publish(b"x", ttl=5)
    clock.advance(4.9)
    assert [d.data for d in c.fetch(1)] == [b"x"]
    assert queue.dead_letters() == []


def test_the_queue_setting_expires_messages_without_a_header(client, queue, clock):
    # given a queue ttl of 2 s and a message published with its own longer ttl
    client.configure("orders", ttl=2)
    c = queue.consumer("g")
    queue.publish_many([b"a", b"b"])
    queue.publish(b"own", ttl=60)
    # when 3 s pass, then the two without their own ttl expired and the other is handed out
    clock.advance(3)
    assert [d.data for d in c.fetch(10)] == [b"own"]
    assert reasons(queue) == [(1, "expired"), (2, "expired")]


def test_a_message_waiting_in_a_redelivery_delay_expires_too(client, queue, clock):
    # given a message with a ttl of 10 s, nacked with a delay of 30 s
    c = queue.consumer("g")
    queue.publish(b"x", ttl=10)
    [d] = c.fetch(1)
    d.nack(delay=30)
    # when its delay runs out, after its ttl, then it is not handed out again but dead-lettered
    clock.advance(31)
    assert c.fetch(1) == []
    assert reasons(queue) == [(1, "expired")]
    assert queue.stats().group("g").ack_floor == 1


def test_with_dead_letter_none_an_expired_message_is_dropped_and_counted(client, queue, clock):
    client.configure("orders", dead_letter="none")
    c = queue.consumer("g")
    queue.publish(b"x", ttl=1)
    clock.advance(2)
    assert c.fetch(1) == []
    g = queue.stats().group("g")
    assert (g.ack_floor, g.dropped) == (1, 1)


def test_an_expired_event_is_recorded_when_asked_for(client, queue, clock):
    client.configure("orders", events=["expired"])
    c = queue.consumer("g")
    queue.publish(b"x", ttl=1)
    clock.advance(2)
    c.fetch(1)
    assert [e["event"] for e in queue.events() if e["event"] == "expired"] == ["expired"]


def test_a_failed_attempt_past_the_retry_deadline_dead_letters_as_deadline(client, queue, clock):
    # given a retry deadline of 10 s and many deliveries allowed
    client.configure("orders", retry_deadline=10, max_deliveries=100)
    c = queue.consumer("g")
    queue.publish(b"x")
    # when an attempt fails before the deadline, then it is offered again
    [d] = c.fetch(1)
    assert d.nack(delay=0) == "requeued"
    # when an attempt fails after it, then it is dead-lettered as deadline
    clock.advance(11)
    [d] = c.fetch(1)
    assert d.nack(delay=0, error="still broken") == "dead"
    assert reasons(queue) == [(1, "deadline")]
    assert queue.dead_letters()[0].error == "still broken"


@pytest.mark.sync_only("the expiry of a lease is the fetch script's: one client shows it")
def test_a_lease_that_runs_out_past_the_retry_deadline_dead_letters(client, queue, clock):
    client.configure("orders", retry_deadline=10, max_deliveries=100, ack_wait=30)
    c = queue.consumer("g")
    queue.publish(b"x")
    c.fetch(1)
    clock.advance(31)
    assert c.fetch(1) == []
    assert reasons(queue) == [(1, "deadline")]


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), "5", True, 10**12])
def test_a_bad_ttl_is_refused_and_nothing_is_stored(client, queue, ttl):
    with pytest.raises(rqueue.InvalidInput, match="ttl"):
        queue.publish(b"x", ttl=ttl)
    assert queue.stats().last_seq == 0


@pytest.mark.sync_only("settings are validated once, by rqueue.settings")
@pytest.mark.parametrize("name", ["ttl", "retry_deadline"])
@pytest.mark.parametrize("value", [0, -3, "soon", 10**12])
def test_bad_lifecycle_settings_are_refused(client, name, value):
    with pytest.raises(rqueue.InvalidSetting, match=name):
        client.configure("orders", **{name: value})


def test_pauses_and_resumes_are_paused_events_when_asked_for(client, queue, clock):
    # given a group, and the events setting naming paused
    client.configure("orders", events=["paused"])
    queue.consumer("g")
    # when the group and the queue are paused and resumed, and a pause repeats (no change)
    queue.pause("g")
    queue.pause("g")
    queue.pause(mode="hold")
    queue.resume("g")
    queue.resume()
    # then each change is one paused event, naming what changed
    got = [(e["group"], e["reason"]) for e in queue.events() if e["event"] == "paused"]
    assert got == [("g", "paused"), ("", "paused (hold)"), ("g", "resumed"), ("", "resumed")]


def test_without_the_setting_pauses_record_nothing(client, queue):
    queue.consumer("g")
    queue.pause("g")
    queue.resume("g")
    assert [e for e in queue.events() if e["event"] == "paused"] == []


@pytest.mark.sync_only("the crash is the fetch script's call without the consumer's follow-up: one client shows it")
@pytest.mark.parametrize("max_deliveries, reason", [(10, "expired"), (1, "max-deliveries")])
def test_a_consumer_that_dies_before_dead_lettering_an_expired_message_costs_one_delivery(
    client, queue, clock, max_deliveries, reason
):
    # given a message past its ttl, handed out by a fetch whose consumer dies
    # before its follow-up dead-letters it (the fetch call alone: no reject comes)
    client.configure("orders", ack_wait=30, max_deliveries=max_deliveries)
    dying, other = queue.consumer("g", "dying"), queue.consumer("g", "other")
    queue.publish(b"x", ttl=5)
    clock.advance(6)
    dying._fetch_once(1)
    # then it stays leased to the dead consumer, handed to nobody, until the lease runs out
    assert other.fetch(1) == [] and queue.dead_letters() == []
    assert queue.stats().group("g").in_flight == 1
    # when another consumer fetches after the lease ran out
    clock.advance(31)
    assert other.fetch(1) == []
    # then it is dead-lettered: as expired, its lost delivery counted (2), or, when
    # that delivery was its last, as a failed attempt (the lease ran out)
    [dead] = queue.dead_letters()
    assert (dead.seq, dead.reason, dead.deliveries) == (1, reason, 2 if reason == "expired" else 1)
    assert "lease expired" in dead.error if reason == "max-deliveries" else "time to live" in dead.error
    assert queue.stats().group("g").ack_floor == 1


def around_set_aside(monkeypatch, before=lambda: None, after=lambda: None):
    """Wraps the set_aside of both clients' engines: ``before`` runs ahead
    of each call, ``after`` once it ran (and may raise in its place)."""
    for module in (commands, async_commands):
        real = module.set_aside
        if module is async_commands:

            async def wrapped(*args, _real=real, **kwargs):
                before()
                out = await _real(*args, **kwargs)
                after()
                return out

        else:

            def wrapped(*args, _real=real, **kwargs):
                before()
                out = _real(*args, **kwargs)
                after()
                return out

        monkeypatch.setattr(module, "set_aside", wrapped)


def test_a_fetch_whose_set_aside_reply_is_lost_leaves_its_other_deliveries_to_no_settle(
    client, queue, clock, monkeypatch
):
    # given a message past its ttl and two good ones in one fetch, whose set_aside runs but its reply is lost
    c = queue.consumer("g")
    queue.publish(b"short", ttl=5)
    queue.publish_many([b"a", b"b"])
    clock.advance(5)

    def lost():
        raise rqueue.ConnectionLost("the reply of set_aside was lost")

    around_set_aside(monkeypatch, after=lost)
    # when the fetch raises, and a later fetch's delivery is acked with all the earlier ones
    with pytest.raises(rqueue.ConnectionLost):
        c.fetch(10)
    monkeypatch.undo()
    queue.publish(b"c")
    [later] = c.fetch(10)
    c.ack(later, multiple=True)
    # then only it is acked: the two no caller was handed stay leased until their leases run out
    g = queue.stats().group("g")
    assert (later.data, g.acked, g.in_flight) == (b"c", 1, 2)
    clock.advance(queue.settings().ack_wait + 1)
    assert sorted(d.data for d in c.fetch(10)) == [b"a", b"b"]


def test_a_set_aside_delivery_whose_state_is_damaged_costs_only_itself(client, queue, clock, monkeypatch):
    # given a message past its ttl and a good one in one fetch, the first's delivery state damaged
    # before the client sets it aside
    c = queue.consumer("g")
    queue.publish(b"short", ttl=5)
    queue.publish(b"good")
    clock.advance(5)

    around_set_aside(monkeypatch, before=lambda: client.redis.hset(queue.keys.group("g").deliveries, 1, "garbage"))
    # when it is fetched, then the good one is handed out all the same
    [good] = c.fetch(10)
    assert good.data == b"good"
    good.ack()
    # and the damaged one is left in flight, for its lease to run out and the doctor to name it
    g = queue.stats().group("g")
    assert (g.acked, g.in_flight, reasons(queue)) == (1, 1, [])


def test_a_fetch_that_may_wait_goes_on_past_expired_messages_at_once(client, queue, clock):
    # given ten messages with a ttl of 5 s, a plain one behind them, and a group
    c = queue.consumer("g")
    for i in range(10):
        queue.publish(b"short %d" % i, ttl=5)
    queue.publish(b"plain")
    # when 5 s pass, and a fetch of one that may wait 2 s runs: each call sets its expired one aside
    clock.advance(5)
    got = c.fetch(1, timeout=2)
    # then it fetched again at once after each (no wait of a poll interval, 0.5 s, in between),
    # and hands out the plain one
    assert [d.data for d in got] == [b"plain"]
    assert reasons(queue) == [(seq, "expired") for seq in range(1, 11)]
