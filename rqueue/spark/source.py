"""The ``rqueue`` data source (PySpark's Python Data Source API): register
it once per SparkSession with :func:`register`, then
``spark.read``/``readStream``/``df.write``/``writeStream`` ``.format("rqueue")``
with the options of docs/spark.md."""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from ..client import connect
from ..errors import InvalidInput
from .checks import check_schema
from .options import read_plan, window_option, write_plan
from .reader import SOURCE_SCHEMA, RqueueReader, RqueueStreamReader
from .writer import RqueueStreamWriter, RqueueWriter

log = logging.getLogger("rqueue.spark")

SHORT_WINDOW = 3600.0  # seconds: a dedup window below this gets a warning from a streaming write


class RqueueDataSource(DataSource):
    """format("rqueue"): reads a queue (batch or stream) and writes into one."""

    @classmethod
    def name(cls) -> str:
        return "rqueue"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> RqueueReader:
        return RqueueReader(read_plan(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> RqueueStreamReader:  # noqa: N802  # Spark's name
        return RqueueStreamReader(read_plan(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> RqueueWriter:
        plan = write_plan(self.options)
        check_schema(schema, plan)
        if plan.job is None and plan.mode != "id":
            raise InvalidInput(
                "a batch write needs the job_id option (a name for this job's rows, the same when it is "
                "run again) or id_col"
            )
        _configure(plan.url, plan.queue, plan.prefix, self.options, streaming=False, ids=plan.mode == "id")
        return RqueueWriter(plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> RqueueStreamWriter:  # noqa: N802
        plan = write_plan(self.options)
        check_schema(schema, plan)
        _configure(plan.url, plan.queue, plan.prefix, self.options, streaming=True, ids=plan.mode == "id")
        return RqueueStreamWriter(plan)


def _configure(url: str, queue: str, prefix: str, options: Any, streaming: bool, ids: bool) -> float:
    """Sets the queue's dedup_window when the option gives one; returns the
    one in force. Fails early, on the driver, when Redis is not there."""
    window = window_option(options)
    with connect(url, prefix=prefix) as client:
        if window is not None:
            client.configure(queue, dedup_window=window)
        in_force = client.queue(queue).settings().dedup_window
    if streaming and in_force < SHORT_WINDOW:
        log.warning(
            "rqueue: queue %r has dedup_window %g s: a micro-batch replayed later than that after its first run "
            "(a query restarted from its checkpoint) would be published again; set the dedup_window option "
            "(e.g. 86400)%s",
            queue,
            in_force,
            "" if not ids else " (it is the window of the id column's ids)",
        )
    return in_force


def register(spark: SparkSession) -> None:
    """Registers format("rqueue") with ``spark`` (once per session; again is harmless)."""
    spark.dataSource.register(RqueueDataSource)
