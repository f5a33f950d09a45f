"""The commands of rqueue.engine.commands and rqueue.engine.store for an
asyncio client: each awaits its script (or plain commands) with the same
KEYS and ARGV builders and the same reply parsers as the sync call, and
translates errors in the same place (commands.translate). Only the I/O
differs.

Long because it is the asyncio twin of commands.py and store.py together:
every awaitable call sits beside the others, as the sync ones do there.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from ..clock import Clock
from ..randomness import Randomness
from ..results import GroupStats, MessageStatus
from . import commands as c
from . import log
from .async_scripts import AsyncScript, AsyncScripts
from .commands import text
from .keys import QueueKeys, partitions_key, registry_key, settings_key
from .store import (
    DELETE_BATCH,
    DELETING,
    EVENTS_MAX,
    deliveries_out,
    event,
    headed_result,
    in_flight_of,
    same_incarnation,
)

T = TypeVar("T")


async def run(script: AsyncScript, keys: Sequence[Any], args: Sequence[Any], queue: str, where: str) -> Any:
    """``script`` awaited with ``keys`` and ``args``; every error it raises
    is translated (commands.translate), with the driver's error as cause."""
    try:
        return await script(keys, args)
    except (redis.RedisError, OSError) as exc:
        raise c.translate(exc, queue, where) from exc


async def guarded(call: Callable[[], Awaitable[T]], queue: str = "", where: str = "") -> T:
    """``await call()`` (plain Redis commands), its errors translated."""
    try:
        return await call()
    except (redis.RedisError, OSError) as exc:
        raise c.translate(exc, queue, where) from exc


@dataclass(frozen=True)
class AsyncGroupCall(c.GroupArgs):
    """:class:`~rqueue.engine.commands.GroupArgs` with the scripts of an
    asyncio client."""

    scripts: AsyncScripts

    @classmethod
    def of(
        cls,
        scripts: AsyncScripts,
        clock: Clock,
        randomness: Randomness,
        keys: list[str],
        queue: str,
        where: str,
        group: str,
        consumer: str,
        settings: c.GroupSettings,
    ) -> AsyncGroupCall:
        fields = c.GroupArgs.fields_of(clock, randomness, keys, queue, where, group, consumer, settings)
        fields["marks"] = fields["marks"] and wakes_usable(scripts)
        return cls(scripts=scripts, **fields)

    async def run(self, script: AsyncScript, extra: Sequence[Any]) -> Any:
        try:
            return await script(self.keys, self.argv(extra), self.keys_stream)
        except (redis.RedisError, OSError) as exc:
            raise c.translate(exc, self.queue, self.where) from exc

    async def settle(self, script: AsyncScript, extra: Sequence[Any]) -> Any:
        """:meth:`run` for a script that reads none of the flow-control keys
        (SETTLE_KEYS)."""
        try:
            return await script(self.settle_keys, self.argv(extra), self.settle_keys_stream)
        except (redis.RedisError, OSError) as exc:
            raise c.translate(exc, self.queue, self.where) from exc


# -- the group scripts ---------------------------------------------------------


# fetch and ack await their script themselves (one coroutine less than
# call.run): they are the calls a consumer makes per message.


async def fetch(
    call: AsyncGroupCall, n: int, token: str, acks: Sequence[c.Tag] = (), waits: bool = False
) -> c.FetchReply:
    """As :func:`rqueue.engine.commands.fetch`."""
    packed, slots = c.pack_acks(acks, call.spans)
    args = c.fetch_args(n, token + call.rate, acks, call.marks and waits, packed)
    sent = len(acks) if slots is None else len(slots)
    if not call.flow[0]:  # the short layout first, as the sync fetch (commands.fetch)
        try:
            guess = call.guess.range(n) if call.fetch_keys_stream else None
            argv = call.argv(args)
            pair = None
            if guess is not None:
                read = ("XRANGE", call.keys[1], *guess)
                pair = await call.scripts.fetch.call_and_read(call.fetch_keys, argv, read, True)
            reply, entries = pair or (await call.scripts.fetch(call.fetch_keys, argv, call.fetch_keys_stream), None)
            parsed = c.noted(call, c.parse_fetch(reply, token, sent, slots, len(acks), call.fetch_keys_stream))
            filled = c.filled_by_guess(parsed, guess, entries)
            return filled if filled is not None else await claimed_filled(call, parsed)
        except (redis.RedisError, OSError) as exc:
            if not c.needs_flow_keys(exc):
                raise c.translate(exc, call.queue, call.where) from exc
            call.flow[0] = True
    try:
        reply = await call.scripts.fetch(call.keys, call.argv(args), call.keys_stream)
    except (redis.RedisError, OSError) as exc:
        raise c.translate(exc, call.queue, call.where) from exc
    return c.noted(call, c.parse_fetch(reply, token, sent, slots, len(acks), call.keys_stream))


