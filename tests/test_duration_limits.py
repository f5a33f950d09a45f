"""Durations and windows are bounded: every one a user can set is refused
beyond MAX_DURATION (10 years), naming the limit and changing nothing, and
the largest accepted value works end to end on every backend (rqueue/validate.py
says why the limit is where it is)."""

from __future__ import annotations

import threading

import pytest
from support.refusals import names_input, nothing_changes
from support.servers import wait_for

import rqueue
from rqueue import InvalidInput, InvalidSetting
from rqueue.constants import MAX_DURATION

LIMIT = "315360000 s (10 years)"
BEYOND = [MAX_DURATION + 0.001, 2e11, 1e14, 10**400]


# -- the largest accepted values work ------------------------------------------------


def test_largest_dedup_window_keeps_an_id_for_all_of_it(client, queue, clock):
    # given the largest de-duplication window and a message with an id
    client.configure("orders", dedup_window=MAX_DURATION)
    first = queue.publish(b"x", id="order-1")
    # when the id comes again just before the window ends, then it is a duplicate
    clock.advance(MAX_DURATION - 1)
    assert queue.publish(b"x", id="order-1") == rqueue.PublishResult(first.seq, True)
    # and after it, it is new
    clock.advance(2)
    assert not queue.publish(b"x", id="order-1").duplicate


def test_largest_ack_wait_holds_the_lease_for_all_of_it(client, queue, clock):
    # given a message leased with the largest ack_wait
    queue.publish(b"x")
    holder = queue.consumer("g", name="w1", ack_wait=MAX_DURATION)
    [d] = holder.fetch()
    other = queue.consumer("g", name="w2", ack_wait=MAX_DURATION)
    # when almost all of it has passed, then the message is still leased
    clock.advance(MAX_DURATION - 1)
    assert other.fetch() == []
    assert queue.stats().group("g").in_flight == 1
    # and the members' liveness (ack_wait) reads back as a number
    assert [c.name for c in queue.stats().group("g").consumers] == ["w1", "w2"]
    # and once it has passed the message is offered again
    clock.advance(2)
    [again] = other.fetch()
    assert (again.seq, again.delivery_count) == (d.seq, 2)


def test_largest_redelivery_delay_with_growth_and_jitter_offers_the_message_again(client, queue, clock):
    # given the largest redelivery delay and cap, doubling, full jitter
    client.configure(
        "orders",
        redelivery_delay=MAX_DURATION,
        max_redelivery_delay=MAX_DURATION,
        redelivery_multiplier=2,
        redelivery_jitter=1.0,
    )
    queue.publish(b"x")
    c = queue.consumer("g", name="w1")
    # when it is nacked twice under the policy
    for attempt in (1, 2):
        [d] = c.fetch()
        assert d.delivery_count == attempt
        d.nack()
        assert queue.stats().group("g").delayed == 1
        # then it is offered again within twice the cap (jitter 1), never lost
        clock.advance(2 * MAX_DURATION + 1)
    assert [d.delivery_count for d in c.fetch()] == [3]


def test_default_cap_of_the_largest_redelivery_delay_is_the_limit():
    # given the largest redelivery delay and no cap
    settings = rqueue.Settings(redelivery_delay=MAX_DURATION)
    # then the cap is the limit rather than ten times the delay
    assert settings.effective_max_redelivery_delay == MAX_DURATION


@pytest.mark.parametrize("how", ["publish", "nack"])
def test_largest_delay_holds_the_message_back_for_all_of_it(client, queue, clock, how):
    # given a message held back by the largest delay, at publish or by a nack
    c = queue.consumer("g", name="w1")
    if how == "publish":
        queue.publish(b"x", delay=MAX_DURATION)
    else:
        queue.publish(b"x")
        c.fetch()[0].nack(delay=MAX_DURATION)
    # when almost all of it has passed, then it is not offered
    clock.advance(MAX_DURATION - 1)
    assert c.fetch() == []
    # and once it has passed it is
    clock.advance(2)
    assert [d.data for d in c.fetch()] == [b"x"]


