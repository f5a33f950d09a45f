"""The plain Redis commands rqueue sends besides its scripts: reads for
inspection, and the deletions that need no script (whole keys, records no
group holds). Each translates the driver's errors as the scripts' calls do
(commands.guarded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import redis

from ..connection.cluster import Retrier, no_retry
from ..connection.open import RedisClient
from . import log
from .commands import guarded, text
from .keys import GroupKeys, QueueKeys, partitions_key, registry_key, settings_key

EVENTS_MAX = 10_000  # entries a queue's event stream keeps (approximately)
DELETE_BATCH = 500  # keys deleted per DEL
# Meta field set on every level before a queue's delete reads its groups:
# join.lua and group_create.lua refuse it (RQ_DELETING), so no group is made
# or joined after the read, whose state the delete would leave behind. It
# goes with the meta hash, deleted last. Redis at maxmemory refuses the
# HSET: the delete, which frees memory, goes on without it.
DELETING = "deleting"


def _int(value: Any) -> int:
    return int(value or 0)


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def last_seq(r: RedisClient, keys: QueueKeys) -> int:
    return guarded(lambda: _int(r.hget(keys.meta, "seq")), where=keys.base)


def pause_state(r: RedisClient, keys: QueueKeys) -> str:
    """The queue's pause (lua/pause.lua): "" running, "refuse" or "hold"."""
    raw = guarded(lambda: r.hget(keys.meta, "paused"), where=keys.base)
    return "" if raw is None else text(raw).partition(":")[0]


def records_after(r: RedisClient, keys: QueueKeys, after: int, n: int) -> list[tuple[int, bytes]]:
    """Up to ``n`` stored records with seq > ``after``, oldest first."""

    def read() -> list[tuple[int, bytes]]:
        last_seq, trimmed, layout = r.hmget(keys.meta, "seq", "trimmed", "layout")
        log.check_layout(keys, layout, last_seq)
        last = _int(last_seq)
        start = max(after, _int(trimmed)) + 1
        out: list[tuple[int, bytes]] = []
        while start <= last and len(out) < n:
            seqs = list(range(start, min(last, start + 4 * n) + 1))
            reply = log.read_many(r, keys, seqs)
            recs = log.records(keys, seqs, reply)
            flow = log.stubs(keys, reply)
            if flow:
                recs = log.with_flow(seqs, recs, flow, log.read_flow(r, keys, flow))
            for seq, rec in zip(seqs, recs, strict=True):
                if rec is not None and len(out) < n:
                    out.append((seq, _bytes(rec)))
            start = seqs[-1] + 1
        return out

    return guarded(read, where=keys.base)


def record(r: RedisClient, keys: QueueKeys, seq: int) -> bytes | None:
    rec = guarded(lambda: log.record_of(keys, log.read(r, keys, seq)), where=keys.base)
    if rec is None and log.stream(keys):
        # A stub's record is in the side hash; a replayed one beside the pins.
        rec = guarded(lambda: log.read_flow(r, keys, [seq])[0] or log.read_side(r, keys, [seq])[0], where=keys.base)
    return None if rec is None else _bytes(rec)


def group_names(r: RedisClient, keys: QueueKeys) -> list[str]:
    """The queue's groups, sorted."""
    return guarded(lambda: sorted(text(g) for g in r.hkeys(keys.floors)), where=keys.base)


def has_group(r: RedisClient, keys: QueueKeys, group: str) -> bool:
    return bool(guarded(lambda: r.hexists(keys.floors, group), where=keys.base))


def group_position(r: RedisClient, keys: QueueKeys, group: str, n: int) -> tuple[list[int], int]:
    """The first ``n`` seqs ready for redelivery to ``group`` and its cursor."""
    gk = keys.group(group)

    def read() -> tuple[list[int], int]:
        ready: list[Any] = r.zrange(gk.ready, 0, n - 1)
        return [int(s) for s in ready], _int(r.hget(gk.state, "cursor"))

    return guarded(read, where=keys.base)


