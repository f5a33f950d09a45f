"""What idle consumers cost a publisher: publish() call time with N idle
consumers of one queue, waiting on the channel (the default) or with
wait_in_redis, where one of them, the queue's waiter, waits in Redis and the
rest on the channel (docs/design.md, "Wake-ups").

usage: .venv/bin/python benchmarks/idle_herd.py [--consumers 1,4,16] [--publishes 300]
           [--gap 0.01] [--runs 3] [--json FILE]

A private redis-server (no persistence) on a free loopback port. Each
consumer is a process of its own looping fetch(1, timeout=5) and ack. The
publisher publishes one message every --gap seconds, so every consumer is
idle again before the next one, and times each publish() call. The variants
take turns per run; each figure is the median of --runs runs [min-max].
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rqueue  # noqa: E402
from rqueue.embedded import EmbeddedServer  # noqa: E402

QUEUE = "herd"


def consume(url: str, prefix: str, wait_in_redis: bool, stop: mp.Event, ready: mp.Event) -> None:
    client = rqueue.connect(url, prefix=prefix)
    c = client.queue(QUEUE).consumer("g", wait_in_redis=wait_in_redis)
    ready.set()
    while not stop.is_set():
        got = c.fetch(1, timeout=0.5)
        if got:
            c.ack(got)
    client.close()


def measure(url: str, n: int, wait_in_redis: bool, publishes: int, gap: float, run: int) -> dict[str, float]:
    prefix = f"herd{run}{n}{int(wait_in_redis)}"
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(n)]
    procs = [ctx.Process(target=consume, args=(url, prefix, wait_in_redis, stop, r)) for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(60)
    client = rqueue.connect(url, prefix=prefix)
    q = client.queue(QUEUE)
    time.sleep(1.0)  # every consumer has found nothing and waits
    times: list[float] = []
    for _ in range(publishes):
        started = time.perf_counter()
        q.publish(b"x" * 100)
        times.append((time.perf_counter() - started) * 1e6)
        time.sleep(gap)
    deadline = time.monotonic() + 30
    while q.stats().group("g").pending and time.monotonic() < deadline:
        time.sleep(0.05)
    left = q.stats().group("g").pending
    stop.set()
    for p in procs:
        p.join(10)
    client.close()
    times = times[len(times) // 10 :]
    qs = statistics.quantiles(times, n=10)
    return {"p50_us": statistics.median(times), "p90_us": qs[8], "left": float(left)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--consumers", default="1,4,16")
    parser.add_argument("--publishes", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    server = EmbeddedServer(binary=shutil.which("redis-server")).start()
    url = server.url
    figures: dict[str, list[dict[str, float]]] = {}
    try:
        for run in range(args.runs):
            for n in (int(x) for x in args.consumers.split(",")):
                order = [False, True] if run % 2 == 0 else [True, False]
                for flag in order:
                    key = f"{n} {'wait_in_redis' if flag else 'channel'}"
                    figures.setdefault(key, []).append(measure(url, n, flag, args.publishes, args.gap, run))
                    print(key, figures[key][-1], flush=True)
    finally:
        server.stop()
    print("\npublish() call time, µs: median of runs [min-max]")
    print("| idle consumers | channel p50 / p90 | wait_in_redis p50 / p90 |")
    print("|---|---|---|")
    for n in (int(x) for x in args.consumers.split(",")):
        cells = []
        for flag in ("channel", "wait_in_redis"):
            rows = figures[f"{n} {flag}"]
            p50 = [r["p50_us"] for r in rows]
            p90 = [r["p90_us"] for r in rows]
            cells.append(
                f"{statistics.median(p50):.0f} [{min(p50):.0f}-{max(p50):.0f}] / "
                f"{statistics.median(p90):.0f} [{min(p90):.0f}-{max(p90):.0f}]"
            )
        print(f"| {n} | {cells[0]} | {cells[1]} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
