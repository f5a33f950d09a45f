"""What the dashboard's overview costs with many queues (issue 23): time to
read and render it, and the round trips it makes to Redis, next to the
CLI's per-queue reading (Queue.stats() for each queue, as `rqueue queues`
does) measured in the same run on the same server.

usage: .venv/bin/python benchmarks/dashboard_bench.py [--queues N] [--runs R] [--json] [--binary PATH]

A private server (redis-server or valkey-server, on a free loopback port,
without persistence; never the shared Redis on 6379) holds N queues (default
1,000), each with 5 messages, a group with a consumer holding one delivery,
one dead letter, and every tenth queue partitioned (3 partitions). Timed,
each --runs times (median, min-max), after one untimed warm-up:

  overview   Client.overview(): every queue's figures;
  page       GET / of rqueue.dashboard.app (Starlette's TestClient, in
             process): the overview read and the whole HTML page rendered
             (the app's one-second sharing of the overview between viewers
             is turned off, so that each request reads it);
  fragment   GET /fragment/overview: what a live page asks for every 2 s;
  per_queue  the reference: client.queue(name).stats() for every queue.

Round trips are counted on the client (each write of a command or pipeline
to a socket, redis-py's send_packed_command) and commands on the server
(INFO commandstats, the calls of every command, before and after). Progress
goes to stderr, the table (or with --json one JSON object) to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import redis

import rqueue
from rqueue.embedded import EmbeddedServer, find_binary

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # newer Starlette asks for httpx2 (a warning of its own class); httpx works alike
    from starlette.testclient import TestClient

from rqueue.dashboard import app  # noqa: E402  (after the TestClient import, under its warning filter)

MESSAGES = 5
PARTITIONED_EVERY = 10


class Counter:
    """Counts what redis-py sends: one call per round trip."""

    def __init__(self) -> None:
        self.sent = 0
        self._original = redis.connection.AbstractConnection.send_packed_command
        counter = self

        def counting(conn: Any, command: Any, check_health: bool = True) -> None:
            counter.sent += 1
            counter._original(conn, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]

    def close(self) -> None:
        redis.connection.AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]


def commands(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def fill(client: rqueue.Client, n: int) -> None:
    for i in range(n):
        name = f"queue-{i:04d}"
        q = client.queue(name, partitions=3) if i % PARTITIONED_EVERY == 0 else client.queue(name)
        q.publish_many([b'{"n": %d}' % j for j in range(MESSAGES)])
        c = q.consumer("workers", "w1")
        first, second = c.fetch(2)
        c.reject(first)
        if i % 100 == 0:
            print(f"  filled {i}/{n} queues", file=sys.stderr)


def measure(what: Callable[[], Any], runs: int, counter: Counter, r: redis.Redis) -> dict[str, Any]:
    what()  # warm-up: scripts loaded, settings cached, as on a running dashboard
    times, trips, calls = [], [], []
    for _ in range(runs):
        before_calls = commands(r)
        before_trips = counter.sent  # after the INFO above, which is not the dashboard's
        start = time.perf_counter()
        what()
        times.append(time.perf_counter() - start)
        trips.append(counter.sent - before_trips)
        calls.append(commands(r) - before_calls - 1)  # minus the INFO of "before"
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "round_trips": statistics.median(trips),
        "server_commands": statistics.median(calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--binary", default=None, help="redis-server or valkey-server to start")
    args = parser.parse_args()
    with EmbeddedServer(binary=args.binary or find_binary(prefer="redis")) as server:
        print(f"server {server.url}; filling {args.queues} queues", file=sys.stderr)
        client = rqueue.connect(server.url, prefix="bench")
        fill(client, args.queues)
        admin = redis.Redis.from_url(server.url)
        served = app(client)
        served.dash.overviews.ttl = 0  # every request reads the overview (no sharing between viewers)
        web = TestClient(served)
        counter = Counter()
        try:
            found: dict[str, dict[str, Any]] = {}
            for label, call in (
                ("overview", client.overview),
                ("page", lambda: web.get("/").raise_for_status()),
                ("fragment", lambda: web.get("/fragment/overview").raise_for_status()),
                ("per_queue", lambda: [client.queue(name).stats() for name in client.queues()]),
            ):
                print(f"  timing {label}", file=sys.stderr)
                found[label] = measure(call, args.runs, counter, admin)
        finally:
            counter.close()
        page_bytes = len(web.get("/").content)
        version = admin.info("server").get("redis_version")
        client.close()
    reference = found["per_queue"]["median_s"]
    result = {
        "schema": "rqueue-dashboard-bench/1",
        "queues": args.queues,
        "runs": args.runs,
        "server": f"{server.binary} {version}",
        "page_bytes": page_bytes,
        "figures": found,
        "ratios_vs_per_queue": {k: v["median_s"] / reference for k, v in found.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    partitioned = args.queues // PARTITIONED_EVERY
    print(f"{args.queues} queues ({partitioned} of 3 partitions), {args.runs} runs, {result['server']}")
    print(f"{'figure':<10} {'median':>9} {'min-max':>17} {'round trips':>12} {'commands':>9} {'vs per_queue':>13}")
    for label, f in found.items():
        spread = f"{f['min_s'] * 1000:.0f}-{f['max_s'] * 1000:.0f} ms"
        print(
            f"{label:<10} {f['median_s'] * 1000:>6.0f} ms {spread:>17} {f['round_trips']:>12.0f} "
            f"{f['server_commands']:>9.0f} {result['ratios_vs_per_queue'][label]:>12.2f}x"
        )
    print(f"overview page: {page_bytes / 1024:.0f} KiB of HTML")


if __name__ == "__main__":
    main()
