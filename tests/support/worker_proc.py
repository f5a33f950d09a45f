"""A worker process for tests: records every handler call in a Redis list so
that the test can count invocations across processes and crashes.

usage: python worker_proc.py URL PREFIX QUEUE GROUP SLEEP_S CONCURRENCY [HEARTBEAT_TIMEOUT_S [SETTINGS_TTL_S]]

A long SETTINGS_TTL_S keeps the worker from reading its settings again
while a test holds Redis paused, so that its next call is a fetch.
"""

from __future__ import annotations

import logging
import sys
import time

import redis

import rqueue


def main() -> None:
    url, prefix, queue, group = sys.argv[1:5]
    sleep_s, concurrency = float(sys.argv[5]), int(sys.argv[6])
    hb_timeout = float(sys.argv[7]) if len(sys.argv) > 7 else 5.0
    settings_ttl = float(sys.argv[8]) if len(sys.argv) > 8 else rqueue.constants.SETTINGS_CACHE_TTL
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    client = rqueue.connect(url, prefix=prefix, settings_ttl=settings_ttl)
    calls = redis.Redis.from_url(url)
    calls_key = f"{prefix}:test:calls"

    def handler(d: rqueue.Delivery) -> None:
        calls.rpush(calls_key, d.seq)
        time.sleep(sleep_s)

    worker = rqueue.Worker(
        client.queue(queue),
        group,
        handler,
        concurrency=concurrency,
        heartbeat_interval=min(1.0, hb_timeout / 4),
        heartbeat_timeout=hb_timeout,
        grace_period=10,
    )
    stats = worker.run()
    print(stats.as_dict(), flush=True)


if __name__ == "__main__":
    main()
