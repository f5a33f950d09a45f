"""The client: loading scripts, the connections script calls take, lost
replies (a script call is never sent twice), and the queue registry."""

from __future__ import annotations

import os
import threading
from collections import Counter

import pytest
import redis
from support.servers import wait_for

import rqueue
from rqueue.connection.cluster import not_run
from rqueue.constants import MAX_BATCH
from rqueue.engine.direct import ScriptConnections


def test_scripts_reload_after_script_flush(client, queue):
    # given scripts already loaded on the server
    queue.publish(b"a")
    c = queue.consumer("g")
    # when the server forgets every script (as after a restart)
    client.redis.script_flush()
    # then the next calls load them again transparently
    queue.publish(b"b")
    assert [d.data for d in c.fetch(10)] == [b"a", b"b"]


def test_queue_registry_lists_written_queues(client):
    # given a queue published to, one with a group, and one only named
    client.queue("a").publish(b"x")
    client.queue("b").consumer("g")
    client.queue("never-used")
    # then the registry lists the two that were written to
    assert client.queues() == ["a", "b"]


# -- the connections of script calls ---------------------------------------------------------


def _client_ids(admin: redis.Redis) -> set[int]:
    return {int(c["id"]) for c in admin.client_list()}


def _script_connection_id(client: rqueue.Client) -> int:
    """CLIENT ID of the connection the client's script calls take next."""
    connections = client.scripts.connections
    assert connections is not None
    conn = connections.get_connection()
    try:
        conn.send_command("CLIENT", "ID")
        return int(conn.read_response())
    finally:
        connections.release(conn)


@pytest.mark.parametrize("backend", ["redis", "valkey"], indirect=True)
def test_a_script_connection_the_server_closed_is_replaced_before_a_call(backend, prefix):
    # given a client whose script calls have a connection open
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"a")
    # when the server closes every connection but the admin's
    admin = redis.Redis.from_url(backend)
    admin.client_kill_filter(_type="normal", skipme=True)
    # then the next call goes through on a new connection (a script call is
    # never sent twice, so without the check it would fail) and is stored once
    assert q.publish(b"b").seq == 2
    assert [d.data for d in q.consumer("g").fetch(10)] == [b"a", b"b"]
    client.close()
    admin.close()


@pytest.mark.parametrize("backend", ["redis", "valkey"], indirect=True)
def test_closing_a_client_closes_its_script_connections(backend, prefix):
    # given a client that has made script calls from two threads at once
    admin = redis.Redis.from_url(backend)
    before = _client_ids(admin)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=lambda: (barrier.wait(), q.publish_many([b"m"] * 100))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    script_id = _script_connection_id(client)
    assert script_id in _client_ids(admin)
    # when it is closed
    client.close()
    # then none of its connections stays open on the server
    wait_for(lambda: _client_ids(admin) <= before | {admin.client_id()})
    admin.close()


