"""Soak: many messages through a worker leave nothing behind. CI runs 20,000;
RQUEUE_SOAK_MESSAGES=1000000 runs the long version by hand."""

from __future__ import annotations

import os

import pytest
import redis
from conftest import start_server, wait_for

import rqueue

MESSAGES = int(os.environ.get("RQUEUE_SOAK_MESSAGES", "20000"))


@pytest.fixture
def server():
    s = start_server("redis")
    yield s
    s.stop()


def keys_of(r: redis.Redis, prefix: str) -> list[bytes]:
    return list(r.scan_iter(match=f"{prefix}:*", count=1000))


def test_soak_leaves_no_state_behind(server, prefix):
    r = redis.Redis(port=server.port)
    client = rqueue.connect(server.url, prefix=prefix, settings_ttl=0)
    # The baseline is taken warm: every script loaded and the connections
    # open, since those stay whatever rqueue cleans up.
    warm = client.queue("warm")
    warm.publish(b"x")  # no id: an id key would outlive the delete until its window ends
    ww = rqueue.Worker(warm, "g", lambda d: None, concurrency=8)
    ww.start()
    wait_for(lambda: warm.stats().groups and warm.stats().group("g").ack_floor == 1)
    ww.stop()
    assert ww.join(10)
    warm.consumer("g").fetch(1, timeout=0.01)
    warm.delete()
    baseline = r.info("memory")["used_memory"]
    client.configure("soak", dedup_window=1)
    q = client.queue("soak")
    w = rqueue.Worker(q, "g", lambda d: None, concurrency=8)
    w.start()
    for start in range(0, MESSAGES, 1000):
        ids = [f"m{i}" for i in range(start, min(start + 1000, MESSAGES))]
        q.publish_many([b"x" * 100] * len(ids), ids=ids)
    wait_for(lambda: q.stats().group("g").ack_floor == MESSAGES, timeout=600)
    w.stop()
    assert w.join(30)
    peak = r.info("memory")["used_memory"]
    # then the group's bookkeeping has compacted to nothing
    gk = q.keys.group("g").as_list()
    # (of the delivery states and leases only the pins are left: delivery_state.lua, group_keys.lua)
    assert (r.hlen(q.keys.msgs), r.hlen(q.keys.settled), r.zcard(gk[9]), r.hkeys(gk[8])) == (0, 0, 0, [b"pin"])
    assert [m[:4] for m in r.zrange(gk[5], 0, -1)] == [b"pin:"] and r.zscore(gk[5], r.zrange(gk[5], 0, 0)[0]) == float(
        "inf"
    )
    # and the de-duplication ids expire by themselves
    wait_for(lambda: not any(b":id:" in k for k in keys_of(r, prefix)), timeout=60, interval=0.5)
    # and deleting the queue leaves no key at all, and memory at its baseline
    q.delete()
    r.delete(f"{prefix}:settings")
    assert keys_of(r, prefix) == []
    settled = wait_for(
        lambda: (m := r.info("memory")["used_memory"]) - baseline < 256 * 1024 and m, timeout=20, interval=0.5
    )
    print(f"soak: {MESSAGES} messages; used_memory baseline {baseline}, peak {peak}, after {settled}")
    client.close()


def test_delete_removes_every_key_of_the_queue_only(backend, prefix):
    client = rqueue.connect(backend, prefix=prefix)
    q, other = client.queue("orders"), client.queue("orders2")
    q.publish_many([b"a", b"b"], ids=["a", "b"])
    other.publish(b"keep")
    c = q.consumer("g")
    c.fetch()[0].reject()
    assert q.delete() > 0
    r = client.redis
    left = [k for k in r.scan_iter(match=f"{prefix}:*") if b"{orders}" in k]
    # only the de-duplication ids stay, until their window ends
    assert sorted(left) == sorted(k.encode() for k in (q.keys.message_id("a"), q.keys.message_id("b")))
    assert all(0 < r.pttl(k) <= 120_000 for k in left)
    assert client.queues() == ["orders2"] and other.stats().depth == 1
    client.close()
