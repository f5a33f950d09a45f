"""The log seen from the client: the commands that read, count and delete
a queue's message records outside the scripts (lua/includes/log.lua is
the scripts' side). The log is the hash ``msgs`` (seq -> record).

Each function queues one command on ``r``, a client or a pipeline, sync or
asyncio, and returns what that call returns (a reply, the pipeline, or an
awaitable), so callers keep their round trips and their error handling.
"""

from __future__ import annotations

from typing import Any

from .keys import QueueKeys


def read(r: Any, keys: QueueKeys, seq: int) -> Any:
    """The record of ``seq``, or None."""
    return r.hget(keys.msgs, seq)


def read_many(r: Any, keys: QueueKeys, seqs: list[int]) -> Any:
    """One record (or None) per seq, in the order of ``seqs``."""
    return r.hmget(keys.msgs, seqs)


def has(r: Any, keys: QueueKeys, seq: int) -> Any:
    """Whether ``seq`` has a record (no payload is read)."""
    return r.hexists(keys.msgs, seq)


def length(r: Any, keys: QueueKeys) -> Any:
    """How many records are stored."""
    return r.hlen(keys.msgs)


def delete(r: Any, keys: QueueKeys, seqs: list[int]) -> Any:
    """Deletes the records of ``seqs``; replies how many there were."""
    return r.hdel(keys.msgs, *seqs)


def key(keys: QueueKeys) -> str:
    """The log's key, for EXISTS and DEL beside other keys, and for messages."""
    return keys.msgs


def scan(r: Any, keys: QueueKeys, cursor: Any, count: int) -> Any:
    """One step of a walk over every record: (next cursor, {seq: record}),
    as HSCAN (which may repeat a record)."""
    return r.hscan(keys.msgs, cursor, count=count)
