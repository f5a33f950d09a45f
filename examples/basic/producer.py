"""Publishes orders to the queue "orders" of the Redis at RQUEUE_URL.

    RQUEUE_URL=redis://localhost:6379/0 python producer.py            # 20 orders
    RQUEUE_URL=redis://localhost:6379/0 python producer.py -n 100
    RQUEUE_URL=redis://localhost:6379/0 python producer.py --every 1  # one a second until Ctrl-C

Every 10th order has a negative amount, which the handler rejects into the
dead-letter queue DLQ.orders. Each order has an id, so running the producer
twice within the de-duplication window publishes nothing new.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import rqueue


def order(n: int) -> bytes:
    return json.dumps({"order": n, "amount": -5 if n % 10 == 0 else n * 3}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=20, help="orders to publish [default: 20]")
    parser.add_argument("--every", type=float, default=None, help="publish one order every this many seconds, forever")
    args = parser.parse_args()
    url = os.environ.get("RQUEUE_URL", "redis://localhost:6379/0")
    with rqueue.connect(url) as client:
        # Settings are stored in Redis for every process that uses the queue.
        client.configure("orders", ack_wait=30, max_deliveries=3, redelivery_delay=1)
        q = client.queue("orders")
        if args.every is None:
            numbers = range(1, args.count + 1)
            results = q.publish_many([order(n) for n in numbers], ids=[f"order-{n}" for n in numbers])
            new = [r.seq for r in results if not r.duplicate]
            print(f"published {len(new)} orders ({len(results) - len(new)} already there)")
            return
        run = int(time.time())
        for n in itertools.count(1):
            r = q.publish(order(n), id=f"order-{run}-{n}")
            print(f"published order {n} as seq {r.seq}", flush=True)
            time.sleep(args.every)


if __name__ == "__main__":
    main()
