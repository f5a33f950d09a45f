"""PySpark integration, both ways, on PySpark's Python Data Source API:

- ``spark.read.format("rqueue")`` / ``spark.readStream.format("rqueue")``
  read a queue (a stream reads for a group and settles what each committed
  micro-batch read);
- ``df.write.format("rqueue")`` / ``df.writeStream.format("rqueue")``
  publish rows exactly once; :func:`publish_dataframe` and :func:`sink`
  (for foreachBatch) are thin wrappers over the same writer;
- :func:`read_dead_letters`: a queue's dead letters as a DataFrame.

Call :func:`register` once per SparkSession before using
``format("rqueue")`` (the wrappers do it themselves). Install with the
``spark`` extra (PySpark 4.x, pyarrow, Java 17); docs/spark.md has the
options, the guarantees and the deployment on a cluster.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark.sql.datasource  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("rqueue.spark needs pyspark 4.x and pyarrow: pip install 'rqueue[spark]'") from exc

from .dataframes import PublishStats, Sink, publish_dataframe, sink
from .deadletters import DEAD_LETTER_SCHEMA, read_dead_letters
from .reader import SOURCE_SCHEMA
from .source import RqueueDataSource, register

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "SOURCE_SCHEMA",
    "PublishStats",
    "RqueueDataSource",
    "Sink",
    "publish_dataframe",
    "read_dead_letters",
    "register",
    "sink",
]