def queue_figures(
    r: RedisClient, keys: QueueKeys, dead_letters: QueueKeys, now_ms: int | None
) -> tuple[int, int, int, int]:
    """(last seq, stored records, delayed publishes not due at ``now_ms`` or
    the server's time when None, stored dead letters)."""

    def read() -> tuple[int, int, int, int]:
        now = now_ms if now_ms is not None else server_ms(r)
        # Not MULTI: Redis refuses every command queued in a transaction while
        # it is over maxmemory, and stats matter most then.
        pipe = r.pipeline(transaction=False)
        pipe.hget(keys.meta, "seq")
        n = log.length(pipe, keys)
        pipe.zcount(keys.sched, f"({now}", "+inf")
        m = log.length(pipe, dead_letters)
        got = pipe.execute()
        depth = log.length_of(keys, got[1 : 1 + n])
        dead = log.length_of(dead_letters, got[2 + n : 2 + n + m])
        return _int(got[0]), depth, int(got[1 + n]), dead

    return guarded(read, where=keys.base)


def server_ms(r: RedisClient) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def purge_records(r: RedisClient, keys: QueueKeys, batch: int, progress: Callable[[int], None] | None) -> int:
    """Deletes the stored records of a queue without groups, ``batch`` per
    transaction (each moves the trimmed mark with it); how many there were."""
    last = last_seq(r, keys)
    start = guarded(lambda: _int(r.hget(keys.meta, "trimmed")), where=keys.base) + 1
    deleted = 0
    for low in range(start, last + 1, batch):
        seqs = list(range(low, min(last, low + batch - 1) + 1))

        def delete(seqs: list[int] = seqs) -> int:
            pipe = r.pipeline(transaction=True)
            log.delete_range(pipe, keys, range(seqs[0], seqs[-1] + 1))
            pipe.hset(keys.meta, "trimmed", seqs[-1])
            return int(pipe.execute()[0])

        deleted += guarded(delete, where=keys.base)
        if progress is not None:
            progress(len(seqs))
    return deleted


def _levels(r: RedisClient, keys: QueueKeys) -> list[QueueKeys]:
    """The queue and each of its dead-letter levels that was ever written."""
    levels = [keys]
    below = keys.dead_letters
    while r.exists(below.meta, log.key(below)):
        levels.append(below)
        below = below.dead_letters
    return levels


def deliveries_out(r: Any, gk: GroupKeys) -> list[Any]:
    """Queues the count of a group's deliveries in flight on ``r`` (a
    client or pipeline, sync or asyncio), as deliveriesOut() in
    lua/includes/group_keys.lua counts them: one lease each, the pin at
    +inf left out; in the stream layout also the seqs out on call records
    (group field callout, lua/includes/call_state.lua). Returns what each
    command returned, which :func:`in_flight_of` adds up once read."""
    parts = [r.zcount(gk.lease, "-inf", "(+inf")]
    if gk.call_keys:
        parts.append(r.hget(gk.state, "callout"))
    return parts


def in_flight_of(replies: Sequence[Any]) -> int:
    """The in-flight count from the replies of :func:`deliveries_out`."""
    return sum(int(reply or 0) for reply in replies)


def in_flight(r: RedisClient, keys: QueueKeys) -> int:
    """Deliveries in flight in every group of the queue and of its
    dead-letter levels (each lease set holds one pin at +inf besides them)."""

    def count() -> int:
        total = 0
        for level in _levels(r, keys):
            for g in r.hkeys(level.floors):
                total += in_flight_of(deliveries_out(r, level.group(text(g))))
        return total

    return guarded(count, where=keys.base)


def delete_queue(r: RedisClient, keys: QueueKeys, prefix: str, name: str) -> int:
    """Deletes every key of a queue, its groups and its dead-letter levels
    (read from the queue's own keys: no SCAN, which a user restricted to the
    prefix may not run), and its registry entry; how many keys there were.
    De-duplication ids expire with their window."""

    def delete() -> int:
        levels = _levels(r, keys)
        for level in levels:
            with contextlib.suppress(redis.exceptions.OutOfMemoryError):
                r.hset(level.meta, DELETING, "1")  # see DELETING
        doomed: list[str] = []
        for level in reversed(levels):  # the deepest dead-letter level first
            doomed += level.deletion_order([text(g) for g in r.hkeys(level.floors)])
        deleted = 0
        for start in range(0, len(doomed), DELETE_BATCH):
            deleted += r.delete(*doomed[start : start + DELETE_BATCH])
        r.srem(registry_key(prefix), name)
        return deleted

    return guarded(delete, where=keys.base)


