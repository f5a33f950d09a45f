"""Fetches sent ahead: a busy worker sends its next fetch before it reads
the last one's reply (Consumer.send_ack_and_fetch, Script.send), so that
Redis runs one while the worker takes the other apart. What is checked:
the reply read later is the call's own, on every server that splits calls;
an abandoned call's connection is never reused with its reply unread; two
calls out at once hand out different messages, and a removed member's two
join once; and a worker that fetches ahead runs each message once, checks
a reply it read late, loses nothing when its connections are cut, and hands
back at once what a fetch out at its stop brought."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from support.chaos import retrying
from support.servers import start_server, wait_for

import rqueue
from rqueue.consumer import SentAckAndFetch
from rqueue.results import MessageState
from rqueue.worker import dispatcher

SPLITS = ["redis", "valkey", "memory"]  # a cluster sends each call whole


def _consumer(backend: str, prefix: str, **settings: object) -> tuple[rqueue.Client, rqueue.Queue, rqueue.Consumer]:
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    if settings:
        client.configure("orders", **settings)
    q = client.queue("orders")
    assert isinstance(q, rqueue.Queue)
    return client, q, q.consumer("g", name="c1")


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_a_fetch_sent_ahead_is_read_after_other_calls_and_brings_its_own_reply(backend, prefix):
    # Given a consumer of a queue of 5 messages
    client, q, c = _consumer(backend, prefix)
    q.publish_many([b"a", b"b", b"c", b"d", b"e"])
    assert c.sends_ahead()
    # When it sends a fetch of 2 and, before reading it, makes other calls
    sent = c.send_ack_and_fetch([], 2)
    assert sent is not None
    others = c.fetch(2)  # on another connection
    # Then the reply read later is that fetch's, and calls go on as before
    _, deliveries, _ = sent.result()
    assert sorted(d.data for d in deliveries + others) == [b"a", b"b", b"c", b"d"]
    c.ack(deliveries + others)
    assert [d.data for d in c.fetch(5)] == [b"e"]
    client.close()


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_a_client_that_sends_calls_whole_sends_nothing_ahead(backend, prefix):
    # Given a consumer on a cluster, with a message waiting
    client, q, c = _consumer(backend, prefix)
    q.publish(b"a")
    # Then it says so, sends nothing, and the message stays for a whole fetch
    assert not c.sends_ahead()
    assert c.send_ack_and_fetch([], 1) is None
    assert [d.data for d in c.fetch(1)] == [b"a"]
    client.close()


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_an_abandoned_fetch_closes_its_connection_and_no_later_call_reads_its_reply(backend, prefix):
    # Given a consumer that sends a fetch and abandons it, its reply unread
    client, q, c = _consumer(backend, prefix, ack_wait=0.3)
    q.publish_many([b"a", b"b"])
    sent = c.send_ack_and_fetch([], 1)
    assert sent is not None
    time.sleep(0.05)  # the reply is on the socket
    sent.abandon()
    sent.abandon()  # once done, a second does nothing
    # When the consumer goes on with many calls (the pool's connections reused)
    seen = []
    for _ in range(20):
        got = c.fetch(1)
        seen.extend(d.data for d in got)
        c.ack(got)
        if len(seen) == 2:
            break
        time.sleep(0.05)
    # Then each reply is its own: both messages come, the abandoned one's
    # after its lease ran out, and none twice
    assert sorted(seen) == [b"a", b"b"]
    with pytest.raises(RuntimeError):
        sent.result()
    client.close()


def test_a_fetch_sent_after_a_script_flush_loads_the_script_and_runs(prefix):
    # Given a server of its own whose scripts were flushed (as after a restart)
    server = start_server("redis")
    try:
        client, q, c = _consumer(server.url, prefix)
        q.publish(b"a")
        client.redis.script_flush()
        # When a fetch is sent ahead and read
        sent = c.send_ack_and_fetch([], 1)
        assert sent is not None
        _, deliveries, _ = sent.result()
        # Then NOSCRIPT, which ran nothing, was answered by loading it and calling again
        assert [d.data for d in deliveries] == [b"a"]
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_two_fetches_out_at_once_hand_out_different_messages_and_carry_their_acks(backend, prefix):
    # Given a consumer that holds message 1, of 5
    client, q, c = _consumer(backend, prefix)
    q.publish_many([b"1", b"2", b"3", b"4", b"5"])
    first = c.fetch(1)
    # When it sends two fetches before reading either, the first acking message 1
    one = c.send_ack_and_fetch(first, 2)
    two = c.send_ack_and_fetch([], 2)
    assert one is not None and two is not None
    acked, got_one, _ = one.result()
    none, got_two, _ = two.result()
    # Then the ack applied, and the two hold different messages
    assert acked == [None] and none == []
    assert sorted(d.data for d in got_one + got_two) == [b"2", b"3", b"4", b"5"]
    c.ack(got_one + got_two)
    assert q.stats().group("g").ack_floor == 5
    client.close()


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_two_fetches_of_a_removed_member_join_once_and_both_acks_apply(backend, prefix):
    # Given a consumer holding messages 1 and 2 of 4, removed from its group
    # (a twin of its name leaves, as when it was silent too long)
    client, q, c = _consumer(backend, prefix)
    q.publish_many([b"1", b"2", b"3", b"4"])
    held = c.fetch(2)
    q.consumer("g", name="c1").close()
    joins = c.joins
    # When it sends two fetches before reading either, each acking one
    one = c.send_ack_and_fetch(held[:1], 1)
    two = c.send_ack_and_fetch(held[1:], 1)
    assert one is not None and two is not None
    acks_one, got_one, _ = one.result()
    acks_two, got_two, _ = two.result()
    # Then both found it no member and it joined again once, not twice; the
    # first late ack applied (nobody held message 1), and the first fetch
    # after the join took message 2 back, which the second ack then names
    # by a delivery that is gone
    assert c.joins - joins == 1
    assert acks_one == [None]
    assert [d.seq for d in got_one] == [2]
    assert isinstance(acks_two[0], rqueue.StaleDelivery)
    c.ack(got_one + got_two)
    rest = c.fetch(4)
    c.ack(rest)
    assert sorted(d.seq for d in got_one + got_two + rest) == [2, 3, 4]
    stats = q.stats().group("g")
    assert stats.ack_floor == 4 and stats.in_flight == 0
    assert [m.name for m in stats.consumers] == ["c1"]
    client.close()


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_a_queue_that_needs_the_flow_keys_is_fetched_ahead_with_them(backend, prefix):
    # Given a queue with a message of priority 5 behind a plain one, and a
    # consumer that has not fetched yet (it sends the short key list first)
    client, q, c = _consumer(backend, prefix)
    q.publish(b"plain")
    q.publish(b"urgent", priority=5)
    # When a fetch is sent ahead and read
    sent = c.send_ack_and_fetch([], 2)
    assert sent is not None
    _, deliveries, _ = sent.result()
    # Then the script's refusal of the short list was answered with every key
    assert [d.data for d in deliveries] == [b"urgent", b"plain"]
    client.close()


# -- the worker -----------------------------------------------------------------------


def _count_sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sends: list[int] = []
    send = rqueue.Consumer.send_ack_and_fetch

    def counted(self, acks, n):
        sent = send(self, acks, n)
        if sent is not None:
            sends.append(n)
        return sent

    monkeypatch.setattr(rqueue.Consumer, "send_ack_and_fetch", counted)
    return sends


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
def test_a_busy_worker_fetches_ahead_and_runs_each_message_once(backend, prefix, monkeypatch, batch):
    # Given 3,000 messages and a worker
    sends = _count_sends(monkeypatch)
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    q = client.queue("orders")
    q.consumer("g", name="first").close()  # the group exists before the worker joins
    q.publish_many([str(i).encode() for i in range(3000)])
    runs: list[int] = []
    lock = threading.Lock()

    def one(d):
        with lock:
            runs.append(d.seq)

    def many(ds):
        with lock:
            runs.extend(d.seq for d in ds)
        return [True] * len(ds)

    handler = rqueue.BatchHandler(many, size=100) if batch else one
    w = rqueue.Worker(q, "g", handler, concurrency=1 if batch else 4, scheduler=False)
    w.start()
    # When it works through them
    try:
        wait_for(lambda: q.stats().group("g").ack_floor == 3000, timeout=60)
    finally:
        w.stop()
        assert w.join(20)
    # Then most of its fetches went ahead, and each message ran once
    assert len(sends) >= 5
    assert sorted(runs) == list(range(1, 3001))
    assert w.stats.acked == 3000 and w.stats.late_settles == 0
    client.close()


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_a_fetch_sent_ahead_and_read_past_its_leases_runs_nothing_acked_meanwhile(backend, prefix, monkeypatch):
    # Given a busy worker whose next fetch, sent ahead, is read only after
    # the 0.5 s leases of what it brought ran out (as when the worker is
    # paused right after sending it)
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=0.5)
    q = client.queue("orders")
    q.publish_many([b"m"] * 4)
    brought: list[int] = []
    go_on = threading.Event()
    result = SentAckAndFetch.result

    def read_late(self):
        got = result(self)
        if got[1] and not brought:
            brought.extend(d.seq for d in got[1])
            go_on.wait(20)
        return got

    monkeypatch.setattr(SentAckAndFetch, "result", read_late)
    calls: list[int] = []
    w = rqueue.Worker(q, "g", lambda d: calls.append(d.seq), concurrency=1, heartbeat_interval=0.1, scheduler=False)
    w.start()
    try:
        wait_for(lambda: brought)
        # When another consumer takes and acks those messages meanwhile
        other = q.consumer("g", name="other")
        taken: list[rqueue.Delivery] = []
        wait_for(lambda: taken.extend(other.fetch(4)) or set(brought) <= {d.seq for d in taken})
        other.ack(taken)
    finally:
        go_on.set()
    # Then the worker checks them with Redis and runs none of them
    wait_for(lambda: w.stats.stale_skipped >= len(brought))
    wait_for(lambda: q.stats().group("g").ack_floor == 4)
    w.stop()
    assert w.join(10)
    assert not set(brought) & set(calls)
    assert sorted(calls + [d.seq for d in taken]) == [1, 2, 3, 4]
    client.close()


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_a_reply_lost_while_the_next_fetch_is_out_runs_nothing_the_worker_does_not_hold(backend, prefix, monkeypatch):
    # Given a busy worker whose handler checks with Redis that the worker
    # holds each message it runs, and replies of fetches sent ahead that are
    # lost on their way after Redis ran them, while a later fetch is out
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    q = client.queue("orders")
    q.consumer("g", name="first").close()
    q.publish_many([b"m"] * 1500)
    send, result = rqueue.Consumer.send_ack_and_fetch, SentAckAndFetch.result
    order: dict[int, int] = {}  # id of a call sent -> its place in the order of sends
    losses = [0]

    def counted(self, acks, n):
        sent = send(self, acks, n)
        if sent is not None:
            order[id(sent)] = len(order)
        return sent

    def lossy(self):
        got = result(self)
        later_out = len(order) - 1 > order[id(self)]
        if later_out and losses[0] < 10:
            losses[0] += 1
            raise rqueue.ConnectionLost("reply lost (test)")
        return got

    monkeypatch.setattr(rqueue.Consumer, "send_ack_and_fetch", counted)
    monkeypatch.setattr(SentAckAndFetch, "result", lossy)
    monkeypatch.setattr(dispatcher, "AHEAD_SHARE", 1000)  # ahead whenever a slot is free: more overlap
    runs: dict[int, int] = {}
    not_held: list[int] = []
    lock = threading.Lock()
    worker: list[rqueue.Worker] = []

    def handler(d):
        view = q.status(seq=d.seq).groups["g"]
        with lock:
            runs[d.seq] = runs.get(d.seq, 0) + 1
            if view.state is not MessageState.IN_FLIGHT or view.consumer != worker[0].consumer.name:
                not_held.append(d.seq)

    w = rqueue.Worker(q, "g", handler, concurrency=2, prefetch=16, scheduler=False)
    worker.append(w)
    w.start()
    # When it works through them
    try:
        wait_for(lambda: q.stats().group("g").ack_floor == 1500, timeout=60)
    finally:
        w.stop()
        assert w.join(20)
    # Then what each lost reply claimed went back (the fetch out meanwhile
    # was read first, so what it brought was known and kept), no handler
    # ran a message the worker did not hold, and each ran once
    assert not_held == []
    assert losses[0] >= 1 and w.stats.reconnects >= losses[0]
    assert sorted(runs) == list(range(1, 1501))
    assert [seq for seq, n in runs.items() if n > 1] == []
    assert w.stats.late_settles == 0
    client.close()


def test_connections_cut_while_fetches_are_out_ahead_lose_nothing(prefix):
    # Given a worker on a server of its own, working through 5,000 messages
    server = start_server("redis")
    client = rqueue.connect(server.url, prefix=prefix, settings_ttl=0)
    try:
        client.configure("orders", ack_wait=2)
        q = client.queue("orders")
        q.publish_many([b"m"] * 5000)
        runs: dict[int, int] = {}
        lock = threading.Lock()

        def handler(d):
            with lock:
                runs[d.seq] = runs.get(d.seq, 0) + 1

        w = rqueue.Worker(q, "g", handler, concurrency=4, scheduler=False, heartbeat_interval=0.2)
        w.start()
        admin = redis.Redis.from_url(server.url)
        # When every client connection is cut 10 times while it works
        cuts = 0
        try:
            while cuts < 10 and len(runs) < 5000:
                if len(runs) > 300 * (cuts + 1):
                    admin.client_kill_filter(_type="normal", skipme=True)
                    cuts += 1
                time.sleep(0.002)
            wait_for(lambda: retrying(lambda: q.stats().group("g").ack_floor) == 5000, timeout=60)
        finally:
            w.stop()
            assert w.join(20)
        # Then every message ran and was acked; none is left in flight
        assert cuts >= 3
        assert sorted(runs) == list(range(1, 5001))
        assert retrying(lambda: q.stats().group("g").in_flight) == 0
        assert w.stats.reconnects >= 1
    finally:
        client.close()
        server.stop()


@pytest.mark.parametrize("backend", SPLITS, indirect=True)
def test_a_stop_with_a_fetch_out_ahead_reads_it_and_hands_back_what_it_brought(backend, prefix, monkeypatch):
    # Given a busy worker (a 120 s lease) told to stop just after it sent a
    # fetch ahead that carries acks, its reply not read yet
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=120)
    q = client.queue("orders")
    q.consumer("g", name="first").close()
    q.publish_many([b"m"] * 50)
    send = rqueue.Consumer.send_ack_and_fetch
    worker: list[rqueue.Worker] = []
    stopped_after: list[int] = []

    def stop_after_sending(self, acks, n):
        refs = list(acks)
        sent = send(self, refs, n)
        if sent is not None and refs and not stopped_after:
            stopped_after.append(len(refs))
            worker[0].stop()  # (from the dispatcher's own thread: no Redis call)
        return sent

    monkeypatch.setattr(rqueue.Consumer, "send_ack_and_fetch", stop_after_sending)
    monkeypatch.setattr(dispatcher, "AHEAD_SHARE", 1000)
    calls: list[int] = []
    w = rqueue.Worker(q, "g", lambda d: calls.append(d.seq), concurrency=1, prefetch=8, scheduler=False)
    worker.append(w)
    # When it runs until then, and stops
    w.start()
    assert w.join(20)
    # Then the worker read that reply (its acks count as applied), nothing is
    # left in flight, and another consumer gets every message the worker did
    # not run, none that it did
    assert stopped_after
    assert w.stats.acked == len(calls)
    assert q.stats().group("g").in_flight == 0
    rest = q.consumer("g", name="rest")
    got = rest.fetch(50)
    rest.ack(got)
    assert sorted(calls + [d.seq for d in got]) == list(range(1, 51))
    client.close()
