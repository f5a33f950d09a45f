"""Where the partitions of a partitioned queue live: the layout stored with
the partition count, and the choice of hash tags by slot ownership.

A partition's keys share the hash tag ``{<queue>/<i>}``, so its shard would
follow from a hash of that name: with 3 partitions on 3 primaries only
about 2 queue names in 9 would use all three. Instead, when a queue is
created (or grown), each new partition is given to the primary that holds
the fewest of the queue's partitions, and its tag is
``{<queue>/<i>~<salt>}`` with the smallest salt (0 = no salt) whose slot
that primary serves. The salts are stored with the count
(:class:`Layout`), so every process finds the same keys whatever the
cluster's topology does later; a resharding that moves slots moves the
partitions with them, and :func:`placements` reports where they are now.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .connection.cluster import primary_names, slot_of, slot_owner
from .constants import MAX_PARTITIONS
from .engine.keys import QueueKeys, partition_tag, queue_base
from .errors import CorruptRecord
from .results import PartitionPlacement, PlacementReport

# Salts tried per partition before giving up on placing it (the default tag
# is kept then): with P primaries a salt fits after about P tries.
MAX_SALT_TRIES = 10_000


@dataclass(frozen=True)
class Layout:
    """A partitioned queue's stored layout: how many partitions, and the
    salt of each one's hash tag. Stored as ``"<n>"`` when no partition has
    a salt (also how queues made before placement are stored), else
    ``"<n>:<salt0>,<salt1>,..."``."""

    partitions: int
    salts: tuple[int, ...]

    @classmethod
    def plain(cls, partitions: int) -> Layout:
        return cls(partitions, (0,) * partitions)

    def text(self) -> str:
        if not any(self.salts):
            return str(self.partitions)
        return f"{self.partitions}:" + ",".join(str(s) for s in self.salts)

    @classmethod
    def parse(cls, raw: bytes | str, where: str) -> Layout:
        """The layout stored as ``raw`` at ``where``; CorruptRecord names
        a value that is not one."""
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
        count, sep, rest = text.partition(":")
        if not count.isascii() or not count.isdigit() or not 2 <= int(count) <= MAX_PARTITIONS:
            raise CorruptRecord(where, f"{text!r} is not a number of partitions from 2 to {MAX_PARTITIONS}")
        n = int(count)
        if not sep:
            return cls.plain(n)
        salts = rest.split(",")
        if len(salts) != n or not all(s.isascii() and s.isdigit() and int(s) < MAX_SALT_TRIES for s in salts):
            raise CorruptRecord(where, f"{text!r} does not list one placement salt per partition ({n})")
        return cls(n, tuple(int(s) for s in salts))

    def grown(self, redis_client: Any, root: str, partitions: int) -> Layout:
        """This layout with partitions added up to ``partitions``, the new
        ones placed as :func:`place` does."""
        return place(redis_client, root, partitions, self.salts)


def place(redis_client: Any, root: str, partitions: int, kept: Sequence[int] = ()) -> Layout:
    """A layout of ``partitions`` partitions for queue ``root``: the salts
    ``kept`` (of partitions that exist already) and, for each further
    partition, a salt that puts it on the primary holding the fewest of the
    queue's partitions (ties broken in an order that starts at a primary
    chosen by the queue's name, so small queues do not all start on the
    same one). On one server every salt is 0."""
    primaries = primary_names(redis_client)
    salts = list(kept)
    if len(primaries) < 2:
        return Layout(partitions, tuple(salts + [0] * (partitions - len(salts))))
    start = zlib.crc32(root.encode("utf-8", "surrogateescape")) % len(primaries)
    order = primaries[start:] + primaries[:start]
    load = dict.fromkeys(order, 0)
    for i, salt in enumerate(salts):
        owner = slot_owner(redis_client, slot_of(partition_tag(root, i, salt)))
        if owner in load:
            load[owner] += 1
    for i in range(len(salts), partitions):
        target = min(order, key=lambda name: load[name])  # min() keeps the first of equals: the order breaks ties
        chosen = 0
        for salt in range(MAX_SALT_TRIES):
            if slot_owner(redis_client, slot_of(partition_tag(root, i, salt))) == target:
                chosen = salt
                break
        salts.append(chosen)
        owner = slot_owner(redis_client, slot_of(partition_tag(root, i, chosen)))
        if owner in load:
            load[owner] += 1
    return Layout(partitions, tuple(salts))


def placements(redis_client: Any, root: str, layout: Layout) -> PlacementReport:
    """Where each partition of queue ``root`` lives now, by the client's map
    of slots to nodes (refresh it first for an up-to-date answer)."""
    rows = []
    for i, salt in enumerate(layout.salts):
        tag = partition_tag(root, i, salt)
        slot = slot_of(tag)
        rows.append(PartitionPlacement(i, "{" + tag + "}", slot, slot_owner(redis_client, slot)))
    primaries = primary_names(redis_client)
    per_node = {name: 0 for name in primaries}
    for row in rows:
        per_node[row.node] = per_node.get(row.node, 0) + 1
    counts = [per_node[name] for name in primaries]
    balanced = not counts or max(counts) - min(counts) <= 1
    return PlacementReport(root, layout.partitions, rows, per_node, balanced)


def plain_meta_name(client: Any, root: str) -> str:
    """The key of queue ``root``'s plain meta hash, which holds its
    partitioning marker (named in errors)."""
    return QueueKeys(queue_base(client.prefix, root, 0)).meta
