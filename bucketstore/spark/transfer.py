"""Spark settings for a bulk build's row-to-Arrow transfer, applied for the length of its write.

The JVM hands a build's rows to the Python tasks as Arrow batches. By default
it cuts a batch at ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows or at
``spark.sql.execution.arrow.maxBytesPerBatch`` bytes, whichever comes first,
and to honour the byte limit it asks the Arrow writer for its size after
**every row** (a walk over the column vectors that allocates iterators). On
the build's two or three fixed-width BIGINT columns that check cost about a
fifth of a warm build's CPU time (2 M rows: 1.31 -> 1.02 CPU s; a JFR profile
of the executor threads showed it beside the row conversion itself). A row
is 16 or 24 bytes, so the row limit alone bounds a batch (64 Ki rows, 1.5 MiB
at most): the byte limit is switched off for the write.

These are session settings (Spark has no per-query ones): they are set just
before the write, restored (or unset) right after it, and in between they
apply to any other query the same session runs from another thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

__all__ = ["TRANSFER_SETTINGS", "TRANSFER_BATCH_ROWS", "transfer_settings"]

#: Rows per Arrow batch sent to a build task.
TRANSFER_BATCH_ROWS = 65_536
#: ``2**31 - 1`` is the value Spark reads as "no byte limit" (it then skips the per-row size check).
_NO_BYTE_LIMIT = str((1 << 31) - 1)

TRANSFER_SETTINGS: dict[str, str] = {
    "spark.sql.execution.arrow.maxBytesPerBatch": _NO_BYTE_LIMIT,
    "spark.sql.execution.arrow.maxRecordsPerBatch": str(TRANSFER_BATCH_ROWS),
}


@contextmanager
def transfer_settings(spark: SparkSession) -> Iterator[None]:
    """Apply :data:`TRANSFER_SETTINGS` to ``spark`` for the body, then put back what was there."""
    before = {key: spark.conf.get(key, None) for key in TRANSFER_SETTINGS}
    try:
        for key, value in TRANSFER_SETTINGS.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
