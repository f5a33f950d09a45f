"""Retention and group positions: the settings max_age and max_length keep
messages every group settled, for groups created later and for resets; a
group can be created at, or reset to, a position (docs/retention.md).

The scripts (lua/retain.lua, group_create, group_reset, group_delete) do
the work; this module turns the API's positions into their arguments (a
partitioned queue's too, checked over its partitions before any changes),
and decides when a publisher runs the trim step, at most every
RETAIN_INTERVAL per queue and client: the sync publishers run it here, the
asyncio ones in rqueue.aio.publishing, on the same decision.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from .constants import RETAIN_CHECK, RETAIN_INTERVAL, RETAIN_STEP
from .engine import commands
from .errors import GroupInUse, InvalidInput, RQueueError
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


PER_PARTITION_SEQ = (
    "seq {seq} names no position of a partitioned queue: each partition has its own seqs; "
    "give 'first', 'last' or a time (they apply in every partition), or name the seq in one "
    "partition's queue (queue.parts[i])"
)


def partitioned_position_args(position: Any) -> tuple[str, str]:
    """The scripts' (mode, value) for ``position`` in every partition of a
    partitioned queue: as :func:`position_args`, but a seq is refused (a
    seq names a message of one partition only)."""
    mode, value = position_args(position)
    if mode == "seq":
        raise InvalidInput(PER_PARTITION_SEQ.format(seq=value))
    return mode, value


def check_partitioned_group(queue: str, group: str, what: str, present: list[bool], held: list[int]) -> None:
    """Refuses, before any partition changes, a group ``what`` (create,
    reset, delete) of a partitioned queue that would fail in one of its
    partitions: ``present`` says per partition whether it has the group,
    ``held`` how many deliveries the group holds there (empty: not asked,
    as with force)."""
    where = [p for p, has in enumerate(present) if has]
    if what == "create" and where:
        raise InvalidInput(f"queue {queue!r} has group {group!r} already (in partitions {where})")
    if what == "reset" and len(where) < len(present):
        missing = [p for p, has in enumerate(present) if not has]
        raise InvalidInput(f"queue {queue!r} has no group {group!r} in partitions {missing}")
    if what == "delete" and not where:
        raise InvalidInput(f"queue {queue!r} has no group {group!r}")
    if sum(held):
        raise GroupInUse(group, sum(held))


def partly_done(exc: Exception, what: str, group: str, done: list[int], targets: list[int]) -> Exception:
    """``exc``, raised by one of the partitions ``targets`` of a
    partitioned queue's group ``what`` (create, reset, delete), with a note
    of the partitions that already did it and those left of ``targets``:
    each partition is one script call, not one atomic step over all of them."""
    if done:
        left = [p for p in targets if p not in done]
        exc.add_note(
            f"group {group!r}: {what} applied in partitions {done} already, not in {left}; "
            "do it in those partitions' queues (queue.parts[i]) once the cause is fixed"
        )
    return exc


def undone(exc: Exception, what: str, group: str, partitions: list[int]) -> Exception:
    """``exc`` with a note that the group ``what`` a partitioned queue had
    applied in ``partitions`` before the refusal was undone there."""
    if partitions:
        exc.add_note(f"group {group!r}: the {what} applied in partitions {partitions} before this refusal is undone")
    return exc


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
        # key bases whose step a publisher took and has not ended
        self.running: set[str] = set()


log = logging.getLogger(__name__)

_TRACKERS: weakref.WeakKeyDictionary[Any, _Tracker] = weakref.WeakKeyDictionary()
_TRACKERS_LOCK = threading.Lock()


def _tracker(client: Any) -> _Tracker:
    with _TRACKERS_LOCK:
        t = _TRACKERS.get(client)
        if t is None:
            t = _TRACKERS[client] = _Tracker()
        return t


def trim(
    queue: QueueLike, settings: Settings | None = None, limit: int = RETAIN_STEP, *, taken: bool = False
) -> commands.RetainReply:
    """Stores the queue's retention and runs one trim step now; ``taken``:
    the step a publisher took with :func:`step_due` (a step by hand leaves
    that one under way)."""
    client = queue.client
    settings = settings if settings is not None else queue.settings()
    want = retention_args(settings)
    reply = commands.retain(client.scripts, queue.keys, client.clock.script_now(), *want, True, limit, queue.name)
    stepped(client, queue.keys.base, reply, want, taken)
    return reply


def step_due(client: Any, base: str, settings: Settings) -> tuple[int | None, int | None] | None:
    """The publish path's share of retention, decided for the sync and the
    asyncio publishers alike: the retention to store with a trim step when
    one is due (this client's last step for the queue is older than
    RETAIN_INTERVAL while the queue is in retention mode, or RETAIN_CHECK
    while it is not, or the queue's retention settings changed), else
    None. The caller runs the step and reports it with :func:`stepped` or
    :func:`step_failed`. A step found due is taken in the same lock: the
    publishes that finish while it is under way (threads, or tasks of an
    event loop) find it not due, however long it takes, rather than each
    sending a step of its own; the interval counts from its end."""
    t = _tracker(client)
    want = retention_args(settings)
    now = client.clock.monotonic()
    with t.lock:
        if base in t.running:
            return None
        seen = t.seen.get(base)
        if seen is not None:
            at, retained, stored = seen
            wait = RETAIN_INTERVAL if retained or want != (None, None) else RETAIN_CHECK
            if stored == want and now - at < wait:
                return None
        t.seen[base] = (now, True if seen is None else seen[1], want)
        t.running.add(base)
    return want


def stepped(
    client: Any, base: str, reply: commands.RetainReply, want: tuple[int | None, int | None], taken: bool
) -> None:
    """Notes a trim step this client ran for the queue of ``base``; with
    ``taken`` it is the publishers' step, which ends here (a step by hand,
    e.g. Queue.trim() while the publishers' one is under way, ends none)."""
    t = _tracker(client)
    with t.lock:
        t.seen[base] = (client.clock.monotonic(), reply.retained, want)
        if taken:
            t.running.discard(base)


def step_failed(client: Any, base: str, name: str, want: tuple[int | None, int | None], exc: BaseException) -> None:
    """Notes a trim step that failed: the publish is stored, so the failure
    must not make it look failed (it would be sent again); the next step
    comes after the interval."""
    t = _tracker(client)
    with t.lock:
        t.seen[base] = (client.clock.monotonic(), True, want)
        t.running.discard(base)
    # A failure of Redis or of the queue's state is expected; anything else
    # is a bug, whose traceback the asyncio client's step would lose.
    expected = isinstance(exc, (RQueueError, OSError, asyncio.CancelledError))
    log.warning(
        "retention trim step of queue %r failed: %s: %s",
        name,
        type(exc).__name__,
        exc,
        exc_info=None if expected else exc,
    )


def after_publish(queue: QueueLike, settings: Settings) -> None:
    """Runs the trim step :func:`step_due` says is due after a publish."""
    client = queue.client
    want = step_due(client, queue.keys.base, settings)
    if want is None:
        return
    try:
        trim(queue, settings, taken=True)
    except BaseException as exc:  # whatever ends it, the next step may come
        step_failed(client, queue.keys.base, queue.name, want, exc)
        if not isinstance(exc, (RQueueError, OSError)):
            raise
