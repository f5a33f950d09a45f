"""Range acks (a prototype of docs/layout-d-plan.md step 5;
rqueue/engine/lua/includes/ack_ranges.lua): the count-1 deliveries of one
call record go in an ack as one range, settled against the record in one
pass; whatever of a range is not out on its call falls back per seq, so
every delivery keeps its own status. Every backend runs the same scripts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_call_records import WAIT, N, callout, calls, connect, held_by, in_flight, queue_with, states

from rqueue.engine import commands
from rqueue.errors import AlreadyAcked, NotHeld


@pytest.fixture
def client(backend: str, prefix: str, clock: Any) -> Iterator[Any]:
    c = connect(backend, prefix, clock, "stream")
    yield c
    c.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The packed ARGV of every ack and fetch's acks (pack_acks)."""
    seen: list[list[Any]] = []
    real = commands.pack_acks

    def spy(tags: Any, scope: Any) -> Any:
        args, slots = real(tags, scope)
        seen.append(list(args))
        return args, slots

    monkeypatch.setattr(commands, "pack_acks", spy)
    return seen


def ranges_in(args: list[Any]) -> list[tuple[int, str]]:
    return [(args[i], args[i + 1]) for i in range(0, len(args), 3) if str(args[i + 1]).startswith("r")]


def test_pack_acks_makes_runs_and_leaves_others_as_triples():
    scope = ("calls", "c")
    commands.CALL_SPANS[("calls", "c", "tok")] = (10, 40)
    try:
        tags = [(f"{s}.1.tok", s, 1, "tok") for s in (12, 10, 11, 15, 16, 30)]
        tags += [("50.1.tok", 50, 1, "tok"), ("13.2.tok", 13, 2, "tok"), ("20.1.oth", 20, 1, "oth")]
        args, slots = commands.pack_acks(tags, scope)
        assert args[:3] == [10, "r3,2,2,13,1", "tok"]
        assert args[3:] == [50, 1, "tok", 13, 2, "tok", 20, 1, "oth"]
        assert slots == [[1, 2, 0, 3, 4, 5], [6], [7], [8]]
        reply = [[b"ok", b"ok", b"RQ_ACKED", b"ok", b"ok", b"ok"], b"ok", b"RQ_UNKNOWN_TAG", b"ok"]
        assert commands.unpack_statuses(reply, slots, len(tags)) == [
            "RQ_ACKED", "ok", "ok", "ok", "ok", "ok", "ok", "RQ_UNKNOWN_TAG", "ok",
        ]  # fmt: skip
        # no scope (a hash log), or one tag: triples
        assert commands.pack_acks(tags, None) == (commands.flat_tags(tags), None)
        assert commands.pack_acks(tags[:1], scope) == (commands.flat_tags(tags[:1]), None)
    finally:
        del commands.CALL_SPANS[("calls", "c", "tok")]


def test_a_whole_call_is_acked_as_one_range(client, sent):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    c.ack(got)
    assert ranges_in(sent[-1]) == [(1, f"r{N}")] and len(sent[-1]) == 3
    assert calls(q) == {} and in_flight(q) == 0 and held_by(q) == {c.name: 0}
    assert q.stats().groups[0].ack_floor == N


def test_partial_ranges_settle_their_seqs_and_leave_the_rest_on_the_call(client, sent):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    # when a range with gaps is acked (lenient), then exactly those leave the call
    part = got[2:7] + got[10:12] + got[15:16]
    assert c.ack_available(part[::-1]) == [None] * len(part)
    assert ranges_in(sent[-1]) == [(3, "r5,3,2,3,1")]
    left = set(range(1, N + 1)) - {d.seq for d in part}
    assert set(calls(q)) == left and callout(q) == len(left) and held_by(q) == {c.name: len(left)}
    assert q.stats().groups[0].ack_floor == 0 and states(q) == {}
    # when the rest goes, with some acked ones again: those are refused as acked, the rest settle
    statuses = c.ack_available(got)
    assert [type(e) if e else None for e in statuses] == [
        AlreadyAcked if d in part else None for d in got
    ]  # fmt: skip
    assert calls(q) == {} and callout(q) == 0 and in_flight(q) == 0
    assert q.stats().groups[0].ack_floor == N


def test_a_range_with_a_seq_split_out_settles_it_by_its_state(client, clock, sent):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    # when some are extended (split out, with states and leases of their own)
    c.in_progress(got[4:6])
    assert set(states(q)) == {5, 6}
    # then a range over the call and the split seqs settles all of them
    c.ack(got)
    assert ranges_in(sent[-1]) == [(1, f"r{N}")]
    assert calls(q) == {} and states(q) == {} and in_flight(q) == 0 and held_by(q) == {c.name: 0}
    assert q.stats().groups[0].ack_floor == N


def test_a_range_with_a_nacked_seq_gives_that_seq_its_own_status(client, sent):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    got[3].nack(delay=0)  # split, then waiting for its redelivery
    statuses = c.ack_available([d.tag for d in got])  # by their texts: the nacked one is sent too
    assert ranges_in(sent[-1]) == [(1, f"r{N}")]
    assert [i for i, e in enumerate(statuses) if e is not None] == [3]
    assert calls(q) == {} and set(states(q)) == {4} and in_flight(q) == 0
    again = c.fetch(1)
    assert [(d.seq, d.delivery_count) for d in again] == [(4, 2)]


