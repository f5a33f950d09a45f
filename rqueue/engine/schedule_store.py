"""Plain commands on recurring schedules, run outside scripts: the prefix's
registry of schedules (a global key, outside every queue's hash slot), each
schedule's hash (under its queue's hash tag) and the channel that tells
schedulers a schedule changed. Firing a tick is a script
(lua/schedule_fire.lua, commands.schedule_fire)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..connection.open import RedisClient
from .commands import guarded, text
from .keys import schedules_channel, schedules_key

Fields = Mapping[str, bytes | str | int]  # a schedule's fields, as written

# The fields a scheduler and a listing read: all but the payload and headers.
STATE_FIELDS = (
    "queue",
    "version",
    "every_ms",
    "cron",
    "timezone",
    "missed",
    "paused",
    "since",
    "last",
    "fired",
    "skipped",
    "fired_at",
    "created",
)


def _mapping(fields: Fields) -> dict[Any, Any]:
    """``fields`` as redis-py's hset takes them (its key type is invariant)."""
    return dict(fields)


def registry(r: RedisClient, prefix: str) -> dict[str, str]:
    """Schedule name -> the queue it publishes to, for every schedule."""
    raw = guarded(lambda: r.hgetall(schedules_key(prefix)), where=f"prefix {prefix!r}")
    return {text(k): text(v) for k, v in raw.items()}


def registered_queue(r: RedisClient, prefix: str, name: str) -> str | None:
    """The queue schedule ``name`` publishes to, or None when there is no such schedule."""
    raw = guarded(lambda: r.hget(schedules_key(prefix), name), where=f"prefix {prefix!r}")
    return None if raw is None else text(raw)


def states(r: RedisClient, keys: Sequence[str]) -> list[dict[str, str] | None]:
    """For each schedule hash, its STATE_FIELDS that are set, or None when
    the hash does not exist; in one round trip."""

    def read() -> list[dict[str, str] | None]:
        pipe = r.pipeline(transaction=False)  # plain reads: safe to send again
        for key in keys:
            pipe.hmget(key, STATE_FIELDS)
        out: list[dict[str, str] | None] = []
        for values in pipe.execute():
            state = {f: text(v) for f, v in zip(STATE_FIELDS, values, strict=True) if v is not None}
            out.append(state if "version" in state else None)
        return out

    return guarded(read) if keys else []


def field(r: RedisClient, key: str, name: str) -> str | None:
    raw = guarded(lambda: r.hget(key, name), where=key)
    return None if raw is None else text(raw)


def write(r: RedisClient, prefix: str, name: str, key: str, fields: Fields, drop: Sequence[str]) -> None:
    """Stores a schedule's ``fields`` (deleting the fields ``drop``), then
    its registry entry: a schedule is listed only once its hash holds it."""

    def store() -> None:
        pipe = r.pipeline(transaction=False)
        if drop:
            pipe.hdel(key, *drop)
        pipe.hset(key, mapping=_mapping(fields))
        pipe.execute()
        r.hset(schedules_key(prefix), name, str(fields["queue"]))

    guarded(store, where=key)


def set_fields(r: RedisClient, key: str, fields: Fields, drop: Sequence[str] = ()) -> None:
    def store() -> None:
        pipe = r.pipeline(transaction=False)
        if drop:
            pipe.hdel(key, *drop)
        if fields:
            pipe.hset(key, mapping=_mapping(fields))
        pipe.execute()

    guarded(store, where=key)


def delete(r: RedisClient, prefix: str, name: str, key: str | None) -> bool:
    """Deletes schedule ``name``: its hash (``key``, when known), then its
    registry entry; whether there was one."""

    def remove() -> bool:
        deleted = r.delete(key) if key is not None else 0
        return bool(r.hdel(schedules_key(prefix), name)) or bool(deleted)

    return guarded(remove, where=f"prefix {prefix!r}")


def announce(r: RedisClient, prefix: str) -> None:
    """Tells running schedulers to read the schedules again (a hint: they
    also read them at least every few seconds)."""
    guarded(lambda: r.publish(schedules_channel(prefix), "1"), where=f"prefix {prefix!r}")
