"""The ``rqueue`` data source's writers: ``df.write.format("rqueue")`` and
``df.writeStream.format("rqueue")``. Spark calls ``write`` in a task per
partition (on an executor) and ``commit`` once per job or micro-batch (on
the driver), with the tasks' reports."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from ..errors import InvalidInput
from .options import WritePlan, check_job
from .publish import TaskReport, publish_partition
from .report import save_report

log = logging.getLogger("rqueue.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's local property naming the running streaming query
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # and the micro-batch it runs


class Report(WriterCommitMessage):
    """A task's report as Spark carries it to the commit."""

    def __init__(self, report: TaskReport) -> None:
        self.report = report


def _task_run(plan: WritePlan, streaming: bool) -> tuple[str, int]:
    """(run, partition) of the running task: the run is "<job>:<batch>",
    the job the job_id option or the streaming query's id (the same across
    restarts from a checkpoint), the batch the micro-batch's id."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "a write runs in a Spark task"
    partition = context.partitionId()
    job = plan.job
    if job is None:
        job = context.getLocalProperty(QUERY_ID_PROPERTY) if streaming else None
        if job:
            job = check_job(job, "streaming query id")
        elif plan.mode == "id":
            job = "-"  # the ids are the rows' own: the run only names the report
        else:
            raise InvalidInput("no job_id option and no streaming query id: nothing names this write's rows")
    batch = plan.batch
    if batch is None:
        batch = (context.getLocalProperty(BATCH_ID_PROPERTY) if streaming else None) or "-"
    return f"{job}:{batch}", partition


def _commit(plan: WritePlan, messages: list[Any], batch: int | None) -> None:
    reports = [m.report for m in messages if isinstance(m, Report)]
    if not reports:
        return
    rows = sum(r.rows for r in reports)
    published = sum(r.published for r in reports)
    duplicates = sum(r.duplicates for r in reports)
    run = reports[0].run
    save_report(plan, run, rows, published, duplicates, len(reports))
    log.info(
        "rqueue: %s into %r: %d rows, %d published, %d duplicates skipped, %d tasks%s",
        run,
        plan.queue,
        rows,
        published,
        duplicates,
        len(reports),
        "" if batch is None else f" (batch {batch})",
    )


class RqueueWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> Report:
        run, partition = _task_run(self.plan, streaming=False)
        return Report(publish_partition(self.plan, run, partition, iterator))

    def commit(self, messages: list[Any]) -> None:
        _commit(self.plan, messages, None)

    def abort(self, messages: list[Any]) -> None:
        # What the tasks stored stays stored: a run again with the same
        # job_id skips it (the trackers live for the dedup_window).
        log.warning("rqueue: a write into %r failed; what it stored stays, and a run again skips it", self.plan.queue)


class RqueueStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> Report:
        run, partition = _task_run(self.plan, streaming=True)
        return Report(publish_partition(self.plan, run, partition, iterator))

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803  # Spark's name
        _commit(self.plan, messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        log.warning(
            "rqueue: batch %d into %r failed; what it stored stays, and its replay skips it", batchId, self.plan.queue
        )
