"""bucketstore.spark: the data source's reader and bulk builder, in Spark local mode.

One SparkSession serves the whole module (JVM start-up dominates). The tests
that need no Spark (bucket cutting, task cleanup, orphans) run without it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import numpy as np
import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install '.[spark]')")
pytest.importorskip("pyarrow", reason="the spark extra is not installed (pip install '.[spark]')")

import bucketstore  # noqa: E402
import bucketstore.spark as bspark  # noqa: E402
from bucketstore.engine.catalog.catalog import Catalog  # noqa: E402
from bucketstore.engine.durability.journal import journal_directory  # noqa: E402
from bucketstore.engine.durability.journal import read_frontier  # noqa: E402
from bucketstore.format.snapshot import BucketFile, parse_bucket_key  # noqa: E402
from bucketstore.spark.bucketing import (LedgerRangeConflict, Rows, cut_buckets, cut_ledger_groups,  # noqa: E402
                                         order_positions, time_order)
from bucketstore.spark.build import _partition_id, packed_positions  # noqa: E402
from bucketstore.spark.build_job import plan_build  # noqa: E402
from bucketstore.spark.build_plan import default_tasks, plan_in_place, plan_partitions  # noqa: E402
from bucketstore.spark.build_task import rows_from_batches, write_partition, write_planned  # noqa: E402
from bucketstore.spark.scan import plan_scan  # noqa: E402
from bucketstore.spark.transfer import TRANSFER_BATCH_ROWS, transfer_settings  # noqa: E402
from helpers import FakeClock  # noqa: E402
from repo_paths import ROOT  # noqa: E402

pytestmark = pytest.mark.spark

U64 = np.uint64
CFG = bucketstore.TrackerConfig(min_index_count_per_bucket=200, max_indexes_per_segment=50,
                                max_time_step_per_segment_ms=1000)


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the Spark tests need Java 17 or newer on PATH or in JAVA_HOME")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("bucketstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    bspark.register(session)
    yield session
    session.stop()


# -- helpers -----------------------------------------------------------------------------------
def rows_frame(spark, rows):
    return spark.createDataFrame([(bspark.to_signed(l), bspark.to_signed(e), t) for l, e, t in rows],
                                 "ledger_id BIGINT, entry_id BIGINT, deliver_at BIGINT")


def random_rows(seed, ledgers, per_ledger, duplicates=0):
    rng = np.random.default_rng(seed)
    rows = [(l, e, int(rng.integers(10_000, 60_000))) for l in ledgers for e in range(per_ledger)]
    # Repeat some positions with another time: the build keeps the earliest.
    for i in rng.choice(len(rows), duplicates, replace=False):
        l, e, _ = rows[i]
        rows.append((l, e, int(rng.integers(10_000, 60_000))))
    rng.shuffle(rows)
    return rows


def ledger_files(store):
    return sorted(os.listdir(os.path.join(store, "ledgers")))


def settled_files(store, expected, timeout=10.0):
    """The ledger files once tasks Spark cancelled have stopped: they may finish a seal after the
    job failed, then see the abort mark and remove their file (see abort_marker)."""
    deadline = time.monotonic() + timeout
    while ledger_files(store) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return ledger_files(store)


def catalog_buckets(store, tracker):
    with Catalog(os.path.join(store, "catalog"), readonly=True) as cat:
        return cat.buckets(tracker)


def file_rows(store):
    """Every index of every bucket file the catalog references, read with BucketFile."""
    out = []
    with Catalog(os.path.join(store, "catalog"), readonly=True) as cat:
        for tracker, keys in cat.all_buckets().items():
            for key, lid in keys.items():
                start, end = parse_bucket_key(key)
                path = os.path.join(store, "ledgers", f"{lid:020d}.ledger")
                with BucketFile(path) as bf:
                    for k in range(1, bf.segment_count + 1):
                        seg = bf.read_segment(k)
                        out += [(tracker, start, end, path, k, int(t), int(l), int(e))
                                for t, l, e in zip(seg.timestamps, seg.ledger_ids, seg.entry_ids)]
    return sorted(out)


def frame_rows(rows, delivered=False):
    """Collected rows as file_rows spells them; with ``delivered``, the column appended."""
    return sorted((r.tracker, bspark.to_unsigned(r.bucket_start_ledger), bspark.to_unsigned(r.bucket_end_ledger),
                   r.ledger_file, r.segment, bspark.to_unsigned(r.timestamp), bspark.to_unsigned(r.ledger_id),
                   bspark.to_unsigned(r.entry_id), *([r.delivered] if delivered else [])) for r in rows)


def deliveries(tracker, clock, until, step=500):
    """Everything a tracker delivers as the clock walks to ``until``: [(time, positions)]."""
    out = []
    for now in range(0, until + step, step):
        clock.now = now
        got = tracker.get_scheduled_messages(10**9)
        if got:
            out.append((now, got))
    return out


# -- bucket cutting (no Spark) -------------------------------------------------------------------
def test_cut_buckets_closes_at_min_count_and_before_existing_ranges():
    ledgers = np.repeat(np.array([1, 2, 3, 10, 11, 20], dtype=U64), [3, 3, 3, 3, 3, 3])
    cuts = cut_buckets(ledgers, 5, existing=[(5, 8)])
    assert [(c.start_ledger, c.end_ledger, c.hi - c.lo) for c in cuts] == [(1, 2, 6), (3, 3, 3), (10, 11, 6),
                                                                           (20, 20, 3)]
    with pytest.raises(LedgerRangeConflict, match="ledger 6 fall inside the existing bucket \\[5, 8\\]"):
        cut_buckets(np.array([1, 6], dtype=U64), 5, existing=[(5, 8)])


def test_order_positions_keeps_the_earliest_time_of_a_repeated_position():
    rows = Rows(np.array([7, 3, 7, 3], dtype=U64), np.array([1, 2, 1, 2], dtype=U64),
                np.array([50, 9, 40, 90], dtype=U64))
    out = order_positions(rows)
    assert list(zip(out.ledgers.tolist(), out.entries.tolist(), out.timestamps.tolist())) == [(3, 2, 9), (7, 1, 40)]
    wide = Rows(np.array([2**64 - 1, 5], dtype=U64), np.array([2**40, 1], dtype=U64), np.array([1, 2], dtype=U64))
    assert order_positions(wide).ledgers.tolist() == [5, 2**64 - 1]


def test_order_positions_returns_rows_already_in_order_as_they_are():
    ledgers = np.repeat(np.arange(3, dtype=U64), 4)
    rows = Rows(ledgers, np.tile(np.arange(4, dtype=U64), 3), np.arange(12, dtype=U64)[::-1].copy())
    out = order_positions(rows)
    assert out.ledgers is rows.ledgers and out.timestamps is rows.timestamps  # no sort, no gather
    # In order but for one repeated position: still one row per position, the earliest time.
    repeated = Rows(np.array([1, 1, 2], dtype=U64), np.array([5, 5, 0], dtype=U64), np.array([9, 3, 7], dtype=U64))
    out = order_positions(repeated)
    assert list(zip(out.ledgers.tolist(), out.entries.tolist(), out.timestamps.tolist())) == [(1, 5, 3), (2, 0, 7)]


def test_order_positions_of_scrambled_rows_with_repeats_matches_a_full_sort():
    # Scrambled (many descents: the quicksort path) and in a few presorted runs (timsort), each
    # with repeated positions whose earliest time must win.
    rng = np.random.default_rng(11)
    ledgers, entries = rng.integers(0, 50, 20_000).astype(U64), rng.integers(0, 300, 20_000).astype(U64)
    times = rng.integers(0, 1000, 20_000).astype(U64)
    runs = np.concatenate([np.sort(part) for part in np.array_split((ledgers << U64(32)) | entries, 3)])
    for rows in (Rows(ledgers, entries, times), Rows(runs >> U64(32), runs & U64(0xFFFFFFFF), times)):
        order = np.lexsort((rows.timestamps, rows.entries, rows.ledgers))
        full = rows.take(order)
        first = np.ones(len(full), dtype=bool)
        first[1:] = (full.ledgers[1:] != full.ledgers[:-1]) | (full.entries[1:] != full.entries[:-1])
        out = order_positions(rows)
        assert len(out) < len(rows)  # there were repeats
        assert out.ledgers.tolist() == full.ledgers[first].tolist()
        assert out.entries.tolist() == full.entries[first].tolist()
        assert out.timestamps.tolist() == full.timestamps[first].tolist()


def test_time_order_sorts_by_time_then_position_whatever_the_ranges():
    rng = np.random.default_rng(3)
    narrow = Rows(rng.integers(0, 8, 5000).astype(U64), rng.integers(0, 4000, 5000).astype(U64),
                  rng.integers(0, 60, 5000).astype(U64))  # many equal times: the position decides
    # Columns spanning all 64 bits (ids past 2**63) leave the packed key for lexsort.
    wide = Rows(rng.integers(0, 2**64 - 1, 5000, dtype=U64, endpoint=True), rng.integers(0, 3, 5000).astype(U64),
                rng.choice(np.array([0, 2**63, 2**64 - 1], dtype=U64), 5000))
    for rows in (narrow, wide):
        rows = order_positions(rows)  # distinct positions, as the tasks call it
        want = np.lexsort((rows.entries, rows.ledgers, rows.timestamps))
        out = time_order(rows)
        assert out.timestamps.tolist() == rows.timestamps[want].tolist()
        assert out.ledgers.tolist() == rows.ledgers[want].tolist()
        assert out.entries.tolist() == rows.entries[want].tolist()


def test_a_failing_task_removes_its_files_and_a_crash_leaves_only_orphans(tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    bucketstore.open(store).close()
    job = plan_build(store, "t", CFG)
    ledgers = np.repeat(np.arange(10, dtype=U64), 100)
    rows = Rows(ledgers, np.tile(np.arange(100, dtype=U64), 10), np.arange(1000, dtype=U64) + 1)
    import bucketstore.spark.build_task as task
    real, calls = task.write_bucket, []

    def failing_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(task, "write_bucket", failing_third)
    with pytest.raises(OSError, match="disk full"):
        write_partition(job, rows, 0)
    assert ledger_files(store) == []
    monkeypatch.setattr(task, "write_bucket", real)
    # A task still running after its job was aborted removes what it writes.
    from bucketstore.spark.abort_marker import JobAborted, mark_aborted
    mark_aborted(store, job.job_id)
    with pytest.raises(JobAborted):
        write_partition(job, rows, 0)
    assert ledger_files(store) == []
    job = plan_build(store, "t", CFG)
    # A driver that dies after its tasks wrote leaves unregistered files: orphans the next open removes.
    assert len(write_partition(job, rows, 0)) == 5
    with bucketstore.open(store) as s:
        assert s.orphans_removed == 5
    assert ledger_files(store) == []


def test_cutting_per_ledger_counts_matches_cutting_the_rows():
    rng = np.random.default_rng(11)
    for _ in range(50):
        distinct = np.unique(rng.integers(0, 300, size=int(rng.integers(1, 60)))).astype(U64)
        per = rng.integers(1, 40, size=len(distinct))
        ledgers = np.repeat(distinct, per)
        existing = [(int(s), int(s) + int(rng.integers(0, 3))) for s in rng.choice(np.arange(300, 400), 2)]
        min_count = int(rng.integers(1, 100))
        by_rows = [(c.start_ledger, c.end_ledger, c.hi - c.lo) for c in cut_buckets(ledgers, min_count, existing)]
        groups = cut_ledger_groups(distinct.tolist(), per.tolist(), min_count, existing)
        assert [(f, l, int(per[a:b].sum())) for a, b, f, l in groups] == by_rows


def test_partition_plan_cuts_the_whole_input_once_and_splits_it_on_bucket_boundaries():
    rng = np.random.default_rng(12)
    ledgers = rng.permutation(np.arange(1000, 1400, dtype=U64))  # the aggregation's order is arbitrary
    counts = rng.integers(1, 300, size=len(ledgers))
    plan = plan_partitions(ledgers, counts, 2000, tasks=6)
    assert plan.rows == int(counts.sum()) and plan.partitions == 6 and plan.starts[0] == 0
    order = np.argsort(ledgers)
    rows = np.repeat(ledgers[order], counts[order])
    whole = cut_buckets(rows, 2000)
    assert plan.buckets == len(whole)
    # Each task cuts its own rows into exactly the buckets of the global cut: only the last is short.
    per_task = [cut_buckets(rows[[plan.partition_of(int(l)) == p for l in rows]], 2000) for p in range(6)]
    assert [(c.start_ledger, c.end_ledger, c.hi - c.lo) for cuts in per_task for c in cuts] == \
        [(c.start_ledger, c.end_ledger, c.hi - c.lo) for c in whole]
    assert max(len(c) for c in per_task) == plan.max_buckets_per_task
    sizes = [sum(c.hi - c.lo for c in cuts) for cuts in per_task]
    assert max(sizes) - min(sizes) <= 2 * (2000 + 300)  # balanced to within about a bucket
    assert sum(c.hi - c.lo < 2000 for c in whole[:-1]) == 0
    # Unsigned order: ledger ids of 2**63 and more come after small ones, and existing ranges are refused.
    big = plan_partitions(np.array([2**64 - 1, 5, 2**63], dtype=U64), np.array([10, 10, 10]), 10, tasks=3)
    assert big.starts == (0, 2**63, 2**64 - 1) and big.partition_of(2**63 + 1) == 1
    with pytest.raises(LedgerRangeConflict, match="ledger 1150 fall inside"):
        plan_partitions(ledgers, counts, 2000, tasks=2, existing=[(1150, 1250)])
    assert plan_partitions(np.zeros(0, U64), np.zeros(0, np.int64), 10, tasks=4).starts == (0,)
    assert [default_tasks(r, 2, 2_000_000) for r in (0, 3_000_000, 10_000_000)] == [2, 2, 6]


def test_in_place_plan_keeps_buckets_within_a_partition_and_moves_only_those_spanning_two():
    # Ledgers 0..29, 10 rows each, in 3 partitions split inside ledgers 9 and 20; buckets of 3 ledgers.
    rows = np.repeat(np.arange(30, dtype=U64), 10)
    part_of_row = np.searchsorted([95, 205], np.arange(300), side="right")
    keys = sorted({(int(p), int(l)) for p, l in zip(part_of_row, rows)})
    parts = np.array([p for p, _ in keys])
    ledgers = np.array([l for _, l in keys], dtype=U64)
    counts = np.array([int(((part_of_row == p) & (rows == l)).sum()) for p, l in keys])
    order = np.random.default_rng(3).permutation(len(keys))  # the aggregation's order is arbitrary
    plan = plan_in_place(parts[order], ledgers[order], counts[order], 30)
    assert plan.partitions == 3 and plan.rows == 300
    assert plan.spanning == [(9, 11), (18, 20)] and plan.spanning_rows == 60
    assert plan.home == {0: [(0, 2, 30), (3, 5, 30), (6, 8, 30)], 1: [(12, 14, 30), (15, 17, 30)],
                         2: [(21, 23, 30), (24, 26, 30), (27, 29, 30)]}
    # Together they are the global cut of the rows.
    got = sorted([(s, e) for b in plan.home.values() for s, e, _ in b] + plan.spanning)
    assert got == [(c.start_ledger, c.end_ledger) for c in cut_buckets(rows, 30)]
    # Partition ids need not follow ledger order (a file scan orders its splits by size).
    flipped = plan_in_place(2 - parts, ledgers, counts, 30)
    assert flipped.spanning == plan.spanning and flipped.home == {2 - k: v for k, v in plan.home.items()}
    rng = np.random.default_rng(4)
    for _ in range(30):  # random splits of ordered rows, partitions numbered in any order
        distinct = np.unique(rng.integers(0, 200, 40)).astype(U64)
        rows = np.repeat(distinct, rng.integers(1, 20, len(distinct)))
        bounds = np.sort(rng.integers(0, len(rows), int(rng.integers(0, 6))))
        ids = rng.permutation(len(bounds) + 1)[np.searchsorted(bounds, np.arange(len(rows)), side="right")]
        keys = sorted({(int(p), int(l)) for p, l in zip(ids, rows)})
        got = plan_in_place(np.array([p for p, _ in keys]), np.array([l for _, l in keys], dtype=U64),
                            np.array([int(((ids == p) & (rows == l)).sum()) for p, l in keys]), 25)
        whole = [(c.start_ledger, c.end_ledger, c.hi - c.lo) for c in cut_buckets(rows, 25)]
        assert sorted([b for v in got.home.values() for b in v] + [(s, e, n) for s, e, n in whole
                                                                   if (s, e) in got.spanning]) == whole
        for p, buckets in got.home.items():
            for s, e, n in buckets:
                assert ((ids == p) & (rows >= s) & (rows <= e)).sum() == n  # all its rows are in partition p
    # Partitions whose ledger ranges interleave are not in ledger order: no plan.
    assert plan_in_place(np.array([0, 1, 0]), np.array([1, 2, 3], dtype=U64), np.array([5, 5, 5]), 5) is None
    with pytest.raises(LedgerRangeConflict):
        plan_in_place(parts, ledgers, counts, 30, existing=[(13, 13)])


def test_a_planned_task_seals_each_bucket_when_its_rows_are_in_and_refuses_rows_it_was_not_planned(tmp_path):
    store = str(tmp_path / "store")
    bucketstore.open(store).close()
    job = plan_build(store, "t", CFG)
    ledgers = np.repeat(np.arange(4, dtype=U64), 100)
    rows = Rows(ledgers, np.tile(np.arange(100, dtype=U64), 4), np.arange(400, dtype=U64) + 1)
    chunks = [rows.take(slice(i, i + 30)) for i in range(0, 400, 30)]
    sealed_after = []

    def watching():
        for chunk in chunks:
            yield chunk
            sealed_after.append(len(ledger_files(store)))

    built = write_planned(job, watching(), [(0, 1, 200), (2, 3, 200)], 0)
    assert [b.key for b in built] == [b.key for b in write_partition(plan_build(store, "u", CFG), rows, 0)]
    assert sealed_after[6] == 1  # the first bucket was written once its 200th row came in (the 7th chunk)
    # Rows in no order within the partition: each chunk is split by bucket, the same buckets come out.
    scrambled = rows.take(np.random.default_rng(5).permutation(400))
    mixed = write_planned(plan_build(store, "w", CFG), [scrambled.take(slice(i, i + 30)) for i in range(0, 400, 30)],
                          [(0, 1, 200), (2, 3, 200)], 0)
    assert [(b.key, b.count) for b in mixed] == [(b.key, b.count) for b in built]
    for a, b in zip(mixed, built):
        with BucketFile(a.path) as fa, BucketFile(b.path) as fb:
            assert [fa.read_segment(k).timestamps.tolist() for k in range(1, fa.segment_count + 1)] == \
                [fb.read_segment(k).timestamps.tolist() for k in range(1, fb.segment_count + 1)]
    for bad in ([], [(0, 1, 200)], [(0, 1, 200), (2, 3, 199)], [(0, 1, 200), (2, 3, 201)]):
        before = ledger_files(store)
        with pytest.raises(ValueError, match="is the input DataFrame deterministic"):
            write_planned(plan_build(store, "v", CFG), iter(chunks), bad, 0)
        assert ledger_files(store) == before


def test_packed_positions_unpack_to_the_same_rows():
    import pyarrow as pa
    ledgers = np.array([0, 7, 2**32 - 1], dtype=np.int64)
    entries = np.array([2**32 - 1, 3, 0], dtype=np.int64)
    packed = pa.record_batch([pa.array((ledgers << 32) | entries), pa.array([5, 6, 7])], names=["position", "deliver_at"])
    rows = rows_from_batches([packed], packed=True)
    assert rows.ledgers.tolist() == ledgers.tolist() and rows.entries.tolist() == entries.tolist()
    assert rows.timestamps.tolist() == [5, 6, 7]


# -- reader ------------------------------------------------------------------------------------
@pytest.fixture
def tracker_store(tmp_path):
    """A store written by trackers, with ids at both ends of the unsigned range."""
    path = str(tmp_path / "store")
    clock = FakeClock(0)
    big = 2**63 + 7
    with bucketstore.open(path, durability="sealed") as store:  # no journal: delivered is unknown
        a = store.tracker("alpha", CFG, clock)
        a.add_messages({"ledger_id": [l for l in range(6) for _ in range(150)],
                        "entry_id": [e for _ in range(6) for e in range(150)],
                        "deliver_at": [10_000 + (l * 37 + e * 11) % 9000 for l in range(6) for e in range(150)]})
        a.add_message(100, 0, 20_000)  # rolls the last ledger range over: seals it
        a.wait_for_maintenance()  # the seals run on the store's worker
        b = store.tracker("beta", CFG, clock)
        b.add_messages((np.full(250, big, U64), 2**40 + np.arange(250, dtype=U64), 2**63 + 5 + np.arange(250, dtype=U64)))
        b.add_message(2**64 - 1, 0, 20_000)
        b.wait_for_maintenance()  # the seals run on the store's worker
        assert a.stats()["immutable_buckets"] >= 2 and b.stats()["immutable_buckets"] == 1
    return path


def test_reader_round_trips_every_index_of_every_bucket_file(spark, tracker_store):
    df = spark.read.format("bucketstore").load(tracker_store)
    assert df.schema.simpleString() == ("struct<tracker:string,bucket_start_ledger:bigint,bucket_end_ledger:bigint,"
                                        "ledger_file:string,segment:int,timestamp:bigint,ledger_id:bigint,"
                                        "entry_id:bigint,delivered:boolean>")
    expected = file_rows(tracker_store)
    assert len(expected) == 6 * 150 + 250
    rows = df.collect()
    assert frame_rows(rows) == expected
    # A sealed-mode store keeps no delivery frontier: whether a row was delivered is unknown.
    assert {r.delivered for r in rows} == {None}
    # uint64 values >= 2**63 arrive as their two's-complement BIGINT.
    beta = df.where("tracker = 'beta'").select("ledger_id", "entry_id", "timestamp").first()
    assert beta.ledger_id == 2**63 + 7 - 2**64 < 0 and beta.entry_id >= 2**40 and beta.timestamp < 0


def test_reader_splits_big_buckets_and_selects_trackers(spark, tracker_store):
    df = (spark.read.format("bucketstore").option("trackers", "beta")
          .option("partition_bytes", "1").load(tracker_store))
    assert df.rdd.getNumPartitions() == 5  # one byte a partition: each of the five segments alone
    assert {r.tracker for r in df.select("tracker").distinct().collect()} == {"beta"}
    assert df.count() == 250
    with pytest.raises(Exception, match="no tracker named 'gamma'"):
        spark.read.format("bucketstore").option("trackers", "alpha,gamma").load(tracker_store).count()


def test_reader_of_an_empty_store_has_no_rows(spark, tmp_path):
    bucketstore.open(tmp_path / "empty").close()
    df = spark.read.format("bucketstore").load(str(tmp_path / "empty"))
    assert df.count() == 0 and len(df.columns) == 9


def test_delivered_marks_exactly_the_rows_at_or_before_the_durable_frontier(spark, tmp_path):
    """Sealed and journal trackers side by side: null, exact prefix, no rows (a journal, no bucket)."""
    path = str(tmp_path / "store")
    clock = FakeClock(0)
    with bucketstore.open(path, durability="sealed") as store:  # this tracker never gets a journal
        s = store.tracker("sealed", CFG, clock)
        s.add_messages([(5, e, 10_000 + e) for e in range(250)])
        s.add_message(6, 0, 90_000)
        s.wait_for_maintenance()  # the seals run on the store's worker
        assert s.stats()["immutable_buckets"] == 1
    big = 2**63
    ledgers = [1, 2, big + 3, big + 4]
    with bucketstore.open(path, durability="journal") as store:
        j = store.tracker("journaled", CFG, clock)
        # Five timestamps shared by every ledger, so the frontier falls among rows of equal
        # time and only (ledger, entry) decides; ledgers of 2**63 and more need an unsigned order.
        j.add_messages((np.repeat(np.array(ledgers, dtype=U64), 100), np.tile(np.arange(100, dtype=U64), 4),
                        np.tile(10_000 + (np.arange(100, dtype=U64) % 5) * 1000, 4)))
        j.add_message(2**64 - 1, 0, 90_000)  # rolls over: seals the second 200 indexes
        j.wait_for_maintenance()  # the seals run on the store's worker
        assert j.stats()["immutable_buckets"] == 2  # ledgers 1-2 and 2**63 + 3-4
        clock.now = 11_500
        # 80 rows at 10 000, then 50 of the 80 at 11 000: ledgers 1 and 2 and half of 2**63 + 3.
        delivered = set(j.get_scheduled_messages(130))
        assert len(delivered) == 130
        j.confirm_delivered()  # handed on: the durable frontier moves past them
        fresh = store.tracker("fresh", CFG, clock)  # created in journal mode, never seals
        fresh.add_message(1, 1, 50_000)
    journal = journal_directory(path, "journaled")
    before = {n: open(os.path.join(journal, n), "rb").read() for n in os.listdir(journal)}

    rows = spark.read.format("bucketstore").load(path).collect()
    assert {r.tracker for r in rows} == {"sealed", "journaled"}
    expected = [(*row, None if row[0] == "sealed" else (row[6], row[7]) in delivered) for row in file_rows(path)]
    assert frame_rows(rows, delivered=True) == sorted(expected)
    # Every delivery came out of the two sealed buckets; the frontier lies inside both.
    assert sum(r.delivered is True for r in rows) == 130 and sum(r.delivered is False for r in rows) == 400 - 130
    assert {n: open(os.path.join(journal, n), "rb").read() for n in os.listdir(journal)} == before

    # Planning (no Spark): one frontier per tracker in every range; a tracker without buckets
    # contributes no range and its journal is not read, so even a damaged one fails nothing.
    fresh_journal = journal_directory(path, "fresh")
    for name in os.listdir(fresh_journal):
        with open(os.path.join(fresh_journal, name), "r+b") as f:
            f.write(b"garbage!")
    ranges = [r for part in plan_scan(path) for r in part]
    assert {(r.tracker, r.journaled, r.frontier) for r in ranges} == {
        ("sealed", False, None), ("journaled", True, read_frontier(path, "journaled"))}
    assert read_frontier(path, "journaled") == (11_000, big + 3, 46)  # the 10th of its entries 1, 6, 11, ...


def test_reader_refuses_a_path_that_is_not_a_store(spark, tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(Exception, match="is not a bucketstore store"):
        spark.read.format("bucketstore").load(str(tmp_path / "plain")).count()


def test_reader_reports_a_damaged_ledger_file_with_its_path_and_offset(spark, tracker_store):
    lid = sorted(catalog_buckets(tracker_store, "beta").values())[0]
    path = os.path.join(tracker_store, "ledgers", f"{lid:020d}.ledger")
    with BucketFile(path) as bf:
        at = bf.ledger.entry_payload_offset(3) + 4
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(Exception) as info:
        spark.read.format("bucketstore").load(tracker_store).collect()
    assert "CorruptLedgerError" in str(info.value) and path in str(info.value) and "offset" in str(info.value)


# -- bulk builder ------------------------------------------------------------------------------
def test_build_store_delivers_exactly_what_single_process_ingestion_delivers(spark, tmp_path):
    rows = random_rows(1, range(40, 60), 60, duplicates=50)
    report = bspark.build_store(rows_frame(spark, rows), tmp_path / "store", "sub", CFG)
    assert report.input_rows == len(rows) and report.buckets_before == 0 and report.buckets_after >= 4
    keys = catalog_buckets(str(tmp_path / "store"), "sub")
    ranges = sorted(parse_bucket_key(k) for k in keys)
    assert all(e1 < s2 for (_, e1), (s2, _) in zip(ranges, ranges[1:])), "bucket ranges overlap"

    reference_clock, clock = FakeClock(0), FakeClock(0)
    reference = bucketstore.InMemoryTracker(CFG, reference_clock)
    for l, e, t in sorted(rows, key=lambda r: r[2]):  # earliest first: the first add of a position wins
        reference.add_message(l, e, t)
    with bucketstore.open(tmp_path / "store") as store:
        built = store.tracker("sub", CFG, clock)
        assert built.number_of_delayed_messages == reference.number_of_delayed_messages == 20 * 60
        assert deliveries(built, clock, 70_000) == deliveries(reference, reference_clock, 70_000)


def test_append_adds_buckets_beside_existing_ones_and_refuses_their_ranges(spark, tmp_path):
    store = str(tmp_path / "store")
    bspark.build_store(rows_frame(spark, random_rows(2, range(100, 110), 50)), store, "sub", CFG)
    first = catalog_buckets(store, "sub")
    bspark.build_store(rows_frame(spark, random_rows(3, [*range(10, 20), *range(200, 210)], 50)), store, "sub", CFG)
    second = catalog_buckets(store, "sub")
    assert set(first.items()) < set(second.items())
    files = ledger_files(store)
    with pytest.raises(Exception, match="fall inside the existing bucket"):
        bspark.build_store(rows_frame(spark, random_rows(4, [1, 2, 3, 104, 300, 301], 100)), store, "sub", CFG)
    assert catalog_buckets(store, "sub") == second and settled_files(store, files) == files


def test_a_task_failure_mid_job_registers_nothing_and_leaves_no_file(spark, tmp_path):
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    @F.udf(LongType(), useArrow=False)  # a plain Python UDF: the spark extra has no pandas
    def explode_on_ledger_900(ledger_id):
        if ledger_id == 900:
            raise RuntimeError("injected task failure")
        return ledger_id

    store = str(tmp_path / "store")
    bucketstore.open(store).close()
    df = rows_frame(spark, random_rows(5, range(0, 1000, 50), 40))
    # Two range partitions: ledgers below 500 build and succeed, the other task dies.
    df = df.repartitionByRange(2, "ledger_id").withColumn("ledger_id", explode_on_ledger_900("ledger_id"))
    with pytest.raises(Exception, match="injected task failure"):
        df.write.format("bucketstore").option("tracker", "sub").option("min_index_count_per_bucket", 100) \
            .mode("append").save(store)
    assert catalog_buckets(store, "sub") == {} and settled_files(store, []) == []


def test_plain_write_with_overlapping_partitions_fails_cleanly(spark, tmp_path):
    store = str(tmp_path / "store")
    rows = [(l, e, 1000 + e) for l in range(10) for e in range(30)]
    # Round-robin partitions both hold every ledger: the ranges of their buckets overlap.
    df = rows_frame(spark, rows).repartition(2)
    with pytest.raises(Exception, match="overlapping ledger ranges"):
        df.write.format("bucketstore").option("tracker", "sub").mode("append").save(store)
    assert catalog_buckets(store, "sub") == {} and settled_files(store, []) == []


def test_overwrite_replaces_the_trackers_buckets_in_one_commit(spark, tmp_path):
    store = str(tmp_path / "store")
    bspark.build_store(rows_frame(spark, random_rows(6, range(0, 8), 50)), store, "sub", CFG)
    old = catalog_buckets(store, "sub")
    rows = random_rows(7, range(4, 12), 50)
    bspark.build_store(rows_frame(spark, rows), store, "sub", CFG, mode="overwrite")
    new = catalog_buckets(store, "sub")
    assert not set(new.values()) & set(old.values())
    assert len(ledger_files(store)) == len(new)
    assert sorted((l, e) for _, _, _, _, _, _, l, e in file_rows(store)) == sorted((l, e) for l, e, _ in rows)


def test_a_build_refuses_a_store_open_for_writing(spark, tmp_path):
    store = str(tmp_path / "store")
    df = rows_frame(spark, random_rows(8, range(3), 10))
    with bucketstore.open(store):
        with pytest.raises(bucketstore.StoreLockedError):
            bspark.build_store(df, store, "sub", CFG)
        with pytest.raises(Exception, match="is open for writing by process"):
            df.write.format("bucketstore").option("tracker", "sub").mode("append").save(store)
    assert catalog_buckets(store, "sub") == {}


def test_partition_ids_computed_in_the_jvm_follow_the_plan_in_unsigned_order(spark):
    ledgers = np.array([3, 90, 2**31, 2**32 + 1, 2**63 - 1, 2**63, 2**63 + 9, 2**64 - 2, 2**64 - 1], dtype=U64)
    plan = plan_partitions(ledgers, np.full(len(ledgers), 5), 5, tasks=7)
    assert plan.partitions == 7
    df = spark.createDataFrame([(bspark.to_signed(int(l)),) for l in ledgers], "ledger_id BIGINT")
    got = df.select("ledger_id", _partition_id(df.ledger_id, plan.starts).alias("p")).collect()
    assert [(bspark.to_unsigned(r.ledger_id), r.p) for r in got] == [(int(l), plan.partition_of(int(l)))
                                                                        for l in ledgers]


def test_build_store_with_ids_past_32_bits_round_trips_through_the_reader(spark, tmp_path):
    """Ids that do not pack into one 64-bit position travel as separate columns; both layouts build alike."""
    rng = np.random.default_rng(13)
    rows = [(l, e, int(rng.integers(1_000, 90_000)))
            for l in (2, 2**32 + 5, 2**63 + 1, 2**64 - 3) for e in (0, 1, 2**33, 2**63 + 4, *range(10, 200))]
    store = str(tmp_path / "store")
    report = bspark.build_store(rows_frame(spark, rows), store, "sub", CFG, rows_per_partition=300)
    assert report.partitions == 2 and report.buckets_after == 2  # two ledgers a bucket, a bucket a task
    read = spark.read.format("bucketstore").load(store).collect()
    assert sorted((bspark.to_unsigned(r.ledger_id), bspark.to_unsigned(r.entry_id), r.timestamp) for r in read) == \
        sorted(rows)


def test_build_store_cuts_buckets_across_tasks_as_one_process_would(spark, tmp_path):
    rows = random_rows(14, range(0, 90), 37)
    report = bspark.build_store(rows_frame(spark, rows), tmp_path / "store", "sub", CFG, rows_per_partition=700)
    assert report.partitions == 6  # 3330 rows, 700 a task at most: 5, rounded up to a multiple of 2 cores
    counts = []
    with Catalog(os.path.join(tmp_path / "store", "catalog"), readonly=True) as cat:
        for key, lid in sorted(cat.buckets("sub").items(), key=lambda kv: parse_bucket_key(kv[0])):
            with BucketFile(os.path.join(tmp_path / "store", "ledgers", f"{lid:020d}.ledger")) as bf:
                counts.append(bf.metadata.count)
    ledgers = np.repeat(np.arange(90, dtype=U64), 37)
    assert counts == [c.hi - c.lo for c in cut_buckets(ledgers, CFG.min_index_count_per_bucket)]
    assert min(counts[:-1]) >= CFG.min_index_count_per_bucket


def test_input_in_ledger_order_builds_in_place_the_same_buckets_as_the_shuffle(spark, tmp_path):
    rows = random_rows(15, range(0, 90), 37, duplicates=20)
    ordered = spark.createDataFrame([(l, e, t) for l, e, t in sorted(rows)],
                                    "ledger_id BIGINT, entry_id BIGINT, deliver_at BIGINT").coalesce(2)
    in_place = bspark.build_store(ordered, tmp_path / "a", "sub", CFG)
    shuffled = bspark.build_store(rows_frame(spark, rows), tmp_path / "b", "sub", CFG)
    assert in_place.in_place and not shuffled.in_place
    # Two input partitions, one bucket spanning them in a task of its own.
    assert in_place.partitions == 3 and in_place.buckets_after == shuffled.buckets_after
    strip = [(t, s, e, k, ts, l, en) for t, s, e, _, k, ts, l, en in file_rows(str(tmp_path / "a"))]
    assert strip == [(t, s, e, k, ts, l, en) for t, s, e, _, k, ts, l, en in file_rows(str(tmp_path / "b"))]
    # Empty partitions after the last one with rows: their tasks write nothing, the spanning task still runs.
    padded = ordered.unionAll(ordered.where("ledger_id < 0"))
    report = bspark.build_store(padded, tmp_path / "c", "sub", CFG)
    assert report.in_place and report.buckets_after == shuffled.buckets_after
    assert strip == [(t, s, e, k, ts, l, en) for t, s, e, _, k, ts, l, en in file_rows(str(tmp_path / "c"))]


def test_the_build_write_gets_large_arrow_batches_and_the_session_keeps_its_settings(spark, tmp_path, monkeypatch):
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
    from pyspark.sql.readwriter import DataFrameWriter

    class BatchProbe(DataSource):  # defined here so that Spark pickles it by value to the workers
        @classmethod
        def name(cls):
            return "batch_probe"

        def writer(self, schema, overwrite):
            return BatchProbeWriter(self.options["path"])

    class BatchProbeWriter(DataSourceArrowWriter):
        def __init__(self, path):
            self.path = path

        def write(self, iterator):
            sizes = [batch.num_rows for batch in iterator]
            with open(self.path, "w") as f:
                f.write(" ".join(map(str, sizes)))
            return WriterCommitMessage()

    spark.dataSource.register(BatchProbe)
    probe = str(tmp_path / "sizes")
    frame = spark.range(100_000).coalesce(1).selectExpr("id AS position", "id AS deliver_at")
    records, limit = "spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.execution.arrow.maxBytesPerBatch"
    spark.conf.set(limit, "1k")  # a session's own (small) byte limit
    try:
        def batch_sizes():
            frame.write.format("batch_probe").mode("append").save(probe)
            with open(probe) as f:
                return [int(v) for v in f.read().split()]

        assert max(batch_sizes()) < 100  # 1 KiB of two BIGINT columns
        with transfer_settings(spark):
            assert batch_sizes() == [TRANSFER_BATCH_ROWS, 100_000 - TRANSFER_BATCH_ROWS]
        assert spark.conf.get(limit) == "1k" and spark.conf.get(records, None) is None
        with pytest.raises(RuntimeError), transfer_settings(spark):
            raise RuntimeError("the write failed")
        assert spark.conf.get(limit) == "1k" and spark.conf.get(records, None) is None

        # build_store writes with these settings and puts the session's back.
        seen = []
        save = DataFrameWriter.save

        def spy(self, *args, **kwargs):
            seen.append((spark.conf.get(records), spark.conf.get(limit)))
            return save(self, *args, **kwargs)

        monkeypatch.setattr(DataFrameWriter, "save", spy)
        rows = [(l, e, 1000 + e) for l in range(3) for e in range(300)]
        report = bspark.build_store(rows_frame(spark, rows), tmp_path / "store", "sub", CFG)
        assert report.input_rows == 900 and seen == [(str(TRANSFER_BATCH_ROWS), str((1 << 31) - 1))]
        assert spark.conf.get(limit) == "1k" and spark.conf.get(records, None) is None
    finally:
        spark.conf.unset(limit)


def test_packed_positions_refuse_an_id_the_planning_pass_did_not_see(spark):
    ok = packed_positions(rows_frame(spark, [(2**32 - 1, 2**32 - 1, 5), (0, 0, 6)])).collect()
    assert sorted((r.position, r.deliver_at) for r in ok) == [(bspark.to_signed(2**64 - 1), 5), (0, 6)]
    for bad in [(2**32, 0, 1), (1, 2**32, 1), (2**63, 1, 1)]:
        with pytest.raises(Exception, match="is the input DataFrame deterministic"):
            packed_positions(rows_frame(spark, [bad])).collect()


# -- no worker traceback when a query stops reading early (show, limit) ---------------------------

_EARLY_CLOSE = """\
Traceback (most recent call last):
  File "/x/pyspark.zip/pyspark/daemon.py", line 264, in manager
  File "/x/pyspark.zip/pyspark/daemon.py", line 95, in worker
