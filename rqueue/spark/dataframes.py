"""The DataFrame helpers: :func:`publish_dataframe` for a batch job and
:func:`sink` for ``foreachBatch``, thin wrappers over the ``rqueue``
data source's writer (``df.write.format("rqueue")``), which do the checks
on the driver and return what was published."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..connection.urls import mask_url
from ..constants import DEFAULT_PREFIX
from ..errors import InvalidInput, InvalidName, InvalidURL, PayloadTooLarge
from ..validate import optional_whole_number, seconds, whole_number
from .checks import check_schema
from .options import ROW_IDS, WritePlan, check_job, header_list, write_plan
from .report import load_report
from .source import register
from .writer import QUERY_ID_PROPERTY

log = logging.getLogger("rqueue.spark")


@dataclass(frozen=True)
class PublishStats:
    """What one publish (one micro-batch, or one :func:`publish_dataframe`) did."""

    batch: str  # "<query>:<batch_id>" for the sink, "<job_id>:-" for publish_dataframe
    rows: int  # rows of the DataFrame
    published: int  # messages stored now
    duplicates: int  # rows a run before had stored (skipped)
    partitions: int  # Spark partitions (tasks) that published


# A bad row fails its task on an executor; Spark reports it wrapped in its
# own exception, the Python traceback inside. The wrappers raise the same
# rqueue error, its message first.
_EXECUTOR_ERROR = re.compile(r"rqueue\.errors\.(InvalidInput|PayloadTooLarge|InvalidName|InvalidURL): ([^\n]*)")
_TOO_LARGE = re.compile(r"payload of (\d+) bytes is over max_payload (\d+) bytes")


def plain_error(exc: BaseException) -> Exception | None:
    """The rqueue error inside a Spark exception, or None when there is none."""
    found = _EXECUTOR_ERROR.search(str(exc))
    if found is None:
        return None
    kind, message = found.groups()
    size = _TOO_LARGE.search(message)
    if kind == "PayloadTooLarge" and size is not None:
        error = PayloadTooLarge(int(size.group(1)), int(size.group(2)))
        error.args = (message,)
        return error
    return InvalidInput(message)


def _options(
    url: str,
    queue: str,
    value_col: str,
    id_col: str | None,
    header_cols: Sequence[str],
    batch_size: int,
    prefix: str,
    dedup_window: float | None,
    row_ids: str,
    label_col: str | None,
) -> dict[str, str]:
    """The data source's options for the wrappers' arguments, checked."""
    if not isinstance(url, str):
        raise InvalidURL(f"<{type(url).__name__}>", f"must be a str, not {type(url).__name__}")
    if not isinstance(value_col, str) or not value_col:
        raise InvalidInput(f"value_col must be a column name (str), not {value_col!r}")
    if id_col is not None and (not isinstance(id_col, str) or not id_col):
        raise InvalidInput(f"id_col must be a column name (str) or None, not {id_col!r}")
    if label_col is not None and (not isinstance(label_col, str) or not label_col):
        raise InvalidInput(f"label_col must be a column name (str) or None, not {label_col!r}")
    if isinstance(header_cols, str) or not isinstance(header_cols, (list, tuple)):
        raise InvalidInput(f"header_cols must be a list of column names, not {header_cols!r}")
    for h in header_cols:
        if not isinstance(h, str) or not h or "," in h:
            raise InvalidInput(f"header_cols holds {h!r}: each entry must be a column name (without ',')")
    header_list(list(header_cols))
    whole_number("batch_size", batch_size, 1)
    if dedup_window is not None:
        seconds("dedup_window", dedup_window, positive=True)
    if row_ids not in ROW_IDS:
        raise InvalidInput(f"row_ids must be one of {', '.join(map(repr, ROW_IDS))}, not {row_ids!r}")
    if not isinstance(queue, str):
        raise InvalidName("queue", queue, f"must be a str, not {type(queue).__name__}")
    options = {
        "url": url,
        "queue": queue,
        "prefix": prefix,
        "value_col": value_col,
        "header_cols": ",".join(header_cols),
        "batch_size": str(batch_size),
        "row_ids": row_ids,
    }
    if id_col is not None:
        options["id_col"] = id_col
    if label_col is not None:
        options["label_col"] = label_col
    if dedup_window is not None:
        options["dedup_window"] = repr(float(dedup_window))
    return options


def _spread(df: DataFrame, plan: WritePlan, partitions: int | None) -> DataFrame:
    """``df`` in ``partitions`` partitions by content (identical rows meet
    in one), so that a run again lays the rows out the same whatever
    Spark's own partitioning does; ``df`` itself when None."""
    if partitions is None:
        return df
    cols = [F.col(plan.value_col).cast("binary"), *(F.col(h).cast("string") for h in plan.headers)]
    return df.repartition(partitions, F.xxhash64(*cols))


def _write(df: DataFrame, options: dict[str, str], plan: WritePlan, run: str) -> PublishStats:
    try:
        df.write.format("rqueue").mode("append").options(**options).save()
    except Exception as exc:
        error = plain_error(exc)
        if error is None:
            raise
        raise error from exc
    report = load_report(plan, run)
    return PublishStats(
        batch=run,
        rows=report.get("rows", 0),
        published=report.get("published", 0),
        duplicates=report.get("duplicates", 0),
        partitions=report.get("tasks", 0),
    )


