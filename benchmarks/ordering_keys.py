"""Ordering keys: fairness across keys, and wall-clock cost beside the plain
path, in one run on one private server (docs/flow-control.md, "Ordering
keys").

usage: .venv/bin/python benchmarks/ordering_keys.py [--hot N] [--cold K] [--per M] [--url URL] [--json]

Fairness: one hot key with N messages (10,000) is published first, then K
cold keys (100) with M messages each (10). A consumer drains the queue
with fetch(100) and an ack of each batch. Reported per key_concurrency (1,
and 1,000: the hot key may run as many at once as it has room for): the
wait of the cold keys' messages, counted in deliveries handed out before
each one (median, 99th percentile, last), the fetch by which every cold
message was out, and the same for a queue without keys (FIFO: the cold
messages wait behind the whole hot backlog). A hot key cannot starve the
others when the cold keys' waits stay near K x M whatever N is.

Cost: fetch(100) + ack per message, wall clock, of a plain queue, of a
queue whose every message has its own key, and of one with 4 keys
(key_concurrency 100): the median over slices of 1,000 messages taking
turns, and its ratio to plain. Instruction counts, which a loaded machine
does not move, are benchmarks/icount.py's fetch100ack-keys100k and
fetch100ack-fewkeys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import rqueue
from rqueue.embedded import EmbeddedServer

PAYLOAD = b"x" * 100


def fairness(client: rqueue.Client, hot: int, cold: int, per: int, concurrency: int | None) -> dict[str, object]:
    """Cold keys' waits behind one hot key; ``concurrency`` None: no keys."""
    q = client.queue(f"fair.{uuid.uuid4().hex[:8]}")
    assert isinstance(q, rqueue.Queue)
    if concurrency is not None:
        client.configure(q.name, key_concurrency=concurrency)
    c = q.consumer("g", prefetch=1000)
    for start in range(0, hot, 1000):
        k = min(1000, hot - start)
        q.publish_many([b"hot"] * k, key=None if concurrency is None else "hot")
    cold_keys = [f"c{i}" for i in range(cold) for _ in range(per)]
    q.publish_many([b"cold"] * len(cold_keys), key=None if concurrency is None else cold_keys)
    handed = fetches = 0
    waits: list[int] = []
    all_cold_by = 0
    while True:
        got = c.fetch(100)
        if not got:
            break
        fetches += 1
        for d in got:
            if d.data == b"cold":
                waits.append(handed)
            handed += 1
        if len(waits) == len(cold_keys) and not all_cold_by:
            all_cold_by = fetches
        c.ack(got)
    waits.sort()
    return {
        "key_concurrency": concurrency,
        "cold_wait_median": waits[len(waits) // 2],
        "cold_wait_p99": waits[int(len(waits) * 0.99)],
        "cold_wait_last": waits[-1],
        "all_cold_out_by_fetch": all_cold_by,
        "fetches": fetches,
        "delivered": handed,
    }


def cost(client: rqueue.Client, n: int, runs: int) -> dict[str, dict[str, float]]:
    """us per message of fetch(100) + ack, per case, and the ratio to plain."""
    cases = {"plain": None, "keys_distinct": "distinct", "keys_4": "four"}
    queues: dict[str, rqueue.Queue] = {}
    for case, kind in cases.items():
        q = client.queue(f"cost.{case}.{uuid.uuid4().hex[:6]}")
        assert isinstance(q, rqueue.Queue)
        if kind == "four":
            client.configure(q.name, key_concurrency=100)
        q.consumer("g").close()
        for start in range(0, n * runs, 1000):
            if kind == "distinct":
                keys: list[str | None] | None = [f"k{start + i}" for i in range(1000)]
            elif kind == "four":
                keys = [f"f{i % 4}" for i in range(1000)]
            else:
                keys = None
            q.publish_many([PAYLOAD] * 1000, key=keys)
        queues[case] = q
    consumers = {case: q.consumer("g", prefetch=1000) for case, q in queues.items()}
    samples: dict[str, list[float]] = {case: [] for case in cases}
    order = list(cases)
    for slice_no in range(n * runs // 1000):
        for case in order[slice_no % len(order) :] + order[: slice_no % len(order)]:
            c = consumers[case]
            t = time.perf_counter()
            for _ in range(10):
                c.ack(c.fetch(100))
            samples[case].append((time.perf_counter() - t) / 1000 * 1e6)
    plain = statistics.median(samples["plain"])
    return {
        case: {"us_per_msg": round(statistics.median(s), 2), "ratio": round(statistics.median(s) / plain, 3)}
        for case, s in samples.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hot", type=int, default=10_000)
    p.add_argument("--cold", type=int, default=100)
    p.add_argument("--per", type=int, default=10)
    p.add_argument("--messages", type=int, default=10_000, help="per cost case and run")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--url")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        client = rqueue.connect(url, prefix=f"keysbench-{uuid.uuid4().hex[:6]}")
        out = {
            "fairness": [fairness(client, args.hot, args.cold, args.per, c) for c in (None, 1, 1000)],
            "cost": cost(client, args.messages, args.runs),
        }
        client.close()
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"fairness: 1 hot key x {args.hot}, then {args.cold} cold keys x {args.per}; fetch(100) + ack")
    for row in out["fairness"]:  # type: ignore[union-attr]
        print("  " + ", ".join(f"{k} {v}" for k, v in row.items()))
    print("cost, fetch(100) + ack:")
    for case, row in out["cost"].items():  # type: ignore[union-attr]
        print(f"  {case:14} {row['us_per_msg']:8.2f} us/msg  ratio {row['ratio']}")


if __name__ == "__main__":
    main()
