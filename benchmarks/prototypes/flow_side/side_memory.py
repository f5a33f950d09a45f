"""B per queued message, plain and with a priority (1-9 in turn), in the
layout of this process's client (RQUEUE_EXPERIMENTAL_LAYOUT) and of the
rqueue it imports (PYTHONPATH: a tree with side_hash.patch applied).

100,000 messages of 100 bytes, one group, used_memory before and after, on
a private redis-server (PATH) on a free port. The priority figure includes
the message's entry in the priority log.

usage: RQUEUE_EXPERIMENTAL_LAYOUT=stream [PYTHONPATH=<tree>] .venv/bin/python side_memory.py
"""

from __future__ import annotations

import redis

import rqueue
from rqueue.embedded import EmbeddedServer

N = 100_000


def main() -> None:
    srv = EmbeddedServer(binary="redis-server").start()
    try:
        r = redis.Redis.from_url(srv.url)
        c = rqueue.connect(srv.url, prefix="mem")
        out = {}
        for case in ("plain", "prio"):
            q = c.queue(f"m{case}")
            assert isinstance(q, rqueue.Queue)
            q.consumer("g").close()
            q.publish_many([b"x" * 100] * 10, priority=5 if case == "prio" else None)  # keys made
            before = r.info("memory")["used_memory"]
            prios = [1 + i % 9 for i in range(1000)] if case == "prio" else None
            for _ in range(0, N, 1000):
                q.publish_many([b"x" * 100] * 1000, priority=prios)
            out[case] = (r.info("memory")["used_memory"] - before) / N
        print(c.log_layout.value, rqueue.__file__, {k: round(v, 1) for k, v in out.items()})
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
