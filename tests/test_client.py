"""Client plumbing: script loading, wake-ups, the queue registry."""

from __future__ import annotations

import threading

import rqueue
from conftest import wait_for


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