async def claimed_filled(call: AsyncGroupCall, reply: c.FetchReply) -> c.FetchReply:
    """As :func:`rqueue.engine.commands.claimed_filled`."""
    if reply.claim is None:
        return reply
    _, lo, hi = reply.claim
    try:
        entries, incarnation = await call.scripts.read_log(call.keys[1], lo, hi, call.keys[0])
    except (redis.RedisError, OSError) as exc:
        raise c.translate(exc, call.queue, call.where) from exc
    return c.fill_claimed(c.claim_of_incarnation(reply, incarnation, call.where), entries)


async def newest_wake(r: Any, keys: QueueKeys) -> str | None:
    """As :func:`rqueue.engine.notify.newest_wake`, for an asyncio client."""
    try:
        return c.newest_wake_id(await r.xrevrange(keys.wakes, count=1))
    except (redis.RedisError, OSError):
        return None


async def wake_waiters(r: Any, keys: QueueKeys) -> None:
    """As :func:`rqueue.engine.notify.wake_waiters`, for an asyncio client."""
    await r.xadd(keys.wakes, {"seq": "0"}, maxlen=1, approximate=False)


def wakes_usable(scripts: AsyncScripts) -> bool:
    """As :func:`rqueue.engine.commands.wakes_usable`, for an asyncio client."""
    from redis.asyncio import RedisCluster  # (imported where the asyncio client is used)

    return not isinstance(scripts.redis, RedisCluster)


async def wait_then_fetch(
    call: AsyncGroupCall, wakes: str, since: str, block_ms: int, n: int, token: str
) -> c.WokenFetch:
    """As :func:`rqueue.engine.commands.wait_then_fetch`: the wait for the
    queue's wake-up and the fetch in one pipeline. A NOSCRIPT reply (the
    fetch did not run) is followed by the fetch alone, which loads it."""
    args = c.fetch_args(n, token + call.rate, marks=True)
    keys = call.keys if call.flow[0] else call.fetch_keys
    pipe = call.scripts.redis.pipeline(transaction=False)
    pipe.execute_command("XREAD", "BLOCK", max(1, block_ms), "STREAMS", wakes, since)
    pipe.execute_command("EVALSHA", call.scripts.fetch.for_keys(keys).sha, len(keys), *keys, *call.argv(args))
    try:
        woke, reply = await pipe.execute(raise_on_error=False)
    except (redis.RedisError, OSError) as exc:
        raise c.translate(exc, call.queue, call.where) from exc
    except c.MEMORY_WRONG_TYPE as exc:  # as the sync wait_then_fetch
        return c.WokenFetch(since, f"{type(exc).__name__}: {exc}", await fetch(call, n, token, waits=True))
    refused = str(woke) or type(woke).__name__ if isinstance(woke, BaseException) else ""
    if not refused:
        since = c.last_wake_id(woke, since)
    if isinstance(reply, BaseException):
        if c.needs_flow_keys(reply):
            call.flow[0] = True  # nothing was changed: the fetch again, with every key
        elif not str(reply).startswith("NOSCRIPT"):
            raise c.translate(reply, call.queue, call.where) from reply
        return c.WokenFetch(since, refused, await fetch(call, n, token, waits=True))
    stream = call.keys_stream if call.flow[0] else call.fetch_keys_stream
    parsed = c.noted(call, c.parse_fetch(reply, token, 0, call_field=stream))
    return c.WokenFetch(since, refused, await claimed_filled(call, parsed))


