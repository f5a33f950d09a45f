"""The ``rqueue`` data source's readers: ``spark.read.format("rqueue")``
(the messages stored now) and ``spark.readStream.format("rqueue")`` (a
stream whose offsets are seqs, one per partition of the queue).

A stream reads for a group: it starts at the group's ack floor, each
micro-batch reads a seq range in tasks of at most rows_per_task seqs, and
Spark's commit of the batch settles the range for the group in one call
(:meth:`rqueue.Queue.settle_through`). Until then the messages stay stored,
so a query restarted from its checkpoint reads the uncommitted range again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..client import Client, connect
from ..engine import commands, store
from ..engine.record import decode_record
from ..ids import incarnation_id
from ..partitions import PartitionedQueue
from ..queue import Queue
from .options import ReadPlan

SOURCE_SCHEMA = StructType(
    [
        StructField("seq", LongType(), False),
        StructField("value", BinaryType(), False),
        StructField("headers", MapType(StringType(), StringType(), False), False),
        StructField("published", TimestampType(), False),
        StructField("partition", IntegerType(), True),  # null for a queue without partitions
    ]
)
SOURCE_CONSUMER = "spark-source"  # the member that creates the stream's group, and leaves at once
READ_CHUNK = 1000  # records per read of a task


def parts(client: Client, plan: ReadPlan) -> list[tuple[str, Queue]]:
    """(offset label, queue) of each partition of the queue: "seq" for a
    queue without partitions, "0", "1", ... for the partitions."""
    queue = client.queue(plan.queue, plan.partitions)
    if isinstance(queue, PartitionedQueue):
        return [(str(i), part) for i, part in enumerate(queue.parts)]
    assert isinstance(queue, Queue)
    return [("seq", queue)]


class SeqRange(InputPartition):
    """The seqs after ``after`` up to ``last`` of one partition of the queue."""

    def __init__(self, label: str, after: int, last: int) -> None:
        super().__init__((label, after, last))
        self.label, self.after, self.last = label, after, last


def split(label: str, after: int, last: int, size: int) -> list[SeqRange]:
    return [SeqRange(label, a, min(last, a + size)) for a in range(after, last, size)]


def read_range(plan: ReadPlan, part: SeqRange) -> Iterator[tuple[Any, ...]]:
    """The stored messages of one seq range, as rows of SOURCE_SCHEMA."""
    with connect(plan.url, prefix=plan.prefix) as client:
        queue = dict(parts(client, plan))[part.label]
        number = None if part.label == "seq" else int(part.label)
        after = part.after
        while after < part.last:
            records = store.records_after(client.redis, queue.keys, after, min(READ_CHUNK, part.last - after))
            if not records:
                return
            for seq, record in records:
                if seq > part.last:
                    return
                published_ms, headers, data = decode_record(record, f"{queue.keys.msgs}[{seq}]")
                yield seq, data, headers, dt.datetime.fromtimestamp(published_ms / 1000, dt.UTC), number
            after = records[-1][0]


def floors(client: Client, plan: ReadPlan) -> dict[str, int]:
    """The group's ack floor per partition; creates the group where it does
    not exist (starting at the oldest message stored)."""
    assert plan.group is not None
    out = {}
    for label, queue in parts(client, plan):
        if plan.group not in queue.groups():
            call = queue.group_call(plan.group, consumer=SOURCE_CONSUMER)
            commands.join(call, 1000, incarnation_id(client.randomness))
            commands.leave(call, SOURCE_CONSUMER, graceful=True)
            client.register(queue.name)
        stats = commands.stats(queue.group_call(plan.group))
        out[label] = stats.ack_floor
    return out


class RqueueReader(DataSourceReader):
    """A batch read of what is stored: above the group's ack floor when the
    group option is given, else every stored message. Settles nothing."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> list[SeqRange]:
        with connect(self.plan.url, prefix=self.plan.prefix) as client:
            starts = floors(client, self.plan) if self.plan.group is not None else None
            out: list[SeqRange] = []
            for label, queue in parts(client, self.plan):
                last = store.last_seq(client.redis, queue.keys)
                out += split(label, starts[label] if starts else 0, last, self.plan.split)
        return out or [SeqRange("seq", 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, SeqRange)
        return read_range(self.plan, partition)


class RqueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are {label: seq}: the last seq read of each partition."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self.until: dict[str, int] | None = None  # availableNow: the last seqs when the query started

    def initialOffset(self) -> dict[str, int]:  # noqa: N802  # Spark's names
        with connect(self.plan.url, prefix=self.plan.prefix) as client:
            return floors(client, self.plan)

    def _last_seqs(self) -> dict[str, int]:
        with connect(self.plan.url, prefix=self.plan.prefix) as client:
            return {label: store.last_seq(client.redis, queue.keys) for label, queue in parts(client, self.plan)}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.until = self._last_seqs()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadAllAvailable() if self.plan.max_rows is None else ReadMaxRows(self.plan.max_rows)

    def latestOffset(self, start: dict[str, int] | None = None, limit: ReadLimit | None = None) -> dict[str, int]:  # noqa: N802
        """The last seqs, at most ReadMaxRows seqs past ``start`` in each
        partition of the queue (max_rows_per_batch)."""
        last = self.until if self.until is not None else self._last_seqs()
        if start is None or not isinstance(limit, ReadMaxRows):
            return dict(last)
        return {label: min(seq, int(start.get(label, 0)) + limit.max_rows) for label, seq in last.items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[SeqRange]:
        out: list[SeqRange] = []
        for label, last in end.items():
            out += split(label, int(start.get(label, 0)), int(last), self.plan.split)
        return out

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, SeqRange)
        return read_range(self.plan, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Settles everything up to ``end`` for the group: the batch that
        read it is committed."""
        assert self.plan.group is not None
        with connect(self.plan.url, prefix=self.plan.prefix) as client:
            queues = dict(parts(client, self.plan))
            for label, last in end.items():
                queues[label].settle_through(self.plan.group, int(last))
