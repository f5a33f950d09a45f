"""The bare publish call (lua/publish.lua): a call whose messages are all
plain payloads (no id, delay, headers, priority or key) sends "" and the
bodies alone, one argument a message, and is answered with the range of
seqs its messages took. Every backend and both log layouts, through the
client and through the script itself."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from support import logview
from support.logview import connect

import rqueue
from rqueue import QueuePaused
from rqueue.engine import commands
from rqueue.engine.keys import LogLayout, QueueKeys
from rqueue.engine.record import decode_record
from rqueue.results import PublishResult


@pytest.fixture(params=["hash", "stream"])
def client(request: pytest.FixtureRequest, backend: str, prefix: str, clock: rqueue.ManualClock) -> Iterator[Any]:
    c = connect(backend, prefix, clock, request.param)
    yield c
    c.close()


def call_args(call: commands.PublishCall) -> list[Any]:
    return call.args[5:]


def payloads(c: Any, q: Any) -> dict[int, bytes]:
    """Every stored record's payload by seq (either layout)."""
    return {seq: decode_record(rec, str(seq))[2] for seq, rec in logview.records(c.redis, q.keys).items()}


# -- the calls the client sends ----------------------------------------------


def test_plain_payloads_go_as_one_bare_call_and_an_id_or_a_timing_as_triples() -> None:
    # given the keys of a stream queue
    keys = QueueKeys("p:{q}", LogLayout.STREAM)

    def calls(messages: list[commands.PublishMessage], batch: int = 100) -> list[commands.PublishCall]:
        return commands.publish_calls(keys, "", 60_000, False, messages, batch, "inc")

    # when plain payloads are sent, then one bare call carries "" and the bodies
    (bare,) = calls([(None, 0, b"a"), (None, 0, b"b")])
    assert call_args(bare) == ["", b"a", b"b"]
    assert bare.keys == keys.publish_keys()
    # when one message has an id, a delay, headers or a priority, then the call is of triples
    for odd in [("id-1", 0, b"b"), (None, 500, b"b"), (None, "0:2", b"{}b"), (None, "0:0:3", b"b")]:
        (triples,) = calls([(None, 0, b"a"), odd])
        assert call_args(triples)[:3] == [0, 0, b"a"], odd
        assert len(call_args(triples)) == 6, odd
    # when a batch is split, then each call is judged alone
    first, second = calls([(None, 0, b"a"), (None, 0, b"b"), ("id-1", 0, b"c")], batch=2)
    assert call_args(first) == ["", b"a", b"b"]
    assert call_args(second) == [len(keys.publish_keys()) + 1, 0, b"c"]


def test_the_replies_of_bare_calls_are_read_as_their_seqs() -> None:
    # given a bare call's reply and a call of triples' reply (seq 9 a duplicate of seq 4)
    bare = [b"inc", b"range", 5, 7]
    triples = [b"inc", 8, 0, 4, 1]
    # when they are read, then the bare one's messages took seqs 5 to 7, none a duplicate
    assert commands.publish_results([bare, triples], partition=2) == [
        PublishResult(5, False, None, 2, "inc"),
        PublishResult(6, False, None, 2, "inc"),
        PublishResult(7, False, None, 2, "inc"),
        PublishResult(8, False, None, 2, "inc"),
        PublishResult(4, True, None, 2, "inc"),
    ]
    assert commands.publish_duplicates([bare, triples]) == 1
    assert commands.publish_duplicates([[b"inc", b"range", 1, 1]]) == 0
    assert commands.publish_seen(bare) == commands.PublishSeen("inc", 5, 7)
    # and an empty range says no new seq, as a call of duplicates only does
    assert commands.publish_seen([b"inc", b"range", 5, 4]) == commands.PublishSeen("inc", 0, -1)
    assert commands.publish_seen([b"inc", 4, 1]) == commands.PublishSeen("inc", 0, -1)


# -- the script ----------------------------------------------------------------


