"""Latency publish -> handler start of one Worker (concurrency 4, no-op
handler) at 1,000 msg/s, with the setting wait_in_redis off or on.

usage: .venv/bin/python benchmarks/worker_latency.py off|on

A private redis-server on a free loopback port; the worker runs in a process
of its own, the publisher in this one (one publish() per message, the
publish time in the payload). 3,000 messages, the first 10 % not counted.
Run the two settings in turns: the figures move by 0.1-0.3 ms at p99 from
run to run on shared cores.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rqueue  # noqa: E402
from rqueue.embedded import EmbeddedServer  # noqa: E402

MESSAGES = 3000
RATE = 1000.0


def work(url: str, wait_in_redis: bool, ready: Any, stop: Any, out: Any) -> None:
    client = rqueue.connect(url, prefix="w")
    client.configure("lw", wait_in_redis=wait_in_redis)
    lat: list[float] = []
    w = rqueue.Worker(client.queue("lw"), "g", lambda d: lat.append(time.time() - float(d.data)), concurrency=4)
    w.start()
    time.sleep(0.5)
    ready.set()
    stop.wait()
    w.stop()
    w.join(10)
    out.put(lat)


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in ("off", "on"):
        sys.exit(__doc__)
    server = EmbeddedServer(binary=shutil.which("redis-server")).start()
    try:
        ctx = mp.get_context("spawn")
        ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        p = ctx.Process(target=work, args=(server.url, sys.argv[1] == "on", ready, stop, out))
        p.start()
        ready.wait(30)
        queue = rqueue.connect(server.url, prefix="w").queue("lw")
        time.sleep(0.5)
        started = time.perf_counter()
        for i in range(MESSAGES):
            queue.publish(repr(time.time()).encode())
            due = started + (i + 1) / RATE
            while time.perf_counter() < due:
                time.sleep(0.0002)
        time.sleep(0.5)
        stop.set()
        lat = sorted(out.get(timeout=20)[MESSAGES // 10 :])
        p.join(10)
    finally:
        server.stop()
    p50, p90, p99 = (lat[int(len(lat) * q)] * 1000 for q in (0.5, 0.9, 0.99))
    print(f"wait_in_redis {sys.argv[1]}: n {len(lat)}, p50 {p50:.3f} ms, p90 {p90:.3f} ms, p99 {p99:.3f} ms")


if __name__ == "__main__":
    main()
