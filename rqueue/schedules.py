"""Recurring schedules: defining, listing, pausing and removing them, and
one pass of a scheduler (:func:`fire_due`), which publishes every due tick
of every schedule of a prefix. docs/schedules.md has the design.

A schedule is a hash under its target queue's hash tag (on a partitioned
queue, of the partition its name routes to), so that one script call
(schedule_fire.lua) checks the last tick handled, stores the message and
moves the last tick together: each tick is published at most once, however
many schedulers run and wherever they crash. The prefix's registry maps
each schedule's name to its queue.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from .engine import commands, schedule_store, store
from .engine.record import encode_body
from .errors import CorruptRecord, InvalidInput, LayoutMismatch, PayloadTooLarge
from .events import EventKind
from .names import check_name
from .partitions import PartitionedQueue
from .queue import Queue
from .ticks import Timing, timing

if TYPE_CHECKING:
    from .protocols import QueueContext

log = logging.getLogger("rqueue.schedules")

SCHEDULE_HEADER = "x-rq-schedule"  # header naming the schedule that published a message
TICK_HEADER = "x-rq-tick"  # header holding the tick (ms since the epoch) a message was published for
SKIP_LATENESS = 60.0  # seconds: with missed="skip", a tick found later than this is not published
FIRE_BATCH = 100  # ticks per script call with missed="all"
FIRE_CALLS = 10  # script calls per schedule per pass: one schedule's backlog does not hold up the others
RECHECK_MS = 50  # ms: a schedule whose due ticks a call did not take is looked at again after this


class Missed(Enum):
    """What a scheduler does with ticks that passed while no scheduler ran
    (or while it could not reach Redis)."""

    ONCE = "once"  # publish one message, for the latest due tick (the default)
    ALL = "all"  # publish every due tick, FIRE_BATCH per call
    SKIP = "skip"  # publish only a tick found within SKIP_LATENESS of its time


def missed_policy(value: object) -> Missed:
    try:
        return Missed(value.value if isinstance(value, Missed) else value)
    except ValueError:
        raise InvalidInput(f"missed must be one of {', '.join(m.value for m in Missed)}, not {value!r}") from None


@dataclass(frozen=True)
class ScheduleInfo:
    """A recurring schedule as stored. Times are ms since the epoch (by
    Redis's clock); ``next_tick_ms`` is the first tick not yet handled (in
    the past when no scheduler has run since; None while paused)."""

    name: str
    queue: str
    every: float | None  # seconds, for an interval schedule
    cron: str | None  # five fields, for a cron schedule
    timezone: str | None  # of the cron expression
    missed: str
    paused: bool
    last_tick_ms: int | None  # the latest tick handled (published or skipped)
    next_tick_ms: int | None
    fired: int  # messages published
    skipped: int  # ticks passed over by the missed policy "skip"
    fired_at_ms: int | None  # when the latest message was published
    created_ms: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class PassResult(NamedTuple):
    """What one scheduler pass did, and when the next is due."""

    now_ms: int
    published: int
    handled: int  # script calls that handled at least one tick
    next_due_ms: int | None  # the earliest tick not yet handled (None: no active schedule)


def now_ms(client: QueueContext) -> int:
    """The scripts' clock: the test clock's time, or the server's TIME."""
    now = client.clock.script_now()
    return int(now) if now else commands.guarded(lambda: store.server_ms(client.redis))


def target(client: QueueContext, queue: str, name: str) -> Queue:
    """The queue (or partition of a partitioned queue: the one the
    schedule's name routes to) that schedule ``name`` publishes to."""
    q = client.queue(queue)
    if isinstance(q, PartitionedQueue):
        return q.parts[q.partition_for(key=name)]
    assert isinstance(q, Queue)
    return q


def _headers(name: str, headers: object) -> str:
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidInput(f"headers must be a mapping of str to str, not {type(headers).__name__}")
    given = dict(headers or {})
    for reserved in (SCHEDULE_HEADER, TICK_HEADER):
        if reserved in given:
            raise InvalidInput(f"header {reserved!r} is set by the scheduler; choose another name")
    given[SCHEDULE_HEADER] = name
    encode_body(b"", given)  # checks str to str, UTF-8 and the size limit
    return json.dumps(given, separators=(",", ":"), ensure_ascii=False)


