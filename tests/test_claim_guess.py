"""The claim's guessed read (rqueue/engine/commands.py, ClaimGuess): a
consumer alone on a backlog claims one run of seqs after another, so its
fetch sends the XRANGE of the next claim's records in the fetch's own round
trip (Script.call_and_read) instead of after its reply. A guess that proves
wrong is read again apart; what a consumer gets never depends on the
guess. The pair goes on the direct path of a single server (redis, valkey,
memory://); a cluster's calls read apart, and must hand out the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from support import logview
from support.aio_bridge import parametrize_api

from rqueue.engine import commands, scripts
from rqueue.engine.async_scripts import AsyncScripts
from rqueue.engine.commands import CALL_MAX, CLAIM_MIN, ClaimGuess, FetchReply, claim_entries
from rqueue.engine.loader import source
from rqueue.engine.scripts import Scripts
from rqueue.errors import ConnectionLost

pytest_generate_tests = parametrize_api

WAIT = 30  # ack_wait, s


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """How each claim's records were read: "guessed" (in the fetch's round
    trip) or "apart" (Scripts.read_log, a round trip of its own)."""
    seen: list[str] = []
    read_log, read_log_async, entries_of = Scripts.read_log, AsyncScripts.read_log, commands.claim_entries

    def apart(self: Scripts, *args: Any) -> tuple[list[Any], str]:
        seen.append("apart")
        return read_log(self, *args)

    async def apart_async(self: AsyncScripts, *args: Any) -> tuple[list[Any], str]:
        seen.append("apart")
        return await read_log_async(self, *args)

    def guessed(reply: FetchReply, entries: list[Any]) -> list[Any]:
        seen.append("guessed")
        return entries_of(reply, entries)

    monkeypatch.setattr(Scripts, "read_log", apart)
    monkeypatch.setattr(AsyncScripts, "read_log", apart_async)
    monkeypatch.setattr(commands, "claim_entries", guessed)
    yield seen


@pytest.fixture
def pairs(request: pytest.FixtureRequest) -> bool:
    """Whether this client's script calls take the direct path, where a
    fetch and its read go as a pair: not a cluster's, nor the asyncio
    client's of memory:// (fakeredis's connections are not redis-py's)."""
    params = request.node.callspec.params
    return params["backend"] != "cluster" and (params["backend"], params.get("api")) != ("memory", "async")


def test_the_python_constants_are_fetch_luas():
    # given fetch.lua's stream text
    text = source("fetch", False, "stream")
    # then CLAIM_MIN and CALL_MAX are what the guess assumes
    assert f"local CLAIM_MIN = {CLAIM_MIN}\n" in text
    assert f"local CALL_MAX = {CALL_MAX}\n" in text


def test_a_consumer_alone_on_a_backlog_reads_its_claims_in_the_fetchs_round_trip(client, reads, pairs):
    # given a backlog of 1,000 messages and one consumer
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 1001)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    # when it drains it 100 at a time, acking each batch
    got: list[Any] = []
    while batch := c.fetch(100):
        got += batch
        c.ack(batch)
    # then every message came once, in order, as published
    assert [d.data for d in got] == [b"m%d" % i for i in range(1, 1001)]
    assert q.stats().groups[0].in_flight == 0
    # and after two claims in a row, each claim's records came with its fetch
    assert reads == (["apart"] * 2 + ["guessed"] * 8 if pairs else ["apart"] * 10)


def test_a_guess_another_consumer_took_is_read_again_apart(client, reads, pairs):
    # given a consumer whose guess is armed by two claims in a row
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 601)])
    c1 = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    c2 = q.consumer("g", "c2", ack_wait=WAIT, prefetch=1000)
    c1.ack(c1.fetch(100))
    c1.ack(c1.fetch(100))
    # when another consumer claims the seqs it guesses
    theirs = c2.fetch(100)
    mine = c1.fetch(100)
    # then each holds its own claim's records
    assert [d.data for d in theirs] == [b"m%d" % i for i in range(201, 301)]
    assert [d.data for d in mine] == [b"m%d" % i for i in range(301, 401)]
    # and the wrong guess was read again apart, and no guess follows it at once
    after = c1.fetch(100)
    assert [d.data for d in after] == [b"m%d" % i for i in range(401, 501)]
    assert reads == ["apart"] * 5


