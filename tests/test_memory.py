"""A server at its maxmemory (noeviction): every call that frees memory or
hands out what is stored still runs (ack, nack, reject, in_progress,
fetch, join, heartbeat, leave, purge, replay, delete), a publish is refused
whole with an error that names used and max memory, and a worker drains
the queue until publishes are taken again. A server that may evict keys is
refused at connect unless allowed (tests/test_connect.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.servers import start_server, wait_for

import rqueue
from rqueue.clock import ManualClock
from rqueue.embedded import EmbeddedServer
from rqueue.engine.loader import SCRIPT_NAMES, declared_flags, source

KINDS = ("redis", "valkey")


@pytest.fixture(params=KINDS)
def full_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """A private server with maxmemory-policy noeviction (the caller sets maxmemory)."""
    server = start_server(request.param, extra_args=["--maxmemory-policy", "noeviction"])
    yield server
    server.stop()


# The scripts that free memory or hand out what is stored; publish and
# stats are not among them. ack_result keeps a small result beside its ack
# (with a TTL): refused at maxmemory, a worker's acks would fail and its
# messages come back; retain, group_reset and group_delete free or move a
# group back, as an operator of a full server needs.
ALLOW_OOM = {
    "set_aside",
    "fetch",
    "ack",
    "ack_result",
    "nack",
    "reject",
    "extend",
    "heartbeat",
    "join",
    "leave",
    "purge",
    "replay",
    "pause",
    "retain",
    "group_reset",
    "group_delete",
}


def test_scripts_that_free_or_hand_out_declare_allow_oom():
    for name in SCRIPT_NAMES:
        # then a script for a server starts with its flags, or with none when it declares none
        first = source(name).split("\n", 1)[0]
        assert (first == "#!lua flags=allow-oom") == (name in ALLOW_OOM), name
        # and memory:// (fakeredis reads no shebang) is sent the same script without that line
        assert not source(name, shebang=False).startswith("#!")
        assert source(name).endswith(source(name, shebang=False))
    # and a flag the loader does not know is refused, named
    with pytest.raises(ValueError, match="x.lua: unknown --@flags no-such"):
        declared_flags("--@flags allow-oom no-such\nreturn 1\n", "x.lua")


def _fill(client: rqueue.Client, prefix: str) -> None:
    """Puts the server over its maxmemory with a key beside the queues."""
    client.redis.set(f"{prefix}:filler", b"x" * 5_000_000)
    client.redis.config_set("maxmemory", 4 * 1024 * 1024)
    assert client.redis.info("memory")["used_memory"] > 4 * 1024 * 1024


def test_every_call_that_frees_or_hands_out_runs_at_maxmemory(full_server, prefix):
    # given a queue with held deliveries, dead letters and a backlog, on a server over its maxmemory
    client = rqueue.connect(full_server.url, prefix=prefix, settings_ttl=0)
    client.configure("orders", max_deliveries=1)
    q = client.queue("orders")
    q.publish_many([b"m"] * 40)
    c = q.consumer("g", "c1")
    held = c.fetch(6)
    held[5].reject()
    _fill(client, prefix)
    # when a consumer acks, nacks, rejects, extends, heartbeats and fetches
    c.ack(held[:1])
    held[1].nack()  # its last delivery (max_deliveries=1): dead-lettered
    held[2].reject()
    held[3].in_progress()
    c.heartbeat([held[4].tag], 10)
    more = c.fetch(5)
    # and a new consumer and a new group join and fetch
    other = q.consumer("g", "c2")
    assert len(other.fetch(2)) == 2
    late = q.consumer("g2")
    assert len(late.fetch(3)) == 3
    # then all of it was applied
    g = q.stats().group("g")
    assert g.acked >= 1 and len(more) == 5
    assert q.stats().dead_letters == 3
    # and dead letters replay, leave returns, purge and delete run too
    assert q.replay_dead_letters("g").replayed == 3
    assert late.close() == 3
    assert q.purge("g")["g"] > 0
    assert q.purge_dead_letters() == 0
    c.close()
    other.close()
    q.delete(force=True)
    assert client.queues() == []
    client.close()


def test_messages_past_their_ttl_are_set_aside_at_maxmemory(full_server, prefix):
    # given three messages with a ttl of 5 s, on a server over its maxmemory, and results kept
    clock = ManualClock()
    client = rqueue.connect(full_server.url, prefix=prefix, settings_ttl=0, clock=clock)
    client.configure("orders", results=True)
    q = client.queue("orders")
    c = q.consumer("g")
    q.publish_many([b"m"] * 3, ttl=5)
    _fill(client, prefix)
    # when their ttl runs out before a fetch
    clock.advance(5)
    assert c.fetch(5) == []
    # then the three went to the dead-letter queue, each with its failure kept
    assert q.stats().dead_letters == 3
    assert [q.result(seq, timeout=0).failure.reason for seq in (1, 2, 3)] == ["expired"] * 3
    client.close()


def test_a_queue_on_hold_resumes_at_maxmemory(full_server, prefix):
    # given a queue on hold whose held messages wait, on a server over its maxmemory
    client = rqueue.connect(full_server.url, prefix=prefix, settings_ttl=0)
    q = client.queue("orders")
    c = q.consumer("g")
    q.pause(mode="hold")
    q.publish_many([b"m"] * 5)
    q.pause("g")
    assert c.fetch(5) == []
    _fill(client, prefix)
    # when the group and the queue are resumed, then the held messages are handed out
    assert q.resume("g") and q.resume()
    assert len(c.fetch(5)) == 5
    client.close()


def test_a_publish_at_maxmemory_is_refused_whole_naming_the_memory(full_server, prefix):
    # given a server over its maxmemory
    client = rqueue.connect(full_server.url, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"first")
    _fill(client, prefix)
    # when a message and a batch are published
    for publish in (lambda: q.publish(b"m"), lambda: q.publish_many([b"n"] * 3)):
        # then each is refused with an error naming used and max memory, and nothing is stored
        with pytest.raises(rqueue.OutOfMemory) as caught:
            publish()
        err = caught.value
        assert err.limit == 4 * 1024 * 1024 and err.used is not None and err.used > err.limit
        assert f"maxmemory {err.limit:,} bytes" in str(err) and f"used_memory {err.used:,}" in str(err)
    assert q.stats().last_seq == 1
    client.close()


def test_a_worker_drains_a_full_server_until_publishes_are_taken_again(full_server, prefix):
    # given a queue that filled the server: publishes are refused
    client = rqueue.connect(full_server.url, prefix=prefix, settings_ttl=0)
    q = client.queue("orders")
    client.redis.config_set("maxmemory", client.redis.info("memory")["used_memory"] + 3_000_000)
    body = b"p" * 10_000
    stored = 0
    with pytest.raises(rqueue.OutOfMemory):
        for _ in range(1_000):
            q.publish(body)
            stored += 1
    assert stored > 100
    handled: list[int] = []
    # when a worker runs against it
    worker = rqueue.Worker(q, "g", lambda d: handled.append(d.seq), concurrency=4, heartbeat_interval=0.2)
    worker.start()
    try:
        wait_for(lambda: len(handled) >= stored, timeout=30)
        wait_for(lambda: q.stats().group("g").acked == stored, timeout=30)
    finally:
        worker.stop()
        assert worker.join(15)
    # then every stored message was handled once, and its acks were applied
    assert sorted(handled) == list(range(1, stored + 1))
    # and the memory they held is free again: the next publish is taken
    assert q.publish(body).seq == stored + 1
    client.close()


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_worker_of_a_new_client_joins_a_full_server_and_drains_it(full_server, prefix, kind):
    # given a queue with a backlog on a server over its maxmemory
    from test_aio_worker import run_worker

    client = rqueue.connect(full_server.url, prefix=prefix, settings_ttl=0)
    q = client.queue("orders")
    q.publish_many([b"m"] * 20)
    _fill(client, prefix)
    # when a worker of a client that never used the queue starts (its join's
    # listing of the queue is a write the server refuses)
    fresh = rqueue.connect(full_server.url, prefix=prefix, settings_ttl=0)
    handled: list[int] = []
    worker = run_worker(kind, full_server.url, prefix, fresh.queue("orders"), lambda d: handled.append(d.seq))
    try:
        # then it joins and handles every message, and their acks are applied
        wait_for(lambda: q.stats().groups and q.stats().group("g").acked == 20, timeout=20)
    finally:
        worker.stop()
        assert worker.join(10)
    assert sorted(handled) == list(range(1, 21))
    # and the queue is still listed
    assert client.queues() == ["orders"]
    fresh.close()
    client.close()


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_a_worker_keeping_results_goes_on_past_a_failure_a_full_server_cannot_keep(full_server, prefix, kind):
    # given results on and a backlog on a server over its maxmemory, one message of which the handler rejects
    from test_aio_worker import run_worker

    client = rqueue.connect(full_server.url, prefix=prefix, settings_ttl=0)
    client.configure("orders", results=True)
    q = client.queue("orders")
    q.publish_many([b"m"] * 20)
    _fill(client, prefix)

    def handler(d: rqueue.Delivery) -> int:
        if d.seq == 2:
            raise rqueue.Reject("not ours")
        return d.seq

    # when a worker runs against it
    worker = run_worker(kind, full_server.url, prefix, q, handler)
    try:
        # then it goes on at once past the failure it cannot keep (a plain write the
        # server refuses), rather than waiting out reconnect_timeout for memory
        wait_for(lambda: q.stats().groups and q.stats().group("g").acked == 19, timeout=10)
    finally:
        worker.stop()
        assert worker.join(10)
    # and the other messages keep their results (kept with their acks), the rejected one none
    assert [q.result(seq, timeout=1).value for seq in (1, 3, 20)] == [1, 3, 20]
    with pytest.raises(rqueue.ResultTimeout):
        q.result(2, timeout=0.05)
    assert q.stats().dead_letters == 1
    client.close()
