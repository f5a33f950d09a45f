"""The move of a queue level's log from the hash layout to the stream layout
(lua/migrate.lua): the level is marked, its records are copied in rising
seq order, COPY_STEP a call, and the level is finished. Every call is
atomic, and the level refuses every other client's call from the mark to
the finish, so a migration cut off anywhere is resumed by running it again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..errors import CorruptRecord, OutOfMemory
from . import log
from .commands import guarded, run
from .keys import LogLayout, QueueKeys, layout_key
from .scripts import Scripts

# Seqs a copy moves at most (lua/migrate.lua's limit): the step's Redis time
# stays near a publish of as many messages.
COPY_STEP = 5000
# Scans of the hash log per level: records found after the first round come
# only from a writer that ignores the mark (an rqueue before layouts).
ROUNDS = 3
# Fields a scan of the hash log asks for per HSCAN.
SCAN_COUNT = 1000

#: Called with the level's base, the records moved so far and the records
#: it held when the copy began.
Progress = Callable[[str, int, int], None]


@dataclass
class LevelMigrated:
    """What the migration of one level did: ``before`` is "hash", or
    "migrating" for a migration cut off and resumed here, or "stream" for
    a level migrated before (nothing done). The counts are migrate.lua's
    copy reply added up."""

    base: str
    before: str
    logged: int = 0
    pinned: int = 0
    dropped: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "level": self.base,
            "before": self.before,
            "logged": self.logged,
            "pinned": self.pinned,
            "dropped": self.dropped,
        }


def level_keys(base: str) -> list[str]:
    """KEYS of migrate.lua for the level at ``base``."""
    hashed, streamed = QueueKeys(base, LogLayout.HASH), QueueKeys(base, LogLayout.STREAM)
    return [hashed.meta, hashed.msgs, streamed.msgs, streamed.side, hashed.prio, hashed.pinned, hashed.settled]


def scanned_bases(r: Any, prefix: str) -> list[str]:
    """The base of every level of ``prefix`` (a queue, a partition, a
    dead-letter level) that has a meta hash, found by SCAN, so also those
    no list names (a dead-letter queue named by the dead_letter setting,
    which dead-lettering makes without listing it). A base is
    ``<prefix>:{<name>}`` or ``<prefix>:part:{<tag>}``, then ``:dlq`` per
    level down; names hold no brace."""
    glob = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + ":*meta"
    shape = re.compile(re.escape(prefix) + r":(?:part:)?\{[^{}]+\}(?::dlq)*:meta")
    found = guarded(lambda: [_text(key) for key in r.scan_iter(match=glob, count=SCAN_COUNT)], where=prefix)
    return sorted({key[: -len(":meta")] for key in found if shape.fullmatch(key)})


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hash_seqs(r: Any, keys: QueueKeys) -> list[int]:
    """The seqs of the records in a hash log, rising (the level is marked:
    nothing is added while they are read)."""
    seqs: list[int] = []
    cursor: Any = 0
    while True:
        reply = guarded(partial(log.scan, r, keys, cursor, SCAN_COUNT), where=keys.base)
        cursor, page = log.scan_page(keys, reply, SCAN_COUNT)
        seqs += (int(seq) for seq in page)
        if not int(cursor):
            return sorted(set(seqs))  # a hash's walk may repeat a field


def migrate_level(
    scripts: Scripts, r: Any, base: str, progress: Progress | None = None, step: int = COPY_STEP
) -> LevelMigrated:
    """Moves the level at ``base`` to the stream layout, or finishes a
    migration of it that was cut off; nothing for a level migrated before.
    Raises what a script call raises (LayoutMismatch, CorruptRecord, ...),
    and CorruptRecord when the hash holds a record at or below one copied
    already, which the stream cannot take (the level stays marked, and its
    records where they are)."""
    keys = level_keys(base)
    before = _text(run(scripts.migrate, keys, ["begin"], base, base)[0])
    done = LevelMigrated(base, "hash" if before == "begun" else before)
    if before == "stream":
        return done
    moved = 0
    for _ in range(ROUNDS):
        seqs = _hash_seqs(r, QueueKeys(base))
        copied = _text(guarded(lambda: r.hget(keys[0], "migrated"), where=base) or "0")
        if seqs and (not copied.isdigit() or seqs[0] <= int(copied)):
            raise CorruptRecord(
                keys[1],
                f"holds the record of seq {seqs[0]}, and meta field migrated says seqs up to {copied[:40]} were "
                "copied: the stream takes no seq below its newest; the level stays marked migrating, its records "
                "where they are",
            )
        total = moved + len(seqs)
        at, size = 0, step
        while at < len(seqs):
            chunk = seqs[at : at + size]
            try:
                logged, pinned, dropped, absent = run(scripts.migrate, keys, ["copy", *chunk], base, base)
            except OutOfMemory:
                # Refused before any write. A copy holds its records twice
                # until its end, and leaves them in less room than before (a
                # stream entry is smaller than a hash field), so smaller
                # steps pass where one would not.
                if size == 1:
                    raise
                size = max(1, size // 4)
                continue
            done.logged, done.pinned, done.dropped = done.logged + logged, done.pinned + pinned, done.dropped + dropped
            moved += len(chunk) - int(absent)
            at += len(chunk)
            if progress is not None:
                progress(base, moved, total)
        finished, _left = run(scripts.migrate, keys, ["finish"], base, base)
        if int(finished):
            if progress is not None:
                progress(base, moved, moved)
            return done
    raise CorruptRecord(
        keys[1],
        f"still holds records after {ROUNDS} rounds of copies: a client that ignores the level's mark writes "
        "to it; the level stays marked migrating",
    )


def mark_prefix(r: Any, prefix: str, layout: LogLayout) -> None:
    """Sets the prefix's layout marker (rqueue.engine.prefix_layout) to
    ``layout``, whatever it held."""
    guarded(lambda: r.set(layout_key(prefix), layout.value), where=f"prefix {prefix!r}")
