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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .connection.cluster import primary_names, slot_of, slot_owner
from .constants import MAX_PARTITIONS
from .engine import store
from .engine.keys import QueueKeys, partition_tag, queue_base
from .errors import CorruptRecord
from .results import PartitionPlacement, PlacementReport, PublishResult

# Salts tried per partition before giving up on placing it (the default tag
# is kept then): with P primaries a salt fits after about P tries.
MAX_SALT_TRIES = 10_000


@dataclass(frozen=True)
class Layout:
    """A partitioned queue's stored layout: how many partitions, the salt
    of each one's hash tag, and its last growth. Stored as ``"<n>"`` when
    no partition has a salt and it never grew (also how queues made before
    placement are stored), else ``"<n>[:<salt0>,<salt1>,...][/<previous>@<grown_ms>]"``:
    ``previous`` partitions before the last growth, at server time
    ``grown_ms``."""

    partitions: int
    salts: tuple[int, ...]
    previous: int = 0  # partitions before the last growth; 0: never grown
    grown_ms: int = 0

    @classmethod
    def plain(cls, partitions: int) -> Layout:
        return cls(partitions, (0,) * partitions)

    def text(self) -> str:
        out = str(self.partitions)
        if any(self.salts):
            out += ":" + ",".join(str(s) for s in self.salts)
        if self.previous:
            out += f"/{self.previous}@{self.grown_ms}"
        return out

    @classmethod
    def parse(cls, raw: bytes | str, where: str) -> Layout:
        """The layout stored as ``raw`` at ``where``; CorruptRecord names
        a value that is not one."""
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
        head, slash, growth = text.partition("/")
        count, sep, rest = head.partition(":")
        if not count.isascii() or not count.isdigit() or not 2 <= int(count) <= MAX_PARTITIONS:
            raise CorruptRecord(where, f"{text!r} is not a number of partitions from 2 to {MAX_PARTITIONS}")
        n = int(count)
        salts = rest.split(",") if sep else ["0"] * n
        if len(salts) != n or not all(s.isascii() and s.isdigit() and int(s) < MAX_SALT_TRIES for s in salts):
            raise CorruptRecord(where, f"{text!r} does not list one placement salt per partition ({n})")
        previous, _, grown = growth.partition("@")
        if slash and not (
            previous.isascii() and previous.isdigit() and 1 <= int(previous) < n and grown.isascii() and grown.isdigit()
        ):
            raise CorruptRecord(where, f"{text!r} does not say its last growth as /<partitions>@<ms>")
        return cls(n, tuple(int(s) for s in salts), int(previous) if slash else 0, int(grown) if slash else 0)

    def grown(self, redis_client: Any, root: str, partitions: int, now_ms: int) -> Layout:
        """This layout with partitions added up to ``partitions``, the new
        ones placed as :func:`place` does, grown at ``now_ms``."""
        placed = place(redis_client, root, partitions, self.salts)
        return Layout(partitions, placed.salts, self.partitions, now_ms)

    def in_transition(self, now_ms: int, window_ms: int) -> bool:
        """Whether a message published before the last growth may still be
        within its de-duplication window (``window_ms``) at ``now_ms``."""
        return self.previous > 0 and now_ms < self.grown_ms + window_ms


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
        if row.node:  # "" on a single server: no primaries to count
            per_node[row.node] = per_node.get(row.node, 0) + 1
    counts = [per_node[name] for name in primaries]
    balanced = not counts or max(counts) - min(counts) <= 1
    return PlacementReport(root, layout.partitions, rows, per_node, balanced)


def queue_placements(queue: Any) -> PlacementReport:
    """Where each partition of a partitioned queue (sync or asyncio) lives,
    by the hash tags its keys carry: those of the queue's root, so a
    dead-letter queue ("DLQ.orders") is placed where its keys are, with
    its queue's partitions (``{orders/<i>}``). The report names the queue."""
    report = placements(queue.client.redis, queue.parts[0].root, queue.layout)
    return replace(report, queue=queue.name)


def plain_meta_name(client: Any, root: str) -> str:
    """The key of queue ``root``'s plain meta hash, which holds its
    partitioning marker (named in errors)."""
    return QueueKeys(queue_base(client.prefix, root, 0)).meta


def seen_before_growth(
    queue: Any,
    routes: dict[int, list[int]],
    keys: Sequence[str | None],
    ids: Sequence[Any],
    partition_of: Callable[[str, int], int],
) -> dict[int, PublishResult]:
    """For a publish to partitioned ``queue`` routed as ``routes``
    (partition -> message indexes): messages with an id (and no key) whose
    first copy may sit in the partition the id had before the last growth.
    While that growth is less than one de-duplication window old, such an
    id is looked up there; one found makes the message a duplicate of that
    copy (it is removed from ``routes``; its result is returned by index).
    ``partition_of`` routes an id over a number of partitions."""
    layout: Layout = queue.layout
    if not layout.previous:
        return {}
    moved = [
        (i, p, partition_of(ids[i], layout.previous))
        for p, idx in routes.items()
        for i in idx
        if keys[i] is None and isinstance(ids[i], str) and partition_of(ids[i], layout.previous) != p
    ]
    if not moved:
        return {}
    client = queue.client
    now = client.clock.script_now()
    now_ms = int(now) if now else store.now_ms(client.redis)
    if not layout.in_transition(now_ms, round(queue.settings().dedup_window * 1000)):
        return {}
    found: dict[int, PublishResult] = {}
    for i, p, old in moved:
        seen = store.id_seen(client.redis, queue.parts[old].keys, ids[i], client.idempotent)
        if seen is not None and seen[1] > now_ms:
            found[i] = PublishResult(seen[0], True, None, old)
            routes[p].remove(i)
    for p in [p for p, idx in routes.items() if not idx]:
        del routes[p]
    return found


def partitioning_refused(name: str, root: str, stored: int) -> str | None:
    """Why queue ``name`` (of queue ``root``), stored with ``stored``
    partitions (1: none), cannot be given another number of partitions;
    None when nothing known without asking Redis refuses it."""
    if stored > 1:
        return f"queue {root!r} has {stored} partitions; the number cannot change except upwards with grow_partitions()"
    if name != root:
        return f"{name!r} is a dead-letter queue: partition its queue {root!r} instead"
    return None


def already_plain(root: str) -> str:
    return f"queue {root!r} already exists without partitions (it has messages or groups)"