@pytest.mark.parametrize("backend", ["redis", "valkey"], indirect=True)
def test_a_forked_child_makes_its_own_script_connections(backend, prefix):
    # given a client whose script calls have a connection open
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"parent")
    parent_id = _script_connection_id(client)
    # when a forked child publishes through the same client
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its connection, then leave at once
        try:
            q.publish(b"child")
            os.write(write_end, str(_script_connection_id(client)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child_id = int(os.read(read_end, 100) or b"0")
    os.close(read_end)
    os.waitpid(pid, 0)
    # then it used a connection of its own, and the parent's still works
    assert child_id not in (0, parent_id)
    assert q.publish(b"parent again").seq == 3
    assert _script_connection_id(client) == parent_id
    assert [d.data for d in q.consumer("g").fetch(10)] == [b"parent", b"child", b"parent again"]
    client.close()


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_script_connections_hold_the_pools_max_connections(backend):
    # given the connections of a pool that allows one
    connections = ScriptConnections(redis.ConnectionPool.from_url(backend, max_connections=1))
    first = connections.get_connection()
    # when a second is asked for while the first is in use, it is refused
    with pytest.raises(redis.exceptions.MaxConnectionsError):
        connections.get_connection()
    # then the first, once returned, is the one handed out again
    connections.release(first)
    assert connections.get_connection() is first
    connections.disconnect()


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_script_calls_take_redis_pys_pool_where_it_does_more_than_hand_out_connections(backend):
    # given a blocking pool (it waits for a free connection) and a
    # single-connection client (it has one)
    # then their script calls keep going through redis-py: no connections of
    # their own; a plain pool's script calls get theirs
    assert ScriptConnections.of(redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(backend))) is None
    single = redis.Redis.from_url(backend, single_connection_client=True)
    assert ScriptConnections.of(single) is None
    assert ScriptConnections.of(redis.Redis.from_url(backend)) is not None
    single.close()


# -- lost replies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["cluster", "redis"], indirect=True)
def test_a_lost_reply_never_runs_a_script_twice(backend, prefix):
    # given a client whose replies time out before a big publish_many is answered
    setup = rqueue.connect(backend, prefix=prefix)
    setup.configure("orders", max_payload=10_000_000)
    hasty = rqueue.connect(backend, prefix=prefix, socket_timeout=0.03, failover_timeout=1.0)
    q = hasty.queue("orders")
    q.publish(b"warm-up")
    attempts = 0
    # (12 tries: under the suite's load the 4 MB send alone can outlast the
    # timeout several times in a row, and nothing of that try runs)
    for attempt in range(12):
        # when the reply is lost (a timeout, whichever layer reports it)
        attempts += 1
        with pytest.raises(Exception):  # noqa: B017
            # (one script call of MAX_BATCH records of 4,000 bytes: the stream
            # layout stores 2,000-byte ones within the timeout on a quiet machine)
            q.publish_many([bytes([ord("a") + attempt]) * 4000] * MAX_BATCH)
        # (on a loaded machine the send itself can time out, and nothing runs:
        # that attempt is repeated; or the server runs it only after this read)
        if setup.queue("orders").stats().last_seq > 1:
            break
    # then each attempt's batch was stored once or not at all, never sent again:
    # a retry would have run before the error was raised (cluster calls are
    # retried only when their reply proves they did not run)
    reader = setup.queue("orders")
    per_attempt: Counter[bytes] = Counter()
    after = 1
    while page := reader.peek(1000, after=after):
        per_attempt.update(m.data[:1] for m in page)
        after = page[-1].seq
    assert per_attempt, "every attempt timed out before its batch was sent"
    assert set(per_attempt.values()) == {MAX_BATCH}
    assert set(per_attempt) <= {bytes([ord("a") + a]) for a in range(attempts)}
    hasty.close()
    setup.close()


# The retry policy of cluster calls: only an error that proves the call was
# never run counts as "not run" and may be retried.


@pytest.mark.parametrize(
    "error, expected",
    [
        ("ConnectionError:Error 111 connecting to 127.0.0.1:1. Connection refused.", True),
        ("ConnectionError:Connection closed by server.", False),
        ("ConnectionError:Error while reading from 127.0.0.1:7000 : (104, 'Connection reset by peer')", False),
        ("TimeoutError:Timeout connecting to server", True),
        ("TimeoutError:Timeout reading from socket", False),
        ("MovedError:3999 127.0.0.1:6381", True),
        ("TryAgainError:", True),
        ("ClusterDownError:The cluster is down", True),
        ("ReadOnlyError:You can't write against a read only replica.", True),
        ("ResponseError:WRONGTYPE", False),
    ],
)
def test_only_errors_that_prove_a_call_never_ran_count_as_not_run(error, expected):
    kind, _, text = error.partition(":")
    assert not_run(getattr(redis.exceptions, kind)(text)) is expected


def test_cluster_cannot_be_connected_counts_only_when_it_hides_no_lost_reply():
    # raised while refreshing the slot map right after a lost reply: the call may have run
    try:
        try:
            raise redis.ConnectionError("Connection closed by server.")
        except redis.ConnectionError:
            # raised without "from": the lost reply is only the implicit context, as in redis-py
            raise redis.exceptions.RedisClusterException(  # noqa: B904
                "Redis Cluster cannot be connected. Please provide ..."
            )
    except redis.exceptions.RedisClusterException as exc:
        assert not not_run(exc)
    # raised before anything was sent
    assert not_run(redis.exceptions.RedisClusterException("Redis Cluster cannot be connected. Please provide ..."))
