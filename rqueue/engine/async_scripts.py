"""Running the Lua scripts on an asyncio client (rqueue.aio), as
rqueue.engine.scripts does on a sync one: EVALSHA first, SCRIPT LOAD and
again on NOSCRIPT; a single server's calls on connections of their own."""

from __future__ import annotations

import asyncio
import math
import select
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
from redis.exceptions import DataError, NoPermissionError, NoScriptError

from ..errors import ScriptsNotLoaded
from .loader import SCRIPT_NAMES, script_sha
from .scripts import field_text, sent_stream_log
from .text_cache import cached_texts

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # redis-py packs then
    _pack = None

# Wraps every awaited call that reaches Redis, as Retrier does for the sync
# scripts (a cluster client retries topology changes with it).
AsyncRetrier = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


async def no_async_retry(call: Callable[[], Awaitable[Any]]) -> Any:
    """The AsyncRetrier of a single server: the call once."""
    return await call()


def _socket_readable(conn: Any) -> bool:
    """Whether the socket of an idle connection holds anything to read: the
    server closed it (a restart), or sent what no call asked for."""
    writer = getattr(conn, "_writer", None)
    sock = writer.transport.get_extra_info("socket") if writer is not None else None
    if sock is None:
        return False
    return bool(select.select([sock.fileno()], [], [], 0)[0])


_seeing: dict[type, type] = {}


def seeing_closes(cls: type) -> type:
    """``cls`` (a redis.asyncio connection class) whose ``connect``, which
    a pool's checkout calls first, reconnects a connection whose socket
    holds something to read. The event loop tells a connection's reader of
    a close only once it next polls, and redis-py's check of the reader is
    skipped where server push messages are on (RESP3, redis-py 8): a
    connection the server closed since (a restart) passed, and the call on
    it failed, where the sync pool's check, which reads the socket,
    reconnects first. rqueue.aio.connect gives a client's pool this class;
    an idle connection of rqueue's holds nothing to read otherwise."""
    if getattr(cls, "_rqueue_plain", None) is not None:
        return cls
    made = _seeing.get(cls)
    if made is None:

        class Seeing(cls):  # type: ignore[misc]
            _rqueue_plain = cls

            async def connect(self) -> None:
                if self.is_connected and _socket_readable(self):
                    await self.disconnect(nowait=True)
                await super().connect()

        Seeing.__name__ = Seeing.__qualname__ = cls.__name__
        made = _seeing[cls] = Seeing
    return made


class AsyncScriptConnections:
    """The connections of the script calls of one asyncio client of one
    server, made with the settings of its pool and checked out without its
    bookkeeping (a lock, metrics and events per checkout and return, and a
    task per send for the socket timeout: more client CPU than a small
    script's time in Redis), as :class:`ScriptConnections` does for the
    sync client. A checkout still reconnects a connection the server closed
    or one with an unread reply. Used for a plain redis.asyncio
    ConnectionPool (:meth:`of`); a Sentinel pool, a cluster and memory://
    take redis-py's path."""

    def __init__(self, pool: Any) -> None:
        self._class = seeing_closes(pool.connection_class)
        self._kwargs = pool.connection_kwargs
        self._max = pool.max_connections
        self._free: list[Any] = []
        self._made: list[Any] = []

    @classmethod
    def of(cls, client: Any) -> AsyncScriptConnections | None:
        import redis.asyncio as aioredis
        from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

        if type(client) is not aioredis.Redis or getattr(client, "single_connection_client", False):
            return None
        pool = client.connection_pool
        if type(pool) is not aioredis.ConnectionPool:
            return None
        plain = getattr(pool.connection_class, "_rqueue_plain", pool.connection_class)
        if plain not in (Connection, SSLConnection, UnixDomainSocketConnection):
            return None
        return cls(pool)

    async def get_connection(self) -> Any:
        try:
            conn = self._free.pop()
        except IndexError:
            if len(self._made) >= self._max:
                raise redis.exceptions.MaxConnectionsError("Too many connections") from None
            conn = self._class(**self._kwargs)
            self._made.append(conn)
        # can_read (redis-py 8) was can_read_destructive before
        can_read = getattr(conn, "can_read", None) or conn.can_read_destructive
        try:
            await conn.connect()
            try:
                if await can_read():
                    raise redis.ConnectionError("Connection has data")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                await conn.disconnect()
                await conn.connect()
                if await can_read():
                    raise redis.ConnectionError("Connection not ready") from None
        except BaseException:
            self._free.append(conn)
            raise
        return conn

    def release(self, conn: Any) -> None:
        self._free.append(conn)

    async def disconnect(self) -> None:
        for conn in list(self._made):
            await conn.disconnect()


