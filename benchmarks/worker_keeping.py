"""Worker msg/s by what settling a message costs: a plain ack, an ack that
keeps a completed event or a result, and a failure (every message
dead-lettered at its first failure, max_deliveries 1); with a handler per
message (concurrency 8) and a batch handler of 100 (docs/results.md and
docs/events.md, "Cost"; docs/worker.md, batch handlers).

Starts a private redis-server. Each checkout given with --root (default:
this one) runs every figure in a process of its own with that checkout on
its PYTHONPATH; the checkouts take turns within each run, so that they
meet the same load, and each figure is printed as the median of the runs
[min-max] with its ratio to the first checkout's.

usage: .venv/bin/python benchmarks/worker_keeping.py [--root DIR ...] [--mode M ...] [--messages N] [--runs R] [--json]

Compare two commits with a worktree of the older one:
  git worktree add /tmp/before <commit>
  .venv/bin/python benchmarks/worker_keeping.py --root /tmp/before --root .
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.servers import start_server  # noqa: E402

MODES = ("plain", "completed", "results", "failing")
HANDLERS = ("msg", "batch")

# One run of one figure, in a process whose rqueue is the checkout's.
ONE_RUN = """
import sys, time
import rqueue

url, prefix, mode, kind, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
client = rqueue.connect(url, prefix=prefix, settings_ttl=0)
if mode == "completed":
    client.configure("q", events=["completed"])
elif mode == "results":
    client.configure("q", results=True)
elif mode == "failing":
    client.configure("q", max_deliveries=1)
q = client.queue("q")
for _ in range(0, n, 1000):
    q.publish_many([b"x" * 100] * 1000)
def fail(_):
    raise ValueError("down")

if kind == "batch":
    handle = fail if mode == "failing" else lambda ds: [True] * len(ds)
    worker = rqueue.Worker(q, "g", rqueue.BatchHandler(handle, size=100), concurrency=1)
else:
    worker = rqueue.Worker(q, "g", fail if mode == "failing" else lambda d: None, concurrency=8)
started = time.perf_counter()
worker.start()
while True:
    stats = q.stats()
    if mode == "failing" and stats.dead_letters >= n:
        break
    if mode != "failing" and stats.groups and stats.group("g").ack_floor >= n:
        break
    time.sleep(0.005)
elapsed = time.perf_counter() - started
worker.stop()
worker.join(10)
print(n / elapsed)
"""


def one_run(root: Path, url: str, prefix: str, mode: str, kind: str, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", ONE_RUN, url, prefix, mode, kind, str(n)],
        env=env,
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", action="append", type=Path, help="a checkout to measure (repeatable)")
    parser.add_argument("--mode", action="append", choices=MODES, help="the modes to run (repeatable; default all)")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    roots = [r.resolve() for r in (args.root or [Path(__file__).resolve().parent.parent])]
    modes = args.mode or list(MODES)
    figures: dict[tuple[str, str, str], list[float]] = {}
    server = start_server("redis")
    try:
        for run in range(args.runs):
            for mode in modes:
                for kind in HANDLERS:
                    for i, root in enumerate(roots):
                        rate = one_run(root, server.url, f"k{run}{mode}{kind}{i}", mode, kind, args.messages)
                        figures.setdefault((mode, kind, str(root)), []).append(rate)
                        print(f"run {run + 1}: {mode} {kind} {root}: {rate:,.0f} msg/s", file=sys.stderr)
    finally:
        server.stop()
    rows = []
    for mode in modes:
        for kind in HANDLERS:
            first = statistics.median(figures[(mode, kind, str(roots[0]))])
            for root in roots:
                rates = figures[(mode, kind, str(root))]
                median = statistics.median(rates)
                rows.append(
                    {
                        "mode": mode,
                        "handler": kind,
                        "root": str(root),
                        "msg_s": round(median),
                        "min": round(min(rates)),
                        "max": round(max(rates)),
                        "ratio": round(median / first, 2),
                    }
                )
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"rows": rows, "messages": args.messages, "runs": args.runs, "load": load}, indent=2))
        return
    for row in rows:
        print(
            f"{row['mode']:<9} {row['handler']:<5} {row['msg_s']:>8,} msg/s [{row['min']:,}-{row['max']:,}] "
            f"{row['ratio']:.2f}x  {row['root']}"
        )
    print(f"{args.messages:,} messages, median of {args.runs} runs; load average {load[0]:.1f}")


if __name__ == "__main__":
    main()
