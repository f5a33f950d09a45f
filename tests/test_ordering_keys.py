"""Ordering keys in the fetch script: per-key seq order, key_concurrency,
a failed delivery holding only its own key, fairness across keys, per-key
rate limits (docs/flow-control.md, "Ordering keys")."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.aio_bridge import parametrize_api

import rqueue
from rqueue import InvalidInput, doctor
from rqueue.cli import cli
from rqueue.engine import commands

pytest_generate_tests = parametrize_api  # the asyncio client too, but where marked


def data(deliveries):
    return [d.data for d in deliveries]


def test_a_keys_messages_go_out_one_at_a_time_in_seq_order_others_flow(queue):
    # given two keys' messages interleaved with a plain one
    queue.publish_many([b"a1", b"b1", b"a2", b"p", b"b2", b"a3"], key=["a", "b", "a", None, "b", "a"])
    c = queue.consumer("g", prefetch=100)
    # when the group fetches, then each key's first message and the plain one come, no key twice
    first = c.fetch(10)
    assert sorted(data(first)) == [b"a1", b"b1", b"p"]
    assert c.fetch(10) == []
    # when a1 is acked, then a2 comes, and only it
    next(d for d in first if d.data == b"a1").ack()
    [a2] = c.fetch(10)
    assert a2.data == b"a2"
    # and once everything is acked, the rest in seq order per key
    for d in first:
        if d.data != b"a1":
            d.ack()
    a2.ack()
    assert sorted(data(c.fetch(10))) == [b"a3", b"b2"]


def test_key_concurrency_allows_that_many_of_one_key_in_flight(client, queue):
    client.configure("orders", key_concurrency=2)
    queue.publish_many([b"1", b"2", b"3", b"4"], key="k")
    c = queue.consumer("g")
    got = c.fetch(10)
    assert data(got) == [b"1", b"2"]
    got[1].ack()
    assert data(c.fetch(10)) == [b"3"]


def test_a_nacked_message_holds_only_its_key_for_its_redelivery_delay(queue, clock):
    # given keys a and b, each with its first message out
    queue.publish_many([b"a1", b"a2", b"b1", b"b2"], key=["a", "a", "b", "b"])
    c = queue.consumer("g")
    got = {d.data: d for d in c.fetch(10)}
    assert set(got) == {b"a1", b"b1"}
    # when a1 is nacked with a delay and b1 acked
    got[b"a1"].nack(delay=5)
    got[b"b1"].ack()
    # then b flows and a waits: neither a1 (its delay) nor a2 (behind it) comes
    assert data(c.fetch(10)) == [b"b2"]
    assert c.fetch(10) == []
    # when the delay passes, a1 comes again, and a2 only after it is acked
    clock.advance(5)
    [again] = c.fetch(10)
    assert (again.data, again.delivery_count) == (b"a1", 2)
    assert c.fetch(10) == []
    again.ack()
    assert data(c.fetch(10)) == [b"a2"]


def test_an_expired_lease_holds_its_key_until_the_redelivery_is_acked(queue, clock):
    queue.publish_many([b"a1", b"a2"], key="a")
    c = queue.consumer("g")
    [d] = c.fetch(10)
    clock.advance(queue.settings().ack_wait + 1)
    [again] = c.fetch(10)
    assert (again.data, again.delivery_count) == (b"a1", 2)
    assert c.fetch(10) == []
    again.ack()
    assert data(c.fetch(10)) == [b"a2"]


def test_a_late_ack_of_a_key_handed_out_again_holds_the_key_until_its_holder_acks(queue, clock):
    # given w1's delivery of a1 expired and redelivered to w2
    queue.publish_many([b"a1", b"a2", b"a3"], key="a")
    w1, w2 = queue.consumer("g", name="w1"), queue.consumer("g", name="w2")
    [late] = w1.fetch(10)
    clock.advance(queue.settings().ack_wait + 1)
    [again] = w2.fetch(10)
    # when w1 acks late: stale, as w2 holds a1 now
    with pytest.raises(rqueue.StaleDelivery):
        late.ack()
    # then the key stays held: a2 waits until w2's ack, then goes out once, and a3 waits for a2
    assert w1.fetch(10) == [] and w2.fetch(10) == []
    again.ack()
    assert data(w2.fetch(10)) == [b"a2"]
    assert w1.fetch(10) == []


def test_a_late_ack_of_a_key_waiting_for_its_redelivery_frees_it_once(queue, clock, client):
    # given w1's delivery of a1 expired and taken back into a 60 s redelivery delay
    client.configure(queue.name, redelivery_delay=60)
    queue.publish_many([b"a1", b"a2", b"a3"], key="a")
    w1, w2 = queue.consumer("g", name="w1"), queue.consumer("g", name="w2")
    [late] = w1.fetch(10)
    clock.advance(queue.settings().ack_wait + 1)
    assert w2.fetch(10) == []
    # when w1 acks late (nobody holds a1: it completes it)
    late.ack()
    # then a2 goes out once, and a3 waits for a2
    assert data(w2.fetch(10)) == [b"a2"]
    assert w1.fetch(10) == [] and w2.fetch(10) == []


def test_a_keyed_message_acked_ahead_of_the_cursor_is_not_met_again_by_the_scan(queue):
    # given a1 handed out by a fetch of one (the scan of new messages did not run), and acked
    queue.create_group("g")
    queue.publish_many([b"a1", b"a2"], key="a")
    queue.publish(b"p3")
    c = queue.consumer("g")
    [a1] = c.fetch(1)
    a1.ack()
    # when another keyed message comes and the group fetches the rest
    queue.publish(b"b4", key="b")
    got = c.fetch(10)
    # then each goes out once, and a1 is not dead-lettered as missing
    assert sorted(data(got)) == [b"a2", b"b4", b"p3"]
    assert queue.dead_letters() == []


@pytest.mark.sync_only("deletes a key")
def test_a_keyed_message_goes_out_once_when_the_log_is_deleted(client, queue):
    # given a1 handed out by a fetch of one and acked, a2 waiting in the group's key queue
    queue.publish_many([b"a1", b"a2"], key="a")
    c = queue.consumer("g")
    c.ack(c.fetch(1))
    # when the queue's priority log is deleted and the group fetches
    client.redis.delete(queue.keys.prio)
    # then a2 comes once (not again from the scan of new messages)
    assert data(c.fetch(10)) == [b"a2"]


@pytest.mark.sync_only("the doctor")
def test_a_floor_past_the_cursor_is_no_damage_to_purge_or_the_doctor(queue):
    # given a1 handed out by a fetch of one and acked: the floor passes the cursor
    queue.publish_many([b"a1", b"a2"], key="a")
    queue.publish(b"p3")
    c = queue.consumer("g")
    [a1] = c.fetch(1)
    a1.ack()
    # then the doctor finds nothing, and a purge settles the rest
    assert doctor.examine(queue) == []
    assert queue.purge("g") == {"g": 2}
    assert c.fetch(10) == []


@pytest.mark.parametrize("how", ["reject", "term", "max_deliveries"])
def test_a_dead_lettered_message_unblocks_its_key(client, queue, how):
    client.configure("orders", max_deliveries=1)
    queue.publish_many([b"a1", b"a2"], key="a")
    c = queue.consumer("g")
    [d] = c.fetch(10)
    if how == "reject":
        d.reject()
    elif how == "term":
        d.term()
    else:
        d.nack()  # its one delivery spent: dead-lettered
    assert data(c.fetch(10)) == [b"a2"]
    assert len(queue.dead_letters()) == 1


def test_a_hot_key_does_not_starve_the_others(client, queue):
    # given one key with 300 messages, allowed to run them all at once, then 20 keys with one each
    client.configure("orders", key_concurrency=1000)
    queue.publish_many([b"hot"] * 300, key="hot")
    queue.publish_many([b"cold"] * 20, key=[f"c{i}" for i in range(20)])
    c = queue.consumer("g", prefetch=1000)
    # when the group fetches 20 at a time, then every cold key is served within the first two fetches
    served = data(c.fetch(20)) + data(c.fetch(20))
    assert served.count(b"cold") == 20


@pytest.mark.sync_only("the sync client's commands.fetch reads the next due time")
def test_a_delayed_keyed_message_holds_its_key_until_due(queue, clock):
    queue.publish(b"a1", key="a", delay=10)
    queue.publish_many([b"a2", b"b1"], key=["a", "b"])
    c = queue.consumer("g")
    assert data(c.fetch(10)) == [b"b1"]
    reply = commands.fetch(queue.group_call("g", queue.settings(), c.name), 5, "tok")
    assert list(reply.deliveries()) == [] and reply.next_due_ms - reply.now_ms == 10000
    clock.advance(10)
    assert data(c.fetch(10)) == [b"a1"]


@pytest.mark.sync_only("the sync client's commands.fetch reads the next due time")
def test_a_key_over_its_rate_limit_is_passed_over_and_the_fetch_says_when_to_come_back(client, queue, clock):
    # given at most 2 deliveries of one key per 10 s, and plenty of concurrency
    client.configure("orders", key_concurrency=100, key_rate_limit=2, key_rate_period=10)
    queue.publish_many([b"a"] * 5, key="a")
    queue.publish_many([b"b"] * 5, key="b")
    c = queue.consumer("g", prefetch=100)
    # when the group fetches, then two of each key come
    assert sorted(data(c.fetch(100))) == [b"a", b"a", b"b", b"b"]
    # and a fetch then finds only limited keys: nothing, and when to come back
    clock.advance(4)
    reply = commands.fetch(queue.group_call("g", queue.settings(), c.name), 5, "tok")
    assert list(reply.deliveries()) == [] and reply.next_due_ms - reply.now_ms == 6000
    clock.advance(6)
    assert len(c.fetch(100)) == 4


@pytest.mark.parametrize("held", ["rate", "delay"])
def test_keys_held_back_at_the_front_of_the_line_do_not_hold_back_a_fetch_of_one(client, queue, clock, held):
    # given three keys in line ahead of key c, each held back: over its
    # rate limit, or its next message delayed
    client.configure("orders", key_concurrency=10, key_rate_limit=1, key_rate_period=60)
    c = queue.consumer("g", prefetch=100)
    keys = ["a", "b", "d"]
    if held == "rate":
        queue.publish_many([b"x"] * 3, key=keys)
        c.ack(c.fetch(100))
        queue.publish_many([b"x"] * 3, key=keys)
    else:
        queue.publish_many([b"x"] * 3, key=keys, delay=30)
    queue.publish(b"c1", key="c")
    # when the group fetches one, then it gets c's message at once
    assert data(c.fetch(1)) == [b"c1"]


def test_each_group_orders_keys_on_its_own(queue):
    queue.publish_many([b"a1", b"a2"], key="a")
    g1, g2 = queue.consumer("g1"), queue.consumer("g2")
    [x] = g1.fetch(10)
    [y] = g2.fetch(10)
    assert x.data == y.data == b"a1"
    y.ack()
    assert g1.fetch(10) == [] and data(g2.fetch(10)) == [b"a2"]


@pytest.mark.sync_only("the asyncio client has no reset_group")
def test_a_group_reset_takes_back_what_keys_hold_and_hands_out_in_order_again(queue):
    queue.publish_many([b"a1", b"a2"], key="a")
    c = queue.consumer("g")
    [d] = c.fetch(10)
    queue.reset_group("g", "first", force=True)
    # then a1 comes again, and only it: the reset took back the first delivery
    assert data(c.fetch(10)) == [b"a1"]
    with pytest.raises(rqueue.DeliveryError):
        d.ack()


def test_a_purge_settles_keyed_messages_and_strands_no_key(queue):
    queue.publish_many([b"a1", b"a2"], key="a")
    c = queue.consumer("g")
    [d] = c.fetch(10)
    # when the group is purged (a2 settled) while a1 is out, and a3 published
    queue.purge("g")
    queue.publish(b"a3", key="a")
    # then a3 waits for a1 alone, and comes once a1 is acked
    assert c.fetch(10) == []
    d.ack()
    assert data(c.fetch(10)) == [b"a3"]


@pytest.mark.parametrize("kind", ["key", "priority", "delayed priority"])
def test_a_purge_settles_no_message_twice_and_leaves_the_other_groups_theirs(queue, clock, kind):
    # given groups g and h, and a keyed (or priority) message between two plain ones
    queue.create_group("g")
    queue.create_group("h")
    queue.publish(b"p1")
    if kind == "delayed priority":
        queue.publish(b"x2", priority=5, delay=30)
    else:
        queue.publish(b"x2", **{kind: "a" if kind == "key" else 5})
    queue.publish(b"p3")
    # when g acks x2 (handed out ahead of its cursor; or p1, x2 waiting
    # delayed above it), then purges
    g = queue.consumer("g")
    [first] = g.fetch(1)
    first.ack()
    assert queue.purge("g") == {"g": 2}
    # then g settled each message once, and h still gets all three
    assert queue.stats().group("g").pending == 0
    clock.advance(30)
    h = queue.consumer("h")
    assert sorted(data(h.fetch(10))) == [b"p1", b"p3", b"x2"]
    assert queue.dead_letters() == []


@pytest.mark.sync_only("reads the group's keys")
def test_a_purge_settles_what_it_takes_from_the_key_queue_above_the_cursor(client, queue):
    # given a busy key's messages pulled into the group's key queue above its cursor
    queue.publish_many([b"a1", b"a2", b"a3", b"a4"], key="a")
    c = queue.consumer("g")
    [a1] = c.fetch(1)
    # when a purge's first call takes them from the key queue, and a fetch
    # moves the cursor over them before the next call
    call = queue.group_call("g")
    commands.purge(call, 2)
    assert c.fetch(10) == []
    while commands.purge(call, 2).more:
        pass
    # then each is settled: once a1 is acked, nothing of the group is left
    a1.ack()
    assert c.fetch(10) == []
    g = queue.stats().group("g")
    assert (g.pending, g.ack_floor) == (0, 4)


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "ü", 5, b"a"])
def test_a_bad_ordering_key_is_refused_naming_it_and_stores_nothing(queue, bad):
    with pytest.raises(InvalidInput, match="key"):
        queue.publish(b"m", key=bad)
    assert queue.stats().last_seq == 0


def test_a_key_with_a_priority_is_refused_and_stores_nothing(queue):
    with pytest.raises(InvalidInput, match="priority=3 with key='k'"):
        queue.publish_many([b"a", b"b"], key=["j", "k"], priority=[0, 3])
    assert queue.stats().last_seq == 0


@pytest.mark.parametrize(
    "values", [{"key_concurrency": 0}, {"key_concurrency": 1.5}, {"key_rate_limit": -1}, {"key_rate_period": 0}]
)
def test_a_bad_key_setting_is_refused(client, values):
    with pytest.raises(rqueue.InvalidSetting, match=next(iter(values))):
        client.configure("orders", **values)


@pytest.mark.sync_only("the CLI")
def test_stats_and_the_cli_count_ready_and_busy_keys(queue, backend, prefix):
    # given keys a (two messages), b and c, and a fetch of two: a1 and b1 out
    queue.publish_many([b"a1", b"a2", b"b1", b"c1"], key=["a", "a", "b", "c"])
    c = queue.consumer("g")
    assert data(c.fetch(2)) == [b"a1", b"b1"]
    # then c may hand out, a and b hold deliveries
    g = queue.stats().group("g")
    assert (g.keys_ready, g.keys_busy) == (1, 2)
    # and `rqueue stats --json` says the same
    result = CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, "stats", "orders", "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)["groups"]
    assert (row["keys_ready"], row["keys_busy"]) == (1, 2)


def test_a_consumer_sends_the_ordering_keys_layout_once_the_queue_needs_it(queue):
    # given a consumer that fetched from a plain queue (the short layout)
    queue.publish(b"p")
    c = queue.consumer("g")
    [p] = c.fetch(10)
    # when keyed messages come, then the next fetch still hands them out in key order (acking p with it)
    queue.publish_many([b"a1", b"a2"], key="a")
    _, got, _ = c.ack_and_fetch([p], 10)
    assert data(got) == [b"a1"]
    assert queue.stats().group("g").acked == 1


def test_a_consumer_keeps_sending_the_ordering_keys_layout_under_new_settings(queue, monkeypatch):
    # given a consumer of a keyed queue, whose client reads settings anew for every call (settings_ttl=0)
    refusals = []
    needs = commands.needs_flow_keys
    monkeypatch.setattr(commands, "needs_flow_keys", lambda exc: refusals.append(exc) or needs(exc))
    queue.publish_many([b"a1", b"b1", b"c1"], key=["a", "b", "c"])
    c = queue.consumer("g")
    # when it fetches three times, then the short layout is refused once, not for every fetch
    for _ in range(3):
        c.ack(c.fetch(1))
    assert len(refusals) == 1


@pytest.mark.sync_only("reads the group's keys")
def test_a_key_leaves_nothing_behind_once_settled(client, queue, clock):
    # given a key with a rate limit, its one message handed out and acked
    client.configure("orders", key_rate_limit=5, key_rate_period=1)
    queue.publish(b"a1", key="a")
    c = queue.consumer("g")
    c.ack(c.fetch(10))
    # when its window has passed and a fetch checks the key again
    clock.advance(2)
    assert c.fetch(10) == []
    # then the group keeps nothing of it
    gk = queue.keys.group("g")
    assert [client.redis.exists(k) for k in (gk.key_queue, gk.key_ready, gk.key_busy, gk.key_flight)] == [0, 0, 0, 0]


@pytest.mark.sync_only("reads the group's keys")
def test_a_keys_rate_window_goes_when_a_fetch_freed_the_key_inside_it(client, queue, clock):
    # given keys with a rate limit, each used once: handed out, acked, and
    # the keys freed by a fetch while their windows still count
    client.configure("orders", key_rate_limit=5, key_rate_period=1)
    queue.publish_many([b"a1", b"b1"], key=["a", "b"])
    c = queue.consumer("g")
    c.ack(c.fetch(10))
    assert c.fetch(10) == []
    # when the windows have passed and fetches go on
    clock.advance(2)
    assert c.fetch(10) == []
    # then the group keeps nothing of the keys
    gk = queue.keys.group("g")
    assert [client.redis.exists(k) for k in (gk.key_queue, gk.key_ready, gk.key_busy, gk.key_flight)] == [0, 0, 0, 0]


def test_a_delivery_handed_back_unseen_keeps_its_key_held(queue):
    # given a1 of key a leased to w1, whose fetch reply w1 never read (or that
    # waited in w1 when it stopped): a sync heartbeat hands it back, and its
    # delivery state goes (its count back to 0)
    queue.publish_many([b"a1", b"a2", b"a3"], key="a")
    w1, w2 = queue.consumer("g", name="w1"), queue.consumer("g", name="w2")
    assert data(w1.fetch(10)) == [b"a1"]
    assert w1.heartbeat([], timeout=10, sync=True).handed_back == 1
    # then a1 goes out again alone: the key is held until it is settled
    [again] = w2.fetch(10)
    assert again.data == b"a1"
    assert w2.fetch(10) == [] and w1.fetch(10) == []
    again.ack()
    assert data(w2.fetch(10)) == [b"a2"]
