"""Soak: many messages through a worker leave nothing behind. CI runs 20,000;
RQUEUE_SOAK_MESSAGES=1000000 runs the long version by hand."""

from __future__ import annotations

import os

import pytest
import redis
from support import logview
from support.raw import group_key
from support.servers import start_server, wait_for

import rqueue
from rqueue.engine.keys import layout_key, settings_key

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
    # given a memory baseline taken warm: every script loaded and the
    # connections open, since those stay whatever rqueue cleans up
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
    # when a worker handles MESSAGES messages published with ids
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
    # (of the delivery states and leases only the pins are left: delivery_state.lua, group_keys.lua)
    acked, dlv, lease = (group_key(q, "g", name) for name in ("acked", "dlv", "lease"))
    assert (logview.count(r, q.keys), r.hlen(q.keys.settled), r.zcard(acked), r.hkeys(dlv)) == (0, 0, 0, [b"pin"])
    assert [m[:4] for m in r.zrange(lease, 0, -1)] == [b"pin:"]
    assert r.zscore(lease, r.zrange(lease, 0, 0)[0]) == float("inf")
    # and the de-duplication ids expire by themselves
    wait_for(lambda: not any(b":id:" in k for k in keys_of(r, prefix)), timeout=60, interval=0.5)
    # and deleting the queue leaves no key at all, and memory at its baseline
    q.delete()
    # (the settings and the layout marker are the prefix's, not the queue's)
    assert r.get(layout_key(prefix)) == client.log_layout.value.encode()
    r.delete(settings_key(prefix), layout_key(prefix))
    assert keys_of(r, prefix) == []
    settled = wait_for(
        lambda: (m := r.info("memory")["used_memory"]) - baseline < 256 * 1024 and m, timeout=20, interval=0.5
    )
    print(f"soak: {MESSAGES} messages; used_memory baseline {baseline}, peak {peak}, after {settled}")
    client.close()
