"""Wall clock of fetch(k)+ack (rqueue, stream layout) against XREADGROUP k +
XACK (redis-py), in turns in one process on a private redis-server.

usage: RQUEUE_EXPERIMENTAL_LAYOUT=stream [PYTHONPATH=<tree>] python wall.py [k] [messages per turn] [turns]
Prints msg/s medians of each, the median of the per-turn ratios, and the
client's CPU per message (rqueue / Streams).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time

import redis

import rqueue
from rqueue.embedded import EmbeddedServer

PAYLOAD = b"x" * 100


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    turns = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    # rqueue's own private server (free port, own data directory, no persistence).
    server = EmbeddedServer(binary=shutil.which("redis-server")).start()
    try:
        r = redis.Redis(port=server.port)
        client = rqueue.connect(server.url, prefix="wall")
        client.configure("q", ack_wait=3600, prefetch=10**6, max_inflight=10**6)
        queue = client.queue("q")
        consumer = queue.consumer("g", "c1")
        rq, st, ratios, cpus = [], [], [], []
        for turn in range(turns + 1):
            queue.publish_many([PAYLOAD] * m)
            t, c = time.perf_counter(), time.process_time()
            for _ in range(m // k):
                consumer.ack(consumer.fetch(k))
            a = m / (time.perf_counter() - t)
            cpu = (time.process_time() - c) * 1e6 / m
            key = f"st{turn}"
            r.xgroup_create(key, "g", id="0", mkstream=True)
            pipe = r.pipeline(transaction=False)
            for _ in range(m):
                pipe.xadd(key, {"d": PAYLOAD})
            pipe.execute()
            t, c = time.perf_counter(), time.process_time()
            for _ in range(m // k):
                got = r.xreadgroup("g", "c", {key: ">"}, count=k)
                r.xack(key, "g", *[entry[0] for entry in got[0][1]])
            b = m / (time.perf_counter() - t)
            scpu = (time.process_time() - c) * 1e6 / m
            r.delete(key)
            if turn:  # the first is a warm-up
                rq.append(a)
                st.append(b)
                ratios.append(a / b)
                cpus.append((cpu, scpu))
        rq_cpu = statistics.median(c for c, _ in cpus)
        st_cpu = statistics.median(s for _, s in cpus)
        print(
            f"k={k} rqueue {statistics.median(rq):,.0f} msg/s, streams {statistics.median(st):,.0f} msg/s, "
            f"ratio median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}), "
            f"client CPU us/msg {rq_cpu:.2f} / {st_cpu:.2f}; "
            f"rqueue from {rqueue.__file__}"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