def test_a_claim_shorter_than_the_guess_hands_out_the_claim_alone(client, reads, pairs):
    # given 240 messages, and a consumer armed after two claims of 100
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 241)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    first = c.fetch(100) + c.fetch(100)
    # when it fetches 100 and 40 are left
    last = c.fetch(100)
    # then it gets those 40, and nothing it did not claim
    assert [d.data for d in first + last] == [b"m%d" % i for i in range(1, 241)]
    assert reads == (["apart"] * 2 + ["guessed"] if pairs else ["apart"] * 3)
    c.ack(first + last)
    assert q.stats().groups[0].in_flight == 0


def test_a_deleted_entry_inside_a_guessed_claim_is_dead_lettered_as_missing_record(client, reads, pairs):
    # given a consumer armed after two claims, and the entry of seq 250 deleted from the log
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 401)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    c.ack(c.fetch(100) + c.fetch(100))
    assert logview.delete(client.redis, q.keys, 250) == 1
    # when it fetches the next 100
    got = c.fetch(100)
    # then it gets the other 99, and seq 250 is a dead letter saying it was lost
    assert [d.seq for d in got] == [s for s in range(201, 301) if s != 250]
    assert [(d.seq, d.reason) for d in q.dead_letters()] == [(250, "missing-record")]
    assert reads == (["apart"] * 2 + ["guessed"] if pairs else ["apart"] * 3)
    c.ack(got)
    assert q.stats().groups[0].in_flight == 0


def test_a_priority_message_while_a_guess_is_armed_takes_every_key_and_the_connection_stays_in_step(client, reads):
    # given a consumer armed after two claims
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 401)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    c.ack(c.fetch(100) + c.fetch(100))
    # when a priority message comes (the plain fetch is refused, its read answered too)
    q.publish(b"urgent", priority=5)
    got = c.fetch(100)
    # then the fetch goes again with every key, the priority message first
    assert [d.data for d in got] == [b"urgent"] + [b"m%d" % i for i in range(201, 300)]
    # and the next calls on the same connections read their own replies
    c.ack(got)
    assert [d.data for d in c.fetch(100)] == [b"m%d" % i for i in range(300, 400)]


def test_scripts_flushed_while_a_guess_is_armed_the_fetch_runs_again_alone(client, reads):
    # given a consumer armed after two claims, and Redis's script cache flushed
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 401)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    c.ack(c.fetch(100) + c.fetch(100))
    client.redis.script_flush()
    # when it fetches (NOSCRIPT, then the script loaded and run alone)
    got = c.fetch(100)
    # then it gets the next 100, read apart, as the read before the script ran is no use
    assert [d.data for d in got] == [b"m%d" % i for i in range(201, 301)]
    assert reads == ["apart"] * 3


def test_claim_entries_takes_the_claims_entries_or_all_of_them_when_the_log_is_uneven():
    # given a reply that claimed seqs 10..12
    reply = FetchReply(0, None, "", 20, 0, 1, [], "t", [], 0, claim=(0, 10, 12))

    def entry(seq: int, ms: int = 5) -> list[Any]:
        return [b"%d-%d" % (seq, ms), [b"p", b"x"]]

    # then an even log's first three entries are the claim's
    even = [entry(10), entry(11), entry(12), entry(13)]
    assert claim_entries(reply, even) == even[:3]
    # and a log missing seq 11, or holding seq 10 twice, gives every entry to place by seq
    holed = [entry(10), entry(12), entry(13)]
    assert claim_entries(reply, holed) == holed
    doubled = [entry(10), entry(10, 6), entry(11), entry(12)]
    assert claim_entries(reply, doubled) == doubled


def reply_of(claim: tuple[int, int, int] | None, raw: list[Any], last_seq: int) -> FetchReply:
    """A fetch reply as the script sends it: a claim's deliveries are not in raw."""
    return FetchReply(0, None, "", last_seq, 0, 1, [], "t", raw, 0, claim=claim)


