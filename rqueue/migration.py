"""The move of every queue of a prefix from the hash layout to the stream
layout (`rqueue migrate`, docs/upgrading.md): the marker first, so that
every client that connects from then on uses the stream layout and makes
new queues in it, then each level of each listed queue (the queue, each
partition, each dead-letter level) by rqueue.engine.migration, then the
list read again for queues an older client made meanwhile. A level refuses
both layouts' calls while it moves; one moved refuses a hash-layout
client's calls: the prefix's workers are stopped first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .client import Client
from .engine import store
from .engine.keys import LogLayout
from .engine.migration import LevelMigrated, Progress, level_bases, mark_prefix, migrate_level
from .partitions import PartitionedQueue
from .queue import Queue

# Readings of the prefix's queue list after the first: each finds only the
# queues a client made while the one before was migrated.
LIST_ROUNDS = 3


@dataclass
class PrefixMigrated:
    """What a migration of a prefix did, level by level."""

    prefix: str
    levels: list[LevelMigrated] = field(default_factory=list)
    #: Levels still listed unmoved after the last reading of the list (a
    #: client kept making queues in the hash layout): run it again.
    left: list[str] = field(default_factory=list)

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
        }


def queue_bases(client: Client) -> list[str]:
    """The base of every level of every queue the prefix lists (a
    partitioned queue's own and each partition's), dead-letter levels
    included, each once. Raises what opening a listed name raises, before
    anything is written."""
    bases: list[str] = []
    for name in store.registered_queues(client.redis, client.prefix):
        q = client.queue(name)
        tops = [Queue(client, name).keys.base]
        if isinstance(q, PartitionedQueue):
            tops += [part.keys.base for part in q.parts]
        for top in tops:
            for base in level_bases(client.redis, top):
                if base not in bases:
                    bases.append(base)
    return bases


def migrate_prefix(client: Client, progress: Progress | None = None) -> PrefixMigrated:
    """Moves every queue of ``client``'s prefix to the stream layout, or
    finishes a migration that was cut off. Levels moved before are passed
    over, so running it again is safe."""
    report = PrefixMigrated(client.prefix)
    bases = queue_bases(client)
    mark_prefix(client.redis, client.prefix, LogLayout.STREAM)
    client.log_layout = LogLayout.STREAM
    done: set[str] = set()
    for _ in range(LIST_ROUNDS):
        todo = [base for base in bases if base not in done]
        if not todo:
            break
        for base in todo:
            report.levels.append(migrate_level(client.scripts, client.redis, base, progress))
            done.add(base)
        bases = queue_bases(client)
    report.left = [base for base in bases if base not in done]
    return report
