"""The reference the rqueue writer is measured against in
benchmarks/spark_bench.py: a foreachBatch sink that gives every row a
de-duplication id of its own (a Redis key per message, publish.lua),
content ids made by a digest, a shuffle by it and a sort. Only the
benchmark imports it.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from rqueue.client import connect
from rqueue.connection.urls import mask_url
from rqueue.constants import DEFAULT_DLQ_PREFIX, DEFAULT_DLQ_SUFFIX, DEFAULT_PREFIX, MAX_BATCH
from rqueue.engine.record import encode_body
from rqueue.errors import InvalidInput, InvalidURL, PayloadTooLarge
from rqueue.names import check_message_id, check_name
from rqueue.validate import optional_whole_number, seconds, whole_number

try:
    from pyspark.sql import Column, DataFrame, Row, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("rqueue.spark needs pyspark 4.x: pip install 'rqueue[spark]'") from exc

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "PublishStats",
    "Sink",
    "publish_dataframe",
    "read_dead_letters",
    "sink",
]

log = logging.getLogger("rqueue.spark")

ROW_IDS = ("content", "position")
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's local property naming the running streaming query
SHORT_WINDOW = 3600.0  # seconds: a dedup window below this gets a warning from the streaming sink

_HEADER_TYPES = (
    T.StringType,
    T.BooleanType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)
_ID_TYPES = (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)

DEAD_LETTER_SCHEMA = T.StructType(
    [
        T.StructField("dlq_seq", T.LongType(), False),
        T.StructField("queue", T.StringType(), False),
        T.StructField("group", T.StringType(), False),
        T.StructField("seq", T.LongType(), False),
        T.StructField("reason", T.StringType(), False),
        T.StructField("deliveries", T.IntegerType(), False),
        T.StructField("first_delivery_ms", T.LongType(), True),
        T.StructField("last_delivery_ms", T.LongType(), True),
        T.StructField("published_ms", T.LongType(), True),
        T.StructField("dead_lettered_ms", T.LongType(), False),
        T.StructField("error", T.StringType(), False),
        T.StructField("data", T.BinaryType(), False),
        T.StructField("headers", T.MapType(T.StringType(), T.StringType(), False), False),
    ]
)


@dataclass(frozen=True)
class PublishStats:
    """What one publish (one micro-batch, or one :func:`publish_dataframe`) did."""

    batch: str  # "<query>:<batch_id>" for the sink, "<job_id>" for publish_dataframe ("-" for none)
    rows: int  # rows of the DataFrame
    published: int  # messages stored now
    duplicates: int  # rows whose id the queue had already seen inside its dedup window
    partitions: int  # Spark partitions (tasks) that published


@dataclass(frozen=True)
class _Plan:
    """Everything an executor needs; plain values only (sent by Spark's closure serialisation)."""

    url: str
    queue: str
    prefix: str
    batch_size: int
    mode: str  # "id", "content" or "position"
    key: str  # start of every generated id: "spark-stream:<query>:<batch>" or "spark-job:<job>"
    where: str  # "batch 7 of query ..." for error messages
    value_col: str
    id_col: str | None
    headers: tuple[str, ...]


# -- argument checks (driver) -------------------------------------------------------


def _check_url(url: object) -> str:
    if not isinstance(url, str):
        raise InvalidURL(f"<{type(url).__name__}>", f"must be a str, not {type(url).__name__}")
    if url.startswith("memory://"):
        raise InvalidURL(
            url,
            "memory:// lives inside one process; Spark executors run in other processes "
            "(use a redis://, rediss:// or unix:// URL)",
        )
    return url


def _check_args(
    url: object,
    queue: object,
    value_col: object,
    id_col: object,
    header_cols: object,
    batch_size: object,
    prefix: object,
    dedup_window: object,
    row_ids: object,
    partitions: object,
) -> tuple[str, ...]:
    _check_url(url)
    check_name("queue", queue)
    check_name("key prefix", prefix)
    if not isinstance(value_col, str) or not value_col:
        raise InvalidInput(f"value_col must be a column name (str), not {value_col!r}")
    if id_col is not None and (not isinstance(id_col, str) or not id_col):
        raise InvalidInput(f"id_col must be a column name (str) or None, not {id_col!r}")
    if isinstance(header_cols, str) or not isinstance(header_cols, Iterable):
        raise InvalidInput(f"header_cols must be a list of column names, not {header_cols!r}")
    headers = tuple(header_cols)
    for h in headers:
        if not isinstance(h, str) or not h:
            raise InvalidInput(f"header_cols holds {h!r}: each entry must be a column name (str)")
    if len(set(headers)) != len(headers):
        raise InvalidInput(f"header_cols {list(headers)!r} names a column twice")
    whole_number("batch_size", batch_size, 1, MAX_BATCH)
    if dedup_window is not None:
        seconds("dedup_window", dedup_window, positive=True)
    if row_ids not in ROW_IDS:
        raise InvalidInput(f"row_ids must be one of {', '.join(map(repr, ROW_IDS))}, not {row_ids!r}")
    optional_whole_number("partitions", partitions, 1)
    return headers


def _check_job_id(job_id: object, what: str = "job_id") -> str:
    check_name(what, job_id)
    assert isinstance(job_id, str)
    if ":" in job_id:
        raise InvalidInput(f"{what} {job_id!r} must not contain ':' (it separates the parts of message ids)")
    return job_id


def _check_columns(df: DataFrame, value_col: str, id_col: str | None, headers: tuple[str, ...]) -> None:
    fields = {f.name: f.dataType for f in df.schema.fields}

    def field(name: str, role: str) -> T.DataType:
        if name not in fields:
            raise InvalidInput(f"{role} {name!r} is not a column of the DataFrame (columns: {', '.join(fields)})")
        return fields[name]

    vtype = field(value_col, "value_col")
    if not isinstance(vtype, (T.BinaryType, T.StringType)):
        raise InvalidInput(
            f"value column {value_col!r} is {vtype.simpleString()}: it must be binary or string "
            "(serialise it first, e.g. with to_json)"
        )
    if id_col is not None:
        itype = field(id_col, "id_col")
        if not isinstance(itype, _ID_TYPES):
            raise InvalidInput(f"id column {id_col!r} is {itype.simpleString()}: it must be a string or an integer")
    for h in headers:
        htype = field(h, "header column")
        if not isinstance(htype, _HEADER_TYPES):
            raise InvalidInput(
                f"header column {h!r} is {htype.simpleString()}: it must be a string, number, boolean, "
                "date or timestamp (headers are str to str)"
            )


# -- the plan (driver) ----------------------------------------------------------------


def _digest(value: Column, headers: list[Column]) -> Column:
    """SHA-256 (hex) of the value's and the headers' own SHA-256, a null shown as "-"."""
    parts = [F.coalesce(F.sha2(c.cast("binary"), 256), F.lit("-")) for c in [value, *headers]]
    return F.sha2(F.concat_ws(",", *parts).cast("binary"), 256)


def _layout(df: DataFrame, plan: _Plan, partitions: int | None) -> DataFrame:
    """The batch as (value binary, key string, header strings...), laid out
    so that the ids it yields are deterministic (docs/spark.md)."""
    value = F.col(plan.value_col).cast("binary")
    headers = [F.col(h).cast("string") for h in plan.headers]
    if plan.mode == "id":
        assert plan.id_col is not None  # the "id" mode is chosen exactly when id_col is given
        key = F.col(plan.id_col).cast("string")
    elif plan.mode == "content":
        key = _digest(value, headers)
    else:
        key = F.lit(None).cast("string")
    names = ["v", "k"] + [f"h{i}" for i in range(len(headers))]
    out = df.select(
        value.alias(names[0]), key.alias(names[1]), *(h.alias(n) for h, n in zip(headers, names[2:], strict=True))
    )
    if plan.mode == "content":
        n = partitions or df.sparkSession.sparkContext.defaultParallelism
        # An explicit number: adaptive execution never coalesces or splits it,
        # so identical rows always meet in one partition.
        out = out.repartition(max(1, n), "k").sortWithinPartitions("k")
    return out


_EXECUTOR_ERROR = re.compile(r"rqueue\.errors\.(InvalidInput|PayloadTooLarge): ([^\n]*)")
_TOO_LARGE = re.compile(r"payload of (\d+) bytes is over max_payload (\d+) bytes")


def _run(df: DataFrame, plan: _Plan, partitions: int | None) -> PublishStats:
    laid_out = _layout(df, plan, partitions)
    task = functools.partial(_publish_partition, plan=plan)
    try:
        counts = laid_out.rdd.mapPartitionsWithIndex(task).collect()
    except Exception as exc:
        # A bad row fails its task on an executor; Spark reports it wrapped in
        # its own exception with the Python traceback inside. Raise the same
        # rqueue error here, so that the caller (and a streaming query's
        # exception) names the row plainly.
        found = _EXECUTOR_ERROR.search(str(exc))
        if found is None:
            raise
        kind, message = found.groups()
        error: InvalidInput
        size = _TOO_LARGE.search(message)
        if kind == "PayloadTooLarge" and size is not None:
            error = PayloadTooLarge(int(size.group(1)), int(size.group(2)))
            error.args = (message,)
        else:
            error = InvalidInput(message)
        raise error from exc
    return PublishStats(
        batch=plan.key.split(":", 1)[1],
        rows=sum(c[0] for c in counts),
        published=sum(c[1] for c in counts),
        duplicates=sum(c[2] for c in counts),
        partitions=len(counts),
    )


def _configure(url: str, queue: str, prefix: str, dedup_window: float | None) -> float:
    """Sets the queue's dedup_window when asked (driver); returns the one in force.
    Also fails early, on the driver, when the URL is wrong or Redis is down."""
    with connect(url, prefix=prefix) as client:
        if dedup_window is not None:
            client.configure(queue, dedup_window=dedup_window)
        return client.queue(queue).settings().dedup_window


# -- publishing (executors) ---------------------------------------------------------


def _bad_row(error: InvalidInput, text: str, plan: _Plan, index: int, row: int, msg_id: str | None) -> InvalidInput:
    """``error`` with ``text`` and the row it is about: message id, batch, partition, row number."""
    named = f"the row with message id {msg_id!r}" if msg_id else "a row"
    error.args = (
        f"{text} in {named} ({plan.where}, partition {index}, row {row}); "
        "rqueue publishes no such row: fix or filter it before the sink",
    )
    return error


def _publish_partition(index: int, rows: Iterator[Row], plan: _Plan) -> Iterator[tuple[int, int, int]]:
    """Publishes one partition in publish_many calls of plan.batch_size
    messages over one connection; yields (rows, published, duplicates)."""
    client = connect(plan.url, prefix=plan.prefix)
    try:
        queue = client.queue(plan.queue)
        limit = queue.settings().max_payload
        payloads: list[bytes] = []
        headers: list[dict[str, str] | None] = []
        ids: list[str] = []
        first = 0  # row number of payloads[0]
        total = published = duplicates = 0
        previous, repeat = None, 0

        def flush() -> None:
            nonlocal published, duplicates
            try:
                results = queue.publish_many(payloads, headers=headers, ids=ids)
            except InvalidInput:
                _find_bad(plan, index, first, payloads, headers, ids)
                raise
            new = sum(1 for r in results if not r.duplicate)
            published += new
            duplicates += len(results) - new

        for number, row in enumerate(rows):
            value, key = row[0], row[1]
            if plan.mode == "id":
                if key is None:
                    raise _bad_row(InvalidInput(), f"id column {plan.id_col!r} is null", plan, index, number, None)
                msg_id = key
            elif plan.mode == "content":
                repeat = repeat + 1 if key == previous else 0
                previous = key
                msg_id = f"{plan.key}:{key[:32]}:{repeat}"
            else:
                msg_id = f"{plan.key}:p{index}:{number}"
            if value is None:
                raise _bad_row(InvalidInput(), f"value column {plan.value_col!r} is null", plan, index, number, msg_id)
            if len(value) > limit:
                error = PayloadTooLarge(len(value), limit)
                raise _bad_row(error, f"{error} in value column {plan.value_col!r}", plan, index, number, msg_id)
            values = row[2:]
            headers.append(
                {n: v for n, v in zip(plan.headers, values, strict=True) if v is not None} if values else None
            )
            payloads.append(bytes(value))
            ids.append(msg_id)
            total += 1
            if len(payloads) >= plan.batch_size:
                flush()
                payloads, headers, ids = [], [], []
                first = number + 1
        if payloads:
            flush()
    finally:
        client.close()
    yield total, published, duplicates


def _find_bad(
    plan: _Plan, index: int, first: int, payloads: list[bytes], headers: list[dict[str, str] | None], ids: list[str]
) -> None:
    """Raises the error of the first message publish_many refused, naming its row."""
    for i, (payload, hdrs, msg_id) in enumerate(zip(payloads, headers, ids, strict=True)):
        try:
            encode_body(payload, hdrs)
        except InvalidInput as exc:
            raise _bad_row(
                exc, f"{exc}, from header columns {', '.join(plan.headers)}", plan, index, first + i, msg_id
            ) from None
        try:
            check_message_id(msg_id)
        except InvalidInput as exc:
            raise _bad_row(exc, f"{exc}, from id column {plan.id_col!r}", plan, index, first + i, None) from None


# -- public API (driver) ------------------------------------------------------------


class Sink:
    """A ``foreachBatch`` function publishing each micro-batch into a queue
    exactly once. Make one with :func:`sink`.

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
        batch_size: int = 500,
        prefix: str = DEFAULT_PREFIX,
        dedup_window: float | None = None,
        job_id: str | None = None,
        row_ids: str = "content",
        partitions: int | None = None,
    ) -> None:
        self.headers = _check_args(
            url, queue, value_col, id_col, header_cols, batch_size, prefix, dedup_window, row_ids, partitions
        )
        self.job_id = None if job_id is None else _check_job_id(job_id)
        self.url, self.queue, self.prefix = url, queue, prefix
        self.value_col, self.id_col = value_col, id_col
        self.batch_size, self.dedup_window = batch_size, dedup_window
        self.row_ids, self.partitions = row_ids, partitions
        self.last: PublishStats | None = None
        self._configured = False

    def __repr__(self) -> str:
        return f"rqueue.spark.sink({mask_url(self.url)!r}, {self.queue!r}, value_col={self.value_col!r})"

    def _query(self, df: DataFrame, batch_id: int) -> str:
        if self.job_id is not None:
            return self.job_id
        if self.id_col is not None:
            return "-"
        query = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query:
            raise InvalidInput(
                f"batch {batch_id}: no streaming query is running, so there is no query id to make message ids from; "
                "pass job_id= to rqueue.spark.sink() (or use rqueue.spark.publish_dataframe for batch jobs)"
            )
        return _check_job_id(query, "streaming query id")

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        whole_number("batch_id", batch_id, 0)
        _check_columns(df, self.value_col, self.id_col, self.headers)
        query = self._query(df, batch_id)
        if not self._configured:
            window = _configure(self.url, self.queue, self.prefix, self.dedup_window)
            if window < SHORT_WINDOW and self.id_col is None:
                log.warning(
                    "queue %r has dedup_window %g s: a micro-batch replayed later than that after its first "
                    "run (e.g. a query restarted from its checkpoint) would be published again; pass "
                    "dedup_window= to rqueue.spark.sink (e.g. 86400)",
                    self.queue,
                    window,
                )
            self._configured = True
        mode = "id" if self.id_col is not None else self.row_ids
        plan = _Plan(
            self.url,
            self.queue,
            self.prefix,
            self.batch_size,
            mode,
            f"spark-stream:{query}:{batch_id}",
            f"batch {batch_id}" + ("" if query == "-" else f" of query {query}"),
            self.value_col,
            self.id_col,
            self.headers,
        )
        self.last = stats = _run(df, plan, self.partitions)
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
    batch_size: int = 500,
    prefix: str = DEFAULT_PREFIX,
    dedup_window: float | None = None,
    *,
    job_id: str | None = None,
    row_ids: str = "content",
    partitions: int | None = None,
) -> Sink:
    """A function for ``df.writeStream.foreachBatch(...)`` that publishes each
    micro-batch into ``queue`` exactly once (docs/spark.md).

    ``value_col`` (binary or string) is the payload; ``id_col`` (optional)
    the message id; ``header_cols`` become str headers named after their
    columns. ``batch_size`` messages go per publish_many call. ``prefix`` is
    the client's key prefix. ``dedup_window`` (seconds), when given, is set
    for the queue before the first batch; it must exceed Spark's retry
    horizon. ``job_id`` names the ids' namespace instead of the streaming
    query's id. ``row_ids`` is "content" (default) or "position";
    ``partitions`` the number of publishing tasks for "content" ids.

    Raises InvalidInput / InvalidURL / InvalidName for bad arguments at once,
    and from a batch for bad columns or rows.
    """
    return Sink(
        url, queue, value_col, id_col, header_cols, batch_size, prefix, dedup_window, job_id, row_ids, partitions
    )


def publish_dataframe(
    df: DataFrame,
    url: str,
    queue: str,
    value_col: str = "value",
    id_col: str | None = None,
    header_cols: Sequence[str] = (),
    batch_size: int = 500,
    prefix: str = DEFAULT_PREFIX,
    dedup_window: float | None = None,
    *,
    job_id: str | None = None,
    row_ids: str = "content",
    partitions: int | None = None,
) -> PublishStats:
    """Publishes every row of a (batch) DataFrame into ``queue``, exactly once
    per ``job_id``: running it again with the same ``job_id`` and rows
    inside the dedup window publishes nothing new. ``job_id`` is required
    unless ``id_col`` is given. Other arguments as for :func:`sink`.
    Returns what was published."""
    headers = _check_args(
        url, queue, value_col, id_col, header_cols, batch_size, prefix, dedup_window, row_ids, partitions
    )
    if job_id is None and id_col is None:
        raise InvalidInput(
            "publish_dataframe needs job_id= (a name for this job's rows, the same when it is run again) or id_col="
        )
    job = "-" if job_id is None else _check_job_id(job_id)
    if not isinstance(df, DataFrame):
        raise InvalidInput(f"df must be a pyspark DataFrame, not {type(df).__name__}")
    if df.isStreaming:
        raise InvalidInput(
            "publish_dataframe takes a batch DataFrame; for a stream use "
            "df.writeStream.foreachBatch(rqueue.spark.sink(...))"
        )
    _check_columns(df, value_col, id_col, headers)
    _configure(url, queue, prefix, dedup_window)
    mode = "id" if id_col is not None else row_ids
    plan = _Plan(url, queue, prefix, batch_size, mode, f"spark-job:{job}", f"job {job}", value_col, id_col, headers)
    stats = _run(df, plan, partitions)
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


def read_dead_letters(
    spark: SparkSession,
    url: str,
    queue: str,
    group: str | None = None,
    reason: str | None = None,
    seq_from: int | None = None,
    seq_to: int | None = None,
    limit: int | None = None,
    prefix: str = DEFAULT_PREFIX,
    dlq_prefix: str = DEFAULT_DLQ_PREFIX,
    dlq_suffix: str = DEFAULT_DLQ_SUFFIX,
) -> DataFrame:
    """The dead letters of ``queue`` (filtered like
    :meth:`rqueue.Queue.dead_letters`) as a DataFrame with
    :data:`DEAD_LETTER_SCHEMA`: dlq_seq, queue, group, seq, reason,
    deliveries, first_delivery_ms, last_delivery_ms, published_ms,
    dead_lettered_ms, error, data (binary), headers (map<string,string>,
    without the x-rq-* ones). Times are server ms since the epoch.

    The dead letters are read on the driver, so ``memory://`` URLs work here;
    use ``limit`` or the seq range for very large dead-letter queues.
    """
    if not isinstance(spark, SparkSession):
        raise InvalidInput(f"spark must be a SparkSession, not {type(spark).__name__}")
    with connect(url, prefix=prefix, dlq_prefix=dlq_prefix, dlq_suffix=dlq_suffix) as client:
        letters = client.queue(queue).dead_letters(group, reason, seq_from, seq_to, limit)
    rows = [
        (
            d.dlq_seq,
            d.queue,
            d.group,
            d.seq,
            d.reason,
            d.deliveries,
            d.first_delivery_ms,
            d.last_delivery_ms,
            d.published_ms,
            d.dead_lettered_ms,
            d.error,
            bytearray(d.data),
            dict(d.headers),
        )
        for d in letters
    ]
    return spark.createDataFrame(rows, schema=DEAD_LETTER_SCHEMA)