def test_the_guess_arms_on_two_claims_in_a_row_with_a_claims_worth_after_them():
    # given a fresh guess
    guess = ClaimGuess()
    claimed: list[Any] = []  # a reply of a claim alone holds no delivery of its own
    # when it sees a claim of 1..100: no guess yet
    guess.saw(reply_of((0, 1, 100), claimed, 1000))
    assert guess.range(100) is None
    # when it sees 101..200 next: the next 100 are guessed, and a fetch of 500 at most CALL_MAX
    guess.saw(reply_of((0, 101, 200), claimed, 1000))
    assert guess.range(100) == (201, 300)
    assert guess.range(500) == (201, 200 + CALL_MAX)
    assert guess.range(CLAIM_MIN - 1) is None
    # when a fetch hands out first deliveries the scan read past a claim of CALL_MAX
    beyond = [329, 1, b"", 330, 1, b""]
    guess.saw(reply_of((0, 201, 200 + CALL_MAX), beyond, 1000))
    assert guess.range(100) == (331, 430)
    # when the queue holds less than a claim after the last one: no guess
    guess.saw(reply_of((0, 331, 430), claimed, 450))
    assert guess.range(100) is None
    # when a fetch hands out without a claim: no guess until two claims in a row again
    guess.saw(reply_of((0, 431, 450), claimed, 1000))
    guess.saw(reply_of(None, [5, 2, b"r"], 1000))
    assert guess.range(100) is None
    guess.saw(reply_of((0, 451, 550), claimed, 1000))
    assert guess.range(100) is None


def test_a_wrong_guess_doubles_the_claims_in_a_row_the_next_one_waits_for():
    # given a guess armed by two claims in a row
    guess = ClaimGuess()

    def claims(*firsts: int) -> None:
        for first in firsts:
            guess.saw(reply_of((0, first, first + 99), [], 10_000))

    claims(1, 101)
    assert guess.range(100) == (201, 300)
    # when another consumer took those seqs: no guess until two claims in a row
    claims(301)
    assert guess.range(100) is None
    claims(401)
    assert guess.range(100) is None
    claims(501)
    assert guess.range(100) == (601, 700)
    # when it is wrong again: four in a row
    claims(801, 901, 1001, 1101)
    assert guess.range(100) is None
    claims(1201)
    assert guess.range(100) == (1301, 1400)
    # and a right guess sets it back to one claim in a row
    claims(1301)
    assert guess.range(100) == (1401, 1500)
    claims(1601)
    claims(1701)
    assert guess.range(100) is None
    claims(1801)
    assert guess.range(100) == (1901, 2000)


@pytest.mark.sync_only("the sync client's direct path")
@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)  # the clients that pair
def test_a_reply_lost_after_a_guessed_read_ran_loses_no_message(client, clock, monkeypatch):
    # given a consumer armed after two claims, 400 messages in all
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(1, 401)])
    c = q.consumer("g", "c1", ack_wait=WAIT, prefetch=1000)
    c.ack(c.fetch(100) + c.fetch(100))
    # and the connection lost after Redis ran the fetch and its read, before the client read the replies
    sent = scripts.send_direct_pair

    def lost(*args: Any) -> Any:
        sent(*args)
        raise redis.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(scripts, "send_direct_pair", lost)
    # when it fetches, the call raises as a lost reply does
    with pytest.raises(ConnectionLost):
        c.fetch(100)
    monkeypatch.undo()
    # then once their leases run out, the claimed messages come again to another consumer, and none is lost
    clock.advance(WAIT + 1)
    other = q.consumer("g", "c2", ack_wait=WAIT, prefetch=1000)
    got: list[Any] = []
    while batch := other.fetch(100):
        got += batch
        other.ack(batch)
    assert sorted(d.seq for d in got) == list(range(201, 401))
    assert [d.seq for d in got if d.delivery_count == 2] == list(range(201, 301))
    assert q.stats().groups[0].in_flight == 0
