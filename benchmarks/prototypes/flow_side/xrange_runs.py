"""How scattered fetch's reads are: XRANGE calls per 100 messages handed
out by fetch(100)+ack of a stream log, by INFO commandstats, for mixes of
flow control. 10,000 messages of 100 bytes preloaded per mix, one group,
on a private redis-server (PATH) on a free port. With PYTHONPATH naming a
tree with side_hash.patch applied, the same with the side hash.

usage: RQUEUE_EXPERIMENTAL_LAYOUT=stream [PYTHONPATH=<tree>] .venv/bin/python xrange_runs.py
"""

from __future__ import annotations

import uuid
from typing import Any

import redis

import rqueue
from rqueue.embedded import EmbeddedServer

N = 10_000
P = b"x" * 100
MIXES: dict[str, dict[str, Any]] = {
    "plain": {},
    "priority 1-9 in turn": {"priority": [1 + i % 9 for i in range(N)]},
    "priority 5, every message": {"priority": 5},
    "every 10th priority 5": {"priority": [5 if i % 10 == 9 else 0 for i in range(N)]},
    "1,000 keys in turn (concurrency 1)": {"key": [f"k{i % 1000}" for i in range(N)]},
    "4 keys in turn (concurrency 100)": {"key": [f"f{i % 4}" for i in range(N)]},
    "a key per 100 messages (concurrency 100)": {"key": [f"b{i // 100}" for i in range(N)]},
}


def main() -> None:
    srv = EmbeddedServer(binary="redis-server").start()
    try:
        r = redis.Redis.from_url(srv.url)
        c = rqueue.connect(srv.url, prefix="runs")
        print("layout", c.log_layout.value, "redis", r.info("server")["redis_version"], rqueue.__file__)
        for name, flow in MIXES.items():
            qn = f"q{uuid.uuid4().hex[:6]}"
            c.configure(
                qn,
                prefetch=10**6,
                max_inflight=10**6,
                ack_wait=3600,
                key_concurrency=100 if "concurrency 100" in name else 1,
            )
            q = c.queue(qn)
            assert isinstance(q, rqueue.Queue)
            con = q.consumer("g")
            for s in range(0, N, 1000):
                part: dict[str, Any] = {k: v[s : s + 1000] if isinstance(v, list) else v for k, v in flow.items()}
                q.publish_many([P] * 1000, **part)
            r.config_resetstat()
            got = fetches = 0
            while got < N:
                batch = con.fetch(100)
                fetches += 1
                if not batch:
                    break
                got += len(batch)
                con.ack(batch)
            calls = r.info("commandstats").get("cmdstat_xrange", {}).get("calls", 0)
            print(f"{name:42s} {calls * 100 / got:6.1f} XRANGE per 100 messages ({got} in {fetches} fetches)")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
