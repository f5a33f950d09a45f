"""Flow control's cost: each feature on beside the plain path, in one run
on one private server (docs/flow-control.md, docs/performance.md).

usage: .venv/bin/python benchmarks/flow_bench.py [--messages N] [--runs R] [--url URL] [--json]

Without --url a private redis-server is started on a free loopback port,
without persistence, and stopped at the end.

Each case preloads N messages of 100 bytes (untimed), then drains them with
fetch(100) and an ack of the whole batch, one call in flight at a time, and
reports wall-clock microseconds per message, the median over --runs. The
cases of one run are measured back to back, their order rotating between
runs, so that a loaded machine moves them alike; the ratio to "plain" is
what to read:

  plain            a queue that never used flow control
  paused_resumed   the group and the queue were paused and resumed first
  hold             the queue is on hold: the N messages were published before
                   the hold, as many after it wait (held) behind them
  priority_seen    one message with a priority was published (and handed
                   out) first: the queue reads its priority log from then on,
                   the N messages are plain
  priority_all     every message has a priority, 1 to 9 in turn
  publish_plain    publish_many(100), no priority (us per message)
  publish_priority publish_many(100), priorities 1 to 9 in turn

The plain path's own cost before and after a change is counted in
instructions by benchmarks/icount.py, which a loaded machine does not move.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable

import rqueue
from rqueue.embedded import EmbeddedServer

PAYLOAD = b"x" * 100
BATCH = 100
Case = Callable[[rqueue.Client, int], float]


def drain(q: rqueue.Queue, n: int) -> float:
    """Seconds to fetch(100) and ack the N messages of ``q``'s group."""
    c = q.consumer("g")
    got = 0
    start = time.perf_counter()
    while got < n:
        batch = c.fetch(BATCH)
        if not batch:
            raise SystemExit(f"{q.name}: {got} of {n} handed out, then nothing")
        c.ack(batch)
        got += len(batch)
    took = time.perf_counter() - start
    c.close()
    return took


def fresh(client: rqueue.Client) -> rqueue.Queue:
    q = client.queue(f"flow.{uuid.uuid4().hex[:8]}")
    assert isinstance(q, rqueue.Queue)
    q.consumer("g").close()  # the group exists before the publishes
    return q


def fill(q: rqueue.Queue, n: int, priority: bool = False) -> None:
    for start in range(0, n, 1000):
        k = min(1000, n - start)
        q.publish_many([PAYLOAD] * k, priority=[1 + (start + i) % 9 for i in range(k)] if priority else None)


def plain(client: rqueue.Client, n: int) -> float:
    q = fresh(client)
    fill(q, n)
    return drain(q, n)


def paused_resumed(client: rqueue.Client, n: int) -> float:
    q = fresh(client)
    q.pause("g")
    q.pause(mode="refuse")
    q.resume("g")
    q.resume()
    fill(q, n)
    return drain(q, n)


def hold(client: rqueue.Client, n: int) -> float:
    q = fresh(client)
    fill(q, n)
    q.pause(mode="hold")
    fill(q, n)
    took = drain(q, n)
    q.purge()
    return took


def priority_seen(client: rqueue.Client, n: int) -> float:
    q = fresh(client)
    q.publish(PAYLOAD, priority=5)
    c = q.consumer("g")
    c.ack(c.fetch(1))
    c.close()
    fill(q, n)
    return drain(q, n)


def priority_all(client: rqueue.Client, n: int) -> float:
    q = fresh(client)
    fill(q, n, priority=True)
    return drain(q, n)


def publishing(priority: bool) -> Case:
    def case(client: rqueue.Client, n: int) -> float:
        q = fresh(client)
        prios = [1 + i % 9 for i in range(BATCH)] if priority else None
        start = time.perf_counter()
        for _ in range(n // BATCH):
            q.publish_many([PAYLOAD] * BATCH, priority=prios)
        took = time.perf_counter() - start
        q.purge()
        return took

    return case


CASES: dict[str, Case] = {
    "plain": plain,
    "paused_resumed": paused_resumed,
    "hold": hold,
    "priority_seen": priority_seen,
    "priority_all": priority_all,
    "publish_plain": publishing(False),
    "publish_priority": publishing(True),
}
BASE = {"publish_plain": "publish_plain", "publish_priority": "publish_plain"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--url", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        client = rqueue.connect(url, prefix=f"flowbench-{uuid.uuid4().hex[:6]}")
        client.configure("flow.*", prefetch=10**6, max_inflight=10**6, ack_wait=3600)
        names = list(CASES)
        plain(client, 2000)  # warm-up: scripts loaded, connections made
        samples: dict[str, list[float]] = {k: [] for k in names}
        for run in range(args.runs):
            order = names[run % len(names) :] + names[: run % len(names)]
            for name in order:
                samples[name].append(CASES[name](client, args.messages) / args.messages * 1e6)
        client.close()
    finally:
        if server is not None:
            server.stop()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    report = {
        k: {"us_per_msg": round(m, 3), "ratio": round(m / medians[BASE.get(k, "plain")], 3)} for k, m in medians.items()
    }
    if args.json:
        print(json.dumps({"messages": args.messages, "runs": args.runs, "cases": report}, indent=2))
    else:
        print(f"{args.messages} messages per case, median of {args.runs} runs (ratio: to plain, or publish_plain)")
        for k, v in report.items():
            print(f"  {k:18s} {v['us_per_msg']:9.3f} us/msg   x{v['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
