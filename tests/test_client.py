"""Client plumbing: script loading, wake-ups, the queue registry."""

from __future__ import annotations

import os
import threading

import pytest
import redis
from conftest import wait_for

import rqueue
from rqueue.engine.scripts import ScriptConnections


def test_scripts_reload_after_script_flush(client, queue):
    # given scripts already loaded on the server
    queue.publish(b"a")
    c = queue.consumer("g")
    # when the server forgets every script (as after a restart)
    client.redis.script_flush()
    # then the next calls load them again transparently
    queue.publish(b"b")
    assert [d.data for d in c.fetch(10)] == [b"a", b"b"]


def test_blocking_fetch_wakes_up_on_publish(backend, prefix, monkeypatch):
    # given a consumer waiting in fetch, with polling made too slow to matter
    monkeypatch.setattr(rqueue.constants, "IDLE_POLL_INTERVAL", 60.0)
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    c = q.consumer("g")
    waiting = threading.Event()
    real_wait = client.notifier.wait

    def wait(*args):
        waiting.set()
        return real_wait(*args)

    monkeypatch.setattr(client.notifier, "wait", wait)
    got: list[rqueue.Delivery] = []
    t = threading.Thread(target=lambda: got.extend(c.fetch(1, timeout=30)))
    t.start()
    wait_for(waiting.is_set)
    # when a message is published
    q.publish(b"wake")
    # then the waiting fetch returns it long before its poll or timeout
    wait_for(lambda: not t.is_alive())
    assert [d.data for d in got] == [b"wake"]
    client.close()


def test_blocking_fetch_returns_empty_after_timeout(client, queue):
    c = queue.consumer("g")
    assert c.fetch(1, timeout=0.05) == []


def test_queue_registry_lists_written_queues(client):
    client.queue("a").publish(b"x")
    client.queue("b").consumer("g")
    client.queue("never-used")
    assert client.queues() == ["a", "b"]


def test_memory_urls_with_the_same_name_share_data(prefix):
    a = rqueue.connect("memory://shared-test", prefix=prefix)
    b = rqueue.connect("memory://shared-test", prefix=prefix)
    a.queue("q").publish(b"x")
    assert b.queue("q").stats().last_seq == 1


def test_unix_socket_url(tmp_path, prefix):
    from conftest import start_server

    sock = tmp_path / "redis.sock"
    server = start_server("redis", extra_args=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    try:
        client = rqueue.connect(f"unix://{sock}", prefix=prefix)
        client.queue("q").publish(b"x")
        assert [d.data for d in client.queue("q").consumer("g").fetch()] == [b"x"]
        client.close()
    finally:
        server.stop()


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
    # Given a client whose script calls have a connection open
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"a")
    # When the server closes every connection but the admin's
    admin = redis.Redis.from_url(backend)
    admin.client_kill_filter(_type="normal", skipme=True)
    # Then the next call goes through on a new connection (a script call is
    # never sent twice, so without the check it would fail) and is stored once
    assert q.publish(b"b").seq == 2
    assert [d.data for d in q.consumer("g").fetch(10)] == [b"a", b"b"]
    client.close()
    admin.close()


@pytest.mark.parametrize("backend", ["redis", "valkey"], indirect=True)
def test_closing_a_client_closes_its_script_connections(backend, prefix):
    # Given a client that has made script calls from two threads at once
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
    # When it is closed
    client.close()
    # Then none of its connections stays open on the server
    wait_for(lambda: _client_ids(admin) <= before | {admin.client_id()})
    admin.close()


@pytest.mark.parametrize("backend", ["redis", "valkey"], indirect=True)
def test_a_forked_child_makes_its_own_script_connections(backend, prefix):
    # Given a client whose script calls have a connection open
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish(b"parent")
    parent_id = _script_connection_id(client)
    # When a forked child publishes through the same client
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
    # Then it used a connection of its own, and the parent's still works
    assert child_id not in (0, parent_id)
    assert q.publish(b"parent again").seq == 3
    assert _script_connection_id(client) == parent_id
    assert [d.data for d in q.consumer("g").fetch(10)] == [b"parent", b"child", b"parent again"]
    client.close()


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_script_connections_hold_the_pools_max_connections(backend):
    # Given the connections of a pool that allows one
    connections = ScriptConnections(redis.ConnectionPool.from_url(backend, max_connections=1))
    first = connections.get_connection()
    # When a second is asked for while the first is in use, it is refused
    with pytest.raises(redis.exceptions.MaxConnectionsError):
        connections.get_connection()
    # Then the first, once returned, is the one handed out again
    connections.release(first)
    assert connections.get_connection() is first
    connections.disconnect()


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_script_calls_take_redis_pys_pool_where_it_does_more_than_hand_out_connections(backend):
    # A blocking pool waits for a free connection, a single-connection client
    # has one; their script calls keep going through redis-py.
    assert ScriptConnections.of(redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(backend))) is None
    single = redis.Redis.from_url(backend, single_connection_client=True)
    assert ScriptConnections.of(single) is None
    assert ScriptConnections.of(redis.Redis.from_url(backend)) is not None
    single.close()
