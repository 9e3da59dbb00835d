"""``df.write.format("bucketstore")``: Spark's side of a bulk build.

``write`` runs once per task on the executors, ``commit``/``abort`` once in a
Python worker on the driver machine; Spark pickles this object to each, with
the :class:`~bucketstore.spark.build_job.BuildJob` they share.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from .build_commit import commit_build, discard_build
from .build_job import BuildJob
from .build_task import BuiltBucket, rows_from_batches, write_partition, write_planned

__all__ = ["BuiltBuckets", "StoreWriter", "InPlaceTasks"]


@dataclass(frozen=True)
class InPlaceTasks:
    """Tasks ``0 .. partitions-1`` read the input's own partitions; ``home`` lists each one's buckets.

    Spelled as JSON in the ``in_place`` option (``{"partitions": P, "home": {"k": [[start, end, rows], ...]}}``),
    which :func:`bucketstore.spark.build_store` sets.
    """

    partitions: int
    home: dict[int, list[tuple[int, int, int]]]

    def to_json(self) -> str:
        return json.dumps({"partitions": self.partitions,
                           "home": {str(k): [list(b) for b in v] for k, v in self.home.items()}})

    @classmethod
    def from_json(cls, text: str) -> "InPlaceTasks":
        raw = json.loads(text)
        return cls(int(raw["partitions"]),
                   {int(k): [(int(s), int(e), int(r)) for s, e, r in v] for k, v in raw["home"].items()})


@dataclass
class BuiltBuckets(WriterCommitMessage):
    """What one task wrote."""

    partition_id: int
    buckets: list[BuiltBucket]


class StoreWriter(DataSourceArrowWriter):
    """Writes each task's rows as sealed buckets; the commit registers them all at once."""

    def __init__(self, job: BuildJob, packed: bool = False, in_place: InPlaceTasks | None = None) -> None:
        self.job = job
        #: Rows arrive as PACKED_COLUMNS (build_store's transfer layout).
        self.packed = packed
        #: The first tasks read unshuffled input partitions with these planned buckets.
        self.in_place = in_place

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BuiltBuckets:
        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        if self.in_place is not None and partition_id < self.in_place.partitions:
            chunks = (rows_from_batches([batch], self.packed) for batch in iterator)
            buckets = self.in_place.home.get(partition_id, [])
            return BuiltBuckets(partition_id, write_planned(self.job, chunks, buckets, partition_id))
        rows = rows_from_batches(iterator, self.packed)
        return BuiltBuckets(partition_id, write_partition(self.job, rows, partition_id))

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        commit_build(self.job, _buckets(messages))

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        # A failed task's message is None; that task already removed its own files.
        discard_build(self.job, _buckets(messages))


def _buckets(messages: Sequence[WriterCommitMessage | None]) -> list[BuiltBucket]:
    return [b for m in messages if isinstance(m, BuiltBuckets) for b in m.buckets]
