"""The commands of rqueue.engine.commands and rqueue.engine.store for an
asyncio client: each awaits its script (or plain commands) with the same
KEYS and ARGV builders and the same reply parsers as the sync call, and
translates errors in the same place (commands.translate). Only the I/O
differs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from ..clock import Clock
from ..randomness import Randomness
from ..results import GroupStats
from . import commands as c
from .async_scripts import AsyncScript, AsyncScripts
from .commands import text
from .keys import QueueKeys, registry_key, settings_key
from .store import EVENTS_MAX

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
        return cls(scripts=scripts, **fields)

    async def run(self, script: AsyncScript, extra: Sequence[Any]) -> Any:
        return await run(script, self.keys, self.argv(extra), self.queue, self.where)


# -- the group scripts ---------------------------------------------------------


async def fetch(call: AsyncGroupCall, n: int, token: str, acks: Sequence[c.Tag] = ()) -> c.FetchReply:
    return c.parse_fetch(await call.run(call.scripts.fetch, c.fetch_args(n, token + call.rate, acks)), token, len(acks))


async def ack(call: AsyncGroupCall, tags: Sequence[c.Tag], strict: bool) -> list[str]:
    reply = await run(call.scripts.ack, call.ack_keys, c.ack_args(call, tags, strict), call.queue, call.where)
    return c.parse_ack(reply, strict)


async def nack(call: AsyncGroupCall, tag: c.Tag, delay_ms: int | None, error: str) -> c.NackReply:
    return c.parse_nack(await call.run(call.scripts.nack, c.nack_args(tag, delay_ms, error)))


async def reject(call: AsyncGroupCall, tag: c.Tag, reason: str, text: str) -> int:
    return int(await call.run(call.scripts.reject, c.reject_args(tag, reason, text)))


async def extend(call: AsyncGroupCall, tags: Sequence[c.Tag]) -> c.ExtendReply:
    return c.parse_extend(await call.run(call.scripts.extend, c.flat_tags(tags)))


async def heartbeat(call: AsyncGroupCall, timeout_ms: int, sync: bool, tags: Sequence[c.Tag]) -> c.HeartbeatReply:
    return c.parse_heartbeat(await call.run(call.scripts.heartbeat, c.heartbeat_args(timeout_ms, sync, tags)))


async def join(call: AsyncGroupCall, liveness_ms: int, incarnation: str) -> c.JoinReply:
    return c.parse_join(await call.run(call.scripts.join, c.join_args(liveness_ms, incarnation)))


async def leave(call: AsyncGroupCall, consumer: str, graceful: bool) -> c.LeaveReply:
    return c.parse_leave(await call.run(call.scripts.leave, c.leave_args(consumer, graceful)))


async def purge(call: AsyncGroupCall, batch: int) -> c.PurgeReply:
    return c.parse_purge(await call.run(call.scripts.purge, [batch]))


async def replay(call: AsyncGroupCall, dead_letter_seqs: Sequence[int]) -> list[str]:
    return c.parse_replay(await call.run(call.scripts.replay, list(dead_letter_seqs)))


async def stats(call: AsyncGroupCall) -> GroupStats:
    return c.group_stats(call.group, await call.run(call.scripts.stats, []))


# -- publishing ----------------------------------------------------------------


async def publish_each(scripts: AsyncScripts, calls: Sequence[c.PublishCall], queue: str) -> list[Any]:
    """Runs publish calls in order, one round trip each; per call its raw
    reply or its error, translated. A call after one that failed is not
    sent: its error is ConnectionLost-free "not sent", so that the caller
    reports only what was stored (publishing._failure)."""
    out: list[Any] = []
    for keys, args in calls:
        try:
            out.append(await scripts.publish(keys, args))
        except (redis.RedisError, OSError) as exc:
            out.append(c.translate(exc, queue))
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
        last = _int(await r.hget(keys.meta, "seq"))
        start = max(after, _int(await r.hget(keys.meta, "trimmed"))) + 1
        out: list[tuple[int, bytes]] = []
        while start <= last and len(out) < n:
            seqs = list(range(start, min(last, start + 4 * n) + 1))
            for seq, rec in zip(seqs, await r.hmget(keys.msgs, seqs), strict=True):
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
        last = await r.hget(keys.meta, "seq")
        depth = await r.hlen(keys.msgs)
        scheduled = await r.zcount(keys.sched, f"({now}", "+inf")
        dead = await r.hlen(dead_letters.msgs)
        return _int(last), int(depth), int(scheduled), int(dead)

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
                pipe.hdel(keys.msgs, *seqs)
                pipe.hset(keys.meta, "trimmed", seqs[-1])
                return int((await pipe.execute())[0])

        deleted += await guarded(delete, where=keys.base)
    return deleted


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
