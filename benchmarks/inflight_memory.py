"""Redis memory per queued message and per message in flight, next to a
Redis stream entry and its consumer group's PEL entry (issue 24's memory
targets; docs/layout-d-plan.md, step 8).

Starts a private redis-server, publishes N 100-byte messages to a queue of
the client's layout (RQUEUE_EXPERIMENTAL_LAYOUT), has one consumer fetch
them all in fetch(100) calls and hold them, and prints the used_memory
deltas per message; then the same with XADD and XREADGROUP on a stream.

usage: [RQUEUE_EXPERIMENTAL_LAYOUT=stream] .venv/bin/python benchmarks/inflight_memory.py [N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.servers import start_server  # noqa: E402

import rqueue  # noqa: E402

BATCH = 1_000
PAYLOAD = b"p" * 100


def rqueue_figures(client: rqueue.Client, n: int) -> tuple[float, float, int]:
    """Bytes per queued message, per message held, and how many were held."""
    client.configure("orders", max_inflight=10 * n, prefetch=10 * n)
    q = client.queue("orders")
    q.publish(PAYLOAD)
    consumer = q.consumer("g")
    consumer.ack(consumer.fetch(1))  # the group and its keys exist before the first reading
    used = client.redis.info("memory")["used_memory"]
    for _ in range(0, n, BATCH):
        q.publish_many([PAYLOAD] * BATCH)
    queued = client.redis.info("memory")["used_memory"]
    held = 0
    while held < n and (got := consumer.fetch(100)):
        held += len(got)
    inflight = client.redis.info("memory")["used_memory"]
    return (queued - used) / n, (inflight - queued) / n, held


def streams_figures(client: rqueue.Client, n: int) -> tuple[float, float, int]:
    """The same for a stream and its consumer group (entries, PEL entries)."""
    r = client.redis
    key = "inflight-bench-stream"
    r.xadd(key, {"p": PAYLOAD})
    r.xgroup_create(key, "g", id="0")
    r.xreadgroup("g", "c", {key: ">"}, count=1)
    used = r.info("memory")["used_memory"]
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(key, {"p": PAYLOAD})
        if i % BATCH == BATCH - 1:
            pipe.execute()
    pipe.execute()
    queued = r.info("memory")["used_memory"]
    held = 0
    while held < n and (got := r.xreadgroup("g", "c", {key: ">"}, count=100)):
        held += len(got[0][1])
    inflight = r.info("memory")["used_memory"]
    return (queued - used) / n, (inflight - queued) / n, held


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    server = start_server("redis")
    try:
        client = rqueue.connect(server.url, prefix="inflight-bench")
        version = client.redis.info("server")["redis_version"]
        print(f"Redis {version}, {n} messages of {len(PAYLOAD)} bytes, layout {client.log_layout.value}")
        for label, measure in (("rqueue", rqueue_figures), ("Streams", streams_figures)):
            queued, inflight, held = measure(client, n)
            print(f"{label}: {queued:.1f} B per queued message, {inflight:.1f} B per message in flight ({held} held)")
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
