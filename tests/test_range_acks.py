"""Range acks (docs/layout-d-plan.md, step 5;
rqueue/engine/lua/includes/ack_ranges.lua): the count-1 deliveries of one
call record go in an ack as one range, settled against the record in one
pass; whatever of a range is not out on its call falls back per seq, so
every delivery keeps its own status. The fetch reply names its call in a
field of its own, which the consumer keeps as a hint (CallSpans). Every
backend runs the same scripts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from support import logview
from support.aio_bridge import connect_as
from test_call_records import WAIT, N, callout, calls, connect, held_by, in_flight, queue_with, states

import rqueue
import rqueue.aio
from rqueue.engine import async_commands as acmd
from rqueue.engine import commands
from rqueue.engine.commands import CLAIM_MIN
from rqueue.engine.keys import LAYOUT_ENV
from rqueue.errors import AlreadyAcked, InvalidInput, NotHeld


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

    def spy(tags: Any, spans: Any) -> Any:
        args, slots = real(tags, spans)
        seen.append(list(args))
        return args, slots

    monkeypatch.setattr(commands, "pack_acks", spy)
    return seen


def ranges_in(args: list[Any]) -> list[tuple[int, str]]:
    return [(args[i], args[i + 1]) for i in range(0, len(args), 3) if str(args[i + 1]).startswith("r")]


def test_pack_acks_makes_runs_and_leaves_others_as_triples():
    spans = commands.CallSpans()
    spans.note("tok", (10, 40))
    tags = [(f"{s}.1.tok", s, 1, "tok") for s in (12, 10, 11, 15, 16, 30)]
    tags += [("50.1.tok", 50, 1, "tok"), ("13.2.tok", 13, 2, "tok"), ("20.1.oth", 20, 1, "oth")]
    args, slots = commands.pack_acks(tags, spans)
    assert args[:3] == [10, "r3,2,2,13,1", "tok"]
    assert args[3:] == [50, 1, "tok", 13, 2, "tok", 20, 1, "oth"]
    assert slots == [[1, 2, 0, 3, 4, 5], [6], [7], [8]]
    reply = [[b"ok", b"ok", b"RQ_ACKED", b"ok", b"ok", b"ok"], b"ok", b"RQ_UNKNOWN_TAG", b"ok"]
    assert commands.unpack_statuses(reply, slots, len(tags)) == [
        "RQ_ACKED", "ok", "ok", "ok", "ok", "ok", "ok", "RQ_UNKNOWN_TAG", "ok",
    ]  # fmt: skip
    # no call known (a hash log's consumer), or one tag: triples
    assert commands.pack_acks(tags, commands.CallSpans()) == (commands.flat_tags(tags), None)
    assert commands.pack_acks(tags[:1], spans) == (commands.flat_tags(tags[:1]), None)
    # a seq listed twice goes once in the range, its repeat as a triple
    args, slots = commands.pack_acks(tags[:2] + tags[:1], spans)
    assert args == [10, "r1,1,1", "tok", 12, 1, "tok"] and slots == [[1, 0], [2]]


@pytest.mark.parametrize(
    "seqs, counts, tokens, shortcut",
    [
        (range(10, 41), None, None, True),  # a whole call in order: the one run
        (range(12, 20), None, None, True),  # part of a call
        ([10, 11, 13, 14], None, None, False),  # a gap
        ([11, 10, 12], None, None, False),  # out of order
        ([10, 11, 11, 12], None, None, False),  # a seq twice
        ([10, 12, 12, 13], None, None, False),  # as many seqs as the span from the first, one twice
        (range(38, 43), None, None, False),  # past the call's last seq
        (range(8, 12), None, None, False),  # before its first
        (range(10, 14), [1, 2, 1, 1], None, False),  # a redelivery among them
        (range(10, 14), None, ["tok", "tok", "oth", "tok"], False),  # another call's tag among them
        (range(20, 24), None, ["oth"] * 4, False),  # a call not known
    ],
)
def test_pack_acks_one_run_shortcut_packs_as_the_general_way(seqs, counts, tokens, shortcut, monkeypatch):
    # given a call's span and tags that are, or nearly are, one run of it
    spans = commands.CallSpans()
    spans.note("tok", (10, 40))
    seqs = list(seqs)
    counts = counts or [1] * len(seqs)
    tokens = tokens or ["tok"] * len(seqs)
    tags = [(f"{s}.{c}.{t}", s, c, t) for s, c, t in zip(seqs, counts, tokens, strict=True)]
    # when they are packed with the shortcut and without it
    taken = commands._one_run(tags, spans) is not None
    packed = commands.pack_acks(tags, spans)
    monkeypatch.setattr(commands, "_one_run", lambda tags, spans: None)
    general = commands.pack_acks(tags, spans)
    # then the shortcut is taken for one run of a call alone, and packs as the general way does
    assert taken is shortcut and packed == general


def test_pack_acks_takes_a_whole_run_as_one_range():
    spans = commands.CallSpans()
    spans.note("tok", (10, 40))
    tags = [(f"{s}.1.tok", s, 1, "tok") for s in range(10, 41)]
    assert commands.pack_acks(tags, spans) == ([10, "r31", "tok"], [list(range(31))])


def test_unpack_statuses_of_triples_reads_each_status_all_ok_or_not():
    assert commands.unpack_statuses([b"ok", b"ok"], None, 2) == ["ok", "ok"]
    assert commands.unpack_statuses([b"ok", b"RQ_ACKED", b"ok"], None, 3) == ["ok", "RQ_ACKED", "ok"]
    assert commands.unpack_statuses([], None, 0) == []


def test_pack_acks_orders_the_ranges_by_their_first_tag_that_fits_whatever_the_tokens_mix():
    # given two calls' tags mixed, the first of "tok" not fitting a range (a redelivery)
    spans = commands.CallSpans()
    spans.note("tok", (10, 40))
    spans.note("oth", (20, 30))
    tags = [("5.2.tok", 5, 2, "tok"), ("20.1.oth", 20, 1, "oth"), ("11.1.tok", 11, 1, "tok")]
    tags += [("21.1.oth", 21, 1, "oth"), ("12.1.tok", 12, 1, "tok"), ("99.1.new", 99, 1, "new")]
    # when they are packed
    args, slots = commands.pack_acks(tags, spans)
    # then "oth"'s range goes first (its tag fitted first), then "tok"'s, then the triples in order
    assert args == [20, "r2", "oth", 11, "r2", "tok", 5, 2, "tok", 99, 1, "new"]
    assert slots == [[1, 3], [2, 4], [0], [5]]


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
    call2.spans.note(got[0].token, (1, N))
    tags = [(d.tag, d.seq, d.delivery_count, d.token) for d in got]
    assert ranges_in(commands.pack_acks(tags, call2.spans)[0]) == [(1, f"r{N}")]
    assert commands.ack(call2, tags, strict=False) == ["RQ_NOT_HELD"] * N
    with pytest.raises(NotHeld):
        commands.ack(call2, tags, strict=True)
    # the script's strict refusal of the range itself
    with pytest.raises(Exception, match="RQ_NOT_HELD"):
        call2.scripts.ack(call2.ack_keys, ["g", c2.name, "1", 1, f"r{N}", got[0].token])
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
    # (a range ends with a run; one comma between two numbers; runs and gaps of 1 or more)
    for spec in ("r5,3", "r5,,3", "r5,", "r3,0,2", "r", "r-1", "r1" + ",1" * 5000):
        with pytest.raises(Exception, match="RQ_BAD_ARGUMENT"):
            call.scripts.ack(call.ack_keys, ["g", c.name, "0", 1, spec, more[0].token])
    # (the client's error: InvalidInput)
    with pytest.raises(InvalidInput, match="a range is"):
        commands.run(call.scripts.ack, call.ack_keys, ["g", c.name, "0", 1, "r5,3", more[0].token], q.name, "")
    assert set(states(q)) == {d.seq for d in more}


def test_the_fetch_reply_names_its_call_in_a_field_of_its_own(client):
    q = queue_with(client, N + 3)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    call = c._group_call()
    # when a fetch takes a call, then the seventh field names its seqs and next_due_ms stays ""
    reply = commands.fetch(call, N, "tcall")
    assert reply.raw[1] == b"" and reply.raw[6] == b"1:%d" % N
    assert (reply.call, reply.first, reply.next_due_ms) == ((1, N), 7, None)
    assert [seq for seq, _, _ in reply.deliveries()] == list(range(1, N + 1))
    assert call.spans.get("tcall") == (1, N)
    # when a fetch takes fewer than a call's least (per message), then the field is ""
    small = commands.fetch(call, 3, "tsmall")
    assert small.raw[6] == b"" and small.call is None and call.spans.get("tsmall") is None
    assert [seq for seq, _, _ in small.deliveries()] == [N + 1, N + 2, N + 3]
    # and the acks sent with a fetch reply after it: one status for the range, one per triple
    tags = [(f"{s}.1.tcall", s, 1, "tcall") for s in range(1, N + 1)] + [(f"{N + 1}.1.tsmall", N + 1, 1, "tsmall")]
    idle = commands.fetch(call, 5, "tidle", tags)
    assert idle.raw[6] == b"" and idle.raw[7:] == [b"ok", b"ok"] and idle.first == 9
    assert idle.ack_statuses == ["ok"] * (N + 1) and idle.call is None
    assert calls(q) == {} and set(states(q)) == {N + 2, N + 3}


def test_a_paused_groups_fetch_has_the_call_field_empty(client):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    q.pause("g")
    call = c._group_call()
    # the paused group's fetch acks the range it is sent and hands out nothing
    tags = [(d.tag, d.seq, d.delivery_count, d.token) for d in got]
    reply = commands.fetch(call, N, "tpaused", tags)
    assert reply.raw[6] == b"" and reply.raw[7:] == [b"ok"] and reply.first == 8
    assert reply.ack_statuses == ["ok"] * N and reply.call is None
    assert calls(q) == {} and q.stats().groups[0].ack_floor == N


def test_a_hash_log_fetch_has_no_call_field_and_its_acks_go_as_triples(backend, prefix, clock, sent):
    client = connect(backend, prefix, clock, "hash")
    try:
        q = queue_with(client, 2 * N)
        c = q.consumer("g", "c1", ack_wait=WAIT)
        call = c._group_call()
        reply = commands.fetch(call, N, "thash")
        assert reply.call is None and reply.first == 6 and reply.raw[6] == 1 and not call.spans
        got = c.fetch(N)
        c.ack(got)
        assert ranges_in(sent[-1]) == [] and len(sent[-1]) == 3 * N
        assert q.stats().groups[0].in_flight == N
    finally:
        client.close()


def test_each_consumer_keeps_its_own_calls_and_forgets_them_when_it_leaves(client, sent):
    q = queue_with(client, 2 * N)
    c1 = q.consumer("g", "c1", ack_wait=WAIT)
    c2 = q.consumer("g", "c2", ack_wait=WAIT)
    got1, got2 = c1.fetch(N), c2.fetch(N)
    spans1, spans2 = c1._group_call().spans, c2._group_call().spans
    assert spans1.get(got1[0].token) == (1, N) and spans1.get(got2[0].token) is None
    assert spans2.get(got2[0].token) == (N + 1, 2 * N) and spans2.get(got1[0].token) is None
    # c2's view of its calls is carried to the view it makes for new settings (settings_ttl=0)
    assert c2._group_call() is not c2._group_call() and c2._group_call().spans.get(got2[0].token) == (N + 1, 2 * N)
    c1.ack(got1)
    assert ranges_in(sent[-1]) == [(1, f"r{N}")]
    # when c2 leaves, then its calls are forgotten (what it held is offered again)
    c2.close()
    assert not spans2 and spans1
    assert calls(q) == {} and q.stats().groups[0].in_flight == 0


def test_a_loss_of_state_forgets_the_calls_made_before_it_and_keeps_the_one_after(client, sent):
    q = queue_with(client, 3 * N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    old = c.fetch(N)
    spans = c._group_call().spans
    assert spans.get(old[0].token) == (1, N)
    # when Redis comes back as it was after seq N (the last seq goes back), and more is published
    r = client.redis
    r.hset(q.keys.meta, "seq", N)
    logview.roll_back(r, q.keys, N)
    q.publish_many([b"n%d" % i for i in range(N)])
    # then the fetch that shows the loss drops the old call's hint and keeps its own call's
    new = c.fetch(N)
    assert c.last_state_loss is not None and [d.seq for d in new] == list(range(N + 1, 2 * N + 1))
    assert spans.get(old[0].token) is None and spans.get(new[0].token) == (N + 1, 2 * N)
    c.ack(new)
    assert ranges_in(sent[-1]) == [(N + 1, f"r{N}")]
    assert set(calls(q)) == {d.seq for d in old}


def test_ack_result_takes_no_range_and_an_ack_with_completed_events_sends_triples(client, sent):
    client.configure("orders", events=["completed"])
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    got = c.fetch(N)
    call = c._group_call()
    before = calls(q)
    # a range sent to ack_result is refused before any write (its results and events go per tag)
    args = commands.ack_results_args([(got[0].tag, 1, 1, got[0].token)], None, [], True, False)
    args[3:] = [1, f"r{N}", got[0].token]
    with pytest.raises(InvalidInput, match="not ranges"):
        commands.run(call.scripts.ack_result, commands.ack_results_keys(call, []), call.argv(args), q.name, "")
    assert calls(q) == before and not [e for e in q.events(100) if e["event"] == "completed"]
    # and a consumer's ack with completed events on goes as triples, one event per message
    c.ack(got)
    assert not any(ranges_in(a) for a in sent)  # (ack_result.lua: triples)
    completed = [e for e in q.events(100) if e["event"] == "completed"]
    assert sorted(int(e["seq"]) for e in completed) == list(range(1, N + 1))
    assert calls(q) == {} and q.stats().groups[0].ack_floor == N


def test_call_spans_keep_two_generations_of_calls():
    spans = commands.CallSpans()
    assert not spans
    for i in range(commands.CallSpans.MAX):
        spans.note(f"t{i}", (i + 1, i + 1))
    spans.note("tnext", (1, 2))  # the newer is full: it becomes the older
    assert spans.get("t0") == (1, 1) and spans.get("tnext") == (1, 2)
    for i in range(commands.CallSpans.MAX):
        spans.note(f"u{i}", (i + 1, i + 1))  # and again: the first generation goes whole
    assert spans.get("t0") is None and spans.get("tnext") == (1, 2) and spans.get("u0") == (1, 1)
    # a view carrying them shares them, and a clear of either is the other's
    other = commands.CallSpans()
    other.carry(spans)
    assert other.get("tnext") == (1, 2)
    other.clear()
    assert not spans and spans.get("tnext") is None


def test_an_asyncio_consumer_acks_its_calls_as_ranges(backend, prefix, clock, sent):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_ENV, "stream")
        seed = rqueue.Randomness(seed=7)
        client = connect_as("async", backend, prefix=prefix, clock=clock, randomness=seed, settings_ttl=0)
    try:
        q = queue_with(client, 3 * N)
        c = q.consumer("g", "c1", ack_wait=WAIT)
        got = c.fetch(N)
        c.ack(got)
        assert ranges_in(sent[-1]) == [(1, f"r{N}")] and len(sent[-1]) == 3
        more = c.fetch(N)
        statuses, last, _ = c.ack_and_fetch(more, N)
        assert statuses == [None] * N and ranges_in(sent[-1]) == [(N + 1, f"r{N}")]
        assert [d.seq for d in last] == list(range(2 * N + 1, 3 * N + 1))
        g = q.stats().groups[0]
        assert (g.ack_floor, g.in_flight) == (2 * N, N)
    finally:
        client.close()


def test_tags_beside_a_range_are_told_apart_from_its_spans(client):
    q = queue_with(client, N)
    c = q.consumer("g", "c1", ack_wait=WAIT)
    token = c.fetch(N)[0].token
    call = c._group_call()
    # a range of seqs 1-3, 6-7, 10 and 15-20, then triples of its ends, of seqs in its gaps and one beyond
    triples = [1, 3, 6, 7, 10, 15, 20, 4, 5, 14]
    args = [1, "r3,2,2,2,1,4,6", token, *(x for seq in triples for x in (seq, 1, token))]
    reply = call.scripts.ack(call.ack_keys, ["g", c.name, "0", *args])
    # then the range is ok, its seqs listed again acked already, the seqs of its gaps ok
    assert reply == [b"ok"] + [b"RQ_ACKED"] * 7 + [b"ok"] * 3
    assert set(calls(q)) == {8, 9, 11, 12, 13} and callout(q) == 5 and held_by(q) == {c.name: 5}


# -- the ack of a fetch's whole claim ------------------------------------------------------

BIG = CLAIM_MIN + 8  # a fetch of this many first deliveries is one claim


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bool]]:
    """(first seq, count, acked) of every ack_run, sync and asyncio."""
    seen: list[tuple[int, int, bool]] = []
    sync_run, async_run = commands.ack_run, acmd.ack_run

    def spy(call: Any, lo: int, n: int, token: str) -> bool:
        done = sync_run(call, lo, n, token)
        seen.append((lo, n, done))
        return done

    async def aspy(call: Any, lo: int, n: int, token: str) -> bool:
        done = await async_run(call, lo, n, token)
        seen.append((lo, n, done))
        return done

    monkeypatch.setattr(commands, "ack_run", spy)
    monkeypatch.setattr(acmd, "ack_run", aspy)
    return seen


def test_the_ack_of_a_fetchs_whole_claim_goes_as_one_range_with_no_tag_packed(client, sent, runs):
    # given a consumer that fetched one claim's whole run
    q = queue_with(client, 2 * BIG)
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    got = c.fetch(BIG)
    packed_before = len(sent)
    # when it acks the list the fetch returned
    c.ack(got)
    # then one range went, without a tag packed per delivery, and all of it settled
    assert runs == [(1, BIG, True)] and len(sent) == packed_before
    assert calls(q) == {} and in_flight(q) == 0 and held_by(q) == {c.name: 0} and c._held == {}
    assert q.stats().groups[0].ack_floor == BIG
    # and acking the same list again is refused as already acked, naming its first delivery
    with pytest.raises(AlreadyAcked, match=got[0].tag):
        c.ack(got)
    assert runs == [(1, BIG, True)]


def test_a_changed_list_of_a_claim_is_acked_delivery_by_delivery(client, runs):
    # given a consumer that fetched one claim, and took one delivery out of the list
    q = queue_with(client, BIG)
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    got = c.fetch(BIG)
    kept = got.pop(5)
    # when it acks the list, then only what is in it settles, by the general path
    c.ack(got)
    assert runs == [] and in_flight(q) == 1 and set(calls(q)) == {kept.seq} and list(c._held) == [kept.seq]
    # and the one left out is acked on its own
    c.ack([kept])
    assert q.stats().groups[0].ack_floor == BIG and c._held == {}


def test_a_refused_whole_claim_changes_nothing_and_names_the_first_bad_delivery(client, runs):
    # given a consumer that fetched one claim and acked two of its deliveries on their own
    q = queue_with(client, BIG)
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    got = c.fetch(BIG)
    c.ack(got[7])
    c.ack(got[3])
    # when it acks the whole list (the claim is forgotten by the acks between: no range is tried)
    with pytest.raises(AlreadyAcked, match=got[3].tag):
        c.ack(got)
    # then nothing else was acked
    assert runs == [] and in_flight(q) == BIG - 2 and len(c._held) == BIG - 2


def test_a_whole_claim_refused_as_a_range_goes_again_as_triples(client, runs, monkeypatch):
    # given a consumer that fetched one claim, one delivery of which another call acked
    q = queue_with(client, BIG)
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    got = c.fetch(BIG)
    call = c._group_call()
    call.scripts.ack(call.ack_keys, ["g", c.name, "1", got[4].seq, 1, got[4].token])
    # when it acks the list the fetch returned, unchanged
    with pytest.raises(AlreadyAcked, match=got[4].tag):
        c.ack(got)
    # then the range was tried and refused, and the triples named the delivery acked before
    assert runs == [(1, BIG, False)]
    assert in_flight(q) == BIG - 1 and q.stats().groups[0].ack_floor == 0
    # and the others, acked as a list, settle
    c.ack(got[:4] + got[5:])
    assert in_flight(q) == 0 and q.stats().groups[0].ack_floor == BIG


def test_a_whole_claim_from_before_a_loss_is_not_acked(client, runs):
    # given a consumer that fetched one claim, then saw Redis lose the queue's state
    q = queue_with(client, BIG)
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    got = c.fetch(BIG)
    client.redis.hset(q.keys.meta, "inc", "another-incarnation")
    c.fetch(1)
    # when it acks the claim's list, then nothing is sent: its deliveries are from before the loss
    with pytest.raises(rqueue.LostDelivery):
        c.ack(got)
    assert runs == []


def test_an_asyncio_consumer_acks_a_whole_claim_as_one_range(backend, prefix, clock, runs, monkeypatch):
    monkeypatch.setenv(LAYOUT_ENV, "stream")

    async def main() -> tuple[int, int]:
        client = await rqueue.aio.connect(backend, prefix=prefix, clock=clock, settings_ttl=0)
        try:
            q = client.queue("orders")
            await q.publish_many([b"m%d" % i for i in range(1, BIG + 1)])
            async with q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000) as c:
                got = await c.fetch(BIG)
                await c.ack(got)
                g = (await q.stats()).groups[0]
                return g.ack_floor, g.in_flight
        finally:
            await client.close()

    assert asyncio.run(main()) == (BIG, 0)
    assert runs == [(1, BIG, True)]