def test_another_consumers_range_is_refused_and_changes_nothing(client):
    q = queue_with(client, N)
    c1 = q.consumer("g", "c1", ack_wait=WAIT)
    c2 = q.consumer("g", "c2", ack_wait=WAIT)
    got = c1.fetch(N)
    before = calls(q)
    # c2 told the call is its own (its hint), so that it sends c1's deliveries as a range
    call2 = c2._group_call()
    scope = commands.span_scope(call2)
    assert scope is not None
    commands.CALL_SPANS[(*scope, got[0].token)] = (1, N)
    try:
        tags = [(d.tag, d.seq, d.delivery_count, d.token) for d in got]
        assert ranges_in(commands.pack_acks(tags, scope)[0]) == [(1, f"r{N}")]
        assert commands.ack(call2, tags, strict=False) == ["RQ_NOT_HELD"] * N
        with pytest.raises(NotHeld):
            commands.ack(call2, tags, strict=True)
        # the script's strict refusal of the range itself
        with pytest.raises(Exception, match="RQ_NOT_HELD"):
            call2.scripts.ack(call2.ack_keys, ["g", c2.name, "1", 1, f"r{N}", got[0].token])
    finally:
        del commands.CALL_SPANS[(*scope, got[0].token)]
    assert calls(q) == before and callout(q) == N and states(q) == {} and held_by(q) == {c1.name: N, c2.name: 0}


def test_a_strict_ack_with_a_range_and_a_bad_tag_changes_nothing(client, sent):
    q = queue_with(client, N + 1)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    c.ack(got[:1])
    before = calls(q)
    # when a strict ack sends a range and a tag already acked, then it is refused
    with pytest.raises(AlreadyAcked):
        c.ack([d.tag for d in got])
    assert ranges_in(sent[-1]) == [(1, f"r{N}")]
    # (the engine sends a refused packed ack again as triples; the script's own refusal:)
    call = c._group_call()
    with pytest.raises(Exception, match="RQ_ACKED 1.1."):
        call.scripts.ack(call.ack_keys, ["g", c.name, "1", 1, f"r{N}", got[0].token])
    assert calls(q) == before and callout(q) == N - 1 and held_by(q) == {c.name: N - 1}
    assert q.stats().groups[0].ack_floor == 1
    # and the rest acked strictly then settle
    c.ack(got[1:])
    assert calls(q) == {} and in_flight(q) == 0 and q.stats().groups[0].ack_floor == N


def test_a_delivery_listed_twice_is_acked_once(client, sent):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    statuses = c.ack_available([d.tag for d in got] + [got[2].tag])
    assert [type(e) if e else None for e in statuses] == [None] * N + [AlreadyAcked]
    assert calls(q) == {} and in_flight(q) == 0 and held_by(q) == {c.name: 0}


def test_acks_sent_with_the_next_fetch_go_as_a_range(client, sent):
    q = queue_with(client, 2 * N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    statuses, more, _ = c.ack_and_fetch(got, N)
    assert statuses == [None] * N and ranges_in(sent[-1]) == [(1, f"r{N}")]
    assert [d.seq for d in more] == list(range(N + 1, 2 * N + 1))
    assert set(calls(q)) == {d.seq for d in more} and q.stats().groups[0].ack_floor == N


def test_a_range_reaching_past_its_call_falls_back_for_the_rest(client):
    q = queue_with(client, N + 3)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    more = c.fetch(3)  # per message (below CALL_MIN), with their own token
    call = c._group_call()
    # a range of N + 3 seqs from 1 under the call's token: the 3 past it fall back
    # (another token's deliveries: unknown), the call's settle
    reply = call.scripts.ack(call.ack_keys, ["g", c.name, "0", 1, f"r{N + 3}", got[0].token])
    assert reply[0] == [b"ok"] * N + [b"RQ_UNKNOWN_TAG"] * 3
    assert calls(q) == {} and set(states(q)) == {d.seq for d in more}
    # and a range that does not parse is refused before any write
    with pytest.raises(Exception, match="RQ_BAD_ARGUMENT"):
        call.scripts.ack(call.ack_keys, ["g", c.name, "0", 1, "r0", more[0].token])
    with pytest.raises(Exception, match="RQ_BAD_ARGUMENT"):  # wider than any call: bounded work
        call.scripts.ack(call.ack_keys, ["g", c.name, "0", 1, "r1,5000,1", more[0].token])
    assert set(states(q)) == {d.seq for d in more}


def test_an_ack_of_call_deliveries_then_split_ones_moves_the_floor_only_over_them(client, monkeypatch):
    # (step 4's ackTags handed settleMany its state fields, which miss the
    # call's seqs: the floor was written as the field of another seq)
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    c.in_progress(got[9:11])  # seqs 10 and 11 split out
    assert set(states(q)) == {10, 11}
    monkeypatch.setattr(commands, "CALL_SPANS", {})  # as triples
    c.ack([got[0], got[1], got[9], got[10]])
    assert q.stats().groups[0].ack_floor == 2
    assert [d.seq for d in q.consumer("g", "c2", ack_wait=WAIT).fetch(N)] == []
    c.ack(got[2:9] + got[11:])
    assert q.stats().groups[0].ack_floor == N and in_flight(q) == 0
