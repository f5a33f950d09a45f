"""Which messages' latency the Lua collector's step made longer.

Redis runs a step of the Lua garbage collector after every 50th script
call (benchmarks/lua_gc.py). This publishes one message a millisecond, one
publish() each, to a consumer process waiting in Redis (wait_in_redis,
fetch(100, timeout=1)), as the bench's latency figure does, while SLOWLOG
logs every command. Each message's latency (handler start less the
publish time in its payload) is then put next to the time Redis took for
its publish script (found in SLOWLOG by the payload) and for the first
fetch Redis ran after it (the one that hands it out, as the consumer waits
in Redis). A message "met a step" when
either call took four times that script's median or more. Printed: the
p50, p90 and p99 of all messages, of those that met no step and of those
that did.

usage: .venv/bin/python benchmarks/latency_gc.py [SECONDS] [RATE] [--all-scripts]
  SECONDS of publishing (default 3), RATE messages a second (default
  1000); --all-scripts loads every script first (a larger Lua heap, as on
  a server that also serves the CLI and the dashboard). Needs
  redis-server on PATH.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

import rqueue
from rqueue.embedded import EmbeddedServer
from rqueue.engine.loader import SCRIPT_NAMES, source

SLOW = 4  # a call at SLOW times its script's median or more met a step
LOG_PER_MESSAGE = 100  # SLOWLOG entries kept per message: its scripts' commands are logged too
SHAS = ("publish", "fetch")  # the scripts whose calls are timed


def consume(url: str, n: int, out: str) -> None:
    """The consumer process: (payload, latency in ms) of each of n messages."""
    client = rqueue.connect(url, prefix="lgc")
    client.configure("q", ack_wait=60)
    consumer = client.queue("q").consumer("g", "c1", prefetch=1000)
    rows: list[tuple[str, float]] = []
    deadline = time.monotonic() + 60
    while len(rows) < n and time.monotonic() < deadline:
        got = consumer.fetch(100, timeout=1)
        start = time.time()
        rows += [(d.data.decode(), (start - float(d.data)) * 1000) for d in got]
        if got:
            consumer.ack(got)
    Path(out).write_text(json.dumps(rows))
    client.close()


def percentiles(values: list[float]) -> str:
    if not values:
        return "none"
    s = sorted(values)
    at = [s[min(len(s) - 1, int(len(s) * q))] for q in (0.5, 0.9, 0.99)]
    return f"{len(s):5d} messages: p50 {at[0]:.2f}  p90 {at[1]:.2f}  p99 {at[2]:.2f} ms"


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--all-scripts"]
    if any(not a.replace(".", "", 1).isdigit() for a in args):
        print(__doc__)
        return 2
    seconds = float(args[0]) if args else 3.0
    rate = int(args[1]) if len(args) > 1 else 1000
    n = int(seconds * rate)
    with EmbeddedServer(binary="redis-server") as server, tempfile.TemporaryDirectory() as tmp:
        r = redis.Redis.from_url(server.url)
        if "--all-scripts" in sys.argv:
            for name in SCRIPT_NAMES:
                r.script_load(source(name, layout="stream"))
        client = rqueue.connect(server.url, prefix="lgc")
        client.configure("q", wait_in_redis=True)
        queue = client.queue("q")
        assert isinstance(queue, rqueue.Queue)
        queue.create_group("g")  # before the consumer starts: none of its messages goes unseen
        out = str(Path(tmp) / "rows.json")
        child = multiprocessing.get_context("spawn").Process(target=consume, args=(server.url, n, out))
        child.start()
        time.sleep(2)  # the consumer joined and waits in Redis
        r.config_set("slowlog-max-len", LOG_PER_MESSAGE * n)
        r.config_set("slowlog-log-slower-than", 0)
        r.slowlog_reset()
        start = time.perf_counter()
        for i in range(n):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            queue.publish(b"%.6f" % time.time())
        child.join(120)
        log = r.slowlog_get(LOG_PER_MESSAGE * n)
        r.config_set("slowlog-log-slower-than", 10000)
        rows = json.loads(Path(out).read_text())
        heap = r.info("memory")["used_memory_lua"] // 1024
        client.close()
        r.close()
    sha = {name: hashlib.sha1(source(name, layout="stream").encode()).hexdigest().encode() for name in SHAS}
    # SLOWLOG keeps a call's first 32 arguments, which a fetch's token is
    # past: the fetch that handed a message out is taken to be the first one
    # Redis ran after its publish (entries' ids are in the order of the runs;
    # a consumer idle in Redis runs it right after the publish that wakes it).
    publishes: dict[bytes, tuple[int, int]] = {}  # payload -> (entry id, µs) of its publish
    fetch_runs: list[tuple[int, int]] = []  # (entry id, µs) of each fetch
    for entry in log:
        words = entry["command"].split(b" ")
        if words[0] != b"EVALSHA":
            continue
        if words[1] == sha["publish"]:
            publishes[words[-1]] = (int(entry["id"]), int(entry["duration"]))  # a bare call's one payload, last
        elif words[1] == sha["fetch"]:
            fetch_runs.append((int(entry["id"]), int(entry["duration"])))
    fetch_runs.sort()
    fetch_ids = [i for i, _ in fetch_runs]
    publish_median = statistics.median(us for _, us in publishes.values())
    fetch_median = statistics.median(us for _, us in fetch_runs)
    met: list[float] = []
    clear: list[float] = []
    unknown = 0
    for payload, latency in rows:
        published = publishes.get(payload.encode())
        after = bisect.bisect_right(fetch_ids, published[0]) if published else len(fetch_ids)
        if published is None or after == len(fetch_ids):
            unknown += 1
            continue
        slow = published[1] >= SLOW * publish_median or fetch_runs[after][1] >= SLOW * fetch_median
        (met if slow else clear).append(latency)
    print(f"{n} publishes at {rate}/s to a consumer waiting in Redis; Lua heap {heap} KiB at the end")
    print(f"  publish script median {publish_median} µs, fetch script median {fetch_median} µs (SLOWLOG)")
    print(f"  all           {percentiles(met + clear)}")
    print(f"  met no step   {percentiles(clear)}")
    print(f"  met a step    {percentiles(met)}")
    if unknown:
        print(f"  ({unknown} messages whose calls SLOWLOG did not show)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
