"""Durable confirms: publish(durable=True) returns once replicas have the
message (WAIT) and, where the server has WAITAOF with AOF on, once it is
fsynced; otherwise NotDurable says what fell short, with the messages stored."""

from __future__ import annotations

import pytest
import redis
from support import logview
from support.aio_bridge import connect_as, parametrize_api
from support.servers import start_cluster, start_server

import rqueue


def pytest_generate_tests(metafunc):
    # every test runs against the sync client and the asyncio one (tests/support/aio_bridge.py)
    parametrize_api(metafunc)


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster()
    yield c
    c.stop()


def test_durable_publish_on_a_cluster_is_held_by_a_replica(api, cluster, prefix):
    # given a cluster whose primaries have one replica each
    client = connect_as(api, cluster.url, prefix=prefix)
    q = client.queue("orders")
    # when publishing durably, one message and a batch
    one = q.publish(b"a", id="a", durable=True)
    many = q.publish_many([b"b", b"c"], ids=["b", "c"], durable=True)
    # then both were confirmed, and the replica of the queue's primary already has them
    assert [one.seq] + [r.seq for r in many] == [1, 2, 3]
    primary = cluster.primary_of(q.keys.msgs)
    replica = next(n for n in cluster.nodes if n is not primary and _replicates(n, primary))
    with redis.Redis(port=replica.port) as r:
        r.execute_command("READONLY")
        assert logview.count(r, q.keys) == 3
    client.close()


def _replicates(node, primary) -> bool:
    with redis.Redis(port=node.port) as r:
        info = r.info("replication")
    return info.get("role") == "slave" and int(info.get("master_port", 0)) == primary.port


def test_durable_publish_without_replicas_says_what_fell_short(api, prefix):
    # given a single server without replicas
    server = start_server("redis")
    try:
        client = connect_as(api, server.url, prefix=prefix, durable_replicas=1, durable_timeout=0.1)
        q = client.queue("orders")
        # when publishing durably
        with pytest.raises(rqueue.NotDurable, match="0 of 1 replicas acknowledged within 0.1 s") as exc:
            q.publish(b"a", id="a", durable=True)
        # then the message is stored all the same, and the error says so and how many acked
        assert (exc.value.replicas, exc.value.required) == (0, 1)
        assert [r.seq for r in exc.value.results] == [1]
        assert [m.data for m in q.peek()] == [b"a"]
        # and publishing again with the same id is safe
        with pytest.raises(rqueue.NotDurable) as again:
            q.publish(b"a", id="a", durable=True)
        assert again.value.results[0].duplicate and q.stats().last_seq == 1
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("appendonly", [True, False], ids=["aof", "no-aof"])
def test_durable_publish_waits_for_fsync_where_the_server_has_waitaof(api, prefix, appendonly):
    # given Valkey (which has WAITAOF), with or without an append-only file, and no replica required
    server = start_server("valkey", appendonly=appendonly)
    try:
        client = connect_as(api, server.url, prefix=prefix, durable_replicas=0)
        q = client.queue("orders")
        if appendonly:
            # when publishing durably, then it is confirmed once fsynced
            assert q.publish(b"a", durable=True).seq == 1
        else:
            # then nothing could make it durable: the error says why, the message is stored
            with pytest.raises(rqueue.NotDurable, match="no append-only file with WAITAOF") as exc:
                q.publish(b"a", durable=True)
            assert exc.value.fsynced is None and q.stats().last_seq == 1
        client.close()
    finally:
        server.stop()


def test_durable_publish_on_redis_7_0_needs_replicas(api, prefix):
    # given Redis 7.0 (no WAITAOF) and no replica required
    server = start_server("redis", appendonly=True)
    try:
        client = connect_as(api, server.url, prefix=prefix, durable_replicas=0)
        # when publishing durably, then the server cannot confirm anything and says so
        with pytest.raises(rqueue.NotDurable, match="WAITAOF"):
            client.queue("orders").publish(b"a", durable=True)
        client.close()
    finally:
        server.stop()


def test_durable_publish_in_memory_is_refused_after_storing(api, prefix):
    # given the in-process server, which keeps nothing on disk
    client = connect_as(api, "memory://durable", prefix=prefix, durable_replicas=0)
    # when publishing durably, then it is not confirmed durable, and the message is stored
    with pytest.raises(rqueue.NotDurable, match="refused WAIT"):
        client.queue("orders").publish(b"a", durable=True)
    assert client.queue("orders").stats().last_seq == 1
    client.close()


def test_durable_must_be_a_bool(client, queue):
    # given a durable flag that is not a bool, then nothing is stored
    with pytest.raises(rqueue.InvalidInput, match="durable must be True or False, not 'yes'"):
        queue.publish(b"a", durable="yes")
    assert queue.stats().last_seq == 0
