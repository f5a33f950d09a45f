"""Pattern settings for an asyncio client: the sync SettingsStore does the
validation, resolution and caching, on a copy of the settings hash that
this module reads and writes with awaited calls."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..engine import async_commands as acmd
from ..settings import Settings, SettingsStore


class _HashCopy:
    """The settings hash as last read, standing in for the Redis client of a
    SettingsStore: reads return the copy; writes change it and are kept for
    :class:`AsyncSettings` to send."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.writes: dict[str, str] = {}

    def hgetall(self, _key: str) -> dict[str, str]:
        return dict(self.fields)

    def hset(self, _key: str, mapping: Mapping[str, str]) -> int:
        self.fields.update(mapping)
        self.writes.update(mapping)
        return len(mapping)


class AsyncSettings:
    """The settings of the queues of one asyncio client, re-read from Redis
    after ``ttl`` seconds (as SettingsStore)."""

    def __init__(self, redis: Any, prefix: str, now: Callable[[], float], ttl: float) -> None:
        self._redis = redis
        self._prefix = prefix
        self._now = now
        self.ttl = ttl
        self._copy = _HashCopy()
        self._store = SettingsStore(self._copy, prefix, now, ttl)  # type: ignore[arg-type]  # the copy answers its calls
        self._read_at: float | None = None

    async def _refresh(self, fresh: bool = False) -> None:
        if not fresh and self._read_at is not None and self._now() - self._read_at < self.ttl:
            return
        self._copy.fields = await acmd.read_settings(self._redis, self._prefix)
        self._read_at = self._now()
        self._store.patterns(fresh=True)

    async def resolve(self, name: str) -> Settings:
        """The settings in force for queue ``name`` now."""
        await self._refresh()
        return self._store.resolve(name)[0]

    def fresh(self, name: str) -> Settings | None:
        """The settings of queue ``name`` when the copy is younger than the
        cache time (no await: the hot path's), else None."""
        if self._read_at is not None and self._now() - self._read_at < self.ttl:
            return self._store.resolve(name)[0]
        return None

    def cached(self, name: str) -> Settings:
        """The settings of queue ``name`` as last read (no Redis call)."""
        return self._store.resolve(name)[0]

    async def configure(self, pattern: str, values: Mapping[str, Any]) -> None:
        """Validates and stores ``values`` for ``pattern`` (SettingsStore.configure)."""
        await self._refresh(fresh=True)
        self._copy.writes = {}
        self._store.configure(pattern, values)  # raises, writing nothing, on a bad value
        writes, self._copy.writes = self._copy.writes, {}
        if writes:
            await acmd.write_settings(self._redis, self._prefix, writes)
        self._read_at = None