def delete_dead_letters(r: RedisClient, dead_letters: QueueKeys, events: str, seqs: list[int]) -> int:
    """Deletes the dead letters ``seqs`` and records a "purged" event, in one
    transaction; how many were there."""

    def delete() -> int:
        pipe = r.pipeline(transaction=True)
        log.delete(pipe, dead_letters, seqs)
        pipe.xadd(events, {"event": "purged", "count": len(seqs)}, maxlen=EVENTS_MAX, approximate=True)
        return int(pipe.execute()[0])

    return guarded(delete, where=dead_letters.base)


def record_event(r: RedisClient, keys: QueueKeys, fields: dict[str, str]) -> None:
    """Appends an event to the queue's events stream (capped as the
    scripts cap it)."""
    guarded(lambda: r.xadd(keys.events, fields, maxlen=EVENTS_MAX, approximate=True), where=keys.base)  # type: ignore[arg-type]  # str -> str is a valid mapping


def event(entry_id: Any, fields: Any) -> dict[str, str]:
    return {"id": text(entry_id), **{text(k): text(v) for k, v in fields.items()}}


def events_after(r: RedisClient, keys: QueueKeys, last_id: str, count: int) -> list[dict[str, str]]:
    """Events newer than the stream id ``last_id`` ("0" for all), oldest first."""
    low = f"({last_id}" if last_id != "0" else "-"
    entries: list[Any] = guarded(lambda: r.xrange(keys.events, min=low, count=count) or [], where=keys.base)
    return [event(i, f) for i, f in entries]


def newest_events(r: RedisClient, keys: QueueKeys, count: int) -> list[dict[str, str]]:
    """The newest ``count`` events, oldest first."""
    entries: list[Any] = guarded(lambda: r.xrevrange(keys.events, count=count) or [], where=keys.base)
    return [event(i, f) for i, f in reversed(entries)]


# -- the prefix's registry of queues and partitioned queues -------------------


def stored_partitions(r: RedisClient, prefix: str, root: str, retry: Retrier[Any] = no_retry) -> bytes | None:
    """The stored number of partitions of queue ``root`` (None: not partitioned)."""
    raw: bytes | None = guarded(lambda: retry(lambda: r.hget(partitions_key(prefix), root)), where=f"prefix {prefix!r}")
    return raw


def claim_partitions(r: RedisClient, prefix: str, root: str, layout: str, retry: Retrier[Any] = no_retry) -> bool:
    """Stores ``layout`` (the partition count, with placement salts) for
    queue ``root`` unless one is stored already; True when this call stored it."""
    return bool(
        guarded(lambda: retry(lambda: r.hsetnx(partitions_key(prefix), root, layout)), where=f"prefix {prefix!r}")
    )


def set_partitions(r: RedisClient, prefix: str, root: str, layout: str, retry: Retrier[Any] = no_retry) -> None:
    """Writes the prefix's copy of queue ``root``'s layout (after a growth)."""
    guarded(lambda: retry(lambda: r.hset(partitions_key(prefix), root, layout)), where=f"prefix {prefix!r}")


def partition_marker(r: RedisClient, keys: QueueKeys, retry: Retrier[Any] = no_retry) -> bytes | None:
    """The layout stored in the plain queue's meta (partition.lua), or None."""
    raw: bytes | None = guarded(lambda: retry(lambda: r.hget(keys.meta, "partitioned")), where=keys.base)
    return raw


def id_seen(r: RedisClient, keys: QueueKeys, msg_id: str, retry: Retrier[Any] = no_retry) -> tuple[int, int] | None:
    """The seq and expiry (ms, the scripts' clock) stored for message id
    ``msg_id`` in the queue of ``keys`` (publish.lua's id key), or None."""
    raw = guarded(lambda: retry(lambda: r.get(keys.message_id(msg_id))), where=keys.base)
    if raw is None:
        return None
    seq, _, rest = text(raw).partition(":")
    expires = rest.split(":", 1)[0]
    if not seq.isdigit() or not expires.isdigit():
        return None  # not an id record of this version: publish.lua judges it
    return int(seq), int(expires)


