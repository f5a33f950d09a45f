"""rqueue.spark: DataFrames and Structured Streaming micro-batches published
into rqueue exactly once through format("rqueue") and its wrappers (tasks
retried mid-write, batches replayed), queues read back by the source, bad
rows refused loudly, dead letters as a DataFrame.

One local SparkSession (local[2,3]: two cores, a failed task is tried up to
three times) and one private redis-server serve the whole module; each test
has its own key prefix. Streaming queries use the file source with
availableNow and end by themselves: no query is ever stopped mid-batch.
When CI is set, a missing pyspark or Java is a failure, not a skip.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from support import logview
from support.servers import IN_CI, start_server

try:
    import pyspark  # noqa: F401
except ImportError:
    if IN_CI:
        raise ImportError(
            "CI must run the Spark tests: install the spark extra (pip install -e '.[dev,spark]')"
        ) from None
    pytest.skip("pyspark is not installed (pip install -e '.[spark]')", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    if IN_CI:
        raise RuntimeError("CI must run the Spark tests: Java 17 is missing (apt-get install openjdk-17-jre-headless)")
    pytest.skip("Spark needs Java 17 (java on PATH or JAVA_HOME)", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import rqueue  # noqa: E402
import rqueue.spark as rs  # noqa: E402
from rqueue.engine.keys import QueueKeys  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    s = start_server("redis")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def spark():
    # Executors run Python workers; they must use this virtual environment's
    # interpreter, where rqueue (and so rqueue.spark) is installed.
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("rqueue-tests")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    if before is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = before


@pytest.fixture
def client(server, prefix):
    c = rqueue.connect(server.url, prefix=prefix)
    yield c
    c.close()


def stored(client: rqueue.Client, queue: str) -> list[rqueue.Message]:
    """Every message stored in ``queue``, in seq order."""
    q, out = client.queue(queue), []
    while page := q.peek(1000, after=out[-1].seq if out else 0):
        out += page
    return out


def payloads(client: rqueue.Client, queue: str) -> collections.Counter:
    return collections.Counter(m.data for m in stored(client, queue))


def test_every_row_arrives_once_with_its_headers(spark, server, client, prefix):
    # given 3000 rows over 3 partitions, a string value, an int header, a string header that is sometimes null
    df = spark.range(0, 3000, 1, 3).select(
        F.format_string("event-%d", "id").alias("value"),
        (F.col("id") % 4).alias("kind"),
        F.when(F.col("id") % 2 == 0, F.lit("even")).alias("parity"),
    )
    # when the DataFrame is published, spread over 3 tasks by content
    stats = rs.publish_dataframe(
        df,
        server.url,
        "events",
        header_cols=["kind", "parity"],
        batch_size=128,
        prefix=prefix,
        job_id="load-1",
        partitions=3,
    )
    # then every row is stored exactly once, UTF-8 encoded, with its headers (a null header is left out)
    assert (stats.rows, stats.published, stats.duplicates) == (3000, 3000, 0)
    messages = stored(client, "events")
    assert sorted(m.data for m in messages) == sorted(f"event-{i}".encode() for i in range(3000))
    for m in messages:
        i = int(m.data.split(b"-")[1])
        assert m.headers == ({"kind": str(i % 4), "parity": "even"} if i % 2 == 0 else {"kind": str(i % 4)})
    # and running the same job again, its input partitioned another way, publishes nothing new
    again = rs.publish_dataframe(
        df.repartition(5),
        server.url,
        "events",
        header_cols=["kind", "parity"],
        prefix=prefix,
        job_id="load-1",
        partitions=3,
    )
    assert (again.published, again.duplicates) == (0, 3000)
    assert client.queue("events").stats().depth == 3000


def test_binary_values_and_an_id_column(spark, server, client, prefix):
    # given binary payloads with an id column, one of whose ids was already published by someone else
    client.queue("blobs").publish(b"from the web app", id="42")
    df = spark.createDataFrame([(i, bytes([i, 0, 255])) for i in range(40, 50)], "id long, blob binary")
    # when the DataFrame is published with id_col
    stats = rs.publish_dataframe(df, server.url, "blobs", value_col="blob", id_col="id", prefix=prefix)
    # then the ids are the column's values, shared with every other publisher of the queue
    assert (stats.published, stats.duplicates) == (9, 1)
    assert payloads(client, "blobs") == collections.Counter(
        [b"from the web app"] + [bytes([i, 0, 255]) for i in range(40, 50) if i != 42]
    )
    # and the same rows written with format("rqueue") directly, ids from the column and no job_id, add nothing
    (
        df.write.format("rqueue")
        .mode("append")
        .option("url", server.url)
        .option("queue", "blobs")
        .option("prefix", prefix)
        .option("value_col", "blob")
        .option("id_col", "id")
        .save()
    )
    assert client.queue("blobs").stats().last_seq == 10


@pytest.mark.parametrize("row_ids", ["content", "position"])
def test_a_replayed_batch_id_adds_nothing(spark, server, client, prefix, row_ids):
    # given a sink and a batch holding 200 distinct rows and 5 identical ones
    rows = [(f"row-{i}",) for i in range(200)] + [("same",)] * 5
    batch = spark.createDataFrame(rows, "value string").repartition(2)
    sink = rs.sink(server.url, "replay", prefix=prefix, job_id="pipeline", row_ids=row_ids)
    sink(batch, 7)
    assert (sink.last.rows, sink.last.published, sink.last.duplicates) == (205, 205, 0)
    # when batch 7 runs again (with content ids, each partition's rows in another order, as a
    # recomputed shuffle may give them)
    replay = batch.sortWithinPartitions(F.rand(3)) if row_ids == "content" else batch
    sink(replay, 7)
    # then nothing new is stored, and the identical rows are still 5 messages
    assert (sink.last.published, sink.last.duplicates) == (0, 205)
    assert payloads(client, "replay") == collections.Counter([r[0].encode() for r in rows])
    # and the next batch id is new data
    sink(batch, 8)
    assert sink.last.published == 205
    assert client.queue("replay").stats().depth == 410


def cut_connections_once(server, keys: QueueKeys, depth: int) -> threading.Thread:
    """Closes every client connection of the server once the log of the
    queue of ``keys`` (tests/support/logview.py) holds ``depth`` records: a writing task fails mid-write, as on a
    network fault, and Spark runs it again."""
    admin = redis.Redis.from_url(server.url)
    deadline = time.monotonic() + 60

    def watch() -> None:
        try:
            while time.monotonic() < deadline:
                if logview.length(admin, keys) >= depth:
                    # writes wait while paused, so the writers' next calls are in flight when cut
                    # (a second gives writers slowed by a loaded machine the time to send them)
                    admin.client_pause(3000, all=False)
                    time.sleep(1.0)
                    admin.client_kill_filter(_type="normal", skipme=True)
                    admin.client_unpause()
                    return
                time.sleep(0.005)
        finally:
            admin.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("row_ids", ["position", "content"])
def test_a_task_failing_mid_write_is_retried_without_duplicates(spark, server, client, prefix, row_ids):
    # given 8000 rows in 2 partitions; with content ids each computation of a partition orders its rows
    # at random (as rows fetched from a shuffle may come), so the retry sees them in another order
    df = spark.range(0, 8000, 1, 2).select(F.format_string("row-%06d", "id").alias("value"))
    if row_ids == "content":
        shuffle_order = F.udf(lambda: random.random(), "double").asNondeterministic()
        df = df.sortWithinPartitions(shuffle_order())
    queue = client.queue("retry")
    # when the connections to Redis are cut while the tasks publish (20 rows a call)
    watcher = cut_connections_once(server, queue.keys, 1500)
    stats = rs.publish_dataframe(df, server.url, "retry", batch_size=20, prefix=prefix, job_id="retry", row_ids=row_ids)
    watcher.join()
    # then Spark ran a task again, the retry skipped what the failed attempt had stored, and every row is there once
    assert stats.rows == 8000 and stats.duplicates > 0, stats
    assert stats.published + stats.duplicates == 8000
    counts = payloads(client, "retry")
    assert len(counts) == 8000 and set(counts.values()) == {1}


def test_bad_rows_fail_the_batch_naming_the_row(spark, server, client, prefix):
    url = server.url
    sink = rs.sink(url, "bad", prefix=prefix, job_id="p")
    # a null value: the batch fails with InvalidInput naming the column, the row's message id and the batch
    df = spark.createDataFrame([("ok",), (None,)], "value string").coalesce(1)
    with pytest.raises(
        rqueue.InvalidInput,
        match=r"^value column 'value' is null in row 1 of Spark partition 0 \(run p:3\); rqueue publishes no such row",
    ):
        sink(df, 3)
    # a payload over the queue's max_payload: PayloadTooLarge naming the row
    client.configure("bad", max_payload=100)
    df = spark.createDataFrame([("x" * 101,)], "value string")
    with pytest.raises(
        rqueue.PayloadTooLarge,
        match=r"^payload of 101 bytes is over max_payload 100 bytes in "
        r"value column 'value' in row 0 of Spark partition \d \(run p:4\)",
    ) as info:
        sink(df, 4)
    assert (info.value.size, info.value.limit) == (101, 100)
    # no bad row was stored (the good row before it may be)
    assert {m.data for m in stored(client, "bad")} <= {b"ok"}
    # a null id, the row named by the input's own label column
    df = spark.createDataFrame([("line-7", None, "v")], "line string, id string, value string")
    with pytest.raises(rqueue.InvalidInput, match=r"^id column 'id' is null in the row with line 'line-7' \(row 0"):
        rs.publish_dataframe(df, url, "bad", id_col="id", prefix=prefix, label_col="line")
    # a header column with rqueue's reserved prefix
    with pytest.raises(rqueue.InvalidInput, match="header column 'x-rq-trace' starts with 'x-rq-'"):
        rs.publish_dataframe(df, url, "bad", prefix=prefix, job_id="j", header_cols=["x-rq-trace"])
    # columns of the wrong kind, missing columns and bad arguments are refused on the driver, before any Spark job
    ints = spark.range(3)
    with pytest.raises(rqueue.InvalidInput, match="value column 'id' is bigint: it must be binary or string"):
        rs.publish_dataframe(ints, url, "bad", value_col="id", prefix=prefix, job_id="j")
    with pytest.raises(rqueue.InvalidInput, match="value_col 'value' is not a column of the DataFrame"):
        rs.publish_dataframe(ints, url, "bad", prefix=prefix, job_id="j")
    with pytest.raises(rqueue.InvalidInput, match="header column 'm' is map<string,string>"):
        rs.publish_dataframe(
            spark.sql("select 'v' as value, map('a', 'b') as m"),
            url,
            "bad",
            header_cols=["m"],
            prefix=prefix,
            job_id="j",
        )
    with pytest.raises(rqueue.InvalidInput, match="takes a batch DataFrame"):
        rs.publish_dataframe(spark.readStream.format("rate").load(), url, "bad", prefix=prefix, job_id="j")
    with pytest.raises(rqueue.InvalidInput, match="needs job_id="):
        rs.publish_dataframe(df, url, "bad", prefix=prefix)
    with pytest.raises(rqueue.InvalidURL, match="memory:// lives inside one process"):
        rs.sink("memory://x", "bad")
    with pytest.raises(rqueue.InvalidInput, match="batch_size"):
        rs.sink(url, "bad", batch_size=0)
    with pytest.raises(rqueue.InvalidInput, match="must not contain ':'"):
        rs.sink(url, "bad", job_id="a:b")
    with pytest.raises(rqueue.InvalidInput, match="no streaming query id"):
        rs.sink(url, "bad", prefix=prefix)(df, 0)


def test_a_bad_row_stops_the_stream_with_the_rqueue_error(spark, server, client, prefix, tmp_path):
    # given a stream whose second row has no value
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.json").write_text('{"value": "fine"}\n{"other": 1}\n')
    sink = rs.sink(server.url, "strict", prefix=prefix, dedup_window=3600)
    query = (
        spark.readStream.schema("value string")
        .json(str(inbox))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    # when it runs, the query fails with the sink's error naming the column and the batch, and is not committed
    with pytest.raises(
        Exception,
        match=r"InvalidInput: value column 'value' is null in row 1 of Spark partition 0 \(run [0-9a-f-]{36}:0\)",
    ):
        query.awaitTermination(60)
    assert not query.isActive
    assert not (tmp_path / "checkpoint" / "commits" / "0").exists()
    assert {m.data for m in stored(client, "strict")} <= {b"fine"}


def write_events(folder: Path, name: str, first: int, count: int) -> None:
    lines = [
        json.dumps({"event_id": i, "user": f"u{i % 7}", "amount": i * 1.5, "type": "click" if i % 3 else "buy"})
        for i in range(first, first + count)
    ]
    tmp = folder.parent / f".{name}"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(folder / name)  # the file source must never see a half-written file


def test_file_stream_end_to_end_and_a_replayed_micro_batch(spark, server, client, prefix, tmp_path):
    # given three JSON files of events and a streaming query: file source -> transformation -> rqueue
    inbox, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    inbox.mkdir()
    for n in range(3):
        write_events(inbox, f"events-{n}.json", n * 100, 100)
    sink = rs.sink(
        server.url, "stream", value_col="json", header_cols=["type"], prefix=prefix, dedup_window=86400, batch_size=64
    )

    def run() -> None:
        events = (
            spark.readStream.schema("event_id long, user string, amount double, type string")
            .option("maxFilesPerTrigger", 1)
            .json(str(inbox))
        )
        shaped = (
            events.where(F.col("type") == "buy")
            .withColumn("cents", (F.col("amount") * 100).cast("long"))
            .select("type", F.to_json(F.struct("event_id", "user", "cents")).alias("json"))
        )
        query = (
            shaped.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)  # availableNow: the query ends by itself after the last file
        assert not query.isActive and query.exception() is None

    def expected(upto: int) -> collections.Counter:
        return collections.Counter(
            json.dumps({"event_id": i, "user": f"u{i % 7}", "cents": int(i * 150)}, separators=(",", ":")).encode()
            for i in range(upto)
            if i % 3 == 0
        )

    # when it runs: one micro-batch per file
    run()
    # then every "buy" event arrives once, with its header, and the queue keeps ids for a day
    assert payloads(client, "stream") == expected(300)
    assert {m.headers["type"] for m in stored(client, "stream")} == {"buy"}
    assert client.queue("stream").settings().dedup_window == 86400
    assert sink.last.batch.endswith(":2") and sink.last.published == sink.last.rows > 0
    last = sink.last.rows

    # when the driver dies after the sink published batch 2 but before Spark committed it (its commit file
    # is missing), and the query is restarted from its checkpoint
    for name in ("2", ".2.crc"):  # the commit and its checksum file
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    run()
    # then Spark runs batch 2 again and the sink publishes nothing new
    assert sink.last.batch.endswith(":2") and (sink.last.published, sink.last.duplicates) == (0, last)
    assert payloads(client, "stream") == expected(300)

    # when a new file arrives and the query runs again: only its rows are added
    write_events(inbox, "events-3.json", 300, 100)
    run()
    assert sink.last.batch.endswith(":3")
    assert payloads(client, "stream") == expected(400)

    # and a group consuming the queue gets each event once
    seen = collections.Counter()
    with client.queue("stream").consumer("billing") as c:
        while batch := c.fetch(100, timeout=0.2):
            seen.update(d.data for d in batch)
            c.ack(batch)
    assert seen == expected(400)


def test_dead_letters_as_a_dataframe(spark, server, client, prefix):
    # given a queue whose group rejected one message and terminated another
    q = client.queue("orders")
    q.publish_many([b"a", b"b", b"c"], headers=[{"trace": "t1"}, None, {"trace": "t3"}])
    settle = {
        b"a": lambda d: d.reject(reason="bad order"),
        b"b": lambda d: d.ack(),
        b"c": lambda d: d.term("gone"),
    }
    with q.consumer("billing") as c:
        for d in c.fetch(3):
            settle[d.data](d)
    # when its dead letters are read into a DataFrame
    df = rs.read_dead_letters(spark, server.url, "orders", prefix=prefix)
    # then there is one row per dead letter with its history, payload and own headers
    assert df.schema == rs.DEAD_LETTER_SCHEMA
    assert df.columns == [
        "dlq_seq",
        "queue",
        "group",
        "seq",
        "reason",
        "deliveries",
        "first_delivery_ms",
        "last_delivery_ms",
        "published_ms",
        "dead_lettered_ms",
        "error",
        "data",
        "headers",
    ]
    rows = sorted(df.collect(), key=lambda r: r.seq)
    assert [(r.queue, r.group, r.seq, r.reason, r.deliveries, bytes(r.data), r.headers) for r in rows] == [
        ("orders", "billing", 1, "rejected", 1, b"a", {"trace": "t1"}),
        ("orders", "billing", 3, "terminated", 1, b"c", {"trace": "t3"}),
    ]
    assert rows[0].error == "bad order" and rows[1].error == "gone"
    assert all(r.published_ms <= r.first_delivery_ms <= r.last_delivery_ms <= r.dead_lettered_ms for r in rows)
    # and the reader filters like Queue.dead_letters
    only = rs.read_dead_letters(spark, server.url, "orders", reason="terminated", prefix=prefix)
    assert [r.seq for r in only.collect()] == [3]
    assert rs.read_dead_letters(spark, server.url, "empty", prefix=prefix).count() == 0


# -- format("rqueue"): the source, and the writer used directly --------------------------


def test_read_a_queue_as_a_dataframe(spark, server, client, prefix):
    # given 7 messages, some with headers, a group "g" that settled the first 2 and a group "h" that settled none
    q = client.queue("in")
    q.consumer("h").close()
    q.publish_many([f"m{i}".encode() for i in range(7)], headers=[{"k": str(i)} if i % 2 else None for i in range(7)])
    with q.consumer("g") as c:
        c.ack(c.fetch(2))
    rs.register(spark)
    reader = spark.read.format("rqueue").option("url", server.url).option("queue", "in").option("prefix", prefix)
    # when the queue is read in tasks of 3 seqs, then every stored message is a row, in seq order
    rows = reader.option("rows_per_task", 3).load().orderBy("seq").collect()
    assert [(r.seq, bytes(r.value), r.headers, r.partition) for r in rows] == [
        (i + 1, f"m{i}".encode(), {"k": str(i)} if i % 2 else {}, None) for i in range(7)
    ]
    assert all(r.published is not None for r in rows)
    # and with the group, only what it has not settled; reading settles nothing
    assert [r.seq for r in reader.option("group", "g").load().orderBy("seq").collect()] == [3, 4, 5, 6, 7]
    assert [g.ack_floor for g in q.stats().groups] == [2, 0]


def test_the_data_source_options_are_checked_on_the_driver():
    from rqueue.spark.options import read_plan, write_plan

    base = {"url": "redis://127.0.0.1:1/0", "queue": "q"}
    # a stream needs a group; a batch read does not
    with pytest.raises(rqueue.InvalidInput, match="a stream of an rqueue queue needs the group option"):
        read_plan(base, streaming=True)
    assert read_plan(base, streaming=False).group is None
    # each bad write option is named with the value it refused
    for options, message in [
        ({"header_cols": "kind,X-RQ-seq"}, "header column 'X-RQ-seq' starts with 'x-rq-'"),
        ({"header_cols": "a,a"}, "names a column twice"),
        ({"row_ids": "random"}, "option row_ids must be one of 'content', 'position', not 'random'"),
        ({"batch_size": "0"}, "option batch_size must be a whole number from 1 to 5000, not '0'"),
        ({"batch_size": "ten"}, "option batch_size must be a whole number, not 'ten'"),
        ({"dedup_window": "-1"}, "option dedup_window must be more than 0 seconds"),
        ({"job_id": "a:b"}, "must not contain ':'"),
        ({"rows_per_task": "0"}, None),
    ]:
        if message is None:
            with pytest.raises(rqueue.InvalidInput, match="option rows_per_task"):
                read_plan({**base, **options, "group": "g"}, streaming=True)
            continue
        with pytest.raises(rqueue.RQueueError, match=re.escape(message)):
            write_plan({**base, **options})
    with pytest.raises(rqueue.InvalidURL, match="memory:// lives inside one process"):
        write_plan({**base, "url": "memory://x"})
    with pytest.raises(rqueue.InvalidURL, match="the url option is required"):
        read_plan({"queue": "q"}, streaming=False)


def test_the_stream_reader_settles_on_commit_and_a_restart_reads_the_uncommitted_range(server, client, prefix):
    # given 30 messages and the stream reader of format("rqueue") for group "spark", 10 seqs a batch
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from rqueue.spark.options import read_plan
    from rqueue.spark.reader import RqueueStreamReader

    q = client.queue("feed")
    q.publish_many([f"m{i}".encode() for i in range(1, 31)])
    options = {"url": server.url, "queue": "feed", "group": "spark", "prefix": prefix, "rows_per_task": "4"}
    reader = RqueueStreamReader(read_plan(options, streaming=True))

    def read(r, start, end):
        return [row[0] for part in r.partitions(start, end) for row in r.read(part)]

    # when it plans and reads two batches, and Spark commits the first only (the driver dies in the second)
    start = reader.initialOffset()
    assert start == {"seq": 0} and q.groups() == ["spark"]
    first = reader.latestOffset(start, ReadMaxRows(10))
    second = reader.latestOffset(first, ReadMaxRows(10))
    assert (first, second) == ({"seq": 10}, {"seq": 20})
    assert read(reader, start, first) == list(range(1, 11))
    assert read(reader, first, second) == list(range(11, 21))
    reader.commit(first)
    # then the first batch is settled for the group (its records are gone), the rest is stored
    assert q.stats().groups[0].ack_floor == 10
    assert [m.seq for m in q.peek(100)] == list(range(11, 31))
    # and a reader restarted from the checkpoint's offsets reads exactly the uncommitted range again
    again = RqueueStreamReader(read_plan(options, streaming=True))
    assert again.initialOffset() == {"seq": 10}
    assert read(again, first, second) == list(range(11, 21))
    # and a commit past a seq another consumer of the group holds leaves that delivery to it
    held = q.consumer("spark", "other").fetch(1)
    assert [d.seq for d in held] == [11]
    again.commit(again.latestOffset(second, None))
    group = q.stats().groups[0]
    assert (group.ack_floor, group.in_flight) == (10, 1)
    held[0].ack()
    assert q.stats().groups[0].ack_floor == 30