async def ack(call: AsyncGroupCall, tags: Sequence[c.Tag], strict: bool, ranges: bool = True) -> list[str]:
    packed, slots = c.pack_acks(tags, call.spans) if ranges else (None, None)
    try:
        reply = await call.scripts.ack(call.ack_keys, c.ack_args(call, tags, strict, packed), call.ack_keys_stream)
    except (redis.RedisError, OSError) as exc:
        error = c.translate(exc, call.queue, call.where)
        if not (strict and slots is not None and isinstance(error, c.RETRY_AS_TRIPLES)):
            raise error from exc
        # as the sync ack (commands.ack): again as triples
        try:
            reply = await call.scripts.ack(call.ack_keys, c.ack_args(call, tags, strict), call.ack_keys_stream)
        except (redis.RedisError, OSError) as exc2:
            raise c.translate(exc2, call.queue, call.where) from exc2
        slots = None
    return c.parse_ack(reply, strict, slots, len(tags))


async def ack_run(call: AsyncGroupCall, lo: int, n: int, token: str) -> bool:
    args = c.run_ack_args(call, lo, n, token)
    if args is None:
        return False
    try:
        await call.scripts.ack(call.ack_keys, args, call.ack_keys_stream)
    except (redis.RedisError, OSError) as exc:
        error = c.translate(exc, call.queue, call.where)
        if isinstance(error, c.RETRY_AS_TRIPLES):
            return False  # as the sync ack_run: the caller sends the tags as triples
        raise error from exc
    return True


async def nack(call: AsyncGroupCall, tag: c.Tag, delay_ms: int | None, error: str, event: str = "") -> c.NackReply:
    return c.parse_nack(await call.settle(call.scripts.nack, c.nack_args(tag, delay_ms, error, event)))


async def nack_many(
    call: AsyncGroupCall, tags: Sequence[c.Tag], delay_ms: int | None, error: str, event: str
) -> list[c.NackReply | str]:
    """As commands.nack_many."""
    return c.parse_nack_many(await call.settle(call.scripts.nack, c.nack_many_args(tags, delay_ms, error, event)))


async def ack_results(
    call: AsyncGroupCall,
    tags: Sequence[c.Tag],
    result_keys: Sequence[str],
    ttl_ms: int | None,
    results: Sequence[bytes],
    event: bool,
    strict: bool,
) -> list[str]:
    """As commands.ack_results."""
    keys = c.ack_results_keys(call, result_keys)
    args = call.argv(c.ack_results_args(tags, ttl_ms, results, event, strict))
    return c.parse_ack(await run(call.scripts.ack_result, keys, args, call.queue, call.where), strict)


async def ack_completed(call: AsyncGroupCall, tags: Sequence[c.Tag], strict: bool) -> list[str]:
    """As commands.ack_completed."""
    return await ack_results(call, tags, [], None, [], True, strict)


async def reject(call: AsyncGroupCall, tag: c.Tag, reason: str, text: str, event: str = "") -> int:
    return int(await call.settle(call.scripts.reject, c.reject_args(tag, reason, text, event)))


async def set_aside(
    call: AsyncGroupCall, items: Sequence[c.AsideTag], result_keys: Sequence[str], ttl_ms: int | None
) -> list[int | str]:
    args = call.argv(c.set_aside_args(items, ttl_ms))
    return c.parse_set_aside(
        await run(call.scripts.set_aside, c.set_aside_keys(call, result_keys), args, call.queue, call.where)
    )


async def extend(call: AsyncGroupCall, tags: Sequence[c.Tag]) -> c.ExtendReply:
    return c.parse_extend(await call.settle(call.scripts.extend, c.flat_tags(tags)))


async def heartbeat(call: AsyncGroupCall, timeout_ms: int, sync: bool, tags: Sequence[c.Tag]) -> c.HeartbeatReply:
    return c.parse_heartbeat(await call.settle(call.scripts.heartbeat, c.heartbeat_args(timeout_ms, sync, tags)))


