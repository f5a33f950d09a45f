"""How long each script call takes inside Redis, by the scripts loaded.

Redis (script_lua.c, luaCallFunction) runs a step of the Lua garbage
collector after every 50th script call, whatever the scripts are. The
step's work is a fixed quota, or less when the collection cycle ends
within it, and a cycle's work grows with the Lua heap, which holds every
script loaded on the server. So the more script code a server holds, the
longer some calls take, one call in about 50. This loads a set of rqueue's
scripts (stream layout) on a private redis-server, publishes one message a
call, and reads each EVALSHA's duration from SLOWLOG (logging every
command; a script call's duration covers the commands it runs): the
median, the p99 and the calls that took four times the median or more.

usage: .venv/bin/python benchmarks/lua_gc.py [CALLS] [TURNS]
  CALLS publishes per set (default 5000), TURNS turns of the three sets
  (default 2): publish (the scripts a publish loads), worker (those a
  Worker's consumer uses as well), all (every script). Needs
  redis-server on PATH.
"""

from __future__ import annotations

import statistics
import sys

import redis

import rqueue
from rqueue.embedded import EmbeddedServer
from rqueue.engine.loader import SCRIPT_NAMES, source

PAYLOAD = b"x" * 100
SETS = {
    "publish": (),
    "worker": ("publish", "fetch", "ack", "nack", "extend", "heartbeat", "join", "leave", "status"),
    "all": tuple(SCRIPT_NAMES),
}


def probe(url: str, r: redis.Redis, name: str, calls: int, turn: int) -> str:
    r.script_flush()
    for script in SETS[name]:
        r.script_load(source(script, layout="stream"))
    client = rqueue.connect(url, prefix=f"gc{turn}{name}")
    try:
        queue = client.queue("q")
        queue.consumer("g", "c1")
        for _ in range(300):  # what a publish loads, loaded; its call shape known
            queue.publish(PAYLOAD)
        memory = r.info("memory")
        # Redis logs the commands a script runs as well: eight a publish is room enough.
        r.config_set("slowlog-max-len", 8 * calls)
        r.config_set("slowlog-log-slower-than", 0)
        r.slowlog_reset()
        for _ in range(calls):
            queue.publish(PAYLOAD)
        log = r.slowlog_get(8 * calls)
        r.config_set("slowlog-log-slower-than", 10000)
    finally:
        client.close()
    took = sorted(int(e["duration"]) for e in log if e["command"].startswith(b"EVALSHA"))
    median = statistics.median(took)
    slow = [t for t in took if t >= 4 * median]
    scripts, heap = memory["number_of_cached_scripts"], memory["used_memory_lua"] // 1024
    slow_mean = statistics.mean(slow) if slow else 0
    return (
        f"{name:8} {scripts:3d} scripts, Lua heap {heap:5d} KiB:"
        f" median {median:4.0f} µs, p99 {took[int(len(took) * 0.99)]:4d}, max {took[-1]:5d};"
        f" {len(slow)} of {len(took)} calls at 4x the median or more"
        f" (mean {slow_mean:4.0f} µs); mean less median {statistics.mean(took) - median:4.1f} µs"
    )


def main() -> int:
    args = sys.argv[1:]
    if any(not a.isdigit() for a in args):
        print(__doc__)
        return 2
    calls = int(args[0]) if len(args) > 0 else 5000
    turns = int(args[1]) if len(args) > 1 else 2
    with EmbeddedServer(binary="redis-server") as server:
        r = redis.Redis.from_url(server.url)
        print(f"publish(), one message a call, {calls} calls a set; EVALSHA durations from SLOWLOG")
        for turn in range(turns):
            for name in SETS:
                print(" ", probe(server.url, r, name, calls, turn))
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
