"""Durable confirms: a publish that returns only once ``durable_replicas``
replicas have the message (WAIT) and, where the server has WAITAOF and its
append-only file is on, once the primary has fsynced it.

WAIT and WAITAOF count the writes of the connection they are sent on, so
they go in the same pipeline as the publish script, on the connection of the
node that serves the queue's slot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis

from ..connection.cluster import no_retry, not_run
from ..errors import NotDurable
from .commands import translate, with_memory_figures
from .scripts import Script, ScriptPipeline


class DurableSettings(Protocol):
    """What judging a durable publish reads of the client."""

    cluster: bool
    durable_replicas: int
    durable_timeout: float
    failover_timeout: float
    durable_state: dict[str, Any]


class DurableTarget(DurableSettings, Protocol):
    """What a durable publish needs of the client."""

    def node_for(self, key: str) -> tuple[Any, str]: ...
    def refresh_topology(self) -> None: ...


class NodeState:
    """What one node was found to support (learned from its replies)."""

    __slots__ = ("waitaof", "aof")

    def __init__(self) -> None:
        self.waitaof: bool | None = None  # the command exists (Redis >= 7.2, Valkey >= 8)
        self.aof: bool | None = None  # appendonly is on


def _publish_durably(
    client: DurableTarget, slot_key: str, script: Script, calls: Sequence[tuple[list[Any], list[Any]]]
) -> list[Any]:
    deadline = time.monotonic() + client.failover_timeout
    results: list[Any] = [None] * len(calls)
    pending = list(range(len(calls)))  # calls not known to have run
    waits: list[tuple[Any, Any]] = []  # (WAIT, WAITAOF) replies after calls that ran
    while True:
        node, name = client.node_for(slot_key)
        state = client.durable_state.setdefault(name, NodeState())
        pipe = ScriptPipeline(node, no_retry)
        for i in pending:
            keys, args = calls[i]
            script(keys=keys, args=args, client=pipe)
        for command in wait_commands(client, state):
            pipe.then(*command)
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:
            # only calls that surely did not run may be sent again
            if not client.cluster or not not_run(exc) or time.monotonic() > deadline:
                raise
            client.refresh_topology()
            time.sleep(0.05)
            continue
        pending = record_replies(client.cluster, pending, replies, results, waits)
        if not pending:
            break
        if time.monotonic() > deadline:
            raise results[pending[0]]
        client.refresh_topology()
        time.sleep(0.05)
    return judge(client, state, results, waits)


def publish_durably(
    client: DurableTarget, slot_key: str, script: Script, calls: Sequence[tuple[list[Any], list[Any]]]
) -> list[Any]:
    """Runs the publish ``calls`` (KEYS, ARGV) and waits for durability on
    the same connection. Returns the script replies; raises NotDurable (the
    messages are stored) when the wait fell short, and the error of the
    first call that failed otherwise (translated as commands.run does)."""
    try:
        return _publish_durably(client, slot_key, script, calls)
    except (redis.RedisError, OSError) as exc:
        raise with_memory_figures(translate(exc), lambda: client.node_for(slot_key)[0].info("memory")) from exc


def _fsynced(state: NodeState, reply: Any) -> bool | None:
    """True/False from a WAITAOF reply; None when it could not be asked (and
    remembers why, so it is not asked again)."""
    if reply is None:
        return None
    if isinstance(reply, Exception):
        text = str(reply).lower()
        if "appendonly is disabled" in text:
            state.aof = False
        elif "unknown command" in text:
            state.waitaof = False
        return None
    state.waitaof = state.aof = True
    return int(reply[0]) >= 1


def wait_commands(client: DurableSettings, state: NodeState) -> list[tuple[Any, ...]]:
    """The WAIT (and, where the node may have it, WAITAOF) sent after the
    publish calls, on their connection."""
    timeout_ms = max(1, int(client.durable_timeout * 1000))
    out: list[tuple[Any, ...]] = [("WAIT", client.durable_replicas, timeout_ms)]
    if state.waitaof is not False and state.aof is not False:
        out.append(("WAITAOF", 1, 0, timeout_ms))
    return out


def record_replies(
    cluster: bool, sent: list[int], replies: Sequence[Any], results: list[Any], waits: list[tuple[Any, Any]]
) -> list[int]:
    """Files the replies of one attempt (the calls ``sent``, then WAIT and
    WAITAOF) in ``results`` and ``waits``; returns the calls to send again:
    MOVED/ASK/... replies mean that call did not run there."""
    for i, reply in zip(sent, replies, strict=False):  # WAIT and WAITAOF follow
        results[i] = reply
    pending = [i for i in sent if cluster and isinstance(results[i], Exception) and not_run(results[i])]
    if len(pending) < len(sent):
        tail = replies[len(sent) :]
        waits.append((tail[0], tail[1] if len(tail) > 1 else None))
    return pending


def judge(client: DurableSettings, state: NodeState, results: list[Any], waits: list[tuple[Any, Any]]) -> list[Any]:
    """The script replies of a durable publish whose calls all ran; raises
    the first call's error, or NotDurable (the messages are stored) for the
    weakest confirmation of its waits (one per node written to)."""
    for reply in results:
        if isinstance(reply, Exception):
            raise reply
    refused = next((w for w, _ in waits if isinstance(w, Exception)), None)
    synced = [_fsynced(state, aof) for _, aof in waits]
    fsynced = None if None in synced else all(synced)
    if refused is not None:  # a server without WAIT (the in-process memory:// server)
        raise NotDurable(results, 0, client.durable_replicas, fsynced, f"the server refused WAIT ({refused})")
    replicas = min(int(w) for w, _ in waits)
    if replicas < client.durable_replicas:
        raise NotDurable(
            results,
            replicas,
            client.durable_replicas,
            fsynced,
            f"{replicas} of {client.durable_replicas} replicas acknowledged within {client.durable_timeout} s",
        )
    if fsynced is False:
        raise NotDurable(
            results,
            replicas,
            client.durable_replicas,
            fsynced,
            f"the primary did not fsync within {client.durable_timeout} s",
        )
    if client.durable_replicas == 0 and not fsynced:
        raise NotDurable(
            results,
            0,
            0,
            fsynced,
            "nothing to wait for: durable_replicas is 0 and the server has "
            "no append-only file with WAITAOF (Redis >= 7.2, Valkey >= 8)",
        )
    return results
