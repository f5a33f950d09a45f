"""A queue's dead letters as a DataFrame (read on the driver)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from ..client import connect
from ..constants import DEFAULT_DLQ_PREFIX, DEFAULT_DLQ_SUFFIX, DEFAULT_PREFIX
from ..errors import InvalidInput

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
