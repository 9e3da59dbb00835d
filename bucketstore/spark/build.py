"""``build_store``: the bulk builder as one call from the driver."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from pyspark.sql import DataFrame

from ..config import TrackerConfig
from ..engine.store import open_store
from .build_task import BUILD_COLUMNS
from .source import FORMAT_NAME, BucketStoreDataSource

__all__ = ["build_store", "BuildReport", "DEFAULT_ROWS_PER_PARTITION"]

#: Rows one task holds in memory at most, roughly (about 40 bytes each at the peak of its sort).
DEFAULT_ROWS_PER_PARTITION = 2_000_000


@dataclass(frozen=True, slots=True)
class BuildReport:
    """What :func:`build_store` did."""

    tracker: str
    input_rows: int
    partitions: int
    buckets_before: int
    buckets_after: int
    seconds: float


def build_store(df: DataFrame, path: str | os.PathLike[str], tracker: str, config: TrackerConfig | None = None, *,
                mode: str = "append", rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION) -> BuildReport:
    """Write the rows of ``df`` as sealed buckets of ``tracker`` and register them in one catalog commit.

    ``df`` needs integer columns ``ledger_id``, ``entry_id`` and ``deliver_at``
    (others are ignored). Every row becomes a sealed index; a position given
    more than once keeps its smallest ``deliver_at``. The rows are range
    partitioned by ledger so each task owns a ledger range, and each task cuts
    its ledgers into buckets of at least ``config.min_index_count_per_bucket``
    indexes, segmented by the config's time step and segment size.

    The store (created if missing) is held open, and so locked, on this driver
    for the whole job: a tracker cannot open it meanwhile, and the build fails
    at once with :class:`~bucketstore.StoreLockedError` if one has it open.

    :param mode: ``"append"`` adds buckets over ledgers the tracker has no
        bucket for (rows inside an existing bucket's range fail the job);
        ``"overwrite"`` replaces all the tracker's buckets in the same commit.
    :param rows_per_partition: the most rows a task should hold; the job uses
        at least as many tasks as Spark's default parallelism.
    :raises pyspark.errors.PySparkException: the job failed (the error names the
        cause); nothing was registered and the job's files were removed.
    """
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', not {mode!r}")
    if rows_per_partition < 1:
        raise ValueError("rows_per_partition must be at least 1")
    config = config if config is not None else TrackerConfig()
    started = time.perf_counter()
    spark = df.sparkSession
    spark.dataSource.register(BucketStoreDataSource)
    store_path = os.path.abspath(os.fspath(path))
    with open_store(store_path) as store:
        before = store.catalog.buckets(tracker)
        rows = df.select(*BUILD_COLUMNS)
        n = rows.count()
        min_count = config.min_index_count_per_bucket
        partitions = max(spark.sparkContext.defaultParallelism, math.ceil(n / rows_per_partition))
        # More tasks than minimum-size buckets would only make undersized buckets.
        partitions = max(1, min(partitions, n // min_count))
        # A task cuts at most one bucket per min_count rows, plus one per existing
        # bucket it must stop short of, plus its last one: reserve that many ids.
        stride = n // min_count + len(before) + 1
        (rows.repartitionByRange(partitions, "ledger_id")
         .write.format(FORMAT_NAME).mode(mode)
         .option("tracker", tracker)
         .option("min_index_count_per_bucket", config.min_index_count_per_bucket)
         .option("max_time_step_per_segment_ms", config.max_time_step_per_segment_ms)
         .option("max_indexes_per_segment", config.max_indexes_per_segment)
         .option("ledger_id_stride", stride)
         .option("lock_holder_pid", os.getpid())
         .save(store_path))
        after = store.catalog.buckets(tracker)
    return BuildReport(tracker, n, partitions, len(before), len(after), time.perf_counter() - started)
