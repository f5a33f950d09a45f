"""Reading, replaying and purging dead letters.

A dead letter keeps its payload and headers and gains ``x-rq-*`` headers
naming the original queue, group and seq, the reason, the delivery count,
the first and last delivery times, the original publish time and the last
error. Replay returns each one to the group that dead-lettered it, and only
to that group, with a fresh delivery count, exactly once (lua/replay.lua).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis

from .errors import InvalidInput, from_script_error
from .names import check_name

if TYPE_CHECKING:
    from .queue import Message, Queue

PAGE = 500  # dead letters read per round trip
REPLAY_BATCH = 100  # dead letters replayed per script call

Progress = Callable[[int], None]  # called with how many more were handled


@dataclass(frozen=True)
class DeadLetter:
    """One message in a dead-letter queue. Times are server ms since the epoch."""

    dlq_seq: int  # its seq in the dead-letter queue
    queue: str  # the queue it was dead-lettered from
    group: str  # the group that dead-lettered it
    seq: int  # its seq in that queue
    reason: str  # max-deliveries, rejected, terminated, corrupted-record, ...
    deliveries: int  # deliveries it had
    first_delivery_ms: int | None
    last_delivery_ms: int | None
    published_ms: int | None  # when it was first published
    dead_lettered_ms: int
    error: str  # the last error text, "" when none
    data: bytes
    headers: dict[str, str]  # its own headers, without the x-rq-* ones
    partition: int | None = None  # the partition of a partitioned queue it came from

    @classmethod
    def from_message(cls, m: Message) -> DeadLetter:
        h = m.headers

        def num(name: str) -> int | None:
            value = h.get(name, "")
            return int(value) if value.isdigit() else None

        return cls(
            dlq_seq=m.seq,
            queue=h.get("x-rq-queue", ""),
            group=h.get("x-rq-group", ""),
            seq=num("x-rq-seq") or 0,
            reason=h.get("x-rq-reason", ""),
            deliveries=num("x-rq-deliveries") or 0,
            first_delivery_ms=num("x-rq-first-delivery"),
            last_delivery_ms=num("x-rq-last-delivery"),
            published_ms=num("x-rq-published"),
            dead_lettered_ms=m.published_ms,
            error=h.get("x-rq-error", ""),
            data=m.data,
            headers={k: v for k, v in h.items() if not k.startswith("x-rq-")},
        )


@dataclass(frozen=True)
class Selection:
    """Which dead letters an operation applies to; None means any."""

    group: str | None = None
    reason: str | None = None
    seq_from: int | None = None  # original seq, inclusive
    seq_to: int | None = None  # original seq, inclusive
    limit: int | None = None  # at most this many

    def __post_init__(self) -> None:
        if self.group is not None:
            check_name("group", self.group)
        for name in ("seq_from", "seq_to", "limit"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "limit" else 0)
            ):
                raise InvalidInput(f"{name} must be a whole number >= {1 if name == 'limit' else 0}, not {value!r}")
        if self.seq_from is not None and self.seq_to is not None and self.seq_from > self.seq_to:
            raise InvalidInput(f"seq_from {self.seq_from} is above seq_to {self.seq_to}")

    def matches(self, d: DeadLetter) -> bool:
        return (
            (self.group is None or d.group == self.group)
            and (self.reason is None or d.reason == self.reason)
            and (self.seq_from is None or d.seq >= self.seq_from)
            and (self.seq_to is None or d.seq <= self.seq_to)
        )


@dataclass
class ReplayResult:
    """What a replay did (or, with dry_run, would do)."""

    selected: int = 0
    replayed: int = 0
    missing: int = 0  # gone before their turn (replayed or purged by someone else)
    skipped: int = 0  # left alone: another queue's, corrupted, or already open
    dry_run: bool = False
    by_group: dict[str, int] = field(default_factory=dict)

    def plus(self, other: ReplayResult) -> ReplayResult:
        """The two results together (of two partitions of one queue)."""
        by_group = dict(self.by_group)
        for g, n in other.by_group.items():
            by_group[g] = by_group.get(g, 0) + n
        return ReplayResult(
            self.selected + other.selected,
            self.replayed + other.replayed,
            self.missing + other.missing,
            self.skipped + other.skipped,
            self.dry_run,
            by_group,
        )


def iter_dead_letters(queue: Queue, selection: Selection) -> Iterator[DeadLetter]:
    """The dead letters of ``queue`` that match, oldest first."""
    dlq = queue.dead_letter_queue
    after, found = 0, 0
    while selection.limit is None or found < selection.limit:
        page = dlq.peek(PAGE, after=after)
        if not page:
            return
        for m in page:
            d = DeadLetter.from_message(m)
            if d.queue in ("", queue.name) and selection.matches(d):
                yield d
                found += 1
                if selection.limit is not None and found >= selection.limit:
                    return
        after = page[-1].seq


def replay(queue: Queue, selection: Selection, dry_run: bool = False, progress: Progress | None = None) -> ReplayResult:
    """Returns the selected dead letters of ``queue`` to their groups."""
    chosen = list(iter_dead_letters(queue, selection))
    result = ReplayResult(selected=len(chosen), dry_run=dry_run)
    by_group: dict[str, list[int]] = {}
    for d in chosen:
        by_group.setdefault(d.group, []).append(d.dlq_seq)
    if dry_run:
        result.by_group = {g: len(s) for g, s in by_group.items()}
        return result
    script = queue.client.scripts.replay
    for group, dseqs in by_group.items():
        settings = queue.settings()
        keys = queue.group_keys(group, settings)
        for start in range(0, len(dseqs), REPLAY_BATCH):
            batch = dseqs[start : start + REPLAY_BATCH]
            try:
                statuses = script(keys=keys, args=queue._group_argv(group, "", settings, batch))
            except redis.ResponseError as exc:
                raise from_script_error(exc, queue=queue.name, where=queue.keys.base) from None
            for status in statuses:
                s = status.decode()
                if s == "replayed":
                    result.replayed += 1
                    result.by_group[group] = result.by_group.get(group, 0) + 1
                elif s == "missing":
                    result.missing += 1
                else:
                    result.skipped += 1
            if progress is not None:
                progress(len(batch))
    return result


def purge(queue: Queue, selection: Selection, progress: Progress | None = None) -> int:
    """Deletes the selected dead letters of ``queue``; returns how many."""
    dlq = queue.dead_letter_queue
    chosen = [d.dlq_seq for d in iter_dead_letters(queue, selection)]
    r = queue.client.redis
    deleted = 0
    for start in range(0, len(chosen), PAGE):
        batch = chosen[start : start + PAGE]
        pipe = r.pipeline(transaction=True)
        pipe.hdel(dlq.keys.msgs, *batch)
        pipe.xadd(queue.keys.events, {"event": "purged", "count": len(batch)}, maxlen=10_000, approximate=True)
        deleted += pipe.execute()[0]
        if progress is not None:
            progress(len(batch))
    return deleted
