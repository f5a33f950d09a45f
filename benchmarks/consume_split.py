"""Where the time of a fetch(100) + ack loop goes: wall, client CPU and
Redis CPU per message, for rqueue and for redis-py Streams.

The bench's consume_batch figure gives wall time and the client's CPU; this
adds the server's, read from INFO cpu (user and system) around each loop,
so that a ratio to Streams can be split into the client's share and
Redis's. Each turn runs rqueue's loop and then Streams' on a private
redis-server on a free port (rqueue.embedded.EmbeddedServer), each on a
queue or stream of its own filled before the loop; the medians of the
turns are printed. To compare checkouts, run it with PYTHONPATH=<checkout>,
in turns.

usage: .venv/bin/python benchmarks/consume_split.py [N] [TURNS] [BATCH]
  N messages a loop (default 20000), TURNS turns (default 4), BATCH
  messages a fetch (default 100). Needs redis-server on PATH.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import redis
from consume_loops import PAYLOAD, drain_rqueue, drain_streams, fill_stream

import rqueue
from rqueue.embedded import EmbeddedServer


def server_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(r: redis.Redis, n: int, loop: Callable[[], None]) -> tuple[float, float, float]:
    """Wall, client CPU and server CPU of ``loop``, in µs per message."""
    wall, cpu, server = time.perf_counter(), time.process_time(), server_cpu(r)
    loop()
    return (
        (time.perf_counter() - wall) / n * 1e6,
        (time.process_time() - cpu) / n * 1e6,
        (server_cpu(r) - server) / n * 1e6,
    )


def rqueue_turn(url: str, r: redis.Redis, turn: int, n: int, batch: int) -> tuple[float, float, float]:
    client = rqueue.connect(url, prefix=f"split{turn}")
    client.configure("q", ack_wait=3600, prefetch=10**6, max_inflight=10**6)
    queue = client.queue("q")
    consumer = queue.consumer("g", "c1")
    for _ in range(0, n + batch, 1000):
        queue.publish_many([PAYLOAD] * 1000)
    consumer.ack(consumer.fetch(batch))  # scripts loaded, the call spans known
    try:
        return measure(r, n, partial(drain_rqueue, consumer, n, batch))
    finally:
        client.close()


def streams_turn(r: redis.Redis, turn: int, n: int, batch: int) -> tuple[float, float, float]:
    key = f"split-st{turn}"
    fill_stream(r, key, n)
    return measure(r, n, partial(drain_streams, r, key, n, batch))


def main() -> int:
    args = sys.argv[1:]
    if any(not a.isdigit() for a in args):
        print(__doc__)
        return 2
    n = int(args[0]) if len(args) > 0 else 20000
    turns = int(args[1]) if len(args) > 1 else 4
    batch = int(args[2]) if len(args) > 2 else 100
    with EmbeddedServer(binary="redis-server") as server:
        r = redis.Redis.from_url(server.url)
        rows: dict[str, list[tuple[float, float, float]]] = {"rqueue": [], "streams": []}
        for turn in range(turns):
            rows["rqueue"].append(rqueue_turn(server.url, r, turn, n, batch))
            rows["streams"].append(streams_turn(r, turn, n, batch))
        print(f"fetch({batch}) + ack, µs per message, medians of {turns} turns of {n} (rqueue from {rqueue.__file__})")
        medians = {}
        for name, runs in rows.items():
            medians[name] = [statistics.median(run[i] for run in runs) for i in range(3)]
            wall, client, redis_cpu = medians[name]
            print(f"  {name:8} wall {wall:.2f}  client CPU {client:.2f}  Redis CPU {redis_cpu:.2f}")
        print(f"  ratio (Streams' wall / rqueue's): {medians['streams'][0] / medians['rqueue'][0]:.2f}")
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
