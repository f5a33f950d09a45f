"""Routes rqueue's script calls through FCALL (a prototype, by monkeypatch).

``install()`` replaces, in rqueue.engine.scripts, the EVALSHA of a direct
call, of a redis-py call and of a pipelined call with
``FCALL rq_<name> numkeys keys... args...``. A call that finds no such
function (``ERR Function not found``: a restarted server without data, a
FUNCTION FLUSH, a failover to a replica that never got the library, which
functions are replicated so should not happen) loads the whole library with
FUNCTION LOAD REPLACE and is sent again, as NOSCRIPT does for a script.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from typing import Any

import redis
from redis.exceptions import ResponseError

from rqueue.engine import scripts as S

try:
    from .library import build_library
except ImportError:  # run as a script from this folder
    from library import build_library  # type: ignore[no-redef]

PREFIX = "rq_"


@cache
def library_text() -> str:
    # RQUEUE_FCALL_WRAP=1: the control library, each script whole in its function
    return build_library(wrap=os.environ.get("RQUEUE_FCALL_WRAP") == "1")[0]


def _missing(reply: object) -> bool:
    return isinstance(reply, ResponseError) and "Function not found" in str(reply)


def load_library(client: Any) -> None:
    client.execute_command("FUNCTION", "LOAD", "REPLACE", library_text())


def install() -> None:
    def _run(self: S.Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return self._redis.execute_command("FCALL", PREFIX + self.name, len(keys), *keys, *args)
        except ResponseError as exc:
            if not _missing(exc):
                raise
            load_library(self._redis)
            return self._redis.execute_command("FCALL", PREFIX + self.name, len(keys), *keys, *args)

    def _direct(self: S.Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        pool = self._pool
        conn = pool.get_connection()
        command = ("FCALL", PREFIX + self.name, len(keys), *keys, *args)

        def attempt() -> Any:
            if S._pack is not None and type(getattr(conn, "_command_packer", None)) is S._HIREDIS_PACKER:
                conn.send_packed_command([S._pack(command)])
            else:
                conn.send_command(*command)
            return conn.read_response()

        try:
            return conn.retry.call_with_retry(attempt, lambda error: conn.disconnect())
        finally:
            pool.release(conn)

    def __call__(self: S.Script, keys: Sequence[Any], args: Sequence[Any], client: Any = None) -> Any:
        if client is not None:
            client.call(self, keys, args)
            return client
        if self._pool is not None and self._retry is S.no_retry:
            try:
                return self._direct(keys, args)
            except ResponseError as exc:
                if not _missing(exc):
                    raise
                self.load()
                return self._direct(keys, args)
        return self._retry(lambda: self._run(keys, args))

    def load(self: S.Script) -> None:
        if isinstance(self._redis, redis.RedisCluster):
            self._redis.execute_command("FUNCTION", "LOAD", "REPLACE", library_text(), target_nodes="primaries")
        else:
            load_library(self._redis)

    def call(self: S.ScriptPipeline, script: S.Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self._commands.append((script, ("FCALL", PREFIX + script.name, len(keys), *keys, *args)))

    S.Script._run = _run  # type: ignore[method-assign]
    S.Script._direct = _direct  # type: ignore[method-assign]
    S.Script.__call__ = __call__  # type: ignore[method-assign]
    S.Script.load = load  # type: ignore[method-assign]
    S.ScriptPipeline.call = call  # type: ignore[method-assign]

    # A pipeline's missing function reads as NOSCRIPT does.
    def is_noscript(reply: object) -> bool:
        return _missing(reply) or (isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT"))

    S._is_noscript = is_noscript
