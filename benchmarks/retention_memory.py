"""Redis memory per message kept by retention (docs/retention.md).

Starts a private redis-server, publishes N 100-byte messages to a queue
with one group that settles them all, runs a trim step, and prints
used_memory per message: without retention (every record deleted) and with
max_length above N (every record kept).

usage: .venv/bin/python benchmarks/retention_memory.py [N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.servers import start_server  # noqa: E402

import rqueue  # noqa: E402
from rqueue.engine import log  # noqa: E402

BATCH = 5_000


def drain(consumer: rqueue.Consumer) -> None:
    while batch := consumer.fetch(1_000):
        consumer.ack(batch)


def measure(client: rqueue.Client, name: str, n: int) -> tuple[int, float]:
    """Records stored and bytes per message after n are published and settled."""
    q = client.queue(name)
    q.publish(b"warm-up")
    consumer = q.consumer("g")
    drain(consumer)
    before = client.redis.info("memory")["used_memory"]
    for _ in range(0, n, BATCH):
        q.publish_many([b"p" * 100] * BATCH)
    drain(consumer)
    q.trim()
    after = client.redis.info("memory")["used_memory"]
    # The records kept: fields of the hash log, or entries of the stream log.
    kept = client.redis.xlen(q.keys.msgs) if log.stream(q.keys) else client.redis.hlen(q.keys.msgs)
    return kept, (after - before) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    server = start_server("redis")
    try:
        client = rqueue.connect(server.url, prefix="retention-bench")
        client.configure("kept", max_length=10 * n)
        version = client.redis.info("server")["redis_version"]
        for label, name in (("no retention", "plain"), (f"max_length={10 * n}", "kept")):
            count, per = measure(client, name, n)
            print(f"Redis {version}, {label}: {count} records stored, {per:.1f} B per message")
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
