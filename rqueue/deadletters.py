"""Reading, replaying and purging dead letters.

A dead letter keeps its payload and headers and gains ``x-rq-*`` headers
naming the original queue, group and seq, the reason, the delivery count,
the first and last delivery times, the original publish time and the last
error. Replay returns each one to the group that dead-lettered it, and only
to that group, with a fresh delivery count, exactly once (replay.lua).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .engine import commands, store
from .errors import InvalidInput
from .names import check_name
from .results import DeadLetter, Message, Progress, ReplayResult
from .validate import optional_whole_number

if TYPE_CHECKING:
    from .engine.keys import QueueKeys
    from .protocols import QueueLike

PAGE = 500  # dead letters read per round trip
REPLAY_BATCH = 100  # dead letters replayed per script call


@dataclass(frozen=True)
class Selection:
    """Which dead letters an operation applies to; None means any."""

    group: str | None = None
    reason: str | None = None
    seq_from: int | None = None  # original seq, inclusive
    seq_to: int | None = None  # original seq, inclusive
    limit: int | None = None  # at most this many
    dead_lettered_to: int | None = None  # dead-lettered at or before this server ms

    def __post_init__(self) -> None:
        if self.group is not None:
            check_name("group", self.group)
        optional_whole_number("seq_from", self.seq_from, 0)
        optional_whole_number("seq_to", self.seq_to, 0)
        optional_whole_number("limit", self.limit, 1)
        optional_whole_number("dead_lettered_to", self.dead_lettered_to, 0)
        if self.seq_from is not None and self.seq_to is not None and self.seq_from > self.seq_to:
            raise InvalidInput(f"seq_from {self.seq_from} is above seq_to {self.seq_to}")

    def matches(self, d: DeadLetter) -> bool:
        return (
            (self.group is None or d.group == self.group)
            and (self.reason is None or d.reason == self.reason)
            and (self.seq_from is None or d.seq >= self.seq_from)
            and (self.seq_to is None or d.seq <= self.seq_to)
            and (self.dead_lettered_to is None or d.dead_lettered_ms <= self.dead_lettered_to)
        )


def iter_dead_letters(queue: QueueLike, selection: Selection) -> Iterator[DeadLetter]:
    """The dead letters of ``queue`` that match, oldest first."""
    dlq = queue.dead_letter_queue
    after, found = 0, 0
    while selection.limit is None or found < selection.limit:
        page = dlq.peek(PAGE, after=after)
        if not page:
            return
        for d in selected(queue.name, selection, page, found):
            yield d
            found += 1
        after = page[-1].seq


def selected(queue: str, selection: Selection, page: list[Message], found: int) -> list[DeadLetter]:
    """The dead letters of queue ``queue`` in a page of its dead-letter
    queue that ``selection`` takes, ``found`` having been taken before."""
    out: list[DeadLetter] = []
    for m in page:
        if selection.limit is not None and found + len(out) >= selection.limit:
            break
        d = DeadLetter.from_message(m)
        if d.queue in ("", queue) and selection.matches(d):
            out.append(d)
    return out


def by_group(chosen: list[DeadLetter]) -> dict[str, list[DeadLetter]]:
    """The dead letters of ``chosen``, by the group that dead-lettered each."""
    out: dict[str, list[DeadLetter]] = {}
    for d in chosen:
        out.setdefault(d.group, []).append(d)
    return out


def replay_batch(keys: QueueKeys, group: str, letters: Sequence[DeadLetter]) -> tuple[list[int], list[str]]:
    """The dead-letter seqs of one replay call of ``group`` and, per seq,
    the result key of its message for the group (replay.lua deletes it with
    the replay: the outcome of the run before it answers no more), or the
    meta key when its x-rq-seq is not known (left alone)."""
    return [d.dlq_seq for d in letters], [keys.result(d.seq, group) if d.seq >= 1 else keys.meta for d in letters]


def tally(result: ReplayResult, group: str, statuses: list[str]) -> None:
    """Counts the statuses of one replay call of ``group`` in ``result``."""
    for status in statuses:
        if status == "replayed":
            result.replayed += 1
            result.by_group[group] = result.by_group.get(group, 0) + 1
        elif status == "missing":
            result.missing += 1
        else:
            result.skipped += 1


def replay(
    queue: QueueLike, selection: Selection, dry_run: bool = False, progress: Progress | None = None
) -> ReplayResult:
    """Returns the selected dead letters of ``queue`` to their groups."""
    return replay_letters(queue, list(iter_dead_letters(queue, selection)), dry_run, progress)


def replay_letters(
    queue: QueueLike, chosen: list[DeadLetter], dry_run: bool = False, progress: Progress | None = None
) -> ReplayResult:
    """Returns the dead letters ``chosen`` (read from ``queue``'s dead-letter
    queue: each is replayed by its dlq seq) to their groups."""
    result = ReplayResult(selected=len(chosen), dry_run=dry_run)
    groups = by_group(chosen)
    if dry_run:
        result.by_group = {g: len(s) for g, s in groups.items()}
        return result
    for group, letters in groups.items():
        call = queue.group_call(group, queue.settings())
        for start in range(0, len(letters), REPLAY_BATCH):
            batch, result_keys = replay_batch(queue.keys, group, letters[start : start + REPLAY_BATCH])
            tally(result, group, commands.replay(call, batch, result_keys))
            if progress is not None:
                progress(len(batch))
    return result


def purge(queue: QueueLike, selection: Selection, progress: Progress | None = None) -> int:
    """Deletes the selected dead letters of ``queue``; returns how many."""
    return purge_letters(queue, [d.dlq_seq for d in iter_dead_letters(queue, selection)], progress)


def purge_letters(queue: QueueLike, chosen: list[int], progress: Progress | None = None) -> int:
    """Deletes the dead letters of ``queue`` whose dlq seqs are ``chosen``;
    returns how many there were."""
    dlq = queue.dead_letter_queue
    deleted = 0
    for start in range(0, len(chosen), PAGE):
        batch = chosen[start : start + PAGE]
        deleted += store.delete_dead_letters(queue.client.redis, dlq.keys, queue.keys.events, batch)
        if progress is not None:
            progress(len(batch))
    return deleted