async def join(call: AsyncGroupCall, liveness_ms: int, incarnation: str) -> c.JoinReply:
    return c.parse_join(await call.settle(call.scripts.join, c.join_args(liveness_ms, incarnation)))


async def leave(call: AsyncGroupCall, consumer: str, graceful: bool) -> c.LeaveReply:
    """As :func:`rqueue.engine.commands.leave`."""
    reply = c.parse_leave(await call.settle(call.scripts.leave, c.leave_args(consumer, graceful)))
    if consumer == call.consumer:
        call.spans.clear()
    return reply


async def purge(call: AsyncGroupCall, batch: int) -> c.PurgeReply:
    return c.parse_purge(await call.run(call.scripts.purge, [batch]))


async def settle_to(call: AsyncGroupCall, target: int, after: int, batch: int) -> c.SettleToReply:
    settled, reached, more = await call.settle(call.scripts.settle_to, [target, after, batch])
    return c.SettleToReply(int(settled), int(reached), int(more) == 1)


async def replay(call: AsyncGroupCall, dead_letter_seqs: Sequence[int], result_keys: Sequence[str]) -> list[str]:
    """One call of replay.lua (commands.replay)."""
    keys = c.replay_keys(call, result_keys)
    return c.parse_replay(
        await run(call.scripts.replay, keys, call.argv(list(dead_letter_seqs)), call.queue, call.where)
    )


async def status(
    scripts: AsyncScripts, keys: QueueKeys, now: int | str, msg_id: str | None, seq: int | None, groups: Sequence[str]
) -> MessageStatus:
    """One call of status.lua (commands.status)."""
    args = c.status_args(now, seq, groups)
    return c.parse_status(await run(scripts.status, keys.status_keys(msg_id, groups), args, "", keys.base))


async def group_create(call: AsyncGroupCall, mode: str, value: str) -> c.GroupStartReply:
    """As commands.group_create."""
    reply = await call.run(call.scripts.group_create, [mode, value])
    return c.GroupStartReply(int(reply[0]), int(reply[1]))


async def group_reset(call: AsyncGroupCall, mode: str, value: str, force: bool) -> c.ResetReply:
    """As commands.group_reset."""
    reply = await call.run(call.scripts.group_reset, [mode, value, "1" if force else "0"])
    return c.ResetReply(int(reply[0]), int(reply[1]), int(reply[2]))


async def group_delete(call: AsyncGroupCall, force: bool) -> int:
    """As commands.group_delete."""
    return int((await call.run(call.scripts.group_delete, ["1" if force else "0"]))[0])


async def retain(
    scripts: AsyncScripts,
    keys: QueueKeys,
    now: int | str,
    max_age_ms: int | None,
    max_length: int | None,
    apply: bool,
    limit: int,
    queue: str,
) -> c.RetainReply:
    """As commands.retain."""
    args = c.retain_args(now, max_age_ms, max_length, apply, limit)
    return c.parse_retain(await run(scripts.retain, keys.retain_keys(), args, queue, keys.base))


async def stats(call: AsyncGroupCall) -> GroupStats:
    return c.group_stats(call.group, await call.run(call.scripts.stats, []))


# -- publishing ----------------------------------------------------------------


async def with_memory_figures(error: BaseException, info_memory: Callable[[], Awaitable[Any]]) -> BaseException:
    """As :func:`rqueue.engine.commands.with_memory_figures`, INFO memory of
    the server that refused awaited (``info_memory()``)."""
    if not c.lacks_memory_figures(error):
        return error
    try:
        info = await info_memory()
    except Exception:  # the refusal is what matters: said without figures
        return error
    return c.memory_figured(error, info)


async def publish_each(scripts: AsyncScripts, calls: Sequence[c.PublishCall], queue: str) -> list[Any]:
    """Runs publish calls in order, one round trip each; per call its raw
    reply or its error, translated. A call after one that failed is not
    sent: its error is ConnectionLost-free "not sent", so that the caller
    reports only what was stored (publishing.failure)."""
    out: list[Any] = []
    for keys, args in calls:
        try:
            out.append(await scripts.publish(keys, args))
        except (redis.RedisError, OSError) as exc:
            out.append(await with_memory_figures(c.translate(exc, queue), lambda: scripts.redis.info("memory")))
            out += [out[-1]] * (len(calls) - len(out))
            break
    return out


