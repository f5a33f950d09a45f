"""Retention and group positions: the settings max_age and max_length keep
messages every group settled, for groups created later and for resets; a
group can be created at, or reset to, a position (docs/retention.md).

The scripts (lua/retain.lua, group_create, group_reset, group_delete) do
the work; this module turns the API's positions into their arguments and
runs the trim step from the publish path, at most every RETAIN_INTERVAL per
queue and client.
"""

from __future__ import annotations

import logging
import threading
import weakref
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from .constants import RETAIN_CHECK, RETAIN_INTERVAL, RETAIN_STEP
from .engine import commands
from .errors import InvalidInput, RQueueError
from .settings import Settings

if TYPE_CHECKING:
    from .protocols import QueueLike


class Start(Enum):
    """Named positions of a group: the oldest message stored, or after the
    last published (only new messages)."""

    FIRST = "first"
    LAST = "last"


#: A position: Start.FIRST / "first", Start.LAST / "last", a seq (the first
#: seq the group is handed) or an aware datetime (the first message
#: published at or after it).
Position = Start | str | int | datetime


def position_args(position: Any) -> tuple[str, str]:
    """The scripts' (mode, value) for ``position``; InvalidInput naming it
    when it is none."""
    if isinstance(position, Start):
        return position.value, ""
    if isinstance(position, str):
        if position in ("first", "last"):
            return position, ""
        raise InvalidInput(f"position {position!r} is not one: give 'first', 'last', a seq or a datetime")
    if isinstance(position, bool):
        raise InvalidInput(f"position {position!r} is not one: give 'first', 'last', a seq or a datetime")
    if isinstance(position, int):
        if position < 1:
            raise InvalidInput(f"seq {position} is not a seq (a whole number >= 1)")
        return "seq", str(position)
    if isinstance(position, datetime):
        if position.tzinfo is None:
            raise InvalidInput(f"time {position.isoformat()} has no timezone: give an aware datetime")
        ms = round(position.timestamp() * 1000)
        if ms < 0:
            raise InvalidInput(f"time {position.isoformat()} is before 1970")
        return "time", str(ms)
    raise InvalidInput(f"position {position!r} is not one: give 'first', 'last', a seq or a datetime")


def retention_args(settings: Settings) -> tuple[int | None, int | None]:
    """max_age in ms and max_length of ``settings`` (None: unset)."""
    age = None if settings.max_age is None else round(settings.max_age * 1000)
    return age, settings.max_length


class _Tracker:
    """Per client: when each queue was last trimmed, whether it is in
    retention mode, and the retention last stored for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # key base -> (monotonic time of the last step, retained, what was stored)
        self.seen: dict[str, tuple[float, bool, tuple[int | None, int | None]]] = {}


log = logging.getLogger(__name__)

_TRACKERS: weakref.WeakKeyDictionary[Any, _Tracker] = weakref.WeakKeyDictionary()
_TRACKERS_LOCK = threading.Lock()


def _tracker(client: Any) -> _Tracker:
    with _TRACKERS_LOCK:
        t = _TRACKERS.get(client)
        if t is None:
            t = _TRACKERS[client] = _Tracker()
        return t


def trim(queue: QueueLike, settings: Settings | None = None, limit: int = RETAIN_STEP) -> commands.RetainReply:
    """Stores the queue's retention and runs one trim step now."""
    client = queue.client
    settings = settings if settings is not None else queue.settings()
    age, length = retention_args(settings)
    reply = commands.retain(client.scripts, queue.keys, client.clock.script_now(), age, length, True, limit, queue.name)
    t = _tracker(client)
    with t.lock:
        t.seen[queue.keys.base] = (client.clock.monotonic(), reply.retained, (age, length))
    return reply


def after_publish(queue: QueueLike, settings: Settings) -> None:
    """The publish path's share of retention: a trim step when this
    client's last one for the queue is older than RETAIN_INTERVAL (the
    queue is in retention mode) or RETAIN_CHECK (it was not), or when the
    queue's retention settings changed."""
    client = queue.client
    t = _tracker(client)
    now = client.clock.monotonic()
    want = retention_args(settings)
    with t.lock:
        seen = t.seen.get(queue.keys.base)
    if seen is not None:
        at, retained, stored = seen
        wait = RETAIN_INTERVAL if retained or want != (None, None) else RETAIN_CHECK
        if stored == want and now - at < wait:
            return
    try:
        trim(queue, settings)
    except (RQueueError, OSError) as exc:
        # The publish is stored: a failed trim step must not make it look
        # failed (it would be sent again). The next step comes after the
        # interval.
        with t.lock:
            t.seen[queue.keys.base] = (now, True, want)
        log.warning("retention trim step of queue %r failed: %s", queue.name, exc)
