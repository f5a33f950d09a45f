"""The rule that a script is sent (in KEYS) every key it touches, checked
on both layouts, on a real server and on memory://, by the sync and the
asyncio client: the scripts run with tests/support/keycheck.py's prelude,
which refuses a command on a key the call was not sent, and a
representative run of operations (priority and keyed messages,
redeliveries, nack and reject, dead letters, replay, status, settle_to,
reset, retention, the doctor's repair, deletions) must pass unrefused.
A call refused by the rule raises the script's error, RQ_UNSENT_KEY."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support import logview
from support.aio_bridge import connect_as
from support.keycheck import UNSENT, checked_scripts, with_prelude
from support.servers import start_server

import rqueue
from rqueue import doctor
from rqueue.engine.keys import LAYOUT_ENV
from rqueue.engine.text_cache import cached_texts
from rqueue.migration import migrate_prefix


@pytest.fixture(params=["redis", "memory"])
def url(request: pytest.FixtureRequest, servers: dict[str, Any]) -> str:
    if request.param == "memory":
        return "memory://keyrule"
    if "redis" not in servers:
        servers["redis"] = start_server("redis")
    return str(servers["redis"].url)


@pytest.fixture(params=["hash", "stream"])
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sync", "aio"])
def checked(request: pytest.FixtureRequest, url: str, layout: str, prefix: str, clock: Any) -> Iterator[Any]:
    with checked_scripts(), pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_ENV, layout)
        c = connect_as(
            request.param, url, prefix=prefix, clock=clock, randomness=rqueue.Randomness(seed=7), settings_ttl=0
        )
        try:
            yield c
        finally:
            c.close()


def test_the_prelude_refuses_a_key_the_call_was_not_sent(checked):
    # given a client whose scripts check their keys, and a script text made
    # to touch a key it is not sent
    r = checked.redis
    text = with_prelude("probe", "return redis.call('GET', KEYS[1] .. ':other')")
    # when it runs, then the error names the script, the command and the key
    with pytest.raises(Exception, match=rf"{UNSENT} probe.lua: GET touched k:other, which is not in its KEYS"):
        r.eval(text, 1, "k")
    # and one that keeps to its keys runs as it would
    assert r.eval(with_prelude("probe", "return redis.call('EXISTS', KEYS[1], KEYS[2])"), 2, "k", "k2") == 0


def test_every_script_is_sent_every_key_it_touches(checked, clock, layout, url, prefix):
    client = checked
    client.configure("orders", max_deliveries=2, ack_wait=10, redelivery_delay=0)
    q = client.queue("orders")
    w1 = q.consumer("g", name="w1")
    q.create_group("g2", "first")
    # plain, priority and keyed messages, one with headers
    q.publish_many([b"a", b"b", b"c"])
    q.publish(b"p9", priority=9)
    q.publish(b"p2", priority=2, headers={"h": "v"})
    q.publish_many([b"k1", b"k2"], key="x")
    q.publish(b"late", delay=5)
    assert q.status(seq=4).groups["g"].state is rqueue.MessageState.PUBLISHED
    got = {d.data: d for d in w1.fetch(10)}
    assert {b"p9", b"p2", b"k1", b"a"} <= set(got)
    # a nack (a redelivery), a reject (a dead letter), an extend and a heartbeat
    assert got[b"p9"].nack(delay=0, error="again") == "requeued"
    got[b"p2"].reject(reason="bad")
    got[b"k1"].in_progress()
    w1.heartbeat([got[b"k1"]], timeout=5.0, sync=True)
    again = {d.seq: d for d in w1.fetch(10)}
    assert 4 in again
    # the priority message nacked to its last delivery: a dead letter
    again[4].nack(delay=0, error="twice")
    assert q.status(seq=4).groups["g"].state is rqueue.MessageState.DEAD_LETTERED
    assert q.status(seq=5).groups["g"].state is rqueue.MessageState.DEAD_LETTERED
    # a lease that runs out: redelivered by a fetch of another member
    clock.advance(11)
    w2 = q.consumer("g", name="w2")
    redelivered = w2.fetch(10)
    assert any(d.redelivered for d in redelivered)
    for d in redelivered:
        d.ack()
    # dead letters replayed, and a status of each kind
    assert q.replay_dead_letters().replayed == 2
    for seq in range(1, 9):
        q.status(seq=seq)
    back = w2.fetch(10)
    for d in back:
        d.ack()
    # the second group settled through, reset back and forward, a new group
    q.settle_through("g2", 4)
    q.reset_group("g2", "first", force=True)
    q.reset_group("g2", "last", force=True)
    q.create_group("g3", "first")
    w3 = q.consumer("g3", name="w3")
    for d in w3.fetch(3):
        d.nack(delay=0)
    q.reset_group("g3", "first", force=True)
    # retention: kept by age, trimmed when old
    client.configure("orders", max_age=1)
    q.trim()
    clock.advance(2)
    q.trim()
    # a member leaves with deliveries held (returned to the group)
    q.publish(b"held", priority=5)
    w4 = q.consumer("g3", name="w4")
    assert w4.fetch(10)
    w4.close()
    # damage the doctor repairs: a lost lease, a lost delivery state, the
    # flow flag (the doctor runs on a sync client, its scripts checked too)
    sync = connect_as("sync", url, prefix=prefix, clock=clock, settings_ttl=0)
    try:
        doctor_run(sync, client, q)
    finally:
        sync.close()
    # ids, a result kept with the ack, a message that expires unrun (set
    # aside as a dead letter by the fetch's client), a pause and a resume
    q.publish(b"id", id="m-1", priority=3)
    q.publish(b"id again", id="m-1")
    assert q.status("m-1").seq > 0
    q.publish(b"expires", priority=4, ttl=1)
    clock.advance(2)
    q.pause("g3")
    q.resume("g3")
    w6 = q.consumer("g3", name="w6")
    for d in w6.fetch(10):
        w6.ack_result(d, b"done", False)
    # purge, group deletion, dead letters purged, the queue deleted
    q.purge("g3")
    q.delete_group("g3", force=True)
    q.delete_group("g2", force=True)
    q.purge_dead_letters()
    q.delete_group("g", force=True)
    q.delete(force=True)


def doctor_run(sync: Any, client: Any, q: Any) -> None:
    dq = sync.queue("orders")
    w5 = q.consumer("g3", name="w5")
    q.publish(b"dmg", priority=1)
    held = w5.fetch(2)
    assert held
    r = client.redis
    gk = q.keys.group("g3")
    r.zrem(gk.lease, held[0].seq)
    if len(held) > 1:
        r.hdel(gk.deliveries, held[1].seq)
    r.hdel(q.keys.meta, "prio")
    found = doctor.examine(dq)
    assert found
    doctor.repair(dq, found)
    doctor.examine(dq)
    # a record lost: the doctor's checks read it
    q.publish(b"lost", key="y")
    logview.delete(r, q.keys, int(r.hget(q.keys.meta, "seq")))
    doctor.repair(dq, doctor.examine(dq))


def test_the_migration_is_sent_every_key_it_touches(url, prefix, clock):
    # given a hash-layout queue with plain, priority and keyed messages, a
    # dead letter replayed (a pinned record), and a delivery in flight
    with checked_scripts(), pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_ENV, "hash")
        client = connect_as("sync", url, prefix=prefix, clock=clock, settings_ttl=0)
        try:
            q = client.queue("orders")
            w = q.consumer("g")
            q.publish_many([b"a", b"b"])
            q.publish(b"p", priority=4)
            q.publish(b"k", key="x", headers={"h": "v"})
            got = w.fetch(2)
            got[0].reject(reason="bad")
            got[1].ack()
            assert q.replay_dead_letters().replayed == 1
            w.fetch(1)
            # when the prefix is migrated, then no step touches a key it was not sent
            report = migrate_prefix(client)
            assert [lv.before for lv in report.levels] == ["hash", "hash"]
        finally:
            client.close()


def test_the_source_is_the_loaders_own_without_the_checker(layout):
    # the checker is on only while it is open: other tests run the scripts as shipped
    with checked_scripts():
        pass
    from rqueue.engine import scripts

    assert scripts.cached_texts is cached_texts
