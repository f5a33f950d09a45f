"""rqueue.spark through Spark Connect: the wrappers and format("rqueue")
use the DataFrame and data source APIs only, which a Spark Connect client
has. One local Spark Connect session (local[2,2]) and one private
redis-server serve the module."""

from __future__ import annotations

import collections
import os
import shutil
import sys
import uuid
import warnings

import pytest
from support.servers import IN_CI, start_server

try:
    import pyspark.sql.connect  # noqa: F401  # needs pyspark's connect extra (pandas, grpcio)
except ImportError:
    if IN_CI:
        raise ImportError("CI must run the Spark Connect test: install the spark extra") from None
    pytest.skip("pyspark's Spark Connect client is not installed (pip install -e '.[spark]')", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    if IN_CI:
        raise RuntimeError("CI must run the Spark tests: Java 17 is missing")
    pytest.skip("Spark needs Java 17 (java on PATH or JAVA_HOME)", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import rqueue  # noqa: E402
import rqueue.spark as rs  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    s = start_server("redis")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def spark():
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    with warnings.catch_warnings():
        # The local Connect server starts with the UI off; the client then
        # sets the same option on its session again, where Spark refuses a
        # static option and warns.
        warnings.filterwarnings("ignore", message="Failed to set spark.ui.enabled", category=UserWarning)
        session = SparkSession.builder.remote("local[2,2]").config("spark.ui.enabled", "false").getOrCreate()
    yield session
    session.stop()
    if before is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = before


def test_write_and_read_a_queue_through_spark_connect(spark, server):
    # given a Spark Connect session (no SparkContext, no df.rdd) and 200 rows
    prefix = f"connect-{uuid.uuid4().hex[:8]}"
    assert type(spark).__module__.startswith("pyspark.sql.connect")
    df = spark.range(0, 200, 1, 2).select(F.format_string("v%d", "id").alias("value"), (F.col("id") % 3).alias("k"))
    # when the rows are published, and the job is run again
    first = rs.publish_dataframe(df, server.url, "cq", header_cols=["k"], prefix=prefix, job_id="j", dedup_window=600)
    again = rs.publish_dataframe(df, server.url, "cq", header_cols=["k"], prefix=prefix, job_id="j")
    # then every row is stored once
    assert (first.published, again.published, again.duplicates) == (200, 0, 200)
    # and format("rqueue") reads them back with their headers
    rows = spark.read.format("rqueue").option("url", server.url).option("queue", "cq").option("prefix", prefix).load()
    got = collections.Counter((bytes(r.value), r.headers["k"]) for r in rows.collect())
    assert got == collections.Counter((f"v{i}".encode(), str(i % 3)) for i in range(200))
    # and a bad row raises the rqueue error, its message first
    bad = spark.createDataFrame([("ok",), (None,)], "value string").coalesce(1)
    with pytest.raises(rqueue.InvalidInput, match=r"^value column 'value' is null in row 1 of Spark partition 0"):
        rs.publish_dataframe(bad, server.url, "cq", prefix=prefix, job_id="bad")