def test_a_bare_call_replies_the_range_of_seqs_it_stored(client: Any) -> None:
    # given a queue with one message
    q = client.queue("orders")
    q.publish(b"first")
    keys = q.keys.publish_keys()
    # when a bare call of three bodies runs
    reply = client.scripts.publish(keys, ["", 60_000, "0", "", "inc", "", b"a", b"b", b"c"])
    # then it replies the queue's incarnation and the seqs 2 to 4, and stored them in order
    assert reply[1:] == [b"range", 2, 4]
    assert commands.text(reply[0]) == client.redis.hget(q.keys.meta, "inc").decode()
    assert payloads(client, q) == {1: b"first", 2: b"a", 3: b"b", 4: b"c"}
    assert client.redis.hget(q.keys.meta, "seq") == b"4"


def test_bare_calls_across_hundreds_store_every_body_under_its_seq(client: Any) -> None:
    # given a queue with a group
    q = client.queue("orders")
    g = q.consumer("g")
    # when batches of plain payloads take seqs 1 to 1,269 (across 99/100, every hundred and 999/1,000)
    sizes = [1, 98, 3, 150, 17, 1000]
    bodies = [f"m{i}".encode() for i in range(sum(sizes))]
    seqs: list[int] = []
    start = 0
    for size in sizes:
        seqs += [r.seq for r in q.publish_many(bodies[start : start + size])]
        start += size
    # then each took the next seq, and each record holds its own payload
    assert seqs == list(range(1, len(bodies) + 1))
    assert payloads(client, q) == dict(zip(seqs, bodies))
    if q.keys.layout is LogLayout.STREAM:
        # a compact entry's id is "<seq>-<published ms>", the seq without a leading zero
        ids = [i.decode() for i, _ in client.redis.xrange(q.keys.msgs)]
        assert [int(i.split("-")[0]) for i in ids] == seqs
        assert all(re.fullmatch(r"[1-9]\d*-\d+", i) for i in ids)
    # and a consumer gets them in order
    got: list[Any] = []
    while batch := g.fetch(100):
        got += batch
        g.ack(batch)
    assert [(d.seq, d.data) for d in got] == list(zip(seqs, bodies))


def test_a_refused_bare_call_stores_nothing_and_leaves_the_last_seq(client: Any) -> None:
    # given a queue with two messages, paused so that publishes are refused
    q = client.queue("orders")
    q.consumer("g")
    q.publish_many([b"a", b"b"])
    q.pause(mode="refuse")
    before = payloads(client, q)
    # when plain payloads are published, then they are refused
    with pytest.raises(QueuePaused):
        q.publish_many([b"c", b"d", b"e"])
    # and nothing is stored, the last seq is as it was
    assert payloads(client, q) == before
    assert client.redis.hget(q.keys.meta, "seq") == b"2"
    # when the queue is resumed, then the next bare call takes seq 3 on
    q.resume()
    assert [r.seq for r in q.publish_many([b"c", b"d"])] == [3, 4]


def test_a_bare_call_below_a_planted_stream_entry_is_refused_whole(
    backend: str, prefix: str, clock: rqueue.ManualClock
) -> None:
    client = connect(backend, prefix, clock, "stream")  # a hash log has no order of entries to break
    # given a stream queue whose log holds an entry above its last seq (damage)
    q = client.queue("orders")
    q.consumer("g")
    q.publish(b"a")
    client.redis.xadd(q.keys.msgs, {"r": b"planted"}, id="5-0")
    length = client.redis.xlen(q.keys.msgs)
    # when a bare call of 50 bodies runs (seqs 2 to 51)
    # then it is refused at its first entry: nothing stored, the last seq as it was
    with pytest.raises(rqueue.CorruptRecord, match="at or above seq 2"):
        q.publish_many([b"x"] * 50)
    assert client.redis.xlen(q.keys.msgs) == length
    assert client.redis.hget(q.keys.meta, "seq") == b"1"
    client.close()