def test_largest_liveness_and_heartbeat_timeout_keep_a_member(client, queue, clock):
    # given a member with the largest liveness, beating with the largest timeout
    c = queue.consumer("g", name="w1", liveness=MAX_DURATION)
    c.heartbeat([], MAX_DURATION)
    # when almost all of it has passed and another member beats
    clock.advance(MAX_DURATION - 1)
    reaper = queue.consumer("g", name="w2")
    # then the first member is alive, and its figures read back
    assert reaper.heartbeat([], 5).removed == 0
    [w1] = [m for m in queue.stats().group("g").consumers if m.name == "w1"]
    assert w1.idle_ms == (MAX_DURATION - 1) * 1000
    # and after it, it is removed
    clock.advance(2)
    assert reaper.heartbeat([], 5).removed == 1


def test_worker_with_the_largest_durations_handles_and_stops(backend, prefix):
    # given a worker whose timeouts are all the largest allowed (on the real clock)
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    q = client.queue("orders")
    handled = threading.Event()
    w = rqueue.Worker(
        q,
        "g",
        lambda d: handled.set(),
        heartbeat_interval=MAX_DURATION / 2,
        heartbeat_timeout=MAX_DURATION,
        max_run_time=MAX_DURATION,
        grace_period=MAX_DURATION,
        reconnect_timeout=MAX_DURATION,
    )
    w.start()
    try:
        # when a message comes, then it is handled and acked
        q.publish(b"x")
        assert handled.wait(10)
        wait_for(lambda: q.stats().group("g").acked == 1)
    finally:
        # and the worker stops at once, without waiting out any timeout
        w.stop()
        assert w.join(10)
        client.close()


# -- beyond the limit: refused, naming it ----------------------------------------------


@pytest.mark.parametrize("value", BEYOND)
@pytest.mark.parametrize("name", ["dedup_window", "ack_wait", "redelivery_delay", "max_redelivery_delay"])
def test_setting_beyond_the_limit_is_refused(client, queue, held, name, value):
    # given a queue in use
    # when a duration setting beyond the limit is configured, or given to a consumer
    with nothing_changes(client, queue), pytest.raises(InvalidSetting) as exc:
        client.configure("orders", **{name: value})
    with nothing_changes(client, queue), pytest.raises(InvalidSetting):
        queue.consumer("audit", name="w9", **{name: value})
    # then the setting and the limit are named
    assert exc.value.setting == name
    names_input(exc.value, f"invalid setting {name}=", f"over the limit of {LIMIT}")


@pytest.mark.parametrize("value", BEYOND)
def test_delays_beyond_the_limit_are_refused(client, queue, held, value):
    # given a queue with deliveries held
    d = held.d1
    # when a publish or a nack asks for a delay beyond the limit
    with nothing_changes(client, queue):
        with pytest.raises(InvalidInput) as published:
            queue.publish(b"x", delay=value)
        with pytest.raises(InvalidInput) as nacked:
            d.nack(delay=value)
    # then the delay and the limit are named
    for exc in (published.value, nacked.value):
        names_input(exc, "delay", f"from 0 to {LIMIT}")


@pytest.mark.parametrize("value", BEYOND)
def test_consumer_durations_beyond_the_limit_are_refused(client, queue, held, value):
    # given a queue with a group
    c = held.w2
    # when a consumer's liveness, heartbeat timeout or fetch timeout is beyond the limit
    with nothing_changes(client, queue):
        with pytest.raises(InvalidInput, match="liveness") as liveness:
            queue.consumer("billing", name="w9", liveness=value)
        with pytest.raises(InvalidInput, match="timeout") as heartbeat:
            c.heartbeat([], value)
        with pytest.raises(InvalidInput, match="timeout") as fetch:
            c.fetch(1, timeout=value)
    # then the limit is named
    for exc in (liveness.value, heartbeat.value, fetch.value):
        names_input(exc, f"the limit is {LIMIT}")


@pytest.mark.parametrize("value", BEYOND)
@pytest.mark.parametrize(
    "name", ["heartbeat_interval", "heartbeat_timeout", "max_run_time", "grace_period", "reconnect_timeout"]
)
def test_worker_durations_beyond_the_limit_are_refused(client, queue, name, value):
    # given a queue
    # when a worker is made with a duration beyond the limit
    with pytest.raises(InvalidInput) as exc:
        rqueue.Worker(queue, "g", print, **{name: value})
    # then the argument and the limit are named
    names_input(exc.value, name, f"the limit is {LIMIT}")