def delete_partitioning(r: RedisClient, prefix: str, name: str, marker: QueueKeys) -> int:
    """Deletes the record that queue ``name`` is partitioned: the prefix's
    copy, then the marker in the plain queue's meta (``marker.meta``, which
    holds nothing else); returns how many keys or fields went."""
    gone = int(guarded(lambda: r.hdel(partitions_key(prefix), name), where=f"prefix {prefix!r}"))
    return gone + int(guarded(lambda: r.hdel(marker.meta, "partitioned"), where=marker.base))


def register_queue(r: RedisClient, prefix: str, name: str, retry: Retrier[Any] = no_retry) -> None:
    guarded(lambda: retry(lambda: r.sadd(registry_key(prefix), name)), where=f"prefix {prefix!r}")


def registered_queues(r: RedisClient, prefix: str) -> list[str]:
    return guarded(lambda: sorted(text(m) for m in r.smembers(registry_key(prefix))), where=f"prefix {prefix!r}")


def have_dead_letters(r: RedisClient, levels: list[QueueKeys]) -> list[bool]:
    """For each queue, whether its dead-letter queue was ever written."""

    def read() -> list[bool]:
        pipe = r.pipeline(transaction=False)  # plain reads: safe to send again
        for keys in levels:
            pipe.exists(keys.dead_letters.meta)
        return [bool(n) for n in pipe.execute()]

    return guarded(read)


# -- the prefix's pattern settings ---------------------------------------------


def read_settings(r: RedisClient, prefix: str, retry: Retrier[Any] = no_retry) -> dict[str, str]:
    """Every stored setting: "<pattern> <setting>" -> its JSON value."""
    raw: dict[Any, Any] = guarded(lambda: retry(lambda: r.hgetall(settings_key(prefix))), where=f"prefix {prefix!r}")
    return {text(k): text(v) for k, v in raw.items()}


def write_settings(r: RedisClient, prefix: str, values: dict[str, str]) -> None:
    guarded(lambda: r.hset(settings_key(prefix), mapping=values), where=f"prefix {prefix!r}")  # type: ignore[arg-type]  # str -> str is a valid mapping


def delete_settings(r: RedisClient, prefix: str, fields: list[str]) -> None:
    guarded(lambda: r.hdel(settings_key(prefix), *fields), where=f"prefix {prefix!r}")


# -- the overview of many queues at once ----------------------------------------


class GroupFigures(NamedTuple):
    """One group's counts as the overview reads them (no script: plain reads)."""

    name: str
    in_flight: int
    delayed: int
    acked: int
    consumers: int


class LevelFigures(NamedTuple):
    """One queue's (or partition's) counts as the overview reads them."""

    last_seq: int
    depth: int
    scheduled: int
    dead_letters: int
    groups: list[GroupFigures]


def queue_index(r: RedisClient, prefix: str) -> tuple[list[str], dict[str, bytes]]:
    """The registered queue names (sorted) and the stored partition counts
    by queue: one round trip (one per node holding them on a cluster)."""

    def read() -> tuple[list[str], dict[str, bytes]]:
        pipe = r.pipeline(transaction=False)  # plain reads: safe to send again
        pipe.smembers(registry_key(prefix))
        pipe.hgetall(partitions_key(prefix))
        names, parts = pipe.execute()
        return sorted(text(m) for m in names), {text(k): _bytes(v) for k, v in parts.items()}

    return guarded(read, where=f"prefix {prefix!r}")


def now_ms(r: RedisClient) -> int:
    """The server's time in ms (a cluster pipeline cannot carry TIME)."""
    return guarded(lambda: server_ms(r))


