"""Call records for first deliveries in a stream log (docs/layout-d-plan.md,
step 4; rqueue/engine/lua/includes/call_state.lua): a fetch that takes
CALL_MIN messages or more from the cursor writes one record for them, and
anything but fetch, an ack of a call's own delivery or an extension splits
a call delivery into today's delivery state and lease first. Every backend,
memory:// included, runs the same scripts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support import callview
from support.logview import connect

import rqueue
from rqueue import doctor
from rqueue.engine import commands
from rqueue.engine.loader import SCRIPT_NAMES, source
from rqueue.errors import AlreadyAcked, LayoutMismatch, NotHeld, StaleDelivery, UnknownDeliveryTag
from rqueue.results import MessageState

CALL_MIN = 16  # fetch.lua's CALL_MIN
N = CALL_MIN + 4  # a call's size in these tests
CALL_MAX = 128  # fetch.lua's CALL_MAX
WAIT = 30  # ack_wait, s
PIN = b"pin: keeps this sorted set a skiplist, as a listpack every ZADD moves the whole set"  # group_keys.lua's


@pytest.fixture
def client(backend: str, prefix: str, clock: rqueue.ManualClock) -> Iterator[Any]:
    c = connect(backend, prefix, clock, "stream")
    yield c
    c.close()


def keys_of(q: Any, group: str = "g") -> list[str]:
    return q.keys.group(group).as_list()


def calls(q: Any, group: str = "g") -> dict[int, tuple[str, str]]:
    return callview.calls_of(q.client.redis, keys_of(q, group))


def states(q: Any, group: str = "g") -> dict[int, str]:
    raw = q.client.redis.hgetall(q.keys.group(group).deliveries)
    return {int(k): v.decode() for k, v in raw.items() if k != b"pin"}


def leases(q: Any, group: str = "g") -> dict[int, int]:
    raw = q.client.redis.zrange(q.keys.group(group).lease, 0, -1, withscores=True)
    return {int(m): int(s) for m, s in raw if m.isdigit()}


def callout(q: Any, group: str = "g") -> int:
    return int(q.client.redis.hget(q.keys.group(group).state, "callout") or 0)


def in_flight(q: Any, group: str = "g") -> int:
    return next(g.in_flight for g in q.stats().groups if g.name == group)


def held_by(q: Any, group: str = "g") -> dict[str, int]:
    raw = q.client.redis.hgetall(q.keys.group(group).consumers)
    return {k.decode(): int(v) for k, v in raw.items()}


def queue_with(client: Any, n: int) -> Any:
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, n + 1)])
    return q


def test_a_large_fetch_writes_one_call_record_and_its_acks_settle_it_in_parts(client):
    # given more messages than a call takes, and a consumer
    q = queue_with(client, N + 8)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    # when it fetches N from the cursor
    got = c.fetch(N)
    # then they are out on one call record: no delivery state, no lease; in flight all the same
    assert [d.seq for d in got] == list(range(1, N + 1)) and all(d.delivery_count == 1 for d in got)
    assert set(calls(q)) == set(range(1, N + 1)) and {h for _, h in calls(q).values()} == {c.name}
    assert states(q) == {} and leases(q) == {}
    assert callout(q) == N and in_flight(q) == N and held_by(q) == {c.name: N}
    assert q.status(seq=5).groups["g"].state is MessageState.IN_FLIGHT
    assert q.status(seq=5).groups["g"].consumer == c.name
    # when some are acked, out of order
    c.ack([got[0], got[5], got[N - 1]])
    # then the record keeps the rest, and the floor moves over the first
    assert set(calls(q)) == set(range(1, N + 1)) - {1, 6, N} and callout(q) == N - 3
    assert held_by(q) == {c.name: N - 3} and q.stats().groups[0].ack_floor == 1
    # when one more is acked alone, then the rest in one call
    got[1].ack()
    c.ack([d for d in got if d.seq not in (1, 2, 6, N)])
    # then no call is left (the deadline and first-seq sets keep only their pin), nothing is in flight,
    # and every message is settled
    r = client.redis
    gk = q.keys.group("g")
    assert r.exists(gk.calls) == 0 and callout(q) == 0
    for key in (gk.call_deadlines, gk.call_seqs):
        assert r.zrange(key, 0, -1, withscores=True) == [(PIN, float("inf"))]
    assert in_flight(q) == 0 and held_by(q) == {c.name: 0} and q.stats().groups[0].ack_floor == N
    # and an ack of a settled call delivery is refused as acked
    with pytest.raises(AlreadyAcked):
        got[3].ack()


@pytest.mark.parametrize("backend", ["redis", "valkey", "cluster"], indirect=True)  # OBJECT ENCODING: a server's
def test_the_call_sets_are_skiplists_from_the_first_call_and_many_calls_out_are_healthy(client):
    # given a queue whose group holds any number in flight, and a consumer per call
    q = queue_with(client, 130 * N)
    client.configure(q.name, max_inflight=10**6)
    gk = q.keys.group("g")
    r = client.redis
    # when one call is out, then its deadline and first-seq sets are skiplists already (a listpack of a
    # hundred calls would be scanned by every ZADD and ZREM)
    consumers = [q.consumer("g", f"c{i}", ack_wait=WAIT) for i in range(130)]
    held = [consumers[0].fetch(N)]
    assert [r.object("encoding", key) for key in (gk.call_deadlines, gk.call_seqs)] == [b"skiplist"] * 2
    # when 130 calls are out, then each is in both sets, and the doctor finds nothing to repair
    held += [c.fetch(N) for c in consumers[1:]]
    assert len(calls(q)) == 130 * N and callout(q) == 130 * N
    for key in (gk.call_deadlines, gk.call_seqs):
        assert r.zcount(key, "-inf", "(+inf") == 130 and r.zscore(key, PIN) == float("inf")
    assert doctor.examine(q) == []
    # when every call is acked, then the sets keep their pin alone, and the doctor still finds nothing
    for c, batch in zip(consumers, held):
        c.ack(batch)
    assert calls(q) == {} and callout(q) == 0 and in_flight(q) == 0
    assert [r.zcard(key) for key in (gk.call_deadlines, gk.call_seqs)] == [1, 1]
    assert doctor.examine(q) == []


def test_a_fetch_of_more_than_a_call_holds_takes_the_rest_per_message(client):
    q = queue_with(client, CALL_MAX + 22)
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    got = c.fetch(CALL_MAX + 22)
    assert set(calls(q)) == set(range(1, CALL_MAX + 1))
    assert set(states(q)) == set(range(CALL_MAX + 1, CALL_MAX + 23)) == set(leases(q))
    assert in_flight(q) == CALL_MAX + 22 and held_by(q) == {c.name: CALL_MAX + 22}
    c.ack(got[::-1])
    assert calls(q) == {} and states(q) == {} and in_flight(q) == 0 and q.stats().groups[0].ack_floor == CALL_MAX + 22


def test_a_small_fetch_keeps_a_state_and_a_lease_per_message(client):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(CALL_MIN - 1)
    assert calls(q) == {} and set(states(q)) == set(range(1, CALL_MIN)) and set(leases(q)) == set(range(1, CALL_MIN))
    # as does a large fetch that finds fewer than CALL_MIN new messages
    c.ack(got)
    q2 = client.queue("few")
    q2.publish_many([b"a", b"b", b"c"])
    c2 = q2.consumer("g", "c1", ack_wait=WAIT)
    assert len(c2.fetch(100)) == 3 and calls(q2) == {} and set(states(q2)) == {1, 2, 3}


def test_an_ack_of_another_consumer_or_token_is_refused_and_changes_nothing(client):
    q = queue_with(client, N)
    c1 = q.consumer("g", "c1", ack_wait=WAIT)
    c2 = q.consumer("g", "c2", ack_wait=WAIT)
    got = c1.fetch(N)
    before = calls(q)
    # when another consumer acks c1's call delivery by its tag, then it is not held by it
    assert [type(e) for e in c2.ack_available([got[2].tag])] == [NotHeld]
    # and a tag with another token names no delivery, one with a later count none either
    seq, count, token = got[3].tag.split(".")
    assert [type(e) for e in c1.ack_available([f"{seq}.{count}.zz9", f"{seq}.2.{token}"])] == [UnknownDeliveryTag] * 2
    assert calls(q) == before and callout(q) == N and states(q) == {}


def test_a_call_past_its_deadline_is_split_and_redelivered_with_history(client, clock):
    q = queue_with(client, N)
    c1 = q.consumer("g", "c1", ack_wait=WAIT)
    got = c1.fetch(N)
    c1.ack(got[:2])
    # when its deadline passes, then the next fetch splits the call and takes the deliveries back
    clock.advance(WAIT + 1)
    c2 = q.consumer("g", "c2", ack_wait=WAIT)
    again = c2.fetch(3)
    assert [(d.seq, d.delivery_count) for d in again] == [(3, 2), (4, 2), (5, 2)]
    assert calls(q) == {} and callout(q) == 0
    # each state's history names the earlier holder and its token
    token = got[0].token
    for seq in range(3, N + 1):
        assert f"\n1={c1.name}={token}" in states(q)[seq], seq
    assert q.stats().groups[0].expired == N - 2
    # a late ack of a delivery not handed out again completes it, as a late ack does
    got[8].ack()
    # an ack of one handed out again is stale
    with pytest.raises(StaleDelivery):
        got[2].ack()
    c2.ack(again)
    assert sorted(d.seq for d in c2.fetch(N)) == [s for s in range(6, N + 1) if s != 9]  # (9 acked late)


def test_nack_and_reject_of_call_deliveries_split_them_first(client, clock):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    # when one is nacked and one rejected
    got[3].nack(delay=0)
    got[4].reject(reason="bad")
    # then only those left the call: one waits for its redelivery, one is a dead letter
    assert set(calls(q)) == set(range(1, N + 1)) - {4, 5} and callout(q) == N - 2
    assert set(states(q)) == {4} and held_by(q) == {c.name: N - 2} and in_flight(q) == N - 2
    assert [d.seq for d in q.dead_letter_queue.consumer("dlq-reader").fetch(5)] != []
    # and the nacked one comes again, counted
    redelivered = c.fetch(1)
    assert [(d.seq, d.delivery_count) for d in redelivered] == [(4, 2)]
    # an ack after the split settles it by its state
    c.ack(redelivered + [d for d in got if d.seq not in (4, 5)])
    assert calls(q) == {} and states(q) == {} and in_flight(q) == 0 and q.stats().groups[0].ack_floor == N


def test_an_ack_of_call_deliveries_and_split_ones_moves_the_floor_only_over_them(client):
    # given a call of 1..N, with seqs 10 and 11 split out of it by an extension
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    c.in_progress(got[9:11])
    assert set(states(q)) == {10, 11}
    # when 1 and 2 (settled by the call record) are acked with 10 and 11 (by their states)
    c.ack([got[0], got[1], got[9], got[10]])
    # then the floor moves over 1 and 2 only: 3..9 are still out, and no one is handed them
    assert q.stats().groups[0].ack_floor == 2 and in_flight(q) == N - 4
    assert q.consumer("g", "c2", ack_wait=WAIT).fetch(N) == []
    # and acking the rest settles everything
    c.ack(got[2:9] + got[11:])
    assert q.stats().groups[0].ack_floor == N and in_flight(q) == 0


def test_an_extension_of_every_delivery_moves_the_deadline_and_of_some_splits_them(client, clock):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    gk = q.keys.group("g")
    r = client.redis
    token = got[0].token
    first_deadline = r.zscore(gk.call_deadlines, token)
    # when every delivery is extended, then the call's deadline moves, and nothing is split
    clock.advance(10)
    c.in_progress(got)
    assert r.zscore(gk.call_deadlines, token) == first_deadline + 10_000 and states(q) == {}
    # when some are extended later, then those are split out with leases of their own
    clock.advance(10)
    c.in_progress(got[:3])
    assert set(states(q)) == {1, 2, 3} and set(leases(q)) == {1, 2, 3}
    assert all(score == first_deadline + 20_000 for score in leases(q).values())
    assert set(calls(q)) == set(range(4, N + 1)) and callout(q) == N - 3 and in_flight(q) == N
    # and when the call's deadline passes, only the rest is taken back
    clock.advance(WAIT - 5)
    assert [d.seq for d in q.consumer("g", "c2", ack_wait=WAIT).fetch(N)] == list(range(4, N + 1))
    c.ack(got[:3])
    assert in_flight(q) == N - 3


def test_settle_through_leave_and_reset_over_calls(client, clock):
    q = queue_with(client, 3 * N)
    c1 = q.consumer("g", "c1", ack_wait=WAIT)
    got = c1.fetch(N)
    # settle_through over the held call: its deliveries stay held (split), the rest settled
    assert q.settle_through("g", N + 5) == 5
    assert set(states(q)) == set(range(1, N + 1)) and calls(q) == {} and in_flight(q) == N
    c1.ack(got)
    assert q.stats().groups[0].ack_floor == N + 5
    # leave (close) takes a member's calls back at once
    more = c1.fetch(N)
    assert set(calls(q)) == {d.seq for d in more}
    c1.close()
    assert calls(q) == {} and callout(q) == 0
    c2 = q.consumer("g", "c2", ack_wait=WAIT)
    assert [(d.seq, d.delivery_count) for d in c2.fetch(N)][:2] == [(N + 6, 2), (N + 7, 2)]
    # a reset takes every call back
    q.publish_many([b"n"] * N)
    c2.fetch(N)
    assert calls(q) != {}
    q.reset_group("g", "first", force=True)
    assert calls(q) == {} and callout(q) == 0 and states(q) == {} and leases(q) == {} and in_flight(q) == 0
    # and a deleted group leaves no call key behind
    c3 = q.consumer("g", "c3", ack_wait=WAIT)
    c3.fetch(N)
    assert calls(q) != {}
    q.delete_group("g", force=True)
    gk = q.keys.group("g")
    assert client.redis.exists(gk.calls, gk.call_deadlines, gk.call_seqs) == 0


def test_a_dead_letter_handed_out_again_on_a_call_after_a_reset_is_not_replayed(client):
    # given seq 1 dead-lettered, the rest acked, and the group reset back over it (another
    # group keeps the stream's entries: the trim follows the lowest floor)
    q = queue_with(client, N)
    q.create_group("keep")
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    got[0].reject(reason="bad")
    c.ack(got[1:])
    q.reset_group("g", "first")
    # and its fetch hands seq 1 out again as new, on a call
    again = c.fetch(N)
    assert [d.seq for d in again] == list(range(1, N + 1)) and 1 in calls(q)
    # when the dead letter is replayed
    res = q.replay_dead_letters()
    # then it is left alone as pending: seq 1 is out on the call, and nothing else changed
    assert (res.selected, res.replayed, res.skipped) == (1, 0, 1)
    assert set(calls(q)) == set(range(1, N + 1)) and states(q) == {} and in_flight(q) == N
    assert len(q.dead_letters()) == 1
    # and once the call is acked, no fetch hands seq 1 out again
    c.ack(again)
    assert c.fetch(N) == [] and q.stats().group("g").ack_floor == N


def test_a_replay_sent_no_call_keys_is_refused_and_changes_nothing(client, monkeypatch):
    # given a dead letter of a group fetched on calls, its other deliveries still out on the call
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    c.fetch(N)[0].reject(reason="bad")
    r = client.redis
    before = {k: r.dump(k) for k in sorted(r.keys(f"{q.keys.base}*"))}
    # when replay.lua is sent the group's keys without the call keys (a client of before them)
    monkeypatch.setattr(commands, "call_keys_of", lambda keys: [])
    # then it is refused by name, and nothing changed
    with pytest.raises(LayoutMismatch, match="call keys"):
        q.replay_dead_letters()
    assert {k: r.dump(k) for k in sorted(r.keys(f"{q.keys.base}*"))} == before


def test_a_dead_member_is_reaped_with_its_calls(client, clock):
    q = queue_with(client, N)
    dead = q.consumer("g", "dead", liveness=5, ack_wait=WAIT)
    dead.fetch(N)
    live = q.consumer("g", "live", liveness=60, ack_wait=WAIT)
    clock.advance(6)
    live.heartbeat([], timeout=60)
    assert calls(q) == {} and callout(q) == 0
    assert [(d.seq, d.delivery_count) for d in live.fetch(N)] == [(s, 2) for s in range(1, N + 1)]


def test_the_doctor_finds_a_damaged_callout_and_splits_the_calls(client):
    q = queue_with(client, 2 * N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    assert doctor.examine(q) == []
    # when the group's callout is damaged
    gk = q.keys.group("g")
    client.redis.hset(gk.state, "callout", 3)
    found = doctor.examine(q)
    assert [f.kind for f in found] == [doctor.Kind.CALL_DAMAGED]
    # then the repair splits every call out, and the deliveries ack as before
    doctor.repair(q, found)
    assert calls(q) == {} and set(states(q)) == set(range(1, N + 1)) and in_flight(q) == N
    assert doctor.examine(q) == []
    c.ack(got)
    assert in_flight(q) == 0 and q.stats().groups[0].ack_floor == N


def test_a_deleted_calls_key_is_found_and_its_seqs_reported_not_handed_out_twice(client, clock):
    q = queue_with(client, 2 * N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    gk = q.keys.group("g")
    client.redis.delete(gk.calls)
    # then its acks name no delivery, and nothing is handed out again as new
    with pytest.raises(UnknownDeliveryTag):
        got[0].ack()
    assert [d.seq for d in c.fetch(N)] == list(range(N + 1, 2 * N + 1))
    # and the doctor reports the damage, and once repaired each seq the call held as lost
    found = doctor.examine(q)
    assert doctor.Kind.CALL_DAMAGED in {f.kind for f in found}
    doctor.repair(q, found)
    lost = {f.seq for f in doctor.examine(q) if f.kind is doctor.Kind.UNTRACKED}
    assert lost == set(range(1, N + 1))


def test_a_call_whose_record_was_deleted_is_reported_as_corrupt_when_its_time_runs_out(client, clock):
    # given a call out to a consumer, whose record is then deleted
    q = queue_with(client, 2 * N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    c.fetch(N)
    client.redis.delete(q.keys.group("g").calls)
    assert [e for e in q.events() if e["event"] == "corrupt"] == []
    # when its time runs out and a fetch sweeps it
    clock.advance(WAIT + 1)
    second = c.fetch(N)
    assert [d.seq for d in second] == list(range(N + 1, 2 * N + 1))
    c.ack(second)
    # then its seqs go to no one again, and the damage is an event naming the call and its first seq
    (event,) = [e for e in q.events() if e["event"] == "corrupt"]
    assert event["group"] == "g" and event["seq"] == "1"
    assert "without its record" in event["reason"] and "untracked" in event["reason"]
    assert c.fetch(N) == []
    # and the call's deadline and first seq are gone with it: no later fetch reports it again
    clock.advance(WAIT + 1)
    assert c.fetch(N) == []
    assert len([e for e in q.events() if e["event"] == "corrupt"]) == 1
    # and the doctor lists them, with the group's count of seqs out on calls, which still counts them
    found = doctor.examine(q)
    assert {f.seq for f in found if f.kind is doctor.Kind.UNTRACKED} == set(range(1, N + 1))
    assert doctor.Kind.CALL_DAMAGED in {f.kind for f in found} and callout(q) == N
    # and its repair sets the count right, and leaves the seqs listed, not handed out
    doctor.repair(q, found)
    assert callout(q) == 0
    assert {f.seq for f in doctor.examine(q) if f.kind is doctor.Kind.UNTRACKED} == set(range(1, N + 1))
    assert c.fetch(N) == []


def test_a_garbled_call_record_is_found_and_repaired(client):
    q = queue_with(client, 2 * N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    gk = q.keys.group("g")
    client.redis.hset(gk.calls, got[0].token, "garbage")
    found = doctor.examine(q)
    assert doctor.Kind.CALL_DAMAGED in {f.kind for f in found}
    doctor.repair(q, found)
    assert client.redis.exists(gk.calls, gk.call_deadlines, gk.call_seqs) == 0 and callout(q) == 0


def test_the_hash_layout_writes_no_call_record(backend, prefix, clock):
    c = connect(backend, prefix, clock, "hash")
    try:
        q = queue_with(c, N)
        cons = q.consumer("g", "c1", ack_wait=WAIT)
        got = cons.fetch(N)
        gk = q.keys.group("g")
        assert gk.call_keys == () and c.redis.exists(gk.calls) == 0
        assert c.redis.hget(gk.state, "callout") is None and set(states(q)) == set(range(1, N + 1))
        cons.ack(got)
    finally:
        c.close()


# Names only the call-record code uses (includes/call_state.lua, call_ack.lua, group_keys.lua's call
# keys, fetch.lua's scan): none is in a script's hash-layout text, whose code stands in --@layout
# stream blocks (docs/layout-d-plan.md, "Step 4, call records").
CALL_WORDS = ("callsKey", "callExpKey", "callSeqKey", "callPaths", "CALL_MIN", "CALL_MAX", "callout", "splitCall")


# The scripts whose stream-layout text handles calls.
CALL_SCRIPTS = (
    "fetch",
    "ack",
    "ack_result",
    "extend",
    "heartbeat",
    "nack",
    "reject",
    "replay",
    "set_aside",
    "settle_to",
)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_no_script_holds_call_record_code_in_its_hash_layout_text(name):
    hash_text = source(name, layout="hash")
    assert [word for word in CALL_WORDS if word in hash_text] == []
    if name in CALL_SCRIPTS:
        assert "callsKey" in source(name, layout="stream")
