"""``df.write.format("bucketstore")``: Spark's side of a bulk build.

``write`` runs once per task on the executors, ``commit``/``abort`` once in a
Python worker on the driver machine; Spark pickles this object to each, with
the :class:`~bucketstore.spark.build_job.BuildJob` they share.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from .build_commit import commit_build, discard_build
from .build_job import BuildJob
from .build_task import BuiltBucket, rows_from_batches, write_partition

__all__ = ["BuiltBuckets", "StoreWriter"]


@dataclass
class BuiltBuckets(WriterCommitMessage):
    """What one task wrote."""

    partition_id: int
    buckets: list[BuiltBucket]


class StoreWriter(DataSourceArrowWriter):
    """Writes each task's rows as sealed buckets; the commit registers them all at once."""

    def __init__(self, job: BuildJob, packed: bool = False) -> None:
        self.job = job
        #: Rows arrive as PACKED_COLUMNS (build_store's transfer layout).
        self.packed = packed

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BuiltBuckets:
        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        rows = rows_from_batches(iterator, self.packed)
        return BuiltBuckets(partition_id, write_partition(self.job, rows, partition_id))

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        commit_build(self.job, _buckets(messages))

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        # A failed task's message is None; that task already removed its own files.
        discard_build(self.job, _buckets(messages))


def _buckets(messages: Sequence[WriterCommitMessage | None]) -> list[BuiltBucket]:
    return [b for m in messages if isinstance(m, BuiltBuckets) for b in m.buckets]