def queue_overview(r: RedisClient, levels: list[tuple[QueueKeys, QueueKeys]], now_ms: int) -> list[LevelFigures]:
    """For each (queue keys, its dead-letter queue's keys): its counts and
    its groups' (in flight, delayed, acked, consumers), in two pipelined
    round trips whatever the number of queues. Unlike stats.lua this is not
    one snapshot per group: the figures of a busy queue may be a few
    commands apart, which an overview tolerates."""

    def read() -> list[LevelFigures]:
        pipe = r.pipeline(transaction=False)  # plain reads: safe to send again
        widths = []
        for keys, dead in levels:
            pipe.hget(keys.meta, "seq")
            n = log.length(pipe, keys)
            pipe.zcount(keys.sched, f"({now_ms}", "+inf")
            m = log.length(pipe, dead)
            pipe.hkeys(keys.floors)
            widths.append((n, m))
        replies = pipe.execute()
        # Per level: last seq, depth, scheduled, dead letters, group names.
        first: list[tuple[Any, int, Any, int, Any]] = []
        at = 0
        for (keys, dead), (n, m) in zip(levels, widths, strict=True):
            depth = log.length_of(keys, replies[at + 1 : at + 1 + n])
            dead_count = log.length_of(dead, replies[at + 2 + n : at + 2 + n + m])
            first.append((replies[at], depth, replies[at + 1 + n], dead_count, replies[at + 2 + n + m]))
            at += 3 + n + m
        names = [sorted(text(g) for g in level[4]) for level in first]
        pipe = r.pipeline(transaction=False)
        flights: list[int] = []  # the replies of deliveries_out per group
        for (keys, _), groups in zip(levels, names, strict=True):
            for g in groups:
                gk = keys.group(g)
                flights.append(len(deliveries_out(pipe, gk)))
                pipe.zcard(gk.delay)
                pipe.hget(gk.state, "acked")
                pipe.hlen(gk.consumers)
        second = pipe.execute() if any(names) else []
        out: list[LevelFigures] = []
        at = 0
        width = iter(flights)
        for i, groups in enumerate(names):
            figures = []
            for g in groups:
                w = next(width)
                flight = in_flight_of(second[at : at + w])
                delayed, acked, consumers = second[at + w : at + w + 3]
                figures.append(GroupFigures(g, flight, int(delayed), _int(acked), int(consumers)))
                at += w + 3
            last, depth, scheduled, dead_letters, _ = first[i]
            out.append(LevelFigures(_int(last), depth, int(scheduled), dead_letters, figures))
        return out

    return guarded(read)


# -- handler results (docs/results.md) -----------------------------------------


def save_result(r: RedisClient, keys: QueueKeys, seq: int, group: str, value: bytes, ttl_ms: int) -> None:
    """Keeps the result ``value`` of message ``seq`` for ``group`` for ``ttl_ms``, headed
    by the queue's incarnation as ack_result.lua heads it: a failure, kept
    after its settle (a success is kept by ack_result.lua with its ack)."""

    def save() -> None:
        inc = r.hget(keys.meta, "inc")
        key, headed = keys.result(seq, group), headed_result(inc, value)
        # A failure is kept after its settle, in a call of its own, so it
        # may arrive late: after an operator's replay reopened the message
        # (replay.lua deletes its result) and another worker settled it
        # with a result of its own (ack_result.lua). Written with NX, a late
        # failure never replaces the result of that later settle. A result
        # there of an earlier incarnation of the queue (deleted and made
        # anew: its seqs name other messages) answers for nothing and is
        # replaced; a settle racing in between those two calls is a narrow
        # window of a queue made anew, not closed here.
        if r.set(key, headed, px=ttl_ms, nx=True) or same_incarnation(r.get(key), inc):
            return
        r.set(key, headed, px=ttl_ms)

    guarded(save, where=keys.base)


def same_incarnation(stored: Any, incarnation: Any) -> bool:
    """Whether the stored result ``stored`` (None: gone) was kept by the
    queue's incarnation ``incarnation`` (save_result keeps no failure over it)."""
    if stored is None:
        return False
    raw = stored.encode(errors="surrogateescape") if isinstance(stored, str) else bytes(stored)
    return raw.partition(b"\n")[0] + b"\n" == headed_result(incarnation, b"")


def read_result(r: RedisClient, keys: QueueKeys, seq: int, group: str | None) -> tuple[bytes | None, str]:
    """The stored result of message ``seq`` for ``group`` (None: none, and
    no group: not read) and the queue's incarnation now ("" when it has none)."""

    def read() -> list[Any]:
        if group is None:
            return [None, r.hget(keys.meta, "inc")]
        pipe = r.pipeline(transaction=False)
        pipe.get(keys.result(seq, group))
        pipe.hget(keys.meta, "inc")
        return list(pipe.execute())

    raw, inc = guarded(read, where=keys.base)
    return raw, "" if inc is None else text(inc)


def headed_result(incarnation: Any, value: bytes) -> bytes:
    """``value`` after the queue's incarnation and a newline, as stored results are."""
    return ("" if incarnation is None else text(incarnation)).encode(errors="surrogateescape") + b"\n" + value
