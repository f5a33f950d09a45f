"""The kinds of lifecycle events a queue can record in its events stream
besides those it always records (dead letters, drops, replays, purges,
state losses): each is recorded only when the queue's ``events`` setting
names it, so a kind that is off costs the call that would record it
nothing (docs/events.md)."""

from __future__ import annotations

import enum


class EventKind(enum.Enum):
    """A lifecycle event kind of the ``events`` setting."""

    COMPLETED = "completed"  # a message acked by a worker (with its ack)
    FAILED = "failed"  # a handler failed: nack or reject with its error
    TIMEOUT = "timeout"  # a handler ran past its time limit (with the nack)
    EXPIRED = "expired"  # a message's time to live ran out (recorded by the TTL's own path)
    SCHEDULED = "scheduled"  # a recurring schedule published a tick
    PAUSED = "paused"  # a queue or group was paused or resumed (recorded by flow control)