# -- plain commands (rqueue.engine.store's, awaited) -----------------------------


def _int(value: Any) -> int:
    return int(value or 0)


async def group_names(r: Any, keys: QueueKeys) -> list[str]:
    async def read() -> list[str]:
        return sorted(text(g) for g in await r.hkeys(keys.floors))

    return await guarded(read, where=keys.base)


async def has_group(r: Any, keys: QueueKeys, group: str) -> bool:
    async def read() -> bool:
        return bool(await r.hexists(keys.floors, group))

    return await guarded(read, where=keys.base)


async def records_after(r: Any, keys: QueueKeys, after: int, n: int) -> list[tuple[int, bytes]]:
    """Up to ``n`` stored records with seq > ``after``, oldest first (as store.records_after)."""

    async def read() -> list[tuple[int, bytes]]:
        last_seq, trimmed, layout = await r.hmget(keys.meta, "seq", "trimmed", "layout")
        log.check_layout(keys, layout, last_seq)
        last = _int(last_seq)
        start = max(after, _int(trimmed)) + 1
        out: list[tuple[int, bytes]] = []
        while start <= last and len(out) < n:
            seqs = list(range(start, min(last, start + 4 * n) + 1))
            reply = await log.read_many(r, keys, seqs)
            recs = log.records(keys, seqs, reply)
            flow = log.stubs(keys, reply)
            if flow:
                recs = log.with_flow(seqs, recs, flow, await log.read_flow(r, keys, flow))
            for seq, rec in zip(seqs, recs, strict=True):
                if rec is not None and len(out) < n:
                    out.append((seq, rec if isinstance(rec, bytes) else rec.encode()))
            start = seqs[-1] + 1
        return out

    return await guarded(read, where=keys.base)


async def queue_figures(
    r: Any, keys: QueueKeys, dead_letters: QueueKeys, now_ms: int | None
) -> tuple[int, int, int, int]:
    """As store.queue_figures."""

    async def read() -> tuple[int, int, int, int]:
        if now_ms is None:
            sec, usec = await r.time()
            now = int(sec) * 1000 + int(usec) // 1000
        else:
            now = now_ms
        # Not MULTI: as store.queue_figures.
        pipe = r.pipeline(transaction=False)
        pipe.hget(keys.meta, "seq")
        n = log.length(pipe, keys)
        pipe.zcount(keys.sched, f"({now}", "+inf")
        m = log.length(pipe, dead_letters)
        got = await pipe.execute()
        depth = log.length_of(keys, got[1 : 1 + n])
        dead = log.length_of(dead_letters, got[2 + n : 2 + n + m])
        return _int(got[0]), depth, int(got[1 + n]), dead

    return await guarded(read, where=keys.base)


async def pause_state(r: Any, keys: QueueKeys) -> str:
    """As store.pause_state: "" running, "refuse" or "hold"."""
    raw = await guarded(lambda: r.hget(keys.meta, "paused"), where=keys.base)
    return "" if raw is None else c.text(raw).partition(":")[0]


async def purge_records(r: Any, keys: QueueKeys, batch: int) -> int:
    """As store.purge_records: the records of a queue without groups,
    ``batch`` per transaction."""
    last = await guarded(lambda: r.hget(keys.meta, "seq"), where=keys.base)
    start = _int(await guarded(lambda: r.hget(keys.meta, "trimmed"), where=keys.base)) + 1
    deleted = 0
    for low in range(start, _int(last) + 1, batch):
        seqs = list(range(low, min(_int(last), low + batch - 1) + 1))

        async def delete(seqs: list[int] = seqs) -> int:
            async with r.pipeline(transaction=True) as pipe:
                log.delete_range(pipe, keys, range(seqs[0], seqs[-1] + 1))
                pipe.hset(keys.meta, "trimmed", seqs[-1])
                return int((await pipe.execute())[0])

        deleted += await guarded(delete, where=keys.base)
    return deleted