def define(
    client: QueueContext,
    name: str,
    queue: str,
    *,
    every: float | None,
    cron: str | None,
    payload: bytes,
    headers: Mapping[str, str] | None,
    timezone: str | None,
    missed: Missed | str,
) -> ScheduleInfo:
    """Creates schedule ``name``, or changes it (see Client.schedule)."""
    check_name("schedule", name)
    when = timing(every, cron, timezone)
    policy = missed_policy(missed)
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise InvalidInput(f"payload must be bytes, not {type(payload).__name__} (encode str payloads yourself)")
    headers_json = _headers(name, headers)
    dest = target(client, queue, name)
    limit = dest.settings().max_payload
    if len(payload) > limit:
        raise PayloadTooLarge(len(payload), limit, None)
    r = client.redis
    key = dest.keys.schedule(name)
    now = now_ms(client)
    before = schedule_store.registered_queue(r, client.prefix, name)
    if before is not None and before != queue:
        # moved to another queue: a schedule of its own there, from now on
        schedule_store.delete(r, client.prefix, name, _key_of(client, name, before))
    fields: dict[str, bytes | str | int] = {
        "queue": queue,
        "version": when.version,
        "missed": policy.value,
        "payload": bytes(payload),
        "headers": headers_json,
    }
    if when.every_ms is not None:
        fields["every_ms"] = when.every_ms
        drop = ["cron", "timezone"]
    else:
        assert when.cron is not None
        fields["cron"], fields["timezone"] = when.cron, when.timezone
        drop = ["every_ms"]
    stored = schedule_store.field(r, key, "version")
    if stored is None:
        fields["created"] = now
    if stored != when.version:
        # ticks of another timing: only those after now fire
        fields["since"] = now
    schedule_store.write(r, client.prefix, name, key, fields, drop)
    client.register(queue)
    schedule_store.announce(r, client.prefix)
    return get(client, name)


def _key_of(client: QueueContext, name: str, queue: str) -> str | None:
    """The hash of schedule ``name`` on ``queue``, or None when the stored
    queue name can no longer be opened."""
    try:
        return target(client, queue, name).keys.schedule(name)
    except (InvalidInput, CorruptRecord):
        return None


@lru_cache(maxsize=1024)
def stored_timing(every_ms: str | None, cron: str | None, timezone: str | None) -> Timing:
    """The Timing of a schedule's stored fields, checked as when it was
    defined (InvalidInput for fields rqueue did not write); read once per
    process for each timing."""
    if every_ms:
        if not every_ms.isdigit() or int(every_ms) < 1:
            raise InvalidInput(f"every_ms {every_ms!r} is not a whole number of ms above 0")
        return Timing(every_ms=int(every_ms), timezone="")
    return timing(cron=cron, timezone=timezone)


def _floor(state: Mapping[str, str]) -> int:
    """The tick after which a schedule's ticks fire: its latest tick
    handled, or when it was created, changed or resumed."""
    return max(int(state.get("last") or 0), int(state.get("since") or 0))


def _info(name: str, state: Mapping[str, str]) -> ScheduleInfo:
    when = stored_timing(state.get("every_ms"), state.get("cron"), state.get("timezone"))
    paused = state.get("paused") == "1"
    last = state.get("last")
    fired_at = state.get("fired_at")
    return ScheduleInfo(
        name=name,
        queue=state.get("queue", ""),
        every=None if when.every_ms is None else when.every_ms / 1000,
        cron=when.cron,
        timezone=when.timezone or None,
        missed=state.get("missed", Missed.ONCE.value),
        paused=paused,
        last_tick_ms=int(last) if last else None,
        next_tick_ms=None if paused else when.after(_floor(state)),
        fired=int(state.get("fired") or 0),
        skipped=int(state.get("skipped") or 0),
        fired_at_ms=int(fired_at) if fired_at else None,
        created_ms=int(state.get("created") or 0),
    )


def _located(client: QueueContext) -> list[tuple[str, Queue, str]]:
    """(name, target queue, hash key) of every registered schedule whose
    queue can be opened; one that cannot is logged and left out."""
    out = []
    for name, queue in sorted(schedule_store.registry(client.redis, client.prefix).items()):
        try:
            dest = target(client, queue, name)
        except (InvalidInput, CorruptRecord) as exc:
            log.warning("schedule %r publishes to %r, which cannot be opened: %s", name, queue, exc)
            continue
        out.append((name, dest, dest.keys.schedule(name)))
    return out


def list_all(client: QueueContext) -> list[ScheduleInfo]:
    """Every schedule of the prefix, by name."""
    located = _located(client)
    states = schedule_store.states(client.redis, [key for _, _, key in located])
    out = []
    for (name, _, key), state in zip(located, states, strict=True):
        if state is None:
            continue
        try:
            out.append(_info(name, state))
        except (InvalidInput, ValueError) as exc:
            log.warning("schedule %r at %s does not parse: %s", name, key, exc)
    return out


def get(client: QueueContext, name: str) -> ScheduleInfo:
    """Schedule ``name``; InvalidInput when there is none."""
    check_name("schedule", name)
    queue = schedule_store.registered_queue(client.redis, client.prefix, name)
    key = None if queue is None else _key_of(client, name, queue)
    state = None if key is None else schedule_store.states(client.redis, [key])[0]
    if state is None:
        raise InvalidInput(f"there is no schedule {name!r} under prefix {client.prefix!r}")
    return _info(name, state)


def _existing_key(client: QueueContext, name: str) -> str:
    info = get(client, name)
    key = _key_of(client, name, info.queue)
    assert key is not None
    return key


def pause(client: QueueContext, name: str) -> ScheduleInfo:
    """Stops publishing schedule ``name`` until :func:`resume`."""
    schedule_store.set_fields(client.redis, _existing_key(client, name), {"paused": "1"})
    schedule_store.announce(client.redis, client.prefix)
    return get(client, name)


