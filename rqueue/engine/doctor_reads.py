"""The doctor's reads (rqueue/doctor.py): whole small keys, and big ones
in bounded steps. Each translates the driver's errors as the scripts'
calls do (commands.guarded).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ..connection.open import RedisClient
from . import log
from .commands import guarded, text
from .keys import QueueKeys

SCAN_STEP = 1000  # entries read per call from a big key


def hash_all(r: RedisClient, key: str, where: str) -> dict[str, str]:
    """A small hash (a queue's meta, floors, a group's hash, its members)."""
    raw: dict[Any, Any] = guarded(lambda: r.hgetall(key), where=where)
    return {text(k): text(v) for k, v in raw.items()}


def key_exists(r: RedisClient, key: str, where: str) -> bool:
    return bool(guarded(lambda: r.exists(key), where=where))


def group_names(r: RedisClient, keys: QueueKeys, where: str) -> set[str]:
    """The names of the groups whose hashes (``<base>:grp:<group>``) exist,
    by SCAN (SCAN_STEP keys looked at per call) of the queue's group
    hashes: the registry of groups, the floors hash, is the key checked
    against them."""
    head = f"{keys.base}:grp:"
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", head) + "*"

    def read() -> set[str]:
        return {text(k)[len(head) :] for k in r.scan_iter(match=pattern, count=SCAN_STEP)}

    return guarded(read, where=where)


def hash_in_steps(r: RedisClient, key: str, where: str) -> Iterator[list[tuple[str, str]]]:
    """Every field of a hash that may be big (delivery states), SCAN_STEP
    or so per call (HSCAN, which may repeat a field: callers take the last)."""
    return _scan(lambda at: r.hscan(key, at, count=SCAN_STEP), where)


def record_seqs_in_steps(r: RedisClient, keys: QueueKeys, where: str) -> Iterator[list[int]]:
    """The seq of every stored record, SCAN_STEP or so per call (a seq may
    come twice)."""
    for page in _scan(lambda at: log.scan_page(keys, log.scan(r, keys, at, SCAN_STEP), SCAN_STEP), where):
        yield [int(f) for f, _ in page if f.isdigit()]


def _scan(step: Callable[[Any], Any], where: str) -> Iterator[list[tuple[str, str]]]:
    cursor: Any = 0
    while True:
        cursor, page = guarded(partial(step, cursor), where=where)
        yield [(text(k), text(v)) for k, v in page.items()]
        if int(cursor) == 0:
            return


def zset_in_steps(r: RedisClient, key: str, where: str) -> Iterator[list[tuple[str, float]]]:
    """Every member of a sorted set with its score, SCAN_STEP per call, by
    rank (a set that changes meanwhile may show a member twice or not at all)."""
    start = 0
    while True:

        def step(at: int = start) -> list[Any]:
            found: Any = r.zrange(key, at, at + SCAN_STEP - 1, withscores=True)
            return list(found)

        page = guarded(step, where=where)
        yield [(text(m), float(s)) for m, s in page]
        if len(page) < SCAN_STEP:
            return
        start += SCAN_STEP


def records_exist(r: RedisClient, keys: QueueKeys, seqs: list[int]) -> list[bool]:
    """Whether each seq has a stored record (one pipeline of HEXISTS, no
    payload read, in a hash log; a stub counts only with its side record)."""
    return [there for there, _ in record_states(r, keys, seqs)]


def record_states(r: RedisClient, keys: QueueKeys, seqs: list[int]) -> list[tuple[bool, bool]]:
    """Per seq, whether it has a stored record, and whether that record is
    a side record whose stub is gone (log.stub_missing)."""

    def read() -> list[tuple[bool, bool]]:
        pipe = r.pipeline(transaction=False)
        sizes = [log.has(pipe, keys, seq) for seq in seqs]
        replies = pipe.execute()
        found, at = [], 0
        for size in sizes:
            part = replies[at : at + size]
            found.append((log.present(keys, part), log.stub_missing(keys, part)))
            at += size
        return found

    return guarded(read, where=keys.base) if seqs else []


def flow_seqs(r: RedisClient, keys: QueueKeys, seqs: list[int]) -> set[int]:
    """Those of ``seqs`` that a stream log marks as messages published with
    a priority or an ordering key (log.flow), one pipeline; none in a hash
    log."""
    if not log.stream(keys) or not seqs:
        return set()
    states = guarded(partial(_flow_states, r, keys, seqs), where=keys.base)
    return {seq for seq, marked in zip(seqs, states, strict=True) if marked}


def _flow_states(r: RedisClient, keys: QueueKeys, seqs: list[int]) -> list[bool]:
    pipe = r.pipeline(transaction=False)
    sizes = [log.has(pipe, keys, seq) for seq in seqs]
    replies, found, at = pipe.execute(), [], 0
    for size in sizes:
        found.append(log.flow(keys, replies[at : at + size]))
        at += size
    return found


def side_leaks(
    r: RedisClient, keys: QueueKeys, trimmed: int, limit: int, where: str, groups: bool = True
) -> tuple[list[int], bool]:
    """Stream layout: up to ``limit`` seqs at or below the trim point
    ``trimmed`` whose side record stays with no priority log entry to
    delete it (lua/includes/side_sweep.lua), or in a queue without
    ``groups`` any at all (no fetch comes); the side hash read in steps;
    and whether there are more."""
    if not log.stream(keys) or trimmed <= 0:
        return [], False
    found: list[int] = []
    for page in hash_in_steps(r, keys.side, where):
        below = sorted({int(f) for f, _ in page if f.isdigit() and int(f) <= trimmed})
        if not below:
            continue

        def listed(seqs: list[int] = below) -> list[Any]:
            if not groups:
                return [0] * len(seqs)
            pipe = r.pipeline(transaction=False)
            for seq in seqs:
                pipe.zcount(keys.prio, seq, seq)
            return list(pipe.execute())

        for seq, count in zip(below, guarded(listed, where=where), strict=True):
            if not count and seq not in found:
                if len(found) == limit:
                    return found, True
                found.append(seq)
    return found, False


def log_newest(r: RedisClient, keys: QueueKeys, where: str) -> int:
    """The highest seq the queue's log ever held, when it is a stream (which
    keeps its newest id after the trim); else 0."""
    if not log.stream(keys) or not key_exists(r, log.key(keys), where):
        return 0
    return log.newest_of(guarded(lambda: log.newest(r, keys), where=where))


def log_length(r: RedisClient, keys: QueueKeys, where: str) -> int:
    """How many records the queue stores."""

    def read() -> int:
        pipe = r.pipeline(transaction=False)
        log.length(pipe, keys)
        return log.length_of(keys, pipe.execute())

    return guarded(read, where=where)


def state_holder(raw: str) -> tuple[int, str] | None:
    """The delivery count and holder ("" while waiting) of a delivery state
    (lua/includes/delivery_state.lua), or None when it does not parse."""
    head = raw.split("\n", 1)[0]
    found = _STATE.match(head) or _STATE_BEFORE_TOKENS.match(head)
    if found is None:
        return None
    return int(found.group(1)), found.group(2)


_STATE = re.compile(r"(\d+):(.*):(\d+):(\d+):([a-z][a-z0-9]*)?\Z")
_STATE_BEFORE_TOKENS = re.compile(r"(\d+):(.*):(\d+):(\d+)\Z")


def settled_counts(r: RedisClient, keys: QueueKeys, seqs: list[int]) -> list[int]:
    """How many groups settled each seq above their floor (the settled hash
    of a queue with several groups; 0 when none or one group)."""
    if not seqs:
        return []
    found: list[Any] = guarded(lambda: r.hmget(keys.settled, seqs), where=keys.base)
    return [int(v or 0) for v in found]
