"""A writing task: one Spark partition published into a queue (executor
side), exactly once however often Spark runs the task again.

How a task recognises what it stored before (docs/spark.md):

- ``id``: the id column is each message's de-duplication id (one key per
  message, the queue's own de-duplication, publish.lua);
- ``position``: the task's rows come in the same order each time; a tracker
  hash of the task holds how many rows it stored (publish_tracked.lua);
- ``content``: the rows may come in another order (a shuffle before the
  sink); the tracker holds a 16-byte digest of each row it stored, with the
  count of identical rows before it in the partition.

A tracker is named by the run (query or job, and batch) and the Spark
partition, and expires with the queue's dedup_window.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..client import Client, connect
from ..engine import commands
from ..engine.record import encode_body
from ..errors import InvalidInput, PayloadTooLarge
from ..names import check_message_id
from ..partitions import PartitionedQueue
from ..queue import Queue
from .options import WritePlan

BAD_ROW = "rqueue publishes no such row: fix or filter it before the sink"


@dataclass(frozen=True)
class TaskReport:
    """What one writing task did; Spark hands these to the driver's commit."""

    run: str  # "<query or job>:<batch>"
    partition: int  # the Spark partition
    rows: int
    published: int  # messages stored now
    duplicates: int  # rows a run before had stored (skipped)


def target_queue(client: Client, plan: WritePlan, partition: int) -> Queue:
    """The queue a task writes into: the queue, or for a partitioned queue
    the partition of the Spark partition's number (so a task again writes
    where it wrote before)."""
    queue = client.queue(plan.queue, plan.partitions)
    if isinstance(queue, PartitionedQueue):
        return queue.parts[partition % queue.partitions]
    assert isinstance(queue, Queue)
    return queue


def content_key(value: bytes, headers: list[str | None]) -> bytes:
    """16 bytes naming a row by its content: the value and its headers (a
    null header apart from an empty one)."""
    digest = hashlib.blake2b(value, digest_size=16)
    for h in headers:
        digest.update(b"\x00" if h is None else b"\x01" + h.encode())
    return digest.digest()


def bad_row(problem: str, plan: WritePlan, run: str, partition: int, row: int, label: Any) -> InvalidInput:
    """The error of a row rqueue will not publish: the problem first, then
    the row by the input's own label (label_col) when it has one."""
    if plan.label_col is not None and label is not None:
        where = f"the row with {plan.label_col} {label!r} (row {row} of Spark partition {partition}, run {run})"
    else:
        where = f"row {row} of Spark partition {partition} (run {run})"
    return InvalidInput(f"{problem} in {where}; {BAD_ROW}")


class _Task:
    """The state of one writing task: the messages waiting for a script
    call, and what the calls did."""

    def __init__(self, client: Client, queue: Queue, plan: WritePlan, run: str, partition: int) -> None:
        self.client, self.queue, self.plan = client, queue, plan
        self.run, self.partition = run, partition
        settings = queue.settings()
        self.limit = settings.max_payload
        self.window_ms = int(settings.dedup_window * 1000)
        self.writer = f"{run}:{partition}"
        self.messages: list[Any] = []  # PublishMessage (id mode) or TrackedMessage
        self.offset = 0  # row number of messages[0]
        self.rows = self.published = self.duplicates = 0
        self.repeats: dict[bytes, int] = {}

    def flush(self) -> None:
        if not self.messages:
            return
        q, plan = self.queue, self.plan
        now = self.client.clock.script_now()
        if plan.mode == "id":
            watch = self.client.state_watch(q.name, q.keys)
            calls = commands.publish_calls(
                q.keys, now, self.window_ms, False, self.messages, len(self.messages), watch.candidate
            )
            dupes = commands.publish_duplicates(commands.publish(self.client.scripts, calls, q.name))
        else:
            replies = [
                commands.publish_tracked(
                    self.client.scripts,
                    q.keys,
                    self.writer,
                    now,
                    self.window_ms,
                    plan.mode,
                    self.offset,
                    self.messages,
                    q.name,
                )
            ]
            dupes = sum(1 for reply in replies for flag in reply[1::2] if flag == 1)
        self.duplicates += dupes
        self.published += len(self.messages) - dupes
        self.offset += len(self.messages)
        self.messages = []

    def add_batch(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        plan = self.plan

        def strings(name: str) -> list[Any]:
            column = batch.column(name)
            if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
                column = pc.cast(column, pa.string())
            return list(column.to_pylist())

        values = batch.column(plan.value_col).to_pylist()
        headers = [strings(h) for h in plan.headers]
        ids = strings(plan.id_col) if plan.id_col is not None else None
        labels = strings(plan.label_col) if plan.label_col is not None else None
        content = plan.mode == "content"
        for i, value in enumerate(values):
            row = self.rows
            self.rows += 1
            where = (plan, self.run, self.partition, row, labels[i] if labels is not None else None)
            if value is None:
                raise bad_row(f"value column {plan.value_col!r} is null", *where)
            if isinstance(value, str):
                value = value.encode()
            if len(value) > self.limit:
                too_large = PayloadTooLarge(len(value), self.limit)
                too_large.args = (bad_row(f"{too_large} in value column {plan.value_col!r}", *where).args[0],)
                raise too_large
            row_headers = [h[i] for h in headers]
            if row_headers and any(h is not None for h in row_headers):
                named = {n: h for n, h in zip(plan.headers, row_headers, strict=True) if h is not None}
                try:
                    hlen, body = encode_body(value, named)
                except InvalidInput as exc:
                    raise bad_row(f"{exc}, from header columns {', '.join(plan.headers)}", *where) from None
                timing: int | str = f"0:{hlen}" if hlen else 0
            else:
                body, timing = value, 0
            key: str | bytes | None
            if ids is not None:
                if ids[i] is None:
                    raise bad_row(f"id column {plan.id_col!r} is null", *where)
                try:
                    key = check_message_id(ids[i])
                except InvalidInput as exc:
                    raise bad_row(f"{exc}, from id column {plan.id_col!r}", *where) from None
            elif content:
                digest = content_key(value, row_headers)
                seen = self.repeats.get(digest, 0)
                self.repeats[digest] = seen + 1
                key = digest if seen == 0 else digest + b"#%d" % seen
            else:
                key = None
            self.messages.append((key, timing, body))
            if len(self.messages) >= plan.batch_size:
                self.flush()


def publish_partition(plan: WritePlan, run: str, partition: int, batches: Iterable[Any]) -> TaskReport:
    """Publishes the Arrow record batches of one Spark partition; returns
    what it did. Raises InvalidInput (PayloadTooLarge) for a bad row: rows
    before it stay published, and a run again skips them."""
    client = connect(plan.url, prefix=plan.prefix)
    try:
        task = _Task(client, target_queue(client, plan, partition), plan, run, partition)
        for batch in batches:
            task.add_batch(batch)
        task.flush()
        return TaskReport(run, partition, task.rows, task.published, task.duplicates)
    finally:
        client.close()
