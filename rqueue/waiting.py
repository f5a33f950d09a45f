"""Waiting until groups have settled everything published before the wait
began (Dramatiq's ``broker.join``), for tests and batch jobs:
:meth:`rqueue.Queue.wait_settled` and ``rqueue wait``.

It is named for what it waits for, not ``join``: joining is what a consumer
does to a group. A message counts as settled when the group acked,
dead-lettered, dropped or purged it (the group's ack floor passed it); a
message published during the wait is not waited for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import validate as check
from .engine import commands, store
from .errors import InvalidInput, NotSettled
from .names import check_name

if TYPE_CHECKING:
    from .protocols import QueueLike

FIRST_POLL = 0.01  # seconds between the first two looks at the groups
LAST_POLL = 0.5  # seconds between looks at most: polls back off by half each time up to it


def wait_settled(
    parts: Sequence[QueueLike], name: str, group: str | None = None, timeout: float | None = None
) -> dict[str, int]:
    """Waits until ``group`` (every group of the queue when None) has
    settled every message published to ``parts`` (a queue, or the partitions
    of a partitioned queue named ``name``) before the call. Returns, per
    group, the last seq waited for (added up over the partitions: how many
    messages the queue had been given). Raises
    NotSettled after ``timeout`` seconds (None: no limit), InvalidInput for a
    group the queue does not have or a queue without groups."""
    check_wait(group, timeout)
    clock = parts[0].client.clock
    deadline = None if timeout is None else clock.monotonic() + timeout
    known = sorted({g for part in parts for g in store.group_names(part.client.redis, part.keys)})
    groups = groups_to_wait_for(name, group, known)
    # (partition, group) -> the last seq published before the wait
    targets = {(i, g): store.last_seq(part.client.redis, part.keys) for i, part in enumerate(parts) for g in groups}
    floors = {key: 0 for key in targets}
    pending = [key for key, target in targets.items() if target > 0]
    pause = FIRST_POLL
    while True:
        for key in list(pending):
            i, g = key
            floors[key] = commands.stats(parts[i].group_call(g)).ack_floor
            if floors[key] >= targets[key]:
                pending.remove(key)
        if not pending:
            return waited_for(targets, groups)
        left = None if deadline is None else deadline - clock.monotonic()
        if left is not None and left <= 0:
            raise not_settled(name, floors, targets, pending, timeout)
        clock.sleep(pause if left is None else min(pause, left))
        pause = min(pause * 1.5, LAST_POLL)


def check_wait(group: str | None, timeout: float | None) -> None:
    if group is not None:
        check_name("group", group)
    if timeout is not None:
        check.seconds("timeout", timeout)


def groups_to_wait_for(name: str, group: str | None, known: list[str]) -> list[str]:
    """The groups a wait on queue ``name`` (whose groups are ``known``) waits for."""
    if group is not None and group not in known:
        raise InvalidInput(f"queue {name!r} has no group {group!r} (groups: {', '.join(known) or 'none'})")
    groups = [group] if group is not None else known
    if not groups:
        raise InvalidInput(f"queue {name!r} has no group to wait for")
    return groups


Key = tuple[int, str]  # (partition, group)


def waited_for(targets: dict[Key, int], groups: list[str]) -> dict[str, int]:
    """Per group, the last seq waited for, added up over the partitions."""
    return {g: sum(t for (_, tg), t in targets.items() if tg == g) for g in groups}


def not_settled(
    name: str, floors: dict[Key, int], targets: dict[Key, int], pending: list[Key], timeout: float | None
) -> NotSettled:
    behind = {g: (floors[(i, g)], targets[(i, g)]) for i, g in pending}
    return NotSettled(name, behind, timeout or 0.0)
