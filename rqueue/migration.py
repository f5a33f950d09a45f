"""The move of every queue of a prefix from the hash layout to the stream
layout (`rqueue migrate`, docs/upgrading.md): each level of the prefix (a
queue, a partition, a dead-letter level: every meta hash SCAN finds, so
also a dead-letter queue named by the dead_letter setting, which no list
names) by rqueue.engine.migration, the levels read again for those a
client made meanwhile, and the prefix's marker last, once every level moved: a run
refused on the way (memory, a damaged level) leaves the marker on the hash
layout, whose clients the levels not yet moved keep serving. A level
refuses both layouts' calls but a hash-layout ack while it moves, and a
hash-layout client's calls once moved: the prefix's workers are stopped
first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .client import Client
from .engine.keys import LogLayout
from .engine.migration import LevelMigrated, Progress, mark_prefix, migrate_level, scanned_bases

# Readings of the prefix's levels: each after the first finds only those a
# client made while the ones before were moved.
LIST_ROUNDS = 3


@dataclass
class PrefixMigrated:
    """What a migration of a prefix did, level by level."""

    prefix: str
    levels: list[LevelMigrated] = field(default_factory=list)
    #: Levels still unmoved after the last reading of the list (a client
    #: kept making queues in the hash layout): the marker is not written;
    #: stop that client and run it again.
    left: list[str] = field(default_factory=list)
    #: Whether the prefix's marker now names the stream layout.
    marked: bool = False

    @property
    def moved(self) -> int:
        """Levels moved (or finished) by this run."""
        return sum(1 for level in self.levels if level.before != "stream")

    def as_json(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "layout": LogLayout.STREAM.value,
            "moved": self.moved,
            "levels": [level.as_json() for level in self.levels],
            "left": self.left,
            "marked": self.marked,
        }


def migrate_prefix(client: Client, progress: Progress | None = None) -> PrefixMigrated:
    """Moves every queue of ``client``'s prefix to the stream layout, or
    finishes a migration that was cut off, and then marks the prefix.
    Levels moved before are passed over, so running it again is safe."""
    report = PrefixMigrated(client.prefix)
    done: set[str] = set()

    def move_new(bases: list[str]) -> None:
        for base in bases:
            if base not in done:
                report.levels.append(migrate_level(client.scripts, client.redis, base, progress))
                done.add(base)

    bases = scanned_bases(client.redis, client.prefix)
    for _ in range(LIST_ROUNDS):
        if all(base in done for base in bases):
            break
        move_new(bases)
        bases = scanned_bases(client.redis, client.prefix)
    report.left = [base for base in bases if base not in done]
    if report.left:
        return report
    mark_prefix(client.redis, client.prefix, LogLayout.STREAM)
    client.log_layout = LogLayout.STREAM
    report.marked = True
    # A queue a client made between the last reading and the marker.
    move_new(scanned_bases(client.redis, client.prefix))
    return report
