"""``build_store``: the bulk builder as one call from the driver."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..config import TrackerConfig
from ..engine.store.store import open_store
from ..format.snapshot import parse_bucket_key
from .build_plan import InPlacePlan, PartitionPlan, default_tasks, plan_in_place, plan_partitions
from .build_task import BUILD_COLUMNS
from .source import FORMAT_NAME, BucketStoreDataSource, check_build_schema
from .transfer import transfer_settings
from .writer import InPlaceTasks

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
    #: The input was in ledger order: only the rows of buckets spanning two of its partitions were shuffled.
    in_place: bool = False


def build_store(df: DataFrame, path: str | os.PathLike[str], tracker: str, config: TrackerConfig | None = None, *,
                mode: str = "append", rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION) -> BuildReport:
    """Write the rows of ``df`` as sealed buckets of ``tracker`` and register them in one catalog commit.

    ``df`` needs integer columns ``ledger_id``, ``entry_id`` and ``deliver_at``
    (others are ignored). Every row becomes a sealed index; a position given
    more than once keeps its smallest ``deliver_at``. One aggregation counts
    the rows per ledger; the driver cuts the whole input into buckets of at
    least ``config.min_index_count_per_bucket`` indexes from those counts and
    gives each task a run of whole buckets; one shuffle sends each row to its
    task, which seals its buckets (segmented by the config's time step and
    segment size). See :mod:`bucketstore.spark.build_plan`. When the input's
    partitions are already in ledger order, each one's task seals the buckets
    within it without a shuffle, and only the rows of buckets spanning two
    partitions move (:func:`~bucketstore.spark.build_plan.plan_in_place`).

    For the length of the write, the session's
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` and ``maxBytesPerBatch``
    are set for the transfer of rows to the tasks, then put back (see
    :mod:`bucketstore.spark.transfer`).

    The store (created if missing) is held open, and so locked, on this driver
    for the whole job: a tracker cannot open it meanwhile, and the build fails
    at once with :class:`~bucketstore.StoreLockedError` if one has it open.

    :param mode: ``"append"`` adds buckets over ledgers the tracker has no
        bucket for (rows inside an existing bucket's range fail the build
        while it is planned, before any task runs);
        ``"overwrite"`` replaces all the tracker's buckets in the same commit.
    :param rows_per_partition: the most rows a task should hold (about 40
        bytes each at the peak of its sort); the task count is a multiple of
        Spark's default parallelism. Not used in place, where the tasks are
        the input's partitions and one holds a bucket's rows at a time.
    :raises LedgerRangeConflict: (``append``) rows fall inside an existing bucket;
        nothing was written.
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
        check_build_schema(rows.schema)
        parts, ledgers, counts, packable = _rows_per_ledger(rows)
        n = int(counts.sum())
        tasks = default_tasks(n, spark.sparkContext.defaultParallelism, rows_per_partition)
        existing = [] if mode == "overwrite" else sorted(parse_bucket_key(key) for key in before)
        # Refuses rows inside an existing bucket here, before any task writes a file.
        in_place = plan_in_place(parts, ledgers, counts, config.min_index_count_per_bucket, existing)
        if in_place is not None and in_place.spanning_rows > in_place.rows // 2:
            in_place = None  # partitions smaller than buckets: most rows would move anyway
        if in_place is None:
            distinct, inverse = np.unique(ledgers, return_inverse=True)
            per_ledger = np.zeros(len(distinct), dtype=np.int64)
            np.add.at(per_ledger, inverse, counts)  # a ledger split between partitions has a count in each
            plan = plan_partitions(distinct, per_ledger, config.min_index_count_per_bucket, tasks, existing)
        # A task cuts at most one bucket per min_count rows, plus one per existing
        # bucket it must stop short of, plus its last one: reserve that many ids.
        # (The plan's own figure is exact only if a second evaluation of ``df``
        # yields the same rows; this bound holds whatever it yields.)
        stride = n // config.min_index_count_per_bucket + len(before) + 1
        ledger = F.col("ledger_id").cast("long")
        if packable:
            rows = packed_positions(rows)
            ledger = F.shiftrightunsigned(F.col("position"), 32)
        if in_place is None:
            frame, partitions = _shuffle_to_tasks(rows, plan, ledger), plan.partitions
        else:
            frame, partitions = _in_place_frame(rows, in_place, ledger)
        writer = frame.write.format(FORMAT_NAME).mode(mode)
        if in_place is not None:
            writer = writer.option("in_place", InPlaceTasks(in_place.partitions, in_place.home).to_json())
        writer = (writer
                  .option("positions", "packed" if packable else "columns")
                  .option("tracker", tracker)
                  .option("min_index_count_per_bucket", config.min_index_count_per_bucket)
                  .option("max_time_step_per_segment_ms", config.max_time_step_per_segment_ms)
                  .option("max_indexes_per_segment", config.max_indexes_per_segment)
                  .option("ledger_id_stride", stride)
                  .option("lock_holder_pid", os.getpid()))
        with transfer_settings(spark):
            writer.save(store_path)
        after = store.catalog.buckets(tracker)
    return BuildReport(tracker, n, partitions, len(before), len(after), time.perf_counter() - started,
                       in_place is not None)


def _rows_per_ledger(rows: DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Row counts per (input partition, ledger): partition ids, ledger ids (uint64), counts, and whether
    every position packs into 64 bits.

    The build's one pass over the input before the write. Grouping by the
    input partition too costs little (a ledger is usually in one partition)
    and tells whether the input is already in ledger order.
    """
    table = rows.groupBy(F.spark_partition_id().alias("part"), "ledger_id").agg(
        F.count(F.lit(1)).alias("rows"), F.min("entry_id").alias("lo"), F.max("entry_id").alias("hi")).toArrow()
    column = table.column("ledger_id")
    if column.null_count:
        raise ValueError("column ledger_id holds nulls; every row needs a ledger_id, entry_id and deliver_at")
    # BIGINT ids below zero spell unsigned ids of 2**63 and more (see schema.py).
    ledgers = column.to_numpy().astype(np.int64, copy=False).view(np.uint64)
    counts = table.column("rows").to_numpy().astype(np.int64, copy=False)
    # Null entry ids are left for the tasks to refuse; they make min/max null.
    lo, hi = table.column("lo"), table.column("hi")
    packable = (len(ledgers) > 0 and int(ledgers.max()) < 1 << 32 and not lo.null_count and not hi.null_count
                and int(lo.to_numpy().min()) >= 0 and int(hi.to_numpy().max()) < 1 << 32)
    return table.column("part").to_numpy().astype(np.int64), ledgers, counts, packable


def packed_positions(rows: DataFrame) -> DataFrame:
    """``position = ledger_id << 32 | entry_id`` and ``deliver_at``: one BIGINT per position instead of two.

    The JVM's conversion of rows to Arrow and the shuffle are a good part of the
    job's time. The planning pass found every id below 2**32; the write
    evaluates the input again, and should that yield an id that does not fit
    (an input that is not deterministic), the job fails rather than pack it
    into another position.
    """
    ledger, entry = F.col("ledger_id").cast("long"), F.col("entry_id").cast("long")
    fits = ledger.between(0, 0xFFFFFFFF) & entry.between(0, 0xFFFFFFFF)
    position = F.when(fits, F.shiftleft(ledger, 32).bitwiseOR(entry)).otherwise(F.raise_error(
        F.lit("a bulk build row has a null id, or an id of 2**32 or more that the planning pass did not see; "
              "is the input DataFrame deterministic? Nothing was registered")))
    return rows.select(position.alias("position"), F.col("deliver_at").cast("long").alias("deliver_at"))


def _shuffle_to_tasks(rows: DataFrame, plan: PartitionPlan, ledger: Column) -> DataFrame:
    """Send every row to its planned task in one shuffle, by a partition id computed from its ledger id."""
    target = _partition_id(ledger, plan.starts)
    if hasattr(rows, "repartitionById"):  # PySpark 4.1+: the id is the partition, no sampling pass
        return rows.repartitionById(plan.partitions, target)
    # PySpark 4.0: range partitioning on the id keeps each task's ledgers
    # together (at the cost of the partitioner's sampling pass).
    return rows.repartitionByRange(plan.partitions, target)


def _in_place_frame(rows: DataFrame, plan: InPlacePlan, ledger: Column) -> tuple[DataFrame, int]:
    """The input's own partitions, less the rows of the buckets that span two, then one shuffled task per such bucket.

    The input is evaluated twice (once per side of the union); for a
    generated or file input that costs far less than shuffling every row.
    """
    if not plan.spanning:
        return rows, plan.partitions
    which = _interval_index(ledger, plan.spanning)
    stay = rows.where(which < 0)
    move = rows.where(which >= 0)
    if hasattr(move, "repartitionById"):
        move = move.repartitionById(len(plan.spanning), _interval_index(ledger, plan.spanning))
    else:
        move = move.repartitionByRange(len(plan.spanning), _interval_index(ledger, plan.spanning))
    return stay.unionAll(move), plan.partitions + len(plan.spanning)


def _interval_index(ledger: Column, ranges: list[tuple[int, int]]) -> Column:
    """``i`` where ``ranges[i][0] <= ledger <= ranges[i][1]`` (ascending, disjoint, unsigned), else -1."""
    key = ledger.bitwiseXOR(F.lit(-(1 << 63)))

    def pick(lo: int, hi: int) -> Column:
        if hi - lo == 1:
            start, end = ranges[lo]
            return F.when((key >= F.lit(start - (1 << 63))) & (key <= F.lit(end - (1 << 63))), F.lit(lo)) \
                .otherwise(F.lit(-1))
        mid = (lo + hi) // 2
        return F.when(key < F.lit(ranges[mid][0] - (1 << 63)), pick(lo, mid)).otherwise(pick(mid, hi))

    return pick(0, len(ranges))


def _partition_id(ledger: Column, starts: tuple[int, ...]) -> Column:
    """``max p with starts[p] <= ledger`` in unsigned order, as a balanced tree of comparisons."""
    # Flipping the sign bit maps unsigned order onto signed order, which is what
    # BIGINT comparisons do.
    key = ledger.bitwiseXOR(F.lit(-(1 << 63)))

    def pick(lo: int, hi: int) -> Column:
        if hi - lo == 1:
            return F.lit(lo)
        mid = (lo + hi) // 2
        return F.when(key < F.lit(starts[mid] - (1 << 63)), pick(lo, mid)).otherwise(pick(mid, hi))

    return pick(0, len(starts))
