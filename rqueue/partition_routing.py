"""A publish to a partitioned queue, without its I/O: the checks of its
per-message arguments, the routing of each message to a partition, each
partition's share prepared (rqueue.publishing.prepare), and how the
partitions' results add up. The sync partitioned queue (rqueue.partitions)
and the asyncio one (rqueue.aio.partitions) send what this prepares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from . import validate as check
from .errors import InvalidInput, NotDurable, PartialPublish
from .publishing import PreparedPublish, per_message, prepare
from .results import PublishResult

if TYPE_CHECKING:
    from .protocols import QueueLike

P = TypeVar("P")  # a partition: a sync or an asyncio client's Queue


def check_key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidInput(f"partition key must be a non-empty str or None, not {key!r}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"partition key {key!r} cannot be encoded as UTF-8: {exc.reason}") from None
    return key


class Routed(NamedTuple):
    """A publish_many call over partitions, checked: per message its headers
    and id, and the indexes of the messages of each partition."""

    size: int
    headers: list[Any]
    ids: list[Any]
    keys: list[str | None]
    priorities: list[int]
    routes: dict[int, list[int]]


def route(
    payloads: Sequence[bytes],
    headers: Any,
    ids: Sequence[str | None] | None,
    keys: Sequence[str | None] | None,
    partition_for: Callable[[str | None, str | None], int],
    before: Callable[[], object] | None = None,
    priority: int | Sequence[int] | None = None,
) -> Routed:
    """Checks a partitioned publish_many's per-message arguments and routes
    each message with ``partition_for(key, id)``, after ``before()`` (the
    sync queue's read of a grown layout) once the checks passed; raises
    before anything is sent."""
    if type(payloads) is not list and (isinstance(payloads, (bytes, str)) or not isinstance(payloads, Sequence)):
        raise InvalidInput("payloads must be a sequence of bytes (for one message use publish())")
    count = len(payloads)
    if isinstance(keys, (str, bytes)):
        raise InvalidInput("keys must be a sequence with one routing key (or None) per message, not a str")
    per_keys: list[str | None] = [None] * count if keys is None else [check_key(k) for k in keys]
    if len(per_keys) != count:
        raise InvalidInput(f"keys has {len(per_keys)} entries for {count} payloads")
    per_headers = per_message(headers, count, "headers")
    per_priority = check.priorities(priority, count)
    per_ids = [None] * count if ids is None else list(ids)
    if len(per_ids) != count:
        raise InvalidInput(f"ids has {len(per_ids)} entries for {count} payloads")
    if before is not None:
        before()
    routes: dict[int, list[int]] = {}
    for i in range(count):
        msg_id = per_ids[i] if isinstance(per_ids[i], str) else None
        routes.setdefault(partition_for(per_keys[i], msg_id), []).append(i)
    return Routed(count, per_headers, per_ids, per_keys, per_priority, routes)


def prepare_parts(
    parts: Sequence[P],
    routed: Routed,
    payloads: Sequence[bytes],
    delay: float | None,
    mandatory: bool,
    durable: bool,
    view: Callable[[P], Any] | None = None,
) -> list[tuple[P, list[int], PreparedPublish]]:
    """Each partition's share of a routed publish, checked and encoded
    (rqueue.publishing.prepare; ``view(part)`` is what prepare reads of a
    partition, the partition itself by default), in partition order."""
    prepared: list[tuple[P, list[int], PreparedPublish]] = []
    for p, idx in sorted(routed.routes.items()):
        part = parts[p]
        ready = prepare(
            cast("QueueLike", part if view is None else view(part)),
            [payloads[i] for i in idx],
            [routed.headers[i] for i in idx],
            [routed.ids[i] for i in idx],
            delay,
            mandatory,
            durable,
            positions=idx if routed.size > 1 else None,
            priority=[routed.priorities[i] for i in idx],
        )
        if ready is not None:
            prepared.append((part, idx, ready))
    return prepared


def gather(
    count: int,
    sent: Sequence[tuple[Any, list[int], list[PublishResult] | Exception]],
    known: dict[int, PublishResult] | None = None,
) -> list[PublishResult]:
    """The results of a partitioned publish, in the order of its messages,
    from what each partition gave (its results or its error) and the
    results ``known`` without a send (by index: duplicates of a copy in a
    partition from before a growth, placement.seen_before_growth); raises when a
    partition failed: its error when nothing was stored anywhere,
    NotDurable when every failure was a wait that fell short, else
    PartialPublish saying what was stored."""
    out: list[PublishResult | None] = [None] * count
    for i, result in (known or {}).items():
        out[i] = result
    errors: dict[int, Exception] = {}
    durability: dict[int, NotDurable] = {}
    for part, idx, got in sent:
        p = part.partition if part.partition is not None else 0
        if isinstance(got, NotDurable):
            errors[p] = durability[p] = got
            got = got.results
        if isinstance(got, PartialPublish):
            # a partition's batch over MAX_BATCH: its earlier calls stored theirs
            errors[p] = next(iter(got.errors.values()))
            for i, stored in zip(idx, got.results, strict=True):
                out[i] = stored
            continue
        if isinstance(got, Exception):
            errors[p] = got
            continue
        for i, result in zip(idx, got, strict=True):
            out[i] = result
    if not errors:
        return [r for r in out if r is not None]
    if all(r is None for r in out) and not durability:
        raise next(iter(errors.values()))  # nothing stored: as from one queue
    if len(durability) == len(errors):
        weakest = list(durability.values())
        synced = [e.fsynced for e in weakest]
        raise NotDurable(
            out,
            min(e.replicas for e in weakest),
            weakest[0].required,
            None if None in synced else all(synced),
            "; ".join(f"partition {p}: {e.why}" for p, e in sorted(durability.items())),
        )
    raise PartialPublish(out, errors)
