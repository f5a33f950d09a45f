"""Durable confirms for an asyncio client: rqueue.engine.durable's publish
then WAIT (and WAITAOF) on the same connection, awaited. What to send after
the calls, how the replies of an attempt are filed and how the waits are
judged are that module's functions; only the I/O is here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis
from redis.exceptions import NoScriptError

from ..connection.cluster import not_run
from ..errors import NotDurable
from .async_commands import with_memory_figures
from .async_scripts import AsyncScript
from .commands import translate
from .durable import DurableSettings, NodeState, judge, record_replies, wait_commands

__all__ = ["AsyncDurableTarget", "NotDurable", "publish_durably"]


class AsyncDurableTarget(DurableSettings, Protocol):
    """What a durable publish needs of an asyncio client."""

    async def node_for(self, key: str) -> tuple[Any, str]: ...
    async def refresh_topology(self) -> None: ...


async def _attempt(node: Any, script: AsyncScript, commands: list[tuple[Any, ...]]) -> list[Any]:
    """One pipeline of ``commands`` on ``node``; a script the node does not
    have (NOSCRIPT: the call did not run) is loaded and the pipeline sent
    again before any WAIT counts its writes."""
    for _ in range(2):
        pipe = node.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)
        replies: list[Any] = list(await pipe.execute(raise_on_error=False))
        if not any(isinstance(r, NoScriptError) for r in replies):
            return replies
        await node.script_load(script.text)
    return replies


async def _publish_durably(
    client: AsyncDurableTarget, slot_key: str, script: AsyncScript, calls: Sequence[tuple[list[Any], list[Any]]]
) -> list[Any]:
    deadline = time.monotonic() + client.failover_timeout
    if calls:  # the calls of one queue, so of one layout
        script = script.for_keys(calls[0][0])
    results: list[Any] = [None] * len(calls)
    pending = list(range(len(calls)))  # calls not known to have run
    waits: list[tuple[Any, Any]] = []  # (WAIT, WAITAOF) replies after calls that ran
    while True:
        node, name = await client.node_for(slot_key)
        state = client.durable_state.setdefault(name, NodeState())
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", script.sha, len(calls[i][0]), *calls[i][0], *calls[i][1]) for i in pending
        ]
        try:
            replies = await _attempt(node, script, commands + wait_commands(client, state))
        except Exception as exc:
            # only calls that surely did not run may be sent again
            if not client.cluster or not not_run(exc) or time.monotonic() > deadline:
                raise
            await client.refresh_topology()
            await asyncio.sleep(0.05)
            continue
        pending = record_replies(client.cluster, pending, replies, results, waits)
        if not pending:
            break
        if time.monotonic() > deadline:
            raise results[pending[0]]
        await client.refresh_topology()
        await asyncio.sleep(0.05)
    return judge(client, state, results, waits)


async def publish_durably(
    client: AsyncDurableTarget, slot_key: str, script: AsyncScript, calls: Sequence[tuple[list[Any], list[Any]]]
) -> list[Any]:
    """As :func:`rqueue.engine.durable.publish_durably`, awaited."""
    try:
        return await _publish_durably(client, slot_key, script, calls)
    except (redis.RedisError, OSError) as exc:

        async def info_memory() -> Any:
            node, _ = await client.node_for(slot_key)
            return await node.info("memory")

        raise await with_memory_figures(translate(exc), info_memory) from exc
