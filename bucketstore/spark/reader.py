"""``spark.read.format("bucketstore")``: the Spark side of :mod:`bucketstore.spark.scan`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from .scan import SegmentRange, plan_scan, read_segment_range

__all__ = ["SegmentRangePartition", "StoreReader"]


@dataclass
class SegmentRangePartition(InputPartition):
    """One input partition: a range of segments of one bucket file (pickled to a task)."""

    segments: SegmentRange


class StoreReader(DataSourceReader):
    """Plans one partition per bucket, or per segment range of a big bucket, and reads them as Arrow batches."""

    def __init__(self, store: str, trackers: Sequence[str] | None, segments_per_partition: int) -> None:
        self.store = store
        self.trackers = trackers
        self.segments_per_partition = segments_per_partition

    def partitions(self) -> Sequence[InputPartition]:
        return [SegmentRangePartition(r) for r in plan_scan(self.store, self.trackers, self.segments_per_partition)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # With no ranges planned, Spark still runs one task on a placeholder
        # partition of its own: that task has nothing to read.
        if isinstance(partition, SegmentRangePartition):
            yield from read_segment_range(partition.segments)