class Sink:
    """A ``foreachBatch`` function publishing each micro-batch into a queue
    exactly once, through the ``rqueue`` data source. Make one with
    :func:`sink`.

    Attributes:
        last: the :class:`PublishStats` of the latest micro-batch, or None.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        value_col: str = "value",
        id_col: str | None = None,
        header_cols: Sequence[str] = (),
        batch_size: int = 1000,
        prefix: str = DEFAULT_PREFIX,
        dedup_window: float | None = None,
        job_id: str | None = None,
        row_ids: str = "content",
        partitions: int | None = None,
        label_col: str | None = None,
    ) -> None:
        self.options = _options(
            url, queue, value_col, id_col, header_cols, batch_size, prefix, dedup_window, row_ids, label_col
        )
        self.plan = write_plan(self.options)
        self.job_id = None if job_id is None else check_job(job_id)
        self.partitions = optional_whole_number("partitions", partitions, 1)
        self.url, self.queue = url, queue
        self.last: PublishStats | None = None

    def __repr__(self) -> str:
        return f"rqueue.spark.sink({mask_url(self.url)!r}, {self.queue!r}, value_col={self.plan.value_col!r})"

    def _query(self, df: DataFrame, batch_id: int) -> str:
        if self.job_id is not None:
            return self.job_id
        query: Any = None
        try:
            query = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        except Exception:  # Spark Connect has no SparkContext on the client
            query = None
        if not query:
            raise InvalidInput(
                f"batch {batch_id}: no streaming query id to name this batch's rows by; "
                "pass job_id= to rqueue.spark.sink() (or use rqueue.spark.publish_dataframe for batch jobs)"
            )
        return check_job(query, "streaming query id")

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        whole_number("batch_id", batch_id, 0)
        check_schema(df.schema, self.plan)
        query = self._query(df, batch_id)
        register(df.sparkSession)
        options = {**self.options, "job_id": query, "batch_id": str(batch_id)}
        self.last = stats = _write(_spread(df, self.plan, self.partitions), options, self.plan, f"{query}:{batch_id}")
        log.info(
            "batch %d into %r: %d rows, %d published, %d duplicates, %d partitions",
            batch_id,
            self.queue,
            stats.rows,
            stats.published,
            stats.duplicates,
            stats.partitions,
        )


def sink(
    url: str,
    queue: str,
    value_col: str = "value",
    id_col: str | None = None,
    header_cols: Sequence[str] = (),
    batch_size: int = 1000,
    prefix: str = DEFAULT_PREFIX,
    dedup_window: float | None = None,
    *,
    job_id: str | None = None,
    row_ids: str = "content",
    partitions: int | None = None,
    label_col: str | None = None,
) -> Sink:
    """A function for ``df.writeStream.foreachBatch(...)`` that publishes each
    micro-batch into ``queue`` exactly once (docs/spark.md); the same as
    ``df.writeStream.format("rqueue")`` with these options.

    ``value_col`` (binary or string) is the payload; ``id_col`` (optional)
    the message id; ``header_cols`` become str headers named after their
    columns (not ``x-rq-*``). ``batch_size`` messages go per script call.
    ``prefix`` is the client's key prefix. ``dedup_window`` (seconds), when
    given, is set for the queue before the first batch; it must exceed the
    time within which a batch may be run again. ``job_id`` names the
    batches instead of the streaming query's id. ``row_ids`` is "content"
    (default: a run again may see the rows in any order) or "position" (it
    sees them in the same order); ``partitions`` spreads the rows over that
    many tasks by content first. ``label_col`` names a bad row in errors
    (default: id_col).

    Raises InvalidInput / InvalidURL / InvalidName for bad arguments at once,
    and from a batch for bad columns or rows.
    """
    return Sink(
        url,
        queue,
        value_col,
        id_col,
        list(header_cols),
        batch_size,
        prefix,
        dedup_window,
        job_id,
        row_ids,
        partitions,
        label_col,
    )


def publish_dataframe(
    df: DataFrame,
    url: str,
    queue: str,
    value_col: str = "value",
    id_col: str | None = None,
    header_cols: Sequence[str] = (),
    batch_size: int = 1000,
    prefix: str = DEFAULT_PREFIX,
    dedup_window: float | None = None,
    *,
    job_id: str | None = None,
    row_ids: str = "content",
    partitions: int | None = None,
    label_col: str | None = None,
) -> PublishStats:
    """Publishes every row of a (batch) DataFrame into ``queue``, exactly once
    per ``job_id``: running it again with the same ``job_id`` and rows
    inside the dedup window publishes nothing new. ``job_id`` is required
    unless ``id_col`` is given. Other arguments as for :func:`sink`.
    Returns what was published."""
    options = _options(
        url, queue, value_col, id_col, list(header_cols), batch_size, prefix, dedup_window, row_ids, label_col
    )
    if job_id is None and id_col is None:
        raise InvalidInput(
            "publish_dataframe needs job_id= (a name for this job's rows, the same when it is run again) or id_col="
        )
    job = "-" if job_id is None else check_job(job_id)
    optional_whole_number("partitions", partitions, 1)
    if not isinstance(df, DataFrame):
        raise InvalidInput(f"df must be a pyspark DataFrame, not {type(df).__name__}")
    if df.isStreaming:
        raise InvalidInput(
            "publish_dataframe takes a batch DataFrame; for a stream use "
            'df.writeStream.format("rqueue") or foreachBatch(rqueue.spark.sink(...))'
        )
    options = {**options, "job_id": job, "batch_id": "0"}
    plan = write_plan(options)
    check_schema(df.schema, plan)
    register(df.sparkSession)
    stats = _write(_spread(df, plan, partitions), options, plan, f"{job}:0")
    log.info(
        "job %s into %r: %d rows, %d published, %d duplicates, %d partitions",
        job,
        queue,
        stats.rows,
        stats.published,
        stats.duplicates,
        stats.partitions,
    )
    return stats