async def last_seq(r: Any, keys: QueueKeys) -> int:
    return _int(await guarded(lambda: r.hget(keys.meta, "seq"), where=keys.base))


async def record(r: Any, keys: QueueKeys, seq: int) -> bytes | None:
    rec = log.record_of(keys, await guarded(lambda: log.read(r, keys, seq), where=keys.base))
    if rec is None and log.stream(keys):
        # A stub's record is in the side hash; a replayed one beside the pins.
        rec = (await guarded(lambda: log.read_flow(r, keys, [seq]), where=keys.base))[0]
        if rec is None:
            rec = (await guarded(lambda: log.read_side(r, keys, [seq]), where=keys.base))[0]
    return None if rec is None else rec if isinstance(rec, bytes) else rec.encode()


async def group_position(r: Any, keys: QueueKeys, group: str, n: int) -> tuple[list[int], int]:
    """As store.group_position."""
    gk = keys.group(group)

    async def read() -> tuple[list[int], int]:
        ready = await r.zrange(gk.ready, 0, n - 1)
        return [int(s) for s in ready], _int(await r.hget(gk.state, "cursor"))

    return await guarded(read, where=keys.base)


async def _levels(r: Any, keys: QueueKeys) -> list[QueueKeys]:
    levels = [keys]
    below = keys.dead_letters
    while await r.exists(below.meta, log.key(below)):
        levels.append(below)
        below = below.dead_letters
    return levels


async def in_flight(r: Any, keys: QueueKeys) -> int:
    """As store.in_flight."""

    async def count() -> int:
        total = 0
        for level in await _levels(r, keys):
            for g in await r.hkeys(level.floors):
                total += in_flight_of([await reply for reply in deliveries_out(r, level.group(text(g)))])
        return total

    return await guarded(count, where=keys.base)


async def delete_queue(r: Any, keys: QueueKeys, prefix: str, name: str) -> int:
    """As store.delete_queue."""

    async def delete() -> int:
        levels = await _levels(r, keys)
        for level in levels:
            with contextlib.suppress(redis.exceptions.OutOfMemoryError):
                await r.hset(level.meta, DELETING, "1")  # as store.delete_queue
        doomed: list[str] = []
        for level in reversed(levels):  # as store.delete_queue
            doomed += level.deletion_order([text(g) for g in await r.hkeys(level.floors)])
        deleted = 0
        for start in range(0, len(doomed), DELETE_BATCH):
            deleted += int(await r.delete(*doomed[start : start + DELETE_BATCH]))
        await r.srem(registry_key(prefix), name)
        return deleted

    return await guarded(delete, where=keys.base)


async def delete_dead_letters(r: Any, dead_letters: QueueKeys, events: str, seqs: list[int]) -> int:
    """As store.delete_dead_letters: one transaction."""

    async def delete() -> int:
        async with r.pipeline(transaction=True) as pipe:
            log.delete(pipe, dead_letters, seqs)
            pipe.xadd(events, {"event": "purged", "count": len(seqs)}, maxlen=EVENTS_MAX, approximate=True)
            return int((await pipe.execute())[0])

    return await guarded(delete, where=dead_letters.base)


async def events_after(r: Any, keys: QueueKeys, last_id: str, count: int) -> list[dict[str, str]]:
    low = f"({last_id}" if last_id != "0" else "-"
    entries = await guarded(lambda: r.xrange(keys.events, min=low, count=count), where=keys.base)
    return [event(i, f) for i, f in entries or []]


async def newest_events(r: Any, keys: QueueKeys, count: int) -> list[dict[str, str]]:
    entries = await guarded(lambda: r.xrevrange(keys.events, count=count), where=keys.base)
    return [event(i, f) for i, f in reversed(entries or [])]


async def partition_counts(r: Any, prefix: str) -> dict[str, bytes]:
    """Every stored number of partitions of the prefix, by queue."""
    raw = await guarded(lambda: r.hgetall(partitions_key(prefix)), where=f"prefix {prefix!r}")
    return {text(k): v if isinstance(v, bytes) else str(v).encode() for k, v in raw.items()}