BrokenPipeError: [Errno 32] Broken pipe
"""


def _through_quiet(*writes: str) -> str:
    import io

    from bucketstore.spark.quiet_worker import QuietStderr
    target = io.StringIO()
    quiet = QuietStderr(target)
    for text in writes:
        quiet.write(text)
    return target.getvalue()


def test_quiet_stderr_drops_only_the_early_close_report():
    assert _through_quiet(_EARLY_CLOSE) == ""
    # Written piecewise, as traceback.print_exc and print do; and the report PySpark prints when killing is off.
    assert _through_quiet(*[line + "\n" for line in _EARLY_CLOSE.splitlines()]) == ""
    assert _through_quiet("PySpark daemon failed to flush the output to the worker process:\n" + _EARLY_CLOSE,
                          "\n") == "\n"
    other = _EARLY_CLOSE.replace("BrokenPipeError: [Errno 32] Broken pipe", "ValueError: a real failure")
    assert _through_quiet(other) == other
    elsewhere = _EARLY_CLOSE.replace("pyspark/daemon.py", "bucketstore/spark/scan.py")
    assert _through_quiet(elsewhere) == elsewhere
    assert _through_quiet("plain ", "text\nand more\n", _EARLY_CLOSE, "after\n") == "plain text\nand more\nafter\n"


_SHOW_SCRIPT = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
import bucketstore.spark as bspark
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
bspark.register(spark)
df = spark.read.format("bucketstore").load(sys.argv[1])
df.show(3)
print("first", df.limit(5).count(), len(df.take(2)))
spark.stop()
"""


