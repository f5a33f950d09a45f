"""The kinds of lifecycle events a queue can record in its events stream
besides those it always records (dead letters, drops, replays, purges,
state losses): each is recorded only when the queue's ``events`` setting
names it, so a kind that is off costs the call that would record it
nothing (docs/events.md). :data:`EVENT_KINDS` lists every kind the stream
can hold, those always recorded included."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from .errors import InvalidInput


class EventKind(enum.Enum):
    """A lifecycle event kind of the ``events`` setting."""

    COMPLETED = "completed"  # a message acked by a worker (with its ack)
    FAILED = "failed"  # a handler failed: nack or reject with its error
    TIMEOUT = "timeout"  # a handler ran past its time limit (with the nack)
    EXPIRED = "expired"  # a message's time to live ran out (recorded by the TTL's own path)
    SCHEDULED = "scheduled"  # a recurring schedule published a tick
    PAUSED = "paused"  # a queue or group was paused or resumed (recorded by flow control)


#: The kinds a queue records whatever its ``events`` setting says, each
#: with what records it: a dead letter (``dead_letter.lua``), a drop by a
#: dead-letter mode of "drop", a replay, the purge of a queue's messages
#: (``purge.lua``) and of dead letters (``purged``, from Python), a group's
#: reset and deletion, damage a script found (``corrupt``) and a loss of
#: Redis state a client noticed (``state-lost``, from Python).
ALWAYS_RECORDED: tuple[str, ...] = (
    "dead-lettered",
    "dropped",
    "replayed",
    "purged-messages",
    "purged",
    "reset",
    "group-deleted",
    "corrupt",
    "state-lost",
)

#: Every kind the events stream can hold: the lifecycle kinds of the
#: ``events`` setting, then those always recorded (tests/test_events.py
#: checks it against what the Lua scripts and the Python code record).
EVENT_KINDS: tuple[str, ...] = tuple(k.value for k in EventKind) + ALWAYS_RECORDED


def check_kinds(kinds: Iterable[str]) -> None:
    """Raises InvalidInput naming the first of ``kinds`` that no event can
    have, and the kinds there are."""
    for kind in kinds:
        if kind not in EVENT_KINDS:
            raise InvalidInput(f"unknown event kind {kind!r}: the kinds are {', '.join(EVENT_KINDS)}")
