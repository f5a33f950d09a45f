"""Sending a prepared publish on an asyncio client: rqueue.publishing.send,
awaited. The messages are checked and encoded by rqueue.publishing.prepare,
and what the replies mean (results, state watch, PartialPublish, NotDurable,
the weakest durable confirmation) is decided by that module's functions;
only the I/O is here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from ..engine import async_commands as acmd
from ..engine.async_durable import publish_durably
from ..engine.commands import translate
from ..errors import NotDurable, PartialPublish, QueuePartitioned, Unroutable
from ..publishing import PreparedPublish, alternate_results, durable_outcome, failure, resend, short_of_durable, stored
from ..results import PublishResult

if TYPE_CHECKING:
    from .context import AsyncQueueLike


async def send(queue: AsyncQueueLike, prepared: PreparedPublish) -> list[PublishResult]:
    """Runs the script calls of a prepared publish (as rqueue.publishing.send)."""
    client = queue.client
    try:
        if prepared.durable:
            replies = await _send_durably(queue, prepared)
        elif len(prepared.calls) == 1:
            keys, args = prepared.calls[0]
            try:
                replies = [await client.scripts.publish(keys, args)]
            except (redis.RedisError, OSError) as exc:
                raise translate(exc, queue.name) from exc
        else:
            replies = await acmd.publish_each(client.scripts, prepared.calls, queue.name)
            if any(isinstance(r, Exception) for r in replies):
                raise failure(prepared, replies, queue.partition)
    except (NotDurable, PartialPublish) as exc:
        await client.register(queue.name)
        if isinstance(exc, NotDurable):
            raise short_of_durable(prepared, exc, queue.partition) from None
        raise
    except QueuePartitioned as exc:
        if queue.partition is not None:
            raise
        # The name was partitioned after this client last read it as plain:
        # nothing was stored; the messages go to the partitions.
        await client.partitioned_now(queue.root, exc.layout)
        target = client.queue(queue.name)
        if not hasattr(target, "partitions"):  # a dead-letter queue's name: not routed
            raise
        partitioned: list[PublishResult] = await target.publish_many(prepared.payloads, **resend(prepared))
        return partitioned
    except Unroutable:
        alternate = prepared.settings.alternate
        if alternate is None:
            raise
        results = await client.queue(alternate).publish_many(prepared.payloads, **resend(prepared, mandatory=False))
        return alternate_results(alternate, results)
    await client.register(queue.name)
    return stored(prepared, replies, queue.partition)


async def _send_durably(queue: AsyncQueueLike, prepared: PreparedPublish) -> list[Any]:
    client = queue.client
    replies: list[Any] = []
    short: list[NotDurable] = []
    failed: Exception | None = None
    if len(prepared.calls) == 1:
        return await publish_durably(client, queue.keys.meta, client.scripts.publish, prepared.calls)
    for call in prepared.calls:
        try:
            replies += await publish_durably(client, queue.keys.meta, client.scripts.publish, [call])
        except NotDurable as exc:
            replies += exc.results
            short.append(exc)
        except Exception as exc:
            failed = exc
            break
    return durable_outcome(prepared, replies, short, failed, queue.partition)
