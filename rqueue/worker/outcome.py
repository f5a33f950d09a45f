"""What became of a delivery a handler thread was given."""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """The outcome of one delivery, settled by the dispatcher."""

    ACK = "ack"  # the handler returned: acked with the next fetch
    NACK = "nack"  # the handler raised: offered again under the redelivery policy
    REJECT = "reject"  # the handler raised rqueue.Reject: dead-lettered
    TIMEOUT = "timeout"  # the handler ran past its time limit: nacked with the reason timeout
    SKIPPED = "skipped"  # not run: its lease was lost while it waited, or the handler could not be called
    RETURNED = "return"  # not run: the worker is stopping, and its leave returns the delivery
