"""The handler the worker runs for every order:

    rqueue worker handler:handle -q orders -g billing

A normal return acks the message; an exception nacks it (it comes back
after the queue's redelivery_delay, and after max_deliveries it is
dead-lettered); rqueue.Reject dead-letters it at once.
"""

from __future__ import annotations

import json
import logging

import rqueue

log = logging.getLogger("orders")


def handle(d: rqueue.Delivery) -> None:
    order = json.loads(d.data)  # a message that is not JSON fails: nacked, then dead-lettered
    amount = order.get("amount", 0)
    if amount < 0:
        raise rqueue.Reject(f"order {order.get('order')}: negative amount")
    log.info("order %s: charged %s (delivery %d)", order.get("order"), amount, d.delivery_count)