def resume(client: QueueContext, name: str) -> ScheduleInfo:
    """Publishes schedule ``name`` again, from its next tick after now:
    ticks that passed while it was paused are not published."""
    key = _existing_key(client, name)
    if get(client, name).paused:
        schedule_store.set_fields(client.redis, key, {"since": now_ms(client)}, drop=["paused"])
        schedule_store.announce(client.redis, client.prefix)
    return get(client, name)


def remove(client: QueueContext, name: str) -> bool:
    """Deletes schedule ``name``; False when there was none."""
    check_name("schedule", name)
    queue = schedule_store.registered_queue(client.redis, client.prefix, name)
    if queue is None:
        return False
    removed = schedule_store.delete(client.redis, client.prefix, name, _key_of(client, name, queue))
    schedule_store.announce(client.redis, client.prefix)
    return removed


def due_ticks(when: Timing, policy: Missed, floor_ms: int, now_ms: int) -> list[int]:
    """The ticks a scheduler sends now: after ``floor_ms`` (the latest tick
    handled, or when the schedule was created or resumed), not after
    ``now_ms``, as the missed policy picks them."""
    if policy is Missed.ALL:
        return when.between(floor_ms, now_ms, FIRE_BATCH)
    latest = when.latest(now_ms)
    return [latest] if latest > floor_ms else []


def fire_due(client: QueueContext) -> PassResult:
    """One scheduler pass: publishes the due ticks of every active schedule
    of the prefix. Safe to run in any number of processes at once. A
    schedule whose stored fields do not parse is logged and passed over;
    an error of Redis itself (unreachable, out of memory) ends the pass."""
    located = _located(client)
    states = schedule_store.states(client.redis, [key for _, _, key in located])
    now = now_ms(client)
    published = handled = 0
    next_due: int | None = None
    for (name, dest, key), state in zip(located, states, strict=True):
        if state is None:
            _hash_gone(name, dest, key)
            continue
        _hashes_gone.discard(key)
        if state.get("paused") == "1":
            continue
        try:
            outcome = _fire_one(client, name, dest, key, state, now)
        except (CorruptRecord, LayoutMismatch) as exc:
            # The schedule's fields or its target queue damaged, or the queue
            # of another layout than this client's: the others go on.
            log.error("schedule %r (to queue %r) not fired: %s", name, dest, exc)
            continue
        except (InvalidInput, ValueError) as exc:
            log.warning("schedule %r at %s does not parse: %s", name, key, exc)
            continue
        handled += outcome.handled
        published += outcome.published
        if outcome.next_due_ms is not None:
            next_due = outcome.next_due_ms if next_due is None else min(next_due, outcome.next_due_ms)
    return PassResult(now, published, handled, next_due)


# The hashes found gone that this process has logged: each is logged once,
# and again once it came back and went again.
_hashes_gone: set[str] = set()


def _hash_gone(name: str, dest: Queue, key: str) -> None:
    """A schedule the registry names whose hash is gone: deleted or evicted
    (its definition with it), or a removal cut off between the two."""
    if key not in _hashes_gone:
        _hashes_gone.add(key)
        log.error(
            "schedule %r (to queue %r) is in the registry, but its hash %s is gone: it fires no more; "
            "define it again, or remove it (rqueue schedules remove)",
            name,
            dest.name,
            key,
        )


def _fire_one(client: QueueContext, name: str, dest: Queue, key: str, state: Mapping[str, str], now: int) -> PassResult:
    """Publishes the due ticks of one schedule (at most FIRE_CALLS calls)."""
    when = stored_timing(state.get("every_ms"), state.get("cron"), state.get("timezone"))
    policy = missed_policy(state.get("missed", Missed.ONCE.value))
    floor = _floor(state)
    published = handled = 0
    event = EventKind.SCHEDULED.value in dest.settings().events
    for _ in range(FIRE_CALLS):
        ticks = due_ticks(when, policy, floor, now)
        if not ticks:
            break
        reply = commands.schedule_fire(
            client.scripts,
            key,
            dest.keys,
            client.clock.script_now(),
            state["version"],
            round(SKIP_LATENESS * 1000) if policy is Missed.SKIP else None,
            ticks,
            dest.name,
            event,
        )
        if reply.status is not commands.FireStatus.OK or (reply.last_tick_ms or 0) <= floor:
            # changed, paused or removed since it was read, or not yet due by
            # the clock of the server that holds it: looked at again shortly
            return PassResult(now, published, handled, now + RECHECK_MS)
        handled += 1
        published += reply.published
        if reply.published:
            log.info("schedule %r published %d message(s) to %s", name, reply.published, dest.name)
        floor = reply.last_tick_ms or floor
    backlog = bool(due_ticks(when, policy, floor, now))
    return PassResult(now, published, handled, now if backlog else when.after(max(floor, now)))


__all__ = [
    "Missed",
    "PassResult",
    "ScheduleInfo",
    "define",
    "fire_due",
    "get",
    "list_all",
    "pause",
    "remove",
    "resume",
]
