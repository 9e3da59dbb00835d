"""``spark.read.format("bucketstore")``: the Spark side of :mod:`bucketstore.spark.scan`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from . import quiet_worker
from .scan import SegmentRange, plan_scan, read_segment_range
from .topic_scan import TopicPart, plan_topic_scan, read_topic_part

__all__ = ["SegmentRangePartition", "TopicPartition", "StoreReader", "TopicReader"]


@dataclass
class SegmentRangePartition(InputPartition):
    """One input partition: ranges of segments of one or more bucket files (pickled to a task).

    Each range carries its tracker's delivery frontier, read once at planning: tasks never
    open a journal, and every task of a query marks rows against the same frontier.
    """

    ranges: list[SegmentRange]


class StoreReader(DataSourceReader):
    """Plans partitions of whole buckets or segment ranges of about ``partition_bytes`` each; reads Arrow batches."""

    def __init__(self, store: str, trackers: Sequence[str] | None, partition_bytes: int) -> None:
        self.store = store
        self.trackers = trackers
        self.partition_bytes = partition_bytes

    def partitions(self) -> Sequence[InputPartition]:
        return [SegmentRangePartition(p) for p in plan_scan(self.store, self.trackers, self.partition_bytes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        quiet_worker.install()  # a show() or limit closes this stream early: no traceback for that
        # With no ranges planned, Spark still runs one task on a placeholder
        # partition of its own: that task has nothing to read.
        if isinstance(partition, SegmentRangePartition):
            for segments in partition.ranges:
                yield from read_segment_range(segments)


@dataclass
class TopicPartition(InputPartition):
    """One topic, read by one task in one read transaction (rows and subscriptions agree)."""

    part: TopicPart


class TopicReader(DataSourceReader):
    """A partition per topic; a row per (subscription, topic row) of both levels."""

    def __init__(self, store: str, topics: Sequence[str] | None) -> None:
        self.store = store
        self.topics = topics

    def partitions(self) -> Sequence[InputPartition]:
        return [TopicPartition(p) for p in plan_topic_scan(self.store, self.topics)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        quiet_worker.install()
        if isinstance(partition, TopicPartition):  # not Spark's placeholder of a store without topics
            yield from read_topic_part(partition.part)
