"""bucketstore on Spark: read a store as a DataFrame, bulk-build sealed buckets from one.

Needs the ``spark`` extra (``pip install bucketstore[spark]``: PySpark 4 and
pyarrow). The core package never imports PySpark; only this one does.

::

    import bucketstore.spark
    bucketstore.spark.register(spark)
    rows = spark.read.format("bucketstore").load("/data/store")
    topic_rows = spark.read.format("bucketstore").option("topics", "*").load("/data/store")
    bucketstore.spark.build_store(df, "/data/store", tracker="sub-1",
                                  config=bucketstore.TrackerConfig(min_index_count_per_bucket=50_000))

See ``docs/spark.md`` for the columns, the options and the guarantees.

May import: the whole product except ``bucketstore.testing``. Only this subpackage imports
PySpark and pyarrow.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark.sql.datasource  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("bucketstore.spark needs PySpark 4 and pyarrow: pip install 'bucketstore[spark]' "
                      f"({exc})") from exc

from pyspark.sql import SparkSession

from .build import BuildReport, build_store
from .schema import READ_DDL, TOPIC_DDL, to_signed, to_unsigned
from .source import FORMAT_NAME, BucketStoreDataSource

__all__ = ["register", "build_store", "BuildReport", "BucketStoreDataSource", "FORMAT_NAME", "READ_DDL",
           "TOPIC_DDL", "to_signed", "to_unsigned"]


def register(spark: SparkSession) -> None:
    """Register the ``"bucketstore"`` data source with a session (idempotent)."""
    spark.dataSource.register(BucketStoreDataSource)
