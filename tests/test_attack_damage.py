"""Faults found by attack (a helper's, 2026-11-27): single keys of a queue
deleted, and a queue delete cut off between its DEL calls. Each test is a
given/when/then against a real private server; the promise they hold the
code to is guarantee 15 (a missing key a script meets is reported, never
passed over) and guarantee 3 (no handler for a message its group acked)."""

from __future__ import annotations

import pytest
import redis

import rqueue
from rqueue.engine import store


@pytest.mark.parametrize("dels", [1, 2, 3])
def test_a_queue_delete_cut_off_between_its_dels_can_be_run_again_to_the_end(client, queue, monkeypatch, dels):
    # given a queue with more keys than one DEL takes: groups with acked
    # runs, a delayed nack and deliveries returned to ready
    if client.cluster:
        pytest.skip("the cut is made on the single-server client")
    monkeypatch.setattr(store, "DELETE_BATCH", 10)
    groups = [f"g{i}" for i in range(6)]
    for g in groups:
        queue.consumer(g).close()
    queue.publish_many([f"m{i}".encode() for i in range(6)])
    for g in groups:
        c = queue.consumer(g, name="a")
        ds = c.fetch(6)
        c.ack([ds[0], ds[2]])
        ds[1].nack(delay=30)
        c.close()  # 4, 5 and 6 back to ready
    # when a delete is cut off after its first DELs (the process killed,
    # the connection lost), and then run again
    real = client.redis.delete
    calls = []

    def cut(*keys: str) -> int:
        calls.append(keys)
        if len(calls) > dels:
            raise redis.ConnectionError("killed")
        return real(*keys)

    monkeypatch.setattr(client.redis, "delete", cut)
    with pytest.raises(rqueue.RQueueError):
        queue.delete()
    monkeypatch.setattr(client.redis, "delete", real)
    queue.delete()
    # then no key of the queue is left
    assert client.redis.keys(f"{client.prefix}:*{{orders}}*") == []
    # and a queue made again under the name hands each new message out once
    again = client.queue("orders")
    c = again.consumer("g5", name="b")
    again.publish_many([f"n{i}".encode() for i in range(6)])
    assert sorted(d.data for d in c.fetch(20)) == sorted(f"n{i}".encode() for i in range(6))
