"""The consuming side of the example: a handler for rqueue workers.

Each message is one paid order as JSON (made by pipeline.py's Spark job). The
handler adds it to per-user totals; a refund is not this service's business:
``rqueue.Reject`` dead-letters it at once (pipeline.py then reads the dead
letters back into Spark).

Run it on its own against a queue the pipeline filled:

    cd examples/spark_pipeline
    ../../.venv/bin/rqueue --url redis://127.0.0.1:6379/0 worker worker:handle -q orders.enriched -g billing
"""

from __future__ import annotations

import collections
import json
import threading

import rqueue

lock = threading.Lock()
totals: collections.Counter[str] = collections.Counter()  # user -> cents
seen: collections.Counter[str] = collections.Counter()  # order id -> times handled
handled = 0  # messages handled (acked or rejected)
high_priority = 0  # messages with the header priority=high


def handle(delivery: rqueue.Delivery) -> None:
    global handled, high_priority
    order = json.loads(delivery.data)  # a payload that is not JSON raises: nacked, dead-lettered after max_deliveries
    with lock:
        handled += 1
        seen[order["order_id"]] += 1
        high_priority += delivery.headers.get("priority") == "high"
    if order["status"] == "refunded":
        raise rqueue.Reject("refunds are handled by the refunds service")
    with lock:
        totals[order["user"]] += order["amount_cents"]