def test_show_and_limit_print_no_worker_traceback(tmp_path):
    """show() ends its task after a few rows while the worker still writes: the early close is not
    reported as a traceback (it was, from PySpark's daemon, after every show())."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the Spark tests need Java 17 or newer on PATH or in JAVA_HOME")
    import subprocess
    path = str(tmp_path / "store")
    n = 300_000  # a partition of several MiB: the worker is still writing when the task ends
    with bucketstore.open(path, durability="sealed") as store:
        t = store.tracker("t", bucketstore.TrackerConfig(min_index_count_per_bucket=n), FakeClock(0))
        t.add_messages((np.arange(n, dtype=U64) // 100_000, np.arange(n, dtype=U64), 10_000 + np.arange(n, dtype=U64)))
        t.add_message(10, 0, 20_000)
        t.wait_for_maintenance()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    run = subprocess.run([sys.executable, "-c", _SHOW_SCRIPT, path], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert "only showing top 3 rows" in run.stdout and "first 5 2" in run.stdout
    assert "Traceback" not in run.stderr and "Broken pipe" not in run.stderr, run.stderr


# -- topics ------------------------------------------------------------------------------------
TOPIC_SEAL = 50  # rows per sealed run: a few hundred rows are mostly in runs


def topic_level_rows(topic) -> int:
    with topic._file.read() as txn:
        return topic._file.tables.count(txn, topic._id)


def test_topic_read_gives_both_levels_with_each_subscriptions_state(spark, tmp_path):
    """A topic whose rows are mostly in sealed runs reads back as describe_topics counts them and
    as each subscription then delivers them: pending and unconfirmed rows are exactly what it
    delivers, every row is there once per subscription, the runs' rows included."""
    from bucketstore.engine.topics.topic_reader import describe_topics
    path = str(tmp_path / "store")
    clock = FakeClock(1_000)
    cfg = bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=TOPIC_SEAL)
    rows = [(i // 100, i % 100, 2_000 + (i * 7919) % 9_000) for i in range(400)]
    with bucketstore.open(path) as store:
        topic = store.topic("t", config=cfg, clock=clock)
        subs = {name: topic.subscription(name) for name in ("ahead", "acked", "unconfirmed")}
        for start in range(0, len(rows), 10):
            topic.add_messages(rows[start:start + 10])
        late = topic.subscription("late", start="latest")
        topic.add_messages([(9, e, 20_000 + e) for e in range(20)])
        clock.advance(3_000)
        assert len(subs["ahead"].get_scheduled_messages(90)) == 90
        subs["ahead"].confirm_delivered()
        assert len(subs["unconfirmed"].get_scheduled_messages(30)) == 30  # never confirmed: redelivered
        subs["acked"].mark_delete(1, 49)
        topic.add_messages([(0, 0, 9_500)])  # a re-add of a position "ahead" has delivered
        topic.add_messages([(2, 0, 9_600)])  # and of one nobody has: the first row stays the tracked one
        assert topic_level_rows(topic) < TOPIC_SEAL and topic.stats()["rows"] >= 400  # mostly in runs
        store.topic("bare", config=cfg, clock=clock).add_messages([(50, 1, 5_000), (50, 2, 6_000)])
        del late
    doc = describe_topics(path, now_ms=4_000)
    assert doc["t"]["run_files"] >= 1

    df = spark.read.format("bucketstore").option("topics", "*").load(path)
    assert df.columns == ["topic", "subscription", "timestamp", "ledger_id", "entry_id", "seq", "state"]
    got = df.collect()
    bare = sorted((r.ledger_id, r.entry_id, r.subscription, r.state) for r in got if r.topic == "bare")
    assert bare == [(50, 1, None, None), (50, 2, None, None)]
    by_sub: dict[str, list] = {}
    for r in got:
        if r.topic == "t":
            by_sub.setdefault(r.subscription, []).append(r)
    assert sorted(by_sub) == sorted(doc["t"]["subscriptions"]) == ["acked", "ahead", "late", "unconfirmed"]
    every = {(r.timestamp, r.ledger_id, r.entry_id, r.seq) for r in by_sub["ahead"]}
    assert len(every) == len(by_sub["ahead"]) == doc["t"]["rows"]
    tracked = {}
    for name, sub_rows in by_sub.items():
        assert {(r.timestamp, r.ledger_id, r.entry_id, r.seq) for r in sub_rows} == every
        figures = doc["t"]["subscriptions"][name]
        states = [r.state for r in sub_rows]
        assert len(states) - states.count("done") == figures["number_of_delayed_messages"]
        assert states.count("unconfirmed") == figures["unconfirmed"]
        assert sum(r.state == "pending" and r.timestamp <= 4_000 for r in sub_rows) + states.count("unconfirmed") \
            == figures["due_undelivered"]
        tracked[name] = sorted((r.ledger_id, r.entry_id) for r in sub_rows if r.state != "done")
    # "late" has the rows added after it: the 20 and the re-adds. "unconfirmed" had (0, 0) in its
    # batch: re-added, it left the batch (tracked again at its new time, as a tracker does).
    assert len(tracked["late"]) == 22 and doc["t"]["subscriptions"]["unconfirmed"]["unconfirmed"] == 29
    # What each subscription then delivers is exactly what the read said it still had.
    with bucketstore.open(path) as store:
        clock.now = 100_000
        topic = store.topic("t", config=cfg, clock=clock)
        for name, want in tracked.items():
            sub = topic.subscription(name)
            delivered = []
            while batch := sub.get_scheduled_messages(77):
                delivered.extend(batch)
                sub.confirm_delivered()
            assert sorted(delivered) == want, name


def test_topic_read_refuses_an_unknown_topic_and_trackers_beside_topics(spark, tmp_path):
    bucketstore.open(tmp_path / "empty").close()
    df = spark.read.format("bucketstore").option("topics", "*").load(str(tmp_path / "empty"))
    assert df.count() == 0 and len(df.columns) == 7  # a store without topics: no rows
    path = str(tmp_path / "store")
    with bucketstore.open(path) as store:
        store.topic("t").add_message(1, 1, 10**13)
    with pytest.raises(Exception, match="no topic named 'nope'"):
        spark.read.format("bucketstore").option("topics", "t,nope").load(path).count()
    with pytest.raises(Exception, match="trackers or topics, not both"):
        spark.read.format("bucketstore").option("topics", "t").option("trackers", "x").load(path).count()
