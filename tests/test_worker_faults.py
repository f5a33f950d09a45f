"""The worker under faults: a handler that raises BaseException, a lease
shorter than the heartbeat interval, a server that is gone; and a bad group
name."""

from __future__ import annotations

import threading
import time

import pytest
from support.servers import start_server, wait_for

import rqueue


def test_handler_raising_base_exception_does_not_kill_the_worker(backend, prefix):
    # given a handler that raises SystemExit on the first delivery of one message
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=0.5)
    q = client.queue("orders")
    q.publish_many([b"boom", b"fine"])
    seen: list[bytes] = []

    def handler(d):
        seen.append(d.data)
        if d.data == b"boom" and d.delivery_count == 1:
            raise SystemExit("handler asked to exit")

    # when a worker runs it
    w = rqueue.Worker(q, "g", handler, concurrency=1, heartbeat_interval=0.1, heartbeat_timeout=2)
    w.start()
    wait_for(lambda: q.stats().groups and q.stats().group("g").ack_floor == 2, timeout=20)
    w.stop()
    assert w.join(10)
    # then the worker went on: that message ran again, the other once
    assert seen.count(b"boom") == 2 and seen.count(b"fine") == 1
    client.close()


def test_short_ack_wait_with_default_heartbeat_interval_still_runs_once(backend, prefix):
    # given a lease of 0.3 s, shorter than the default heartbeat interval of 1 s,
    # and a handler that takes 1 s
    client = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    client.configure("orders", ack_wait=0.3)
    q = client.queue("orders")
    q.publish(b"slow")
    runs = []

    def handler(d):
        runs.append(d.delivery_count)
        time.sleep(1.0)

    # when two workers run
    workers = [rqueue.Worker(q, "g", handler, concurrency=1) for _ in range(2)]
    for w in workers:
        w.start()
    wait_for(lambda: q.stats().groups and q.stats().group("g").ack_floor == 1, timeout=20)
    for w in workers:
        w.stop()
        assert w.join(10)
    # then the handler ran once: the worker kept the lease alive
    assert runs == [1]
    client.close()


def test_join_returns_when_run_fails(prefix):
    # given a worker whose server is gone
    server = start_server("redis")
    client = rqueue.connect(server.url, prefix=prefix)
    q = client.queue("orders")  # looks up whether the queue is partitioned
    server.stop()
    w = rqueue.Worker(q, "g", print, reconnect_timeout=0.5)
    errors = []

    def run() -> None:
        # any error will do: what is tested is that join returns
        errors.append(pytest.raises(Exception, w.run, install_signal_handlers=False))  # noqa: B017

    # when its run fails
    t = threading.Thread(target=run)
    t.start()
    # then join returns
    assert w.join(15)
    t.join(5)


def test_worker_refuses_a_bad_group_name(queue):
    # given a group name with a space, then the worker is refused
    with pytest.raises(rqueue.InvalidName, match="group"):
        rqueue.Worker(queue, "bad group", print)