class AsyncScript:
    """One script of one asyncio client (redis.asyncio's Redis or
    RedisCluster, or fakeredis's FakeAsyncRedis): EVALSHA, and SCRIPT LOAD
    then EVALSHA again on NOSCRIPT, as :class:`Script` does."""

    def __init__(
        self,
        server: Any,
        name: str,
        text: str,
        retry: AsyncRetrier,
        connections: AsyncScriptConnections | None = None,
        stream_text: str | None = None,
    ) -> None:
        self.name = name
        self.text = text
        self.sha = script_sha(text)
        self._redis = server
        self._retry = retry
        self._pool = connections
        #: The stream layout's own text, as Script.stream.
        self.stream: AsyncScript | None = None
        if stream_text is not None:
            self.stream = AsyncScript(server, f"{name}@stream", stream_text, retry, connections)

    def for_keys(self, keys: Sequence[Any]) -> AsyncScript:
        """The script, of this script's layouts' texts, that a call sent ``keys`` runs."""
        if self.stream is not None and sent_stream_log(keys):
            return self.stream
        return self

    def __call__(self, keys: Sequence[Any], args: Sequence[Any], stream: bool | None = None) -> Awaitable[Any]:
        """As Script.__call__ (``stream``: sent_stream_log(keys), when the
        caller knows it already)."""
        # Returns the coroutine that does the call rather than awaiting it
        # here: one coroutine less per call on the hot path.
        if self.stream is not None and (sent_stream_log(keys) if stream is None else stream):
            return self.stream(keys, args)
        if self._retry is no_async_retry:
            if self._pool is not None:
                return self._direct(keys, args)
            return self._run(keys, args)
        return self._retry(lambda: self._run(keys, args))

    async def call_and_read(
        self, keys: Sequence[Any], args: Sequence[Any], read: tuple[Any, ...], stream: bool | None = None
    ) -> tuple[Any, Any] | None:
        """As Script.call_and_read: the call and ``read`` in one round trip
        on the direct path, (reply, ``read``'s reply or its error, or None
        after NOSCRIPT); None on any other path."""
        if self.stream is not None and (sent_stream_log(keys) if stream is None else stream):
            return await self.stream.call_and_read(keys, args, read, False)
        if self._retry is not no_async_retry or self._pool is None:
            return None
        reply, got = await self._direct(keys, args, read)
        if isinstance(reply, BaseException):
            raise reply
        return reply, got

    async def _direct(self, keys: Sequence[Any], args: Sequence[Any], read: tuple[Any, ...] | None = None) -> Any:
        """EVALSHA on a connection of :class:`AsyncScriptConnections`, and
        after NOSCRIPT, SCRIPT LOAD and EVALSHA again. A connection whose
        call failed other than by an error reply (lost, timed out,
        cancelled: its reply may still come) is closed. With ``read``, a
        command sent after the call in the same write: (the call's reply or
        error reply, ``read``'s), both read; after NOSCRIPT the call goes
        again alone, and ``read``'s reply is None."""
        pool = self._pool
        assert pool is not None
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        paired = read is not None
        # The socket timeout as one timer that cancels this task, cheaper
        # than redis-py's timeout context per read.
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        loaded = False
        while True:
            conn = await pool.get_connection()
            timer = asyncio.get_running_loop().call_later(conn.socket_timeout or math.inf, expire)
            try:
                writer = getattr(conn, "_writer", None)
                if _pack is not None and writer is not None:
                    try:
                        packed = _pack(command) if read is None else _pack(command) + _pack(read)
                    except TypeError as exc:
                        raise DataError(str(exc)) from None
                    writer.write(packed)
                    if writer.transport.get_write_buffer_size():  # the socket did not take it all
                        await writer.drain()
                elif read is None:
                    await conn.send_command(*command)
                else:
                    await conn.send_packed_command(conn.pack_commands([command, read]))
                if read is not None:
                    reply, got = await _reply_or_error(conn), await _reply_or_error(conn)
                    if not isinstance(reply, NoScriptError) or loaded:
                        return reply, got
                    read = None  # it was read before the script ran: the call goes again alone
                else:
                    reply = await conn.read_response(timeout=math.inf)
                    return (reply, None) if paired else reply
            except NoScriptError:
                if loaded:
                    raise
            except redis.ResponseError:
                raise
            except asyncio.CancelledError:
                await conn.disconnect(nowait=True)
                if not expired:
                    raise
                task.uncancel()
                raise redis.TimeoutError("Timeout reading from socket") from None
            except BaseException:
                await conn.disconnect(nowait=True)
                raise
            finally:
                timer.cancel()
                pool.release(conn)
            await self.load()  # NOSCRIPT: the call did not run
            loaded = True

    async def _run(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return await self._redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.load()
            return await self._redis.evalsha(self.sha, len(keys), *keys, *args)

    async def load(self) -> None:
        """SCRIPT LOAD (on every primary of a cluster). ScriptsNotLoaded when
        the user's ACL refuses it."""
        try:
            await self._redis.script_load(self.text)
        except NoPermissionError as exc:
            raise ScriptsNotLoaded(self.name, self.sha, str(exc)) from exc


async def _reply_or_error(conn: Any) -> Any:
    """The next reply on ``conn``; an error reply as its exception."""
    try:
        return await conn.read_response(timeout=math.inf)
    except redis.ResponseError as exc:
        return exc


class AsyncScripts:
    """The scripts of one asyncio client, as attributes (see :class:`Scripts`)."""

    publish: AsyncScript
    fetch: AsyncScript
    ack: AsyncScript
    nack: AsyncScript
    reject: AsyncScript
    set_aside: AsyncScript
    extend: AsyncScript
    heartbeat: AsyncScript
    join: AsyncScript
    leave: AsyncScript
    purge: AsyncScript
    replay: AsyncScript
    stats: AsyncScript
    status: AsyncScript
    schedule_fire: AsyncScript
    settle_to: AsyncScript
    partition: AsyncScript
    pause: AsyncScript
    ack_result: AsyncScript
    migrate: AsyncScript
    retain: AsyncScript
    group_create: AsyncScript
    group_reset: AsyncScript
    group_delete: AsyncScript

    def __init__(self, redis: Any, retry: AsyncRetrier = no_async_retry, shebang: bool = True) -> None:
        #: The client the scripts are sent with.
        self.redis = redis
        self._retry = retry
        #: The connections of the script calls (None: redis-py's pool).
        self.connections = AsyncScriptConnections.of(redis)
        for name in SCRIPT_NAMES:
            texts = cached_texts(name, shebang)
            script = AsyncScript(redis, name, texts["hash"], retry, self.connections, texts.get("stream"))
            setattr(self, name, script)

    async def read_log(self, key: str, first: int, last: int, meta: str) -> tuple[list[Any], str]:
        """As Scripts.read_log, through the client: entries as redis-py
        parses them, (id, {field: value}), then the queue's incarnation."""

        async def both() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            pipe.xrange(key, first, last)
            pipe.hget(meta, "inc")
            replies: list[Any] = await pipe.execute()
            return replies

        parsed, inc = await self._retry(both)
        return parsed, field_text(inc)

    async def close(self) -> None:
        """Closes the connections of the script calls."""
        if self.connections is not None:
            await self.connections.disconnect()