async def mark_partitioned(
    scripts: AsyncScripts, keys: QueueKeys, layout: str, expected: str, queue: str
) -> tuple[c.MarkStatus, str]:
    """As :func:`rqueue.engine.commands.mark_partitioned`, awaited."""
    return c.parse_mark(await run(scripts.partition, c.mark_keys(keys), [layout, expected], queue, keys.base))


async def pause(
    scripts: AsyncScripts,
    keys: QueueKeys,
    group: str | None,
    pause: bool,
    mode: str,
    queue: str,
    record: bool = False,
    now: str = "",
) -> c.PauseReply:
    """As :func:`rqueue.engine.commands.pause`, awaited."""
    call = c.pause_call(keys, group, pause, mode, record, now)
    return c.parse_pause(await run(scripts.pause, *call, queue, keys.base))


async def claim_partitions(r: Any, prefix: str, root: str, layout: str) -> bool:
    return bool(await guarded(lambda: r.hsetnx(partitions_key(prefix), root, layout), where=f"prefix {prefix!r}"))


async def delete_partitioning(r: Any, prefix: str, name: str, marker: QueueKeys) -> int:
    """As :func:`rqueue.engine.store.delete_partitioning`, awaited."""
    gone = int(await guarded(lambda: r.hdel(partitions_key(prefix), name), where=f"prefix {prefix!r}"))
    return gone + int(await guarded(lambda: r.hdel(marker.meta, "partitioned"), where=marker.base))


async def registered_queues(r: Any, prefix: str) -> list[str]:
    members = await guarded(lambda: r.smembers(registry_key(prefix)), where=f"prefix {prefix!r}")
    return sorted(text(m) for m in members)


async def record_event(r: Any, keys: QueueKeys, fields: dict[str, str]) -> None:
    """Appends an event to the queue's events stream (as rqueue.engine.store.record_event)."""
    await guarded(lambda: r.xadd(keys.events, fields, maxlen=EVENTS_MAX, approximate=True), where=keys.base)


async def register_queue(r: Any, prefix: str, name: str) -> None:
    await guarded(lambda: r.sadd(registry_key(prefix), name), where=f"prefix {prefix!r}")


async def read_settings(r: Any, prefix: str) -> dict[str, str]:
    raw: dict[Any, Any] = await guarded(lambda: r.hgetall(settings_key(prefix)), where=f"prefix {prefix!r}")
    return {text(k): text(v) for k, v in raw.items()}


async def write_settings(r: Any, prefix: str, values: dict[str, str]) -> None:
    await guarded(lambda: r.hset(settings_key(prefix), mapping=values), where=f"prefix {prefix!r}")


def settings_values(values: dict[str, Any], pattern: str) -> dict[str, str]:
    """The hash fields that store ``values`` for ``pattern`` (as SettingsStore.configure writes them)."""
    return {f"{pattern} {k}": json.dumps(v) for k, v in values.items()}


async def save_result(r: Any, keys: QueueKeys, seq: int, group: str, value: bytes, ttl_ms: int) -> None:
    """As rqueue.engine.store.save_result."""

    async def save() -> None:
        inc = await r.hget(keys.meta, "inc")
        key, headed = keys.result(seq, group), headed_result(inc, value)
        # NX: a late failure never replaces the result of a later settle
        # (see rqueue.engine.store.save_result).
        if await r.set(key, headed, px=ttl_ms, nx=True) or same_incarnation(await r.get(key), inc):
            return
        await r.set(key, headed, px=ttl_ms)

    await guarded(save, where=keys.base)


async def read_result(r: Any, keys: QueueKeys, seq: int, group: str | None) -> tuple[bytes | None, str]:
    """As rqueue.engine.store.read_result."""

    async def read() -> list[Any]:
        if group is None:
            return [None, await r.hget(keys.meta, "inc")]
        pipe = r.pipeline(transaction=False)
        pipe.get(keys.result(seq, group))
        pipe.hget(keys.meta, "inc")
        return list(await pipe.execute())

    raw, inc = await guarded(read, where=keys.base)
    return raw, "" if inc is None else text(inc)
