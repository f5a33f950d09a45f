"""Sending a prepared publish on an asyncio client: rqueue.publishing.send,
awaited. The messages are checked and encoded by rqueue.publishing.prepare,
and what the replies mean (results, state watch, PartialPublish, NotDurable,
the weakest durable confirmation) is decided by that module's functions;
only the I/O is here, and so is the trim step of retention a publish runs
(rqueue.retention decides when one is due, for both clients)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from ..constants import RETAIN_STEP
from ..engine import async_commands as acmd
from ..engine.async_durable import publish_durably
from ..engine.commands import RetainReply, translate
from ..errors import NotDurable, PartialPublish, QueuePartitioned, Unroutable
from ..publishing import PreparedPublish, alternate_results, durable_outcome, failure, resend, short_of_durable, stored
from ..results import PublishResult
from ..retention import retention_args, step_due, step_failed, stepped
from ..settings import Settings

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
                raise await acmd.with_memory_figures(
                    translate(exc, queue.name), lambda: client.scripts.redis.info("memory")
                ) from exc
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
        partitioned: list[PublishResult] = await target.publish_many(prepared.payloads, **resend(prepared, target))
        return partitioned
    except Unroutable:
        alternate = prepared.settings.alternate
        if alternate is None:
            raise
        other = client.queue(alternate)
        results = await other.publish_many(prepared.payloads, **resend(prepared, other, mandatory=False))
        return alternate_results(alternate, results)
    await client.register(queue.name)
    known = prepared.watch.incarnation
    results = stored(prepared, replies, queue.partition)
    if prepared.watch.incarnation != known:
        # The queue was made (again): a delete by another client took it out of the list.
        await client.register(queue.name, again=True)
    await after_publish(queue, prepared.settings)
    return results


async def trim(
    queue: AsyncQueueLike, settings: Settings | None = None, limit: int = RETAIN_STEP, *, taken: bool = False
) -> RetainReply:
    """As rqueue.retention.trim: stores the queue's retention and runs one
    trim step now (``taken``: the publishers' step)."""
    client = queue.client
    settings = settings if settings is not None else await queue.settings()
    want = retention_args(settings)
    now = client.clock.script_now()
    reply = await acmd.retain(client.scripts, queue.keys, now, *want, True, limit, queue.name)
    stepped(client, queue.keys.base, reply, want, taken)
    return reply


async def after_publish(queue: AsyncQueueLike, settings: Settings) -> None:
    """As rqueue.retention.after_publish: the trim step
    rqueue.retention.step_due says is due after a publish, as a task of its
    own: the message is stored, so the publish returns now, and a caller's
    timeout or cancel can no longer make a stored publish look failed."""
    client = queue.client
    want = step_due(client, queue.keys.base, settings)
    if want is None:
        return

    def failed(exc: BaseException) -> None:
        step_failed(client, queue.keys.base, queue.name, want, exc)

    client.in_background(trim(queue, settings, taken=True), failed)


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
